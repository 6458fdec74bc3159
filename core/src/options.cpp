#include "ckpt/options.hpp"

#include <algorithm>

#include "ckpt/env_contract.hpp"
#include "ckpt/format.hpp"
#include "ckpt/parse.hpp"
#include "ckpt/site_keys.hpp"
#include "ckpt/inplace.hpp"
#include "ckpt/straggler.hpp"

namespace ckpt {

namespace {

constexpr std::string_view kStepsSuffix = "steps";

// "<what>: 5 is above the site maximum of 4 (<where>)" when `spares` exceeds `limit`; empty when it does not.
std::string spares_over_limit(const std::string& what, std::uint64_t spares, std::uint64_t limit,
                              const std::string& where = "") {
  if (spares <= limit) return {};
  std::string note = where;
  if (limit == 0) note += (note.empty() ? "" : ": ") + std::string("the site allows no spares");
  return what + ": " + std::to_string(spares) + " is above the site maximum of " + std::to_string(limit) +
         (note.empty() ? "" : " (" + note + ")");
}

std::string invalid_value(const OptionSpec& spec, std::string_view value) {
  return "--" + std::string(spec.name) + ": invalid value '" + std::string(value) + "' (expected " + spec.expected +
         ")";
}

// Parses one value into `slot`; a second value must equal the first.
template <class T, class Parse>
Status set_once(std::optional<T>& slot, const OptionSpec& spec, std::string_view value, Parse parse) {
  auto parsed = parse(value);
  if (!parsed) return Status::failure(invalid_value(spec, value));
  if (slot && !(*slot == *parsed)) {
    return Status::failure("--" + std::string(spec.name) + ": given twice with different values (second: '" +
                           std::string(value) + "')");
  }
  slot = *parsed;
  return Status::success();
}

Result<std::string> parse_dir_template(std::string_view text) {
  if (text.empty() || text.front() != '/') return Error{"not an absolute path"};
  return std::string(text);
}

}  // namespace

Result<Interval> parse_interval(std::string_view text) {
  if (text == "auto") return Interval{Interval::Kind::Auto, 0};
  if (text.size() > kStepsSuffix.size() && text.ends_with(kStepsSuffix)) {
    auto steps = parse_positive_uint(text.substr(0, text.size() - kStepsSuffix.size()));
    if (!steps) return Error{steps.error()};
    return Interval{Interval::Kind::Steps, *steps};
  }
  auto seconds = parse_positive_duration(text);
  if (!seconds) return Error{seconds.error()};
  return Interval{Interval::Kind::Seconds, *seconds};
}

Result<std::uint64_t> parse_memory(std::string_view text) {
  if (text == "off") return std::uint64_t{0};
  return parse_bytes(text);
}

Result<std::uint64_t> parse_memory_interval(std::string_view text) {
  if (text == "auto") return kMemoryIntervalAuto;
  return parse_positive_uint(text);
}

std::string format_memory_interval(std::uint64_t steps) {
  return steps == kMemoryIntervalAuto ? "auto" : std::to_string(steps);
}

std::string format_memory(std::uint64_t bytes) {
  if (bytes == 0) return "off";
  struct Unit {
    const char* name;
    std::uint64_t bytes;
  };
  // Powers of 1024 first (Slurm's spelling), then of 1000, each largest first; the first that divides is exact.
  static constexpr std::array<Unit, 8> kUnits{{{"T", 1ull << 40}, {"G", 1ull << 30}, {"M", 1ull << 20},
      {"K", 1ull << 10}, {"TB", 1000'000'000'000}, {"GB", 1000'000'000}, {"MB", 1000'000}, {"KB", 1000}}};
  for (const Unit& u : kUnits) {
    if (bytes % u.bytes == 0) return std::to_string(bytes / u.bytes) + u.name;
  }
  return std::to_string(bytes);
}

std::string format_interval(const Interval& interval) {
  switch (interval.kind) {
    case Interval::Kind::Auto: return "auto";
    case Interval::Kind::Seconds: return std::to_string(interval.value) + "s";
    case Interval::Kind::Steps: return std::to_string(interval.value) + "steps";
  }
  return "auto";
}

const std::array<OptionSpec, kOptionCount>& option_specs() {
  static const std::array<OptionSpec, kOptionCount> specs{{
      {OptionId::Interval, "ckpt-interval", "interval", "auto|DURATION|Nsteps",
       "Checkpoint interval: auto (from measured cost and MTBF), a duration like 15m, or N steps",
       "auto, a duration like 15m, or N steps"},
      {OptionId::Dir, "ckpt-dir", "dir", "PATH",
       "Checkpoint directory; %u user, %j job id, %x job name, %a array task id", "an absolute path"},
      {OptionId::Keep, "ckpt-keep", "keep", "N", "Number of complete checkpoints to keep",
       "a whole number of checkpoints, at least 1"},
      {OptionId::LastWords, "ckpt-last-words", "last_words", "on|off",
       "Let survivors write a terminal checkpoint when a peer dies", "on or off"},
      {OptionId::Mtbf, "ckpt-mtbf", "mtbf", "DURATION", "Mean time between failures of this job, for --ckpt-interval=auto",
       "a duration like 24h"},
      {OptionId::MaxRestarts, "ckpt-max-restarts", "max_restarts", "N",
       "Restarts allowed without checkpoint progress before giving up", "a whole number"},
      {OptionId::Grace, "ckpt-grace", "grace", "DURATION",
       "Take the terminal checkpoint this long before the time limit", "a duration like 5m"},
      {OptionId::Spares, "ckpt-spares", "spares", "N",
       "Spare nodes of the allocation that ckpt-run keeps warm to take a dead node's ranks over (restart in "
       "place); at most the site's max_spares",
       "a whole number of spare nodes"},
      {OptionId::Straggler, "ckpt-straggler", "straggler", "off|THRESHOLD[,report|exclude|swap]",
       "Report a node whose ranks run below THRESHOLD of the job's fastest for 3 windows of 4 steps; exclude: "
       "also leave it out of the job's next runs; swap: under ckpt-run, hand its ranks to a warm spare in place",
       "off, or a fraction between 0 and 1 with an optional action: 0.7, 0.7,report, 0.6,exclude or 0.6,swap"},
      {OptionId::Shrink, "ckpt-shrink", "shrink", "off|on|N",
       "Under ckpt-run, when a node is lost and no spare is left, go on in place with fewer data-parallel "
       "replicas (pure data parallelism only), down to N (on: 1); changes the global batch, see docs/inplace.md",
       "off, on, or the fewest data-parallel replicas to go on with"},
      {OptionId::Memory, "ckpt-memory", "memory", "SIZE|off",
       "Host memory per rank the memory tier may use (staging with its last two snapshots, and two copies of the "
       "shard of each rank whose copies it keeps), e.g. 4G; off or 0: no memory tier; at most the site's max_memory; "
       "where it does not fit one rank, the tier is off for the whole job",
       "off, or a size like 4G, 512M or 1T (K, M, G, T: powers of 1024; bytes without a unit)"},
      {OptionId::MemoryInterval, "ckpt-memory-interval", "memory_interval", "N|auto",
       "Steps between memory-tier checkpoints; auto: Young's interval for a memory checkpoint's measured cost and "
       "the job's MTBF, but never more often than the copies keep up (rank 0 measures, and every rank takes the "
       "steps it names)",
       "a whole number of steps, at least 1, or auto"},
  }};
  return specs;
}

const std::array<SiteKeySpec, 9>& site_key_specs() {
  static const std::array<SiteKeySpec, 9> specs{{
      {"min_interval", "DURATION",
       "Shortest checkpoint interval a job may ask for, and the floor of auto; 0s: no floor", "5m"},
      {"max_interval", "DURATION", "Longest checkpoint interval, and the ceiling of auto; 0s: none", "6h"},
      {"allowed_dirs", "DIR[:DIR...]",
       "Checkpoint dirs must lie below one of these absolute paths (default: anywhere the user may write)",
       "/scratch:/lustre/ckpt"},
      {"enabled_by_default", "yes|no",
       "Give checkpointing to jobs that ask for none (no: a job that asks for nothing pays nothing)", "no"},
      {"node_mtbf", "DURATION",
       "Mean time between failures of one node; a job's MTBF for auto is this divided by its node count",
       "50000h"},
      {"controller", "URL|DIR",
       "Where job events go: the recovery controller's http(s) URL, or a spool dir it reads (default: none)",
       "http://127.0.0.1:6830"},
      {"max_spares", "N",
       "Most spare nodes a job may ask for with --ckpt-spares or ckpt-run --spares; 0: no spares (the "
       "allocation's size is Slurm's to bound)",
       "2"},
      {"max_memory", "SIZE|off",
       "Most host memory per rank a job's memory tier may use; a larger --ckpt-memory is capped to it; 0 or off: "
       "no memory tier (default: no maximum)",
       "64G"},
      {"node_dir", "DIR|off",
       "Where a job with the memory tier keeps its ranks' staging as files, so that a relaunch in the job restores "
       "from the node's memory: a node-local memory file system; the plugin's job epilog removes each job's dir "
       "there; off: staging in process memory only (default: /dev/shm)",
       "/dev/shm"},
  }};
  return specs;
}

const OptionSpec& option_spec(OptionId id) {
  for (const auto& spec : option_specs()) {
    if (spec.id == id) return spec;
  }
  return option_specs().front();  // unreachable: every id is in the table
}

bool JobOptions::any() const {
  return interval || dir || keep || last_words || mtbf_s || max_restarts || grace_s || spares || straggler || shrink ||
         memory_bytes || memory_interval;
}

Status set_job_option(JobOptions& options, OptionId id, std::string_view value) {
  const OptionSpec& spec = option_spec(id);
  switch (id) {
    case OptionId::Interval: return set_once(options.interval, spec, value, parse_interval);
    case OptionId::Dir: return set_once(options.dir, spec, value, parse_dir_template);
    case OptionId::Keep: return set_once(options.keep, spec, value, parse_positive_uint);
    case OptionId::LastWords: return set_once(options.last_words, spec, value, parse_on_off);
    case OptionId::Mtbf: return set_once(options.mtbf_s, spec, value, parse_positive_duration);
    case OptionId::MaxRestarts: return set_once(options.max_restarts, spec, value, parse_uint);
    case OptionId::Grace: return set_once(options.grace_s, spec, value, parse_duration);
    case OptionId::Spares: return set_once(options.spares, spec, value, parse_uint);
    case OptionId::Straggler:
      return set_once(options.straggler, spec, value, [](std::string_view text) -> Result<std::string> {
        auto policy = straggler::parse_policy(text);
        if (!policy) return Error{policy.error()};
        return straggler::format_policy(*policy);
      });
    case OptionId::Shrink:
      return set_once(options.shrink, spec, value, [](std::string_view text) -> Result<std::string> {
        auto shrink = inplace::parse_shrink(text);
        if (!shrink) return Error{shrink.error()};
        return inplace::format_shrink(*shrink);
      });
    case OptionId::Memory: return set_once(options.memory_bytes, spec, value, parse_memory);
    case OptionId::MemoryInterval: return set_once(options.memory_interval, spec, value, parse_memory_interval);
  }
  return Status::failure("unknown option");
}

void clear_job_option(JobOptions& options, OptionId id) {
  switch (id) {
    case OptionId::Interval: options.interval.reset(); break;
    case OptionId::Dir: options.dir.reset(); break;
    case OptionId::Keep: options.keep.reset(); break;
    case OptionId::LastWords: options.last_words.reset(); break;
    case OptionId::Mtbf: options.mtbf_s.reset(); break;
    case OptionId::MaxRestarts: options.max_restarts.reset(); break;
    case OptionId::Grace: options.grace_s.reset(); break;
    case OptionId::Spares: options.spares.reset(); break;
    case OptionId::Straggler: options.straggler.reset(); break;
    case OptionId::Shrink: options.shrink.reset(); break;
    case OptionId::Memory: options.memory_bytes.reset(); break;
    case OptionId::MemoryInterval: options.memory_interval.reset(); break;
  }
}

namespace {

Status invalid_site_value(const std::string& key, const std::string& value, const char* expected) {
  return Status::failure("plugstack.conf: " + key + ": invalid value '" + value + "' (expected " + expected + ")");
}

bool names_job_option(const std::string& key) {
  const auto& specs = option_specs();
  return std::any_of(specs.begin(), specs.end(), [&](const OptionSpec& spec) { return key == spec.key; });
}

bool names_site_key(const std::string& key) {
  const auto& specs = site_key_specs();
  return std::any_of(specs.begin(), specs.end(), [&](const SiteKeySpec& spec) { return key == spec.key; });
}

// Sets the site's default for the job option spelled `key`.
Status set_site_default(JobOptions& defaults, const std::string& key, const std::string& value) {
  for (const auto& spec : option_specs()) {
    if (key != spec.key) continue;
    JobOptions probe;  // parse alone first so a repeated key is reported as a plugstack error
    if (!set_job_option(probe, spec.id, value)) return invalid_site_value(key, value, spec.expected);
    if (!set_job_option(defaults, spec.id, value)) {
      return Status::failure("plugstack.conf: " + key + ": given twice with different values");
    }
  }
  return Status::success();
}

// Sets one of the keys of site_key_specs(), which only the site may set.
Status set_site_key(SitePolicy& policy, const std::string& key, const std::string& value) {
  if (key == "min_interval" || key == "max_interval" || key == "node_mtbf") {
    auto d = parse_duration(value);
    if (!d || (*d == 0 && key == "node_mtbf")) return invalid_site_value(key, value, "a duration like 5m");
    if (key == "min_interval") policy.min_interval_s = *d;
    if (key == "max_interval") policy.max_interval_s = *d;
    if (key == "node_mtbf") policy.node_mtbf_s = *d;
  } else if (key == "allowed_dirs") {
    policy.allowed_dirs.clear();
    for (const auto& prefix : split(value, ':')) {
      auto normalized = normalize_absolute_path(prefix);
      if (!normalized) return invalid_site_value(key, value, "absolute paths separated by ':'");
      policy.allowed_dirs.push_back(*normalized);
    }
  } else if (key == "enabled_by_default") {
    auto on = parse_on_off(value);
    if (!on) return invalid_site_value(key, value, "yes or no");
    policy.enabled_by_default = *on;
  } else if (key == "controller") {
    if (value.empty()) return invalid_site_value(key, value, "a spool directory or an http(s) URL");
    policy.controller = value;
  } else if (key == "max_spares") {
    auto n = parse_uint(value);
    if (!n) return invalid_site_value(key, value, "a whole number");
    policy.max_spares = *n;
  } else if (key == "max_memory") {
    auto n = parse_memory(value);
    if (!n) return invalid_site_value(key, value, option_spec(OptionId::Memory).expected);
    policy.max_memory = *n;
  } else if (key == "node_dir") {
    if (value == "off") {
      policy.node_dir.clear();
    } else {
      auto dir = normalize_absolute_path(value);
      if (!dir) return invalid_site_value(key, value, "an absolute path or off");
      policy.node_dir = *dir;
    }
  } else {
    // A bug, caught by tests.
    return Status::failure("plugstack.conf: " + key + ": in site_key_specs() but not parsed");
  }
  return Status::success();
}

// What no single key can break: the bounds against each other, and the default spares against their maximum.
Status check_site_policy(const SitePolicy& policy) {
  if (policy.max_interval_s != 0 && policy.max_interval_s < policy.min_interval_s) {
    return Status::failure("plugstack.conf: max_interval is below min_interval");
  }
  if (policy.defaults.spares && *policy.defaults.spares > policy.max_spares) {
    return Status::failure("plugstack.conf: spares=" + std::to_string(*policy.defaults.spares) +
                           " is above max_spares=" + std::to_string(policy.max_spares));
  }
  // Capping the site's own default would warn every job that gives no --ckpt-memory.
  if (policy.defaults.memory_bytes && policy.max_memory && *policy.defaults.memory_bytes > *policy.max_memory) {
    return Status::failure("plugstack.conf: memory=" + format_memory(*policy.defaults.memory_bytes) +
                           " is above max_memory=" +
                           (*policy.max_memory == 0 ? std::string("0") : format_memory(*policy.max_memory)));
  }
  return Status::success();
}

}  // namespace

Result<SitePolicy> parse_site_policy(const std::vector<std::string>& args) {
  SitePolicy policy;
  for (const std::string& arg : args) {
    auto eq = arg.find('=');
    if (eq == std::string::npos || eq == 0) {
      return Error{"plugstack.conf: malformed argument '" + arg + "' (expected key=value)"};
    }
    std::string key = arg.substr(0, eq);
    std::string value = arg.substr(eq + 1);
    if (names_job_option(key)) {
      if (auto st = set_site_default(policy.defaults, key, value); !st) return Error{st.error()};
      continue;
    }
    if (!names_site_key(key)) return Error{"plugstack.conf: unknown key '" + key + "'"};
    if (auto st = set_site_key(policy, key, value); !st) return Error{st.error()};
  }
  if (auto st = check_site_policy(policy); !st) return Error{st.error()};
  return policy;
}

bool checkpointing_enabled(const JobOptions& user, const SitePolicy& policy) {
  return user.any() || policy.enabled_by_default;
}

namespace {

// Why `value` cannot stand as one path component of a checkpoint dir; empty when it can.
std::string unsafe_component(const std::string& value, bool may_be_empty) {
  if (value.empty()) return may_be_empty ? "" : "which is empty (the dir would be shared with other jobs)";
  if (value == "." || value == "..") return "which is not a path component";
  if (value.find('/') != std::string::npos) return "which contains '/'";
  if (value.size() > 255) return "which is longer than a file name may be";
  for (unsigned char c : value) {
    if (c < 0x20 || c == 0x7f) return "which contains a control character";
  }
  return {};
}

}  // namespace

Result<std::string> expand_dir_template(std::string_view templ, const JobContext& job) {
  std::string out;
  for (std::size_t i = 0; i < templ.size(); ++i) {
    char c = templ[i];
    if (c != '%') {
      out += c;
      continue;
    }
    if (++i == templ.size()) return Error{"ends with a lone '%'"};
    const std::string* value = nullptr;
    switch (templ[i]) {
      case 'u': value = &job.user; break;
      case 'j': value = &job.job_id; break;
      case 'x': value = &job.job_name; break;
      case 'a': value = &job.array_task_id; break;
      case '%': out += '%'; continue;
      default: return Error{std::string("unknown escape '%") + templ[i] + "'"};
    }
    // An expansion must be exactly one path component, or a job name could climb out of the allowed dirs, and an
    // empty one would collapse the path into a dir that other jobs share.
    if (auto why = unsafe_component(*value, templ[i] == 'a'); !why.empty()) {
      return Error{std::string("%") + templ[i] + " expands to '" + printable(*value) + "', " + why};
    }
    out += value->empty() && templ[i] == 'a' ? std::string("0") : *value;
  }
  return out;
}

Result<std::string> normalize_absolute_path(std::string_view path) {
  if (path.empty() || path.front() != '/') return Error{"not an absolute path"};
  std::string out;
  for (const auto& part : split(path, '/')) {
    if (part.empty() || part == ".") continue;
    if (part == "..") return Error{"contains '..'"};
    out += '/';
    out += part;
  }
  return out.empty() ? std::string("/") : out;
}

bool path_within(std::string_view path, std::string_view prefix) {
  if (prefix == "/") return !path.empty() && path.front() == '/';
  if (!path.starts_with(prefix)) return false;
  return path.size() == prefix.size() || path[prefix.size()] == '/';
}

std::string join_trusted_prefixes(const std::vector<std::string>& prefixes) {
  std::string out;
  for (const auto& p : prefixes) out += (out.empty() ? "" : ":") + p;
  return out;
}

std::vector<std::string> trusted_prefixes_of(const std::string& dir, const SitePolicy& policy) {
  std::vector<std::string> out;
  for (const auto& prefix : policy.allowed_dirs) {
    if (path_within(dir, prefix)) out.push_back(prefix);
  }
  return out;
}

Result<Settings> resolve_settings(const JobOptions& user, const SitePolicy& policy, const JobContext& job) {
  const JobOptions& site = policy.defaults;
  Settings s;
  s.interval = user.interval.value_or(site.interval.value_or(Interval{Interval::Kind::Auto, 0}));
  s.keep = user.keep.value_or(site.keep.value_or(BuiltinDefaults::keep));
  s.last_words = user.last_words.value_or(site.last_words.value_or(BuiltinDefaults::last_words));
  s.max_restarts = user.max_restarts.value_or(site.max_restarts.value_or(BuiltinDefaults::max_restarts));
  s.grace_s = user.grace_s.value_or(site.grace_s.value_or(BuiltinDefaults::grace_s));
  s.spares = user.spares.value_or(site.spares.value_or(BuiltinDefaults::spares));
  s.straggler = user.straggler.value_or(site.straggler.value_or(BuiltinDefaults::straggler));
  s.shrink = user.shrink.value_or(site.shrink.value_or(BuiltinDefaults::shrink));
  s.memory_bytes = user.memory_bytes.value_or(site.memory_bytes.value_or(BuiltinDefaults::memory_bytes));
  s.memory_interval = user.memory_interval.value_or(site.memory_interval.value_or(BuiltinDefaults::memory_interval));
  s.max_spares = policy.max_spares;
  s.node_dir = policy.node_dir;
  s.min_interval_s = policy.min_interval_s;
  s.max_interval_s = policy.max_interval_s;
  if (user.mtbf_s) {
    s.mtbf_s = *user.mtbf_s;
  } else if (site.mtbf_s) {
    s.mtbf_s = *site.mtbf_s;
  } else if (policy.node_mtbf_s) {
    s.mtbf_s = std::max<std::uint64_t>(1, *policy.node_mtbf_s / std::max<std::uint32_t>(1, job.node_count));
  }

  if (s.interval.kind == Interval::Kind::Seconds) {
    const OptionSpec& spec = option_spec(OptionId::Interval);
    std::string given = "--" + std::string(spec.name) + ": " + format_duration(s.interval.value);
    if (s.interval.value < policy.min_interval_s) {
      return Error{given + " is below the site minimum of " + format_duration(policy.min_interval_s)};
    }
    if (policy.max_interval_s != 0 && s.interval.value > policy.max_interval_s) {
      return Error{given + " is above the site maximum of " + format_duration(policy.max_interval_s)};
    }
  }

  if (auto over = spares_over_limit("--" + std::string(option_spec(OptionId::Spares).name), s.spares,
                                    policy.max_spares);
      !over.empty()) {
    return Error{over};
  }

  // The memory tier is a bound on host memory, not a correctness matter: a larger request is capped, not refused.
  if (policy.max_memory && s.memory_bytes > *policy.max_memory) {
    const std::string given = "--" + std::string(option_spec(OptionId::Memory).name) + ": " +
                              format_memory(s.memory_bytes) + " is above the site maximum of ";
    s.memory_bytes = *policy.max_memory;
    s.notices.push_back(s.memory_bytes == 0
                            ? given + "0 (the site allows no memory tier): the memory tier is off"
                            : given + format_memory(s.memory_bytes) + ": the memory tier uses " +
                                  format_memory(s.memory_bytes));
  }

  const std::string* templ = user.dir ? &*user.dir : site.dir ? &*site.dir : nullptr;
  if (templ == nullptr) {
    return Error{"--ckpt-dir: no checkpoint directory (give --ckpt-dir or set dir= in plugstack.conf)"};
  }
  auto expanded = expand_dir_template(*templ, job);
  if (!expanded) return Error{"--ckpt-dir: invalid value '" + *templ + "': " + expanded.error()};
  auto normalized = normalize_absolute_path(*expanded);
  if (!normalized) return Error{"--ckpt-dir: invalid value '" + *templ + "': " + normalized.error()};
  if (!policy.allowed_dirs.empty()) {
    bool allowed = false;
    for (const auto& prefix : policy.allowed_dirs) allowed = allowed || path_within(*normalized, prefix);
    if (!allowed) {
      std::string list;
      for (const auto& prefix : policy.allowed_dirs) list += (list.empty() ? "" : ", ") + prefix;
      return Error{"--ckpt-dir: '" + *normalized + "' is outside the allowed checkpoint dirs (" + list + ")"};
    }
  }
  s.dir = *normalized;
  return s;
}

std::vector<std::pair<std::string, std::string>> settings_environment(const Settings& s) {
  const auto seconds = [](std::uint64_t v) { return std::to_string(v) + "s"; };
  return {
      {env::name_of("dir"), s.dir},
      {env::name_of("interval"), format_interval(s.interval)},
      {env::name_of("keep"), std::to_string(s.keep)},
      {env::name_of("last_words"), s.last_words ? "on" : "off"},
      {env::name_of("mtbf"), seconds(s.mtbf_s)},
      {env::name_of("grace"), seconds(s.grace_s)},
      {env::name_of("max_restarts"), std::to_string(s.max_restarts)},
      {env::name_of("min_interval"), seconds(s.min_interval_s)},
      {env::name_of("max_interval"), seconds(s.max_interval_s)},
      {env::name_of("spares"), std::to_string(s.spares)},
      {env::name_of("max_spares"), std::to_string(s.max_spares)},
      {env::name_of("straggler"), s.straggler},
      {env::name_of("shrink"), s.shrink},
      {env::name_of("memory"), format_memory(s.memory_bytes)},
      {env::name_of("memory_interval"), format_memory_interval(s.memory_interval)},
      {env::name_of("node_dir"), s.node_dir.empty() ? "off" : s.node_dir},
  };
}

Result<std::optional<std::uint64_t>> run_spares(std::optional<std::uint64_t> given,
                                               std::optional<std::string_view> env_spares,
                                               std::optional<std::string_view> env_max_spares) {
  // A variable that is set must be well-formed, used or not: a typo never passes silently.
  auto from_env = [](const char* name, std::optional<std::string_view> text) -> Result<std::optional<std::uint64_t>> {
    if (!text) return std::optional<std::uint64_t>{};
    auto n = parse_uint(*text);
    if (!n) {
      return Error{std::string(name) + ": invalid value '" + printable(std::string(*text)) +
                   "' (expected a whole number)"};
    }
    return std::optional<std::uint64_t>{*n};
  };
  auto env = from_env("CKPT_SPARES", env_spares);
  if (!env) return Error{env.error()};
  auto limit = from_env("CKPT_MAX_SPARES", env_max_spares);
  if (!limit) return Error{limit.error()};

  std::optional<std::uint64_t> spares = given;
  const char* source = "--spares";
  if (!spares && *env && **env > 0) {  // 0, the plugin's default, asks for no spares
    spares = *env;
    source = "CKPT_SPARES";
  }
  if (spares && *limit) {
    if (auto over = spares_over_limit(source, *spares, **limit, "CKPT_MAX_SPARES"); !over.empty()) return Error{over};
  }
  return spares;
}

}  // namespace ckpt
