#pragma once
// The controller's durable state: SQLite in WAL mode with synchronous=FULL, so that a decision recorded before
// an action survives a SIGKILL or a power loss. One row per job (its record as JSON) and an append-only history.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/recovery.hpp"
#include "ckpt/result.hpp"

struct sqlite3;

namespace ckpt::controller {

using ckpt::recovery::JobRecord;

struct HistoryLine {
  double time = 0;
  std::uint32_t job_id = 0;
  std::uint32_t restart_count = 0;
  std::string kind;  // event, transition, action, decision, rejected, note
  std::string text;
};

class Database {
 public:
  // Opens or creates the database (and its directory's last component), mode 0600.
  static Result<std::unique_ptr<Database>> open(const std::string& path);
  ~Database();
  Database(const Database&) = delete;
  Database& operator=(const Database&) = delete;

  // Every job record; terminal ones only when `with_terminal`.
  Result<std::vector<JobRecord>> load_jobs(bool with_terminal);
  Result<std::optional<JobRecord>> load_job(std::uint32_t job_id);
  // Saves records and appends history lines in one transaction.
  Status save(const std::vector<const JobRecord*>& records, const std::vector<HistoryLine>& history);
  Result<std::vector<HistoryLine>> history(std::uint32_t job_id);
  // At most `max_rows` history lines per job are kept: each save drops the oldest of the jobs it wrote to.
  void set_history_limit(std::uint64_t max_rows) { history_limit_ = max_rows; }
  // Drops history lines older than `before`, and records of finished jobs (completed, cancelled, gone) not
  // updated since then. Returns how many rows went.
  Result<std::uint64_t> prune(double before);
  // Drops every history line of a job (its id was reused by another job).
  Status drop_history(std::uint32_t job_id);
  // A counter that only grows, kept in the database (intent ids).
  Result<std::uint64_t> next_id();
  std::size_t job_count();

 private:
  explicit Database(sqlite3* db) : db_(db) {}
  Status exec(const char* sql);
  sqlite3* db_ = nullptr;
  std::uint64_t history_limit_ = 1000;
};

}  // namespace ckpt::controller
