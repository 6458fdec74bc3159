// Restart in place: the records of a run's dir, as JSON, and their reads and writes (inplace.hpp).
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <exception>
#include <limits>

#include <nlohmann/json.hpp>

#include "ckpt/clock.hpp"
#include "ckpt/inplace.hpp"
#include "ckpt/parse.hpp"

namespace ckpt::inplace {

std::string records_dir(const std::string& ckpt_dir, const std::string& id) {
  return ckpt_dir + "/.control/inplace-" + id;
}

using nlohmann::json;

namespace {

// A plan names an address and a spare per lost rank: a few hundred bytes per lost rank, far below this at 16k ranks.
constexpr std::size_t kMaxRecordBytes = 4 * 1024 * 1024;
constexpr std::size_t kMaxText = 4096;  // an address, a token, a reason

// A field reader that remembers the first problem: each record's parser reads every field through one.
class Fields {
 public:
  Fields(const json& j, const char* record) : j_(j), record_(record) {}

  bool has(const char* key) const { return j_.contains(key) && !j_.at(key).is_null(); }

  // An integer in [lo, hi]; lo is never negative here.
  template <class T>
  T integer(const char* key, T lo, T hi) {
    const json* v = find(key);
    if (!v) return lo;
    if (!v->is_number_integer()) return bad<T>(key, "not an integer");
    const bool negative = !v->is_number_unsigned() && v->get<std::int64_t>() < 0;
    const std::uint64_t u = negative ? 0 : v->get<std::uint64_t>();
    if (negative || u < static_cast<std::uint64_t>(lo) || u > static_cast<std::uint64_t>(hi)) {
      return bad<T>(key, "out of range");
    }
    return static_cast<T>(u);
  }

  std::optional<std::uint64_t> optional_step(const char* key) {
    if (!has(key)) return std::nullopt;
    return integer<std::uint64_t>(key, 0, std::numeric_limits<std::uint64_t>::max());
  }

  // A time: 0 when absent or null.
  double time(const char* key) {
    if (!has(key)) return 0;
    const json& v = j_.at(key);
    if (!v.is_number()) return bad<double>(key, "not a number");
    const double t = v.get<double>();
    if (!std::isfinite(t) || t < 0) return bad<double>(key, "not a time");
    return t;
  }

  std::string text(const char* key) {
    const json* v = find(key);
    if (!v) return {};
    if (!v->is_string()) return bad<std::string>(key, "not a string");
    std::string s = v->get<std::string>();
    if (s.size() > kMaxText) return bad<std::string>(key, "too long");
    return s;
  }

  std::vector<int> ranks(const char* key, int world) {
    std::vector<int> out;
    const json* v = find(key);
    if (!v) return out;
    if (!v->is_array()) return bad<std::vector<int>>(key, "not a list");
    for (const json& r : *v) {
      if (!r.is_number_integer() || r.get<std::int64_t>() < 0 || r.get<std::int64_t>() >= world) {
        return bad<std::vector<int>>(key, "holds a value that is no rank of the world");
      }
      out.push_back(static_cast<int>(r.get<std::int64_t>()));
    }
    return out;
  }

  const json& raw() const { return j_; }

  template <class T>
  T bad(const char* key, const char* why) {
    if (problem_.empty()) problem_ = std::string(record_) + ": '" + key + "' " + why;
    return T{};
  }

  template <class T>
  Result<T> result(T value) const {
    if (!problem_.empty()) return Error{"ckpt: " + problem_};
    return value;
  }

 private:
  const json* find(const char* key) {
    auto it = j_.find(key);
    if (it == j_.end()) {
      bad<int>(key, "is missing");
      return nullptr;
    }
    return &*it;
  }

  const json& j_;
  const char* record_;
  std::string problem_;
};

// The JSON object of `text`, or an error naming `record`. Never throws.
Result<json> object_of(std::string_view text, const char* record) {
  if (text.size() > kMaxRecordBytes) return Error{std::string("ckpt: ") + record + ": too large"};
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Error{std::string("ckpt: ") + record + ": not a JSON object"};
  return j;
}

template <class T, class Fill>
Result<T> parse_record(std::string_view text, const char* record, Fill fill) {
  auto j = object_of(text, record);
  if (!j) return Error{j.error()};
  try {
    Fields f(*j, record);
    T value;
    fill(f, value);
    return f.result(std::move(value));
  } catch (const std::exception& e) {
    return Error{std::string("ckpt: ") + record + ": " + e.what()};
  }
}

json step_json(const std::optional<std::uint64_t>& step) { return step ? json(*step) : json(nullptr); }

}  // namespace

std::optional<std::pair<std::string, int>> parse_slot(std::string_view slot) {
  const auto dot = slot.rfind('.');
  if (dot == std::string_view::npos || dot == 0) return std::nullopt;
  const std::string node(slot.substr(0, dot));
  auto local = parse_uint(slot.substr(dot + 1));
  if (!local || *local > 1u << 20) return std::nullopt;
  auto names = recovery::expand_hostlist(node, 1);
  if (!names || names->size() != 1 || (*names)[0] != node) return std::nullopt;
  return std::make_pair(node, static_cast<int>(*local));
}

// ---- plan ---------------------------------------------------------------------------------------------------------

std::string to_json(const Plan& plan) {
  json j = {{"generation", plan.generation}, {"written_unix", plan.written_unix}};
  if (plan.abandons()) {
    j["abandon"] = plan.abandon;
    return j.dump();
  }
  json takeover = json::object();
  for (const auto& [rank, slot] : plan.takeover) takeover[std::to_string(rank)] = slot;
  j.update({{"world", plan.world}, {"addr", plan.addr}, {"port", plan.port}, {"root", plan.root},
            {"lost", plan.lost}, {"step", step_json(plan.step)}, {"takeover", takeover},
            {"detect_unix", plan.detect_unix}});
  if (plan.shrinks()) j["world_before"] = plan.world_before;
  if (!plan.copies.empty()) {
    json copies = json::object();
    for (const auto& [rank, holder] : plan.copies) copies[std::to_string(rank)] = holder;
    j["copies"] = copies;
  }
  if (!plan.behind.empty()) j["behind"] = plan.behind;
  return j.dump();
}

Result<Plan> parse_plan(std::string_view text) {
  return parse_record<Plan>(text, "plan", [](Fields& f, Plan& p) {
    p.generation = f.integer<std::uint32_t>("generation", 0, std::numeric_limits<std::uint32_t>::max());
    p.written_unix = f.time("written_unix");
    if (f.has("abandon")) {
      p.abandon = f.text("abandon");
      if (p.abandon.empty()) f.bad<int>("abandon", "is empty");
      return;
    }
    p.world = f.integer<int>("world", 1, kMaxWorld);
    p.addr = f.text("addr");
    p.port = f.integer<int>("port", 1, 65535);
    p.root = f.integer<int>("root", 0, p.world - 1);
    if (f.has("world_before")) {  // a shrinking plan: the lost ranks are the failed generation's
      p.world_before = f.integer<int>("world_before", p.world + 1, kMaxWorld);
      if (f.has("takeover") && !f.raw().at("takeover").empty()) f.bad<int>("takeover", "in a plan that shrinks");
    }
    p.lost = f.ranks("lost", p.shrinks() ? p.world_before : p.world);
    if (p.shrinks() && p.world_before - static_cast<int>(p.lost.size()) != p.world) {
      f.bad<int>("world_before", "minus the lost ranks is not the world");
    }
    p.step = f.optional_step("step");
    p.detect_unix = f.time("detect_unix");
    if (f.has("takeover")) {
      const json& t = f.raw().at("takeover");
      if (!t.is_object()) {
        f.bad<int>("takeover", "not an object");
        return;
      }
      for (const auto& [rank_text, slot] : t.items()) {
        auto rank = parse_uint(rank_text);
        if (!rank || *rank >= static_cast<std::uint64_t>(p.world) || !slot.is_string() ||
            !parse_slot(slot.get<std::string>())) {
          f.bad<int>("takeover", "maps something other than a rank to a spare's <node>.<local id>");
          return;
        }
        p.takeover[static_cast<int>(*rank)] = slot.get<std::string>();
      }
    }
    if (f.has("copies")) {
      const json& c = f.raw().at("copies");
      if (!c.is_object()) {
        f.bad<int>("copies", "not an object");
        return;
      }
      auto is_lost = [&p](std::uint64_t r) {
        return std::find(p.lost.begin(), p.lost.end(), static_cast<int>(r)) != p.lost.end();
      };
      for (const auto& [rank_text, holder] : c.items()) {
        auto rank = parse_uint(rank_text);
        if (!rank || !is_lost(*rank) || !holder.is_number_unsigned() ||
            holder.get<std::uint64_t>() >= static_cast<std::uint64_t>(p.world) || is_lost(holder.get<std::uint64_t>())) {
          f.bad<int>("copies", "maps something other than a lost rank to a survivor");
          return;
        }
        p.copies[static_cast<int>(*rank)] = static_cast<int>(holder.get<int>());
      }
    }
    if (f.has("behind")) p.behind = f.ranks("behind", p.shrinks() ? p.world_before : p.world);
    for (int r : p.behind) {
      if (std::find(p.lost.begin(), p.lost.end(), r) != p.lost.end()) {
        f.bad<int>("behind", "names a lost rank");
        return;
      }
    }
  });
}

// ---- phases -------------------------------------------------------------------------------------------------------

recovery::InPlacePhases Phases::as_report() const {
  recovery::InPlacePhases r;
  r.detected = detect;
  r.agreed = decided;
  r.last_words_done = last_words_done;
  r.regrouped = group;
  r.restored = restored;
  r.resumed = first_step;
  return r;
}

std::string to_json(const Phases& p) {
  return json{{"generation", p.generation}, {"detect", p.detect}, {"decided", p.decided},
              {"last_words_done", p.last_words_done}, {"plan", p.plan}, {"group", p.group},
              {"restored", p.restored}, {"first_step", p.first_step}, {"step", step_json(p.step)}, {"lost", p.lost}}
      .dump();
}

Result<Phases> parse_phases(std::string_view text) {
  return parse_record<Phases>(text, "phases", [](Fields& f, Phases& p) {
    p.generation = f.integer<std::uint32_t>("generation", 0, std::numeric_limits<std::uint32_t>::max());
    p.detect = f.time("detect");
    p.decided = f.time("decided");
    p.last_words_done = f.time("last_words_done");
    p.plan = f.time("plan");
    p.group = f.time("group");
    p.restored = f.time("restored");
    p.first_step = f.time("first_step");
    p.step = f.optional_step("step");
    if (f.has("lost")) p.lost = f.ranks("lost", kMaxWorld);
  });
}

// ---- claims, spares, mailboxes ------------------------------------------------------------------------------------

std::string to_json(const Claim& c) { return json{{"generation", c.generation}, {"rank", c.rank}}.dump(); }

Result<Claim> parse_claim(std::string_view text) {
  return parse_record<Claim>(text, "claim", [](Fields& f, Claim& c) {
    c.generation = f.integer<std::uint32_t>("generation", 0, std::numeric_limits<std::uint32_t>::max());
    c.rank = f.integer<int>("rank", 0, kMaxWorld - 1);
  });
}

std::string to_json(const Spare& s) {
  json j = {{"node", s.node}, {"local", s.local}, {"pid", s.pid}, {"ready_unix", s.ready_unix}};
  if (s.mailbox) j["mailbox"] = {{"addr", s.mailbox->addr}, {"port", s.mailbox->port}, {"token", s.mailbox->token}};
  return j.dump();
}

Result<Spare> parse_spare(std::string_view text) {
  return parse_record<Spare>(text, "spare", [](Fields& f, Spare& s) {
    s.node = f.text("node");
    s.local = f.integer<int>("local", 0, 1 << 20);
    s.pid = f.integer<std::int64_t>("pid", 0, std::numeric_limits<std::int32_t>::max());
    s.ready_unix = f.time("ready_unix");
    if (!parse_slot(s.slot())) f.bad<int>("node", "is no host name");
    if (f.has("mailbox")) {
      const json& m = f.raw().at("mailbox");
      if (!m.is_object()) {
        f.bad<int>("mailbox", "not an object");
        return;
      }
      Fields mf(m, "spare's mailbox");
      SpareMailbox box{mf.text("addr"), mf.integer<int>("port", 1, 65535), mf.text("token")};
      auto checked = mf.result(box);
      if (!checked) {
        f.bad<int>("mailbox", "is malformed");
        return;
      }
      s.mailbox = *checked;
    }
  });
}

std::string to_json(const Mailbox& m) {
  return json{{"rank", m.rank}, {"generation", m.generation}, {"addr", m.addr}, {"port", m.port}, {"pid", m.pid}}
      .dump();
}

Result<Mailbox> parse_mailbox(std::string_view text) {
  return parse_record<Mailbox>(text, "mailbox", [](Fields& f, Mailbox& m) {
    m.rank = f.integer<int>("rank", 0, kMaxWorld - 1);
    m.generation = f.integer<std::uint32_t>("generation", 0, std::numeric_limits<std::uint32_t>::max());
    m.addr = f.text("addr");
    m.port = f.integer<int>("port", 1, 65535);
    m.pid = f.integer<std::int64_t>("pid", 0, std::numeric_limits<std::int32_t>::max());
  });
}

// ---- the run's dir --------------------------------------------------------------------------------------------------

namespace {

std::string plan_name(std::uint32_t g) { return "gen-" + std::to_string(g) + ".plan"; }
std::string phases_name(std::uint32_t g) { return "gen-" + std::to_string(g) + ".phases"; }

bool is_marker(std::string_view name) { return name == "finished" || name == "abandoned"; }

// A record read from `text` (absent: nullopt): parsed, and kept only when it is the one its name promises.
template <class T, class Belongs>
std::optional<T> record_of(std::optional<std::string> text, Result<T> (*parse)(std::string_view), Belongs belongs) {
  if (!text) return std::nullopt;
  auto record = parse(*text);
  if (!record || !belongs(*record)) return std::nullopt;
  return std::move(record).value();
}

}  // namespace

Result<Records> Records::open(const std::string& dir, bool create) {
  struct stat st {};
  if (!create && ::lstat(dir.c_str(), &st) != 0) {
    return Error{"ckpt: restart in place: cannot open " + dir + ": " + posix::errno_text(errno)};
  }
  auto fd = posix::open_private_dir(dir);
  if (!fd) return Error{"ckpt: restart in place: " + fd.error()};
  return Records(std::move(fd).value(), dir);
}

std::optional<std::string> Records::read(const std::string& name) const {
  auto text = posix::read_small_file(dir_.get(), name, kMaxRecordBytes);
  if (!text.ok()) return std::nullopt;
  return std::move(*text.value);
}

Status Records::write(const std::string& name, const std::string& content, bool durable) {
  posix::AtomicWriteOptions options;
  options.durable = durable;
  return posix::write_file_atomic(dir_.get(), name, content, posix::join(path_, name), options);
}

Result<Plan> Records::write_plan(Plan plan, const std::vector<std::pair<std::string, int>>& claims) {
  for (const auto& [slot, rank] : claims) {
    if (!parse_slot(slot)) return Error{"ckpt: restart in place: '" + slot + "' is no spare's slot"};
    if (Status s = write("claim-" + slot, to_json(Claim{plan.generation, rank})); !s) return Error{s.error()};
  }
  plan.written_unix = unix_seconds();
  const std::string text = to_json(plan);
  if (auto checked = parse_plan(text); !checked) return Error{checked.error()};  // what a reader would refuse
  if (Status s = write(plan_name(plan.generation), text); !s) return Error{s.error()};
  return plan;
}

std::optional<Plan> Records::read_plan(std::uint32_t generation) const {
  return record_of(read(plan_name(generation)), parse_plan, [&](const Plan& p) { return p.generation == generation; });
}

bool Records::has_plan(std::uint32_t generation) const {
  struct stat st {};
  return ::fstatat(dir_.get(), plan_name(generation).c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0;
}

Status Records::write_phases(const Phases& phases) { return write(phases_name(phases.generation), to_json(phases)); }

std::optional<Phases> Records::read_phases(std::uint32_t generation) const {
  return record_of(read(phases_name(generation)), parse_phases,
                   [&](const Phases& p) { return p.generation == generation; });
}

Status Records::write_spare(const Spare& spare) {
  if (!parse_slot(spare.slot())) return Status::failure("ckpt: restart in place: '" + spare.slot() + "' is no slot");
  return write("spare-" + spare.slot(), to_json(spare));
}

std::optional<Spare> Records::read_spare(const std::string& slot) const {
  if (!parse_slot(slot)) return std::nullopt;
  return record_of(read("spare-" + slot), parse_spare, [&](const Spare& s) { return s.slot() == slot; });
}

std::optional<Claim> Records::read_claim(const std::string& slot) const {
  if (!parse_slot(slot)) return std::nullopt;
  return record_of(read("claim-" + slot), parse_claim, [](const Claim&) { return true; });
}

std::vector<std::string> Records::free_spares() const {
  std::vector<std::string> names;
  int fd = ::openat(dir_.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return {};
  DIR* d = ::fdopendir(fd);
  if (d == nullptr) {
    ::close(fd);
    return {};
  }
  while (dirent* e = ::readdir(d)) names.emplace_back(e->d_name);
  ::closedir(d);
  return inplace::free_spares(std::move(names));
}

Status Records::publish_mailbox(const Mailbox& mailbox) {
  return write("mailbox-" + std::to_string(mailbox.rank), to_json(mailbox), /*durable=*/false);
}

std::optional<Mailbox> Records::read_mailbox(int rank) const {
  return record_of(read("mailbox-" + std::to_string(rank)), parse_mailbox,
                   [&](const Mailbox& m) { return m.rank == rank; });
}

Status Records::mark(std::string_view marker, std::string_view why, const std::vector<int>& lost) {
  if (!is_marker(marker)) return Status::failure("ckpt: restart in place: no marker '" + std::string(marker) + "'");
  json j = {{"why", std::string(why.substr(0, kMaxText))}, {"unix", unix_seconds()}, {"lost", lost}};
  return write(std::string(marker), j.dump(-1, ' ', false, json::error_handler_t::replace));
}

bool Records::marked(std::string_view marker) const {
  struct stat st {};
  return is_marker(marker) && ::fstatat(dir_.get(), std::string(marker).c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0;
}

std::optional<Abandoned> Records::read_abandoned(int world) const {
  auto text = read("abandoned");
  if (!text) return std::nullopt;
  auto marker = parse_record<Abandoned>(*text, "abandoned", [world](Fields& f, Abandoned& a) {
    a.why = f.text("why");
    if (f.has("lost")) a.lost = f.ranks("lost", world);  // a marker without it predates the relaunch
  });
  if (!marker) return std::nullopt;
  return std::move(marker).value();
}

Result<posix::Secret> Records::secret() const {
  auto s = posix::private_secret(dir_.get(), "secret", posix::join(path_, "secret"));
  if (!s) return Error{"ckpt: restart in place: " + s.error()};
  return s;
}

}  // namespace ckpt::inplace
