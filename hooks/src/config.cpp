// Settings: the CKPT_* environment the SPANK plugin exports, the launchers' rank variables, and code overrides.
#include <algorithm>
#include <cstdlib>
#include <map>
#include <thread>

#include "ckpt/env_contract.hpp"
#include "ckpt/hooks.hpp"
#include "ckpt/log_level.hpp"
#include "ckpt/parse.hpp"
#include "ckpt/recovery.hpp"

namespace ckpt::hooks {

namespace {

// One entry per key; `envs` are tried in order (the first one set wins).
struct KeySpec {
  OptionKey key;
  std::vector<const char*> envs;
};

// The settings the hooks read, in the order --help lists them. Their variables, fallbacks and the text of their
// error lines come from the environment contract (ckpt/env_contract.hpp), which the plugin exports by.
constexpr const char* kHookKeys[] = {
    "dir", "interval", "keep", "last_words", "mtbf", "grace", "min_interval", "max_interval", "max_restarts",
    "restart_count", "job_id", "generation", "resume_step", "resume_path", "end_time", "kill_wait", "exit_grace",
    "requeue", "heartbeat_timeout", "rank", "world_size", "local_rank", "rendezvous", "copy_threads",
    "commit_timeout", "agree_lead", "signals", "run_id", "log", "layout", "coord", "straggler", "controller_url",
    "munge_socket", "inplace_id", "inplace_watch", "memory", "memory_interval", "memory_distance", "node_dir"};

const std::vector<KeySpec>& key_specs() {
  static const std::vector<KeySpec> specs = [] {
    std::vector<KeySpec> out;
    for (const char* key : kHookKeys) {
      const env::Var* v = env::by_key(key);  // every key is in the contract (test_hooks_config checks it)
      if (v == nullptr) continue;
      KeySpec spec{{v->key, v->name, v->expected}, {v->name}};
      spec.envs.insert(spec.envs.end(), v->fallbacks.begin(), v->fallbacks.end());
      out.push_back(std::move(spec));
    }
    return out;
  }();
  return specs;
}

const KeySpec* find_spec(std::string_view key) {
  for (const KeySpec& s : key_specs()) {
    if (key == s.key.key) return &s;
  }
  return nullptr;
}

// A value and where it came from ("dir" for an override, "CKPT_DIR" for the environment).
struct Source {
  std::string value;
  std::string origin;
};

class Lookup {
 public:
  Lookup(const Options& options, const std::function<const char*(const char*)>& getenv_fn)
      : options_(options), getenv_(getenv_fn) {}

  bool overridden(std::string_view key) const { return options_.values.find(key) != options_.values.end(); }

  // The override, else the first variable set; unset when neither (an empty variable counts as unset).
  std::optional<Source> get(std::string_view key) const {
    if (auto it = options_.values.find(key); it != options_.values.end()) {
      return Source{it->second, std::string(key)};
    }
    for (const char* env : find_spec(key)->envs) {
      const char* v = getenv_(env);
      if (v != nullptr && *v != '\0') return Source{v, env};
    }
    return std::nullopt;
  }

  std::optional<Source> env(const char* name) const {
    const char* v = getenv_(name);
    if (v == nullptr || *v == '\0') return std::nullopt;
    return Source{v, name};
  }

 private:
  const Options& options_;
  const std::function<const char*(const char*)>& getenv_;
};

Error bad(const Source& s, std::string_view key, std::string_view detail = {}) {
  std::string line = "ckpt: " + s.origin + "='" + s.value + "': expected " + find_spec(key)->key.expected;
  if (!detail.empty()) line += " (" + std::string(detail) + ")";
  return Error{line};
}

// bad() as a Status, for the steps that return one.
Status rejected(const Source& s, std::string_view key, std::string_view detail = {}) {
  return Status::failure(bad(s, key, detail).message);
}

// Parses key into out when set; fails with an error line when the value is bad.
template <class T, class Parse>
Status read(const Lookup& lookup, std::string_view key, T& out, Parse parse) {
  auto s = lookup.get(key);
  if (!s) return Status::success();
  auto parsed = parse(s->value);
  if (!parsed) return rejected(*s, key, parsed.error());
  out = *parsed;
  return Status::success();
}

// "<address>:<port>,...": a numeric address (no ':' in it) and a port from 1 to 65535 each, at most 4096.
Result<std::vector<std::pair<std::string, std::string>>> parse_watch(std::string_view text) {
  std::vector<std::pair<std::string, std::string>> out;
  while (!text.empty()) {
    const std::string_view item = text.substr(0, text.find(','));
    text.remove_prefix(std::min(text.size(), item.size() + 1));
    const std::size_t colon = item.find(':');
    if (colon == 0 || colon == std::string_view::npos) return Error{"no address"};
    auto port = parse_uint(item.substr(colon + 1));
    if (!port || *port < 1 || *port > 65535) return Error{"bad port"};
    if (out.size() == 4096) return Error{"too many"};
    out.emplace_back(std::string(item.substr(0, colon)), std::to_string(*port));
  }
  return out;
}

Result<int> parse_int_below(std::string_view text, std::uint64_t limit) {
  auto n = parse_uint(text);
  if (!n) return Error{n.error()};
  if (*n >= limit) return Error{"too large"};
  return static_cast<int>(*n);
}

Result<RendezvousKind> parse_rendezvous(std::string_view text) {
  if (text == "auto") return RendezvousKind::Auto;
  if (text == "files") return RendezvousKind::Files;
  if (text == "pmix") return RendezvousKind::Pmix;
  return Error{"unknown rendezvous"};
}

// The shared vocabulary (ckpt/log_level.hpp) onto the public enum.
Result<LogLevel> parse_hooks_log_level(std::string_view text) {
  auto level = ckpt::parse_log_level(text);
  if (!level) return Error{"unknown level"};
  switch (*level) {
    case ckpt::LogLevel::Error: return LogLevel::Error;
    case ckpt::LogLevel::Warning: return LogLevel::Warn;
    case ckpt::LogLevel::Info: return LogLevel::Info;
    case ckpt::LogLevel::Debug: return LogLevel::Debug;
  }
  return Error{"unknown level"};
}

// Milliseconds of silence that declare a peer dead: long enough for a busy host's scheduling, short enough to
// detect a frozen node in a second or two.
Result<std::uint64_t> parse_heartbeat_timeout(std::string_view text) {
  auto s = recovery::parse_duration_ms(text);
  if (!s) return Error{s.error()};
  if (*s < 0.2 || *s > 60) return Error{"outside 200ms..60s"};
  return static_cast<std::uint64_t>(*s * 1000 + 0.5);
}

bool is_run_id_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
         c == '-';
}

Result<std::string> parse_run_id(std::string_view text) {
  if (text.size() > 128) return Error{"longer than 128 characters"};
  if (!std::all_of(text.begin(), text.end(), is_run_id_char) || text.front() == '.') return Error{"bad character"};
  return std::string(text);
}

// A run id every rank of one launch derives alike, without talking: the job, its step and restart, the
// launcher's rendezvous. Runs that differ in all of these must not share control files.
std::string derive_run_id(const Lookup& lookup, const Config& config) {
  std::string id = config.job_id.empty() ? "local" : config.job_id;
  if (auto s = lookup.env("SLURM_STEP_ID")) id += ".s" + s->value;
  id += ".r" + std::to_string(config.restart_count);
  if (auto s = lookup.env("TORCHELASTIC_RUN_ID")) id += "." + s->value;
  if (auto s = lookup.env("MASTER_PORT")) id += ".p" + s->value;
  if (auto s = lookup.env("CKPT_RUN_ATTEMPT")) id += ".a" + s->value;  // ckpt-run's relaunch inside the allocation
  std::string clean;
  for (char c : id) clean += is_run_id_char(c) ? c : '_';
  return clean.substr(0, 128);
}

Status resolve_ranks(const Lookup& lookup, Config& config) {
  std::uint64_t max_rank = 1u << 24;  // far above any job, far below int overflow
  auto take = [&](std::string_view key, const Source& s, int& out, bool positive) -> Status {
    auto n = parse_int_below(s.value, max_rank + 1);
    if (!n || (positive && *n < 1)) return rejected(s, key, n ? "must be at least 1" : n.error());
    out = *n;
    return Status::success();
  };
  std::optional<Source> rank, world, local;
  if (lookup.overridden("rank") || lookup.overridden("world_size")) {
    config.rank_source = "override";
    rank = lookup.get("rank");
    world = lookup.get("world_size");
    local = lookup.get("local_rank");
  } else if (lookup.env("RANK") || lookup.env("WORLD_SIZE")) {
    config.rank_source = "torchrun";
    rank = lookup.env("RANK");
    world = lookup.env("WORLD_SIZE");
    local = lookup.env("LOCAL_RANK");
    if (!rank || !world) return Status::failure("ckpt: RANK and WORLD_SIZE must be set together");
  } else if (lookup.env("SLURM_PROCID") && lookup.env("SLURM_NTASKS")) {
    config.rank_source = "slurm";
    rank = lookup.env("SLURM_PROCID");
    world = lookup.env("SLURM_NTASKS");
    local = lookup.env("SLURM_LOCALID");
  }
  if (rank) {
    if (Status e = take("rank", *rank, config.rank, false); !e) return e;
  }
  if (world) {
    if (Status e = take("world_size", *world, config.world_size, true); !e) return e;
  }
  if (local) {
    if (Status e = take("local_rank", *local, config.local_rank, false); !e) return e;
  }
  if (config.rank >= config.world_size) {
    return Status::failure("ckpt: rank " + std::to_string(config.rank) + " is not below world size " +
                           std::to_string(config.world_size) + " (from " + config.rank_source + ")");
  }
  return Status::success();
}

// "dp=2,tp=2,pp=1,zero1=off" into name -> value; every name must be one of `allowed`, given once.
Result<std::map<std::string, std::string>> parse_pairs(std::string_view text, const std::vector<std::string>& allowed) {
  std::map<std::string, std::string> out;
  if (text.empty()) return Error{"empty"};
  for (const std::string& item : split(text, ',')) {
    std::size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0) return Error{"'" + item + "' is not name=value"};
    std::string name = item.substr(0, eq);
    if (std::find(allowed.begin(), allowed.end(), name) == allowed.end()) return Error{"unknown name '" + name + "'"};
    if (!out.emplace(name, item.substr(eq + 1)).second) return Error{"'" + name + "' given twice"};
  }
  return out;
}

Result<int> parse_size_or_index(const std::map<std::string, std::string>& pairs, const std::string& name, int fallback,
                                bool positive) {
  auto it = pairs.find(name);
  if (it == pairs.end()) return fallback;
  auto n = parse_int_below(it->second, 1u << 24);
  if (!n) return Error{name + ": " + n.error()};
  if (positive && *n < 1) return Error{name + ": must be at least 1"};
  return *n;
}

Result<store::Layout> parse_layout(std::string_view text) {
  auto pairs = parse_pairs(text, {"dp", "tp", "pp", "zero1"});
  if (!pairs) return Error{pairs.error()};
  store::Layout l;
  for (auto [name, out] : {std::pair{"dp", &l.dp}, std::pair{"tp", &l.tp}, std::pair{"pp", &l.pp}}) {
    auto n = parse_size_or_index(*pairs, name, 1, true);
    if (!n) return Error{n.error()};
    *out = *n;
  }
  if (auto it = pairs->find("zero1"); it != pairs->end()) {
    auto z = parse_on_off(it->second);
    if (!z) return Error{"zero1: " + z.error()};
    l.zero1 = *z;
  }
  if (static_cast<std::uint64_t>(l.dp) * static_cast<std::uint64_t>(l.tp) * static_cast<std::uint64_t>(l.pp) >
      (1u << 24)) {
    return Error{"too large"};
  }
  return l;
}

Result<store::RankCoord> parse_coord(std::string_view text) {
  auto pairs = parse_pairs(text, {"dp", "tp", "pp"});
  if (!pairs) return Error{pairs.error()};
  store::RankCoord c;
  for (auto [name, out] : {std::pair{"dp", &c.dp}, std::pair{"tp", &c.tp}, std::pair{"pp", &c.pp}}) {
    auto n = parse_size_or_index(*pairs, name, 0, false);
    if (!n) return Error{n.error()};
    *out = *n;
  }
  return c;
}

// The layout and this rank's place in it. Without a layout: pure data parallelism (dp = world_size), declared
// false. Without a coordinate: tp varies fastest, then dp, then pp (rank = (pp * dp + d) * tp + t).
Status resolve_layout(const Lookup& lookup, Config& c) {
  if (auto s = lookup.get("layout")) {
    auto l = parse_layout(s->value);
    if (!l) return rejected(*s, "layout", l.error());
    if (l->world_size() != c.world_size) {
      return rejected(*s, "layout", "dp*tp*pp is " + std::to_string(l->world_size()) + ", world_size is " +
                                        std::to_string(c.world_size));
    }
    c.layout = *l;
    c.layout_declared = true;
  } else {
    c.layout = store::Layout{c.world_size, 1, 1, false};
  }
  const store::Layout& l = c.layout;
  c.coord = l.coord_of(c.rank);
  if (auto s = lookup.get("coord")) {
    if (!c.layout_declared) return rejected(*s, "coord", "needs a layout");
    auto coord = parse_coord(s->value);
    if (!coord) return rejected(*s, "coord", coord.error());
    if (coord->dp >= l.dp || coord->tp >= l.tp || coord->pp >= l.pp) return rejected(*s, "coord", "outside the layout");
    c.coord = {c.rank, coord->dp, coord->tp, coord->pp};
  }
  return Status::success();
}

}  // namespace

const std::vector<OptionKey>& option_keys() {
  static const std::vector<OptionKey> keys = [] {
    std::vector<OptionKey> out;
    for (const KeySpec& s : key_specs()) out.push_back(s.key);
    return out;
  }();
  return keys;
}

Status Options::set(std::string_view key, std::string_view value) {
  if (find_spec(key) == nullptr) {
    std::string known;
    for (const KeySpec& s : key_specs()) known += (known.empty() ? "" : ", ") + std::string(s.key.key);
    return Status::failure("ckpt: unknown setting '" + std::string(key) + "' (known: " + known + ")");
  }
  values.insert_or_assign(std::string(key), std::string(value));
  return Status::success();
}

// The interval and the times around it: when to checkpoint, how long last words and a stop may take.
Status read_timing(Lookup& lookup, Config& c) {
  c.interval = Interval{Interval::Kind::Auto, 0};
  if (Status e = read(lookup, "interval", c.interval, parse_interval); !e) return e;
  if (Status e = read(lookup, "keep", c.keep, parse_positive_uint); !e) return e;
  if (Status e = read(lookup, "last_words", c.last_words, parse_on_off); !e) return e;
  if (Status e = read(lookup, "mtbf", c.mtbf_s, parse_positive_duration); !e) return e;
  if (Status e = read(lookup, "grace", c.grace_s, parse_duration); !e) return e;
  if (Status e = read(lookup, "kill_wait", c.kill_wait_s, parse_positive_duration); !e) return e;
  if (Status e = read(lookup, "exit_grace", c.exit_grace_s, parse_duration); !e) return e;
  if (Status e = read(lookup, "heartbeat_timeout", c.heartbeat_timeout_ms, parse_heartbeat_timeout); !e) {
    return e;
  }
  if (Status e = read(lookup, "min_interval", c.min_interval_s, parse_positive_duration); !e) return e;
  if (Status e = read(lookup, "max_interval", c.max_interval_s, parse_duration); !e) return e;
  if (c.max_interval_s != 0 && c.max_interval_s < c.min_interval_s) {
    return Status::failure("ckpt: CKPT_MAX_INTERVAL=" + std::to_string(c.max_interval_s) +
                           "s is below CKPT_MIN_INTERVAL=" + std::to_string(c.min_interval_s) + "s");
  }
  return Status::success();
}

// What a restart is: who requeues, the budget, this run's place in the chain, the checkpoint it was handed.
Status read_restarts(Lookup& lookup, Config& c) {
  if (auto s = lookup.get("requeue")) {
    if (s->value != "controller" && s->value != "self" && s->value != "off") {
      return rejected(*s, "requeue", "not controller, self or off");
    }
    c.requeue = s->value;
  }
  if (Status e = read(lookup, "max_restarts", c.max_restarts, parse_uint); !e) return e;
  if (Status e = read(lookup, "restart_count", c.restart_count, parse_uint); !e) return e;
  if (Status e = read(lookup, "generation", c.generation, parse_uint); !e) return e;
  if (auto s = lookup.get("job_id")) c.job_id = s->value;
  std::uint64_t resume_step = 0;
  if (Status e = read(lookup, "resume_step", resume_step, parse_uint); !e) return e;
  if (lookup.get("resume_step")) c.resume_step = resume_step;
  if (auto s = lookup.get("resume_path")) {
    auto path = normalize_absolute_path(s->value);
    if (!path) return rejected(*s, "resume_path", path.error());
    c.resume_path = *path;
  }
  std::uint64_t end_time = 0;
  auto parse_end_time = [](std::string_view t) { return parse_uint(t); };
  if (Status e = read(lookup, "end_time", end_time, parse_end_time); !e) return e;
  if (lookup.get("end_time")) {
    if (end_time > (std::uint64_t{1} << 40)) return rejected(*lookup.get("end_time"), "end_time", "too large");
    c.end_time = static_cast<std::int64_t>(end_time);
  }
  return Status::success();
}

// How the ranks work together, once the ranks are known: coordination, copying, logging, layout, run identity.
Status read_runtime(Lookup& lookup, Config& c) {
  if (Status e = read(lookup, "rendezvous", c.rendezvous, parse_rendezvous); !e) return e;
  std::uint64_t threads = c.copy_threads;
  if (Status e = read(lookup, "copy_threads", threads, parse_uint); !e) return e;
  if (threads > 64) return rejected(*lookup.get("copy_threads"), "copy_threads", "too large");
  c.copy_threads = static_cast<unsigned>(threads);
  if (Status e = read(lookup, "commit_timeout", c.commit_timeout_s, parse_positive_duration); !e) {
    return e;
  }
  if (Status e = read(lookup, "agree_lead", c.agree_lead, parse_positive_uint); !e) return e;
  if (c.agree_lead > 1000) return rejected(*lookup.get("agree_lead"), "agree_lead", "too large");
  if (Status e = read(lookup, "signals", c.signals, parse_on_off); !e) return e;
  if (Status e = read(lookup, "log", c.log_level, parse_hooks_log_level); !e) return e;
  if (Status e = read(lookup, "run_id", c.run_id, parse_run_id); !e) return e;
  if (c.run_id.empty()) c.run_id = derive_run_id(lookup, c);
  if (Status e = resolve_layout(lookup, c); !e) return e;
  if (Status e = read(lookup, "straggler", c.straggler, [](std::string_view t) { return straggler::parse_policy(t); });
      !e) {
    return e;
  }
  if (auto s = lookup.get("controller_url")) c.controller_url = s->value;
  if (auto s = lookup.get("munge_socket")) c.munge_socket = s->value;
  if (Status e = read(lookup, "inplace_id", c.inplace_id, parse_run_id); !e) return e;
  if (Status e = read(lookup, "inplace_watch", c.inplace_watch, parse_watch); !e) return e;
  return Status::success();
}

// The memory tier: its bound per rank, how often it checkpoints, where the partner's copy goes.
Status read_memory_tier(Lookup& lookup, Config& c) {
  if (Status e = read(lookup, "memory", c.memory_bytes, parse_memory); !e) return e;
  if (Status e = read(lookup, "memory_interval", c.memory_interval, parse_memory_interval); !e) return e;
  auto parse_distance = [](std::string_view t) -> Result<int> {
    auto n = parse_int_below(t, (1u << 24) + 1);  // as a rank count: far below int overflow
    if (n && *n < 1) return Error{"must be at least 1"};
    return n;
  };
  if (Status e = read(lookup, "memory_distance", c.memory_distance, parse_distance); !e) return e;
  c.node_dir = BuiltinDefaults::node_dir;
  if (auto s = lookup.get("node_dir")) {
    if (s->value == "off") {
      c.node_dir.clear();
    } else {
      auto dir = normalize_absolute_path(s->value);
      if (!dir) return rejected(*s, "node_dir", dir.error());
      c.node_dir = *dir;
    }
  }
  return Status::success();
}

Result<Config> load_config(const Options& options, const std::function<const char*(const char*)>& getenv_fn) {
  const std::function<const char*(const char*)> system_getenv = [](const char* name) { return std::getenv(name); };
  Lookup lookup(options, getenv_fn ? getenv_fn : system_getenv);
  Config c;
  unsigned hw = std::thread::hardware_concurrency();
  c.copy_threads = std::clamp(hw, 1u, 4u);  // memory bandwidth saturates at a few threads

  if (auto s = lookup.get("dir")) {
    auto dir = normalize_absolute_path(s->value);
    if (!dir) return bad(*s, "dir", dir.error());
    c.dir = *dir;
  }
  if (Status e = read_timing(lookup, c); !e) return Error{e.error()};
  if (Status e = read_restarts(lookup, c); !e) return Error{e.error()};
  if (Status e = resolve_ranks(lookup, c); !e) return Error{e.error()};
  if (Status e = read_runtime(lookup, c); !e) return Error{e.error()};
  if (Status e = read_memory_tier(lookup, c); !e) return Error{e.error()};
  return c;
}

}  // namespace ckpt::hooks
