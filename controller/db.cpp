#include "db.hpp"

#include <sqlite3.h>
#include <sys/stat.h>

#include <set>

namespace ckpt::controller {

namespace {

class Statement {
 public:
  Statement(sqlite3* db, const char* sql) { rc_ = sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr); }
  ~Statement() { sqlite3_finalize(stmt_); }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;
  bool ok() const { return rc_ == SQLITE_OK && stmt_ != nullptr; }
  sqlite3_stmt* get() { return stmt_; }

 private:
  sqlite3_stmt* stmt_ = nullptr;
  int rc_ = SQLITE_ERROR;
};

std::string column_text(sqlite3_stmt* s, int i) {
  const unsigned char* t = sqlite3_column_text(s, i);
  return t ? reinterpret_cast<const char*>(t) : "";
}

}  // namespace

Result<std::unique_ptr<Database>> Database::open(const std::string& path) {
  if (auto slash = path.rfind('/'); slash != std::string::npos && slash > 0) {
    mkdir(path.substr(0, slash).c_str(), 0700);  // the parent of the parent must exist
  }
  sqlite3* raw = nullptr;
  const mode_t old = umask(077);
  int rc = sqlite3_open_v2(path.c_str(), &raw, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
                           nullptr);
  umask(old);
  if (rc != SQLITE_OK) {
    std::string why = raw ? sqlite3_errmsg(raw) : "out of memory";
    sqlite3_close(raw);
    return Error{"database " + path + ": " + why};
  }
  sqlite3_busy_timeout(raw, 5000);
  std::unique_ptr<Database> db(new Database(raw));
  for (const char* sql : {
           "PRAGMA journal_mode=WAL",
           "PRAGMA synchronous=FULL",
           "CREATE TABLE IF NOT EXISTS jobs (job_id INTEGER PRIMARY KEY, state TEXT NOT NULL, "
           "updated REAL NOT NULL, record TEXT NOT NULL)",
           "CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state)",
           "CREATE TABLE IF NOT EXISTS history (id INTEGER PRIMARY KEY AUTOINCREMENT, job_id INTEGER NOT NULL, "
           "time REAL NOT NULL, restart_count INTEGER NOT NULL, kind TEXT NOT NULL, text TEXT NOT NULL)",
           "CREATE INDEX IF NOT EXISTS history_job ON history(job_id, id)",
           "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL)",
       }) {
    if (auto s = db->exec(sql); !s) return Error{"database " + path + ": " + s.error()};
  }
  return db;
}

Database::~Database() { sqlite3_close(db_); }

Status Database::exec(const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    std::string why = err ? err : sqlite3_errmsg(db_);
    sqlite3_free(err);
    return Status::failure(why);
  }
  return Status::success();
}

Result<std::vector<JobRecord>> Database::load_jobs(bool with_terminal) {
  Statement s(db_, with_terminal
                       ? "SELECT record FROM jobs ORDER BY job_id"
                       : "SELECT record FROM jobs WHERE state NOT IN ('completed','cancelled','gone') "
                         "ORDER BY job_id");
  if (!s.ok()) return Error{sqlite3_errmsg(db_)};
  std::vector<JobRecord> out;
  int rc;
  while ((rc = sqlite3_step(s.get())) == SQLITE_ROW) {
    auto r = ckpt::recovery::parse_job_record(column_text(s.get(), 0));
    if (!r) return Error{"database: " + r.error()};
    out.push_back(std::move(r.value()));
  }
  if (rc != SQLITE_DONE) return Error{sqlite3_errmsg(db_)};
  return out;
}

Result<std::optional<JobRecord>> Database::load_job(std::uint32_t job_id) {
  Statement s(db_, "SELECT record FROM jobs WHERE job_id = ?");
  if (!s.ok()) return Error{sqlite3_errmsg(db_)};
  sqlite3_bind_int64(s.get(), 1, job_id);
  if (sqlite3_step(s.get()) != SQLITE_ROW) return std::optional<JobRecord>{};
  auto r = ckpt::recovery::parse_job_record(column_text(s.get(), 0));
  if (!r) return Error{"database: " + r.error()};
  return std::optional<JobRecord>(std::move(r.value()));
}

Status Database::save(const std::vector<const JobRecord*>& records, const std::vector<HistoryLine>& history) {
  if (records.empty() && history.empty()) return Status::success();
  if (auto s = exec("BEGIN IMMEDIATE"); !s) return s;
  Statement put(db_, "INSERT INTO jobs (job_id, state, updated, record) VALUES (?, ?, ?, ?) "
                     "ON CONFLICT(job_id) DO UPDATE SET state = excluded.state, updated = excluded.updated, "
                     "record = excluded.record");
  Statement add(db_, "INSERT INTO history (job_id, time, restart_count, kind, text) VALUES (?, ?, ?, ?, ?)");
  auto fail = [&](const std::string& why) {
    exec("ROLLBACK");
    return Status::failure("database: " + why);
  };
  if (!put.ok() || !add.ok()) return fail(sqlite3_errmsg(db_));
  for (const JobRecord* r : records) {
    const std::string json = ckpt::recovery::to_json(*r);
    sqlite3_bind_int64(put.get(), 1, r->job_id);
    sqlite3_bind_text(put.get(), 2, ckpt::recovery::to_string(r->state), -1, SQLITE_STATIC);
    sqlite3_bind_double(put.get(), 3, r->updated);
    sqlite3_bind_text(put.get(), 4, json.c_str(), static_cast<int>(json.size()), SQLITE_TRANSIENT);
    if (sqlite3_step(put.get()) != SQLITE_DONE) return fail(sqlite3_errmsg(db_));
    sqlite3_reset(put.get());
  }
  for (const auto& h : history) {
    sqlite3_bind_int64(add.get(), 1, h.job_id);
    sqlite3_bind_double(add.get(), 2, h.time);
    sqlite3_bind_int64(add.get(), 3, h.restart_count);
    sqlite3_bind_text(add.get(), 4, h.kind.c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(add.get(), 5, h.text.c_str(), -1, SQLITE_TRANSIENT);
    if (sqlite3_step(add.get()) != SQLITE_DONE) return fail(sqlite3_errmsg(db_));
    sqlite3_reset(add.get());
  }
  std::set<std::uint32_t> touched;
  for (const auto& h : history) touched.insert(h.job_id);
  if (!touched.empty()) {
    Statement trim(db_, "DELETE FROM history WHERE job_id = ?1 AND id <= "
                        "(SELECT id FROM history WHERE job_id = ?1 ORDER BY id DESC LIMIT 1 OFFSET ?2)");
    if (!trim.ok()) return fail(sqlite3_errmsg(db_));
    for (auto id : touched) {
      sqlite3_bind_int64(trim.get(), 1, id);
      sqlite3_bind_int64(trim.get(), 2, static_cast<sqlite3_int64>(history_limit_));
      if (sqlite3_step(trim.get()) != SQLITE_DONE) return fail(sqlite3_errmsg(db_));
      sqlite3_reset(trim.get());
    }
  }
  if (auto s = exec("COMMIT"); !s) return fail(s.error());
  return Status::success();
}

Result<std::vector<HistoryLine>> Database::history(std::uint32_t job_id) {
  Statement s(db_, "SELECT time, restart_count, kind, text FROM history WHERE job_id = ? ORDER BY id");
  if (!s.ok()) return Error{sqlite3_errmsg(db_)};
  sqlite3_bind_int64(s.get(), 1, job_id);
  std::vector<HistoryLine> out;
  while (sqlite3_step(s.get()) == SQLITE_ROW) {
    HistoryLine h;
    h.job_id = job_id;
    h.time = sqlite3_column_double(s.get(), 0);
    h.restart_count = static_cast<std::uint32_t>(sqlite3_column_int64(s.get(), 1));
    h.kind = column_text(s.get(), 2);
    h.text = column_text(s.get(), 3);
    out.push_back(std::move(h));
  }
  return out;
}

Result<std::uint64_t> Database::prune(double before) {
  std::uint64_t gone = 0;
  for (const char* sql : {"DELETE FROM history WHERE time < ?",
                          "DELETE FROM jobs WHERE state IN ('completed','cancelled','gone') AND updated < ?"}) {
    Statement s(db_, sql);
    if (!s.ok()) return Error{"database: " + std::string(sqlite3_errmsg(db_))};
    sqlite3_bind_double(s.get(), 1, before);
    if (sqlite3_step(s.get()) != SQLITE_DONE) return Error{"database: " + std::string(sqlite3_errmsg(db_))};
    gone += static_cast<std::uint64_t>(sqlite3_changes(db_));
  }
  return gone;
}

Status Database::drop_history(std::uint32_t job_id) {
  Statement s(db_, "DELETE FROM history WHERE job_id = ?");
  if (!s.ok()) return Status::failure("database: " + std::string(sqlite3_errmsg(db_)));
  sqlite3_bind_int64(s.get(), 1, job_id);
  if (sqlite3_step(s.get()) != SQLITE_DONE) return Status::failure("database: " + std::string(sqlite3_errmsg(db_)));
  return Status::success();
}

Result<std::uint64_t> Database::next_id() {
  if (auto s = exec("INSERT INTO meta (key, value) VALUES ('next_id', 1) "
                    "ON CONFLICT(key) DO UPDATE SET value = value + 1");
      !s) {
    return Error{"database: " + s.error()};
  }
  Statement s(db_, "SELECT value FROM meta WHERE key = 'next_id'");
  if (!s.ok() || sqlite3_step(s.get()) != SQLITE_ROW) return Error{"database: no id counter"};
  return static_cast<std::uint64_t>(sqlite3_column_int64(s.get(), 0));
}

std::size_t Database::job_count() {
  Statement s(db_, "SELECT COUNT(*) FROM jobs");
  if (!s.ok() || sqlite3_step(s.get()) != SQLITE_ROW) return 0;
  return static_cast<std::size_t>(sqlite3_column_int64(s.get(), 0));
}

}  // namespace ckpt::controller
