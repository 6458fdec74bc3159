#pragma once
// The --ckpt-* option surface: one option table, the site policy from plugstack.conf, and the resolution of
// both into the settings every rank receives. Pure logic; the SPANK plugin is a thin shell around it.
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ckpt/result.hpp"

namespace ckpt {

struct Interval {
  enum class Kind { Auto, Seconds, Steps };
  Kind kind = Kind::Auto;
  std::uint64_t value = 0;  // seconds or steps; unused for Auto
  bool operator==(const Interval&) const = default;
};

// "auto", a duration ("15m", "1h30m") or "<N>steps" (N >= 1). Durations must be at least 1s.
Result<Interval> parse_interval(std::string_view text);
// The normalized spelling exported as CKPT_INTERVAL: "auto", "900s" or "500steps".
std::string format_interval(const Interval& interval);

enum class OptionId {
  Interval, Dir, Keep, LastWords, Mtbf, MaxRestarts, Grace, Spares, Straggler, Shrink, Memory, MemoryInterval
};
inline constexpr std::size_t kOptionCount = 12;

// The memory tier's bound per rank: "off" or a size as parse_bytes reads it ("4G", "512M", "1T", bare bytes; K, M,
// G, T and KiB..TiB are powers of 1024, KB..TB of 1000). 0 ("off", "0", "0G") is no memory tier.
Result<std::uint64_t> parse_memory(std::string_view text);
// The spelling exported as CKPT_MEMORY, which parse_memory reads back exactly: "off", "4G", "512M", "5GB", "1000".
std::string format_memory(std::uint64_t bytes);
// CKPT_MEMORY_INTERVAL / --ckpt-memory-interval: a whole number of steps >= 1, or "auto", which is 0 here
// (ckpt::memtier::auto_interval picks the steps from the tier's measured cost).
inline constexpr std::uint64_t kMemoryIntervalAuto = 0;
Result<std::uint64_t> parse_memory_interval(std::string_view text);
// The spelling exported as CKPT_MEMORY_INTERVAL: "auto" or the steps.
std::string format_memory_interval(std::uint64_t steps);

struct OptionSpec {
  OptionId id;
  const char* name;       // command-line name without dashes: "ckpt-interval"
  const char* key;        // plugstack.conf key for the site default: "interval"
  const char* arginfo;    // shown by --help
  const char* usage;      // shown by --help
  const char* expected;   // what a valid value looks like, for error messages
};

// The single option table; the plugin registers exactly these.
const std::array<OptionSpec, kOptionCount>& option_specs();
// SPANK's has_arg for every option of the table: 1, a value is required (srun then reads "--ckpt-dir /x" too).
inline constexpr int kOptionHasArg = 1;
const OptionSpec& option_spec(OptionId id);

// Option values as given by a user (or as site defaults); unset fields were not given.
struct JobOptions {
  std::optional<Interval> interval;
  std::optional<std::string> dir;  // template, may hold %u %j %x %a
  std::optional<std::uint64_t> keep;
  std::optional<bool> last_words;
  std::optional<std::uint64_t> mtbf_s;
  std::optional<std::uint64_t> max_restarts;
  std::optional<std::uint64_t> grace_s;
  std::optional<std::uint64_t> spares;
  std::optional<std::string> straggler;  // as format_policy spells it (ckpt/straggler.hpp)
  std::optional<std::string> shrink;     // as inplace::format_shrink spells it
  std::optional<std::uint64_t> memory_bytes;     // 0: no memory tier
  std::optional<std::uint64_t> memory_interval;  // steps, at least 1; kMemoryIntervalAuto: auto

  bool any() const;
};

// Parses and records one option value. Giving an option again with an equal value is fine; a different value
// is an error. The message names the option and the value: "--ckpt-keep: invalid value 'x' (expected ...)".
Status set_job_option(JobOptions& options, OptionId id, std::string_view value);

// Forgets one option's value, so that an explicit value can replace one inherited from sbatch.
void clear_job_option(JobOptions& options, OptionId id);

// Built-in defaults used when neither the user nor the site gives a value.
struct BuiltinDefaults {
  static constexpr std::uint64_t keep = 3;
  static constexpr bool last_words = true;
  static constexpr std::uint64_t mtbf_s = 24 * 3600;  // a cautious guess for a small job; sites set node_mtbf
  static constexpr std::uint64_t max_restarts = 3;
  static constexpr std::uint64_t grace_s = 120;       // time for one terminal checkpoint of a mid-size model
  static constexpr std::uint64_t spares = 0;          // spares are nodes that idle: a job asks for them
  // Stragglers are reported, never acted on unasked: leaving a node out is the user's or the site's choice.
  static constexpr const char* straggler = "0.70,report";
  // A job goes on with fewer replicas only when asked: it changes the training's arithmetic.
  static constexpr const char* shrink = "off";
  // The memory tier holds checkpoints in host memory (own staging and a partner's copy): only when asked.
  static constexpr std::uint64_t memory_bytes = 0;
  static constexpr std::uint64_t memory_interval = 1;  // steps between memory-tier checkpoints
  // Where the memory tier keeps staging as files for a relaunch (the site's node_dir=): a node-local memory file
  // system every Linux node has (ckpt/memtier.hpp names the job's dir in it).
  static constexpr const char* node_dir = "/dev/shm";
};

// Site policy, from the `key=value` arguments after the plugin path in plugstack.conf.
struct SitePolicy {
  JobOptions defaults;                      // interval=, dir=, keep=, last_words=, mtbf=, max_restarts=, grace=,
                                            // spares=, straggler=, shrink=, memory=, memory_interval=
  std::uint64_t min_interval_s = 60;        // sub-minute periodic checkpoints flood shared file systems
  std::uint64_t max_interval_s = 0;         // 0: no maximum
  std::vector<std::string> allowed_dirs;    // empty: any absolute path the user may write
  bool enabled_by_default = false;          // a job that asks for nothing pays nothing
  std::optional<std::uint64_t> node_mtbf_s; // per-node MTBF; M for a job is this / its node count
  std::string controller;                   // where job events go: a spool directory or an http(s) URL
  // Most spare nodes a job may ask for (0: none). Idle spares are allocated nodes that do no work, so the
  // default allows a few; the allocation's size itself is Slurm's to bound (QOS, partition limits).
  std::uint64_t max_spares = 4;
  // Most host memory per rank a job's memory tier may use (max_memory=); a larger --ckpt-memory is capped to it,
  // with one line for the user. nullopt: no maximum; 0: the site has no memory tier.
  std::optional<std::uint64_t> max_memory;
  // Where a job's node tier lives (node_dir=; memtier.hpp): the ranks make their dir there, the plugin's job epilog
  // removes it. Empty: off.
  std::string node_dir = BuiltinDefaults::node_dir;
};

// Whether a site's `controller=` is the controller's http(s) URL (else it is a spool directory).
inline bool controller_is_url(const std::string& controller) {
  return controller.rfind("http://", 0) == 0 || controller.rfind("https://", 0) == 0;
}

// The site's allowed dirs that contain `dir` (absolute, normalized): the prefixes below which every component of
// the checkpoint dir must belong to root or the job's user (ckpt/trusted_dir.hpp). Empty: check from "/".
std::vector<std::string> trusted_prefixes_of(const std::string& dir, const SitePolicy& policy);

// The prefixes as CKPT_TRUSTED_DIRS carries them (and the job-start report): ':'-separated, "" when none.
std::string join_trusted_prefixes(const std::vector<std::string>& prefixes);

// Parses plugstack.conf arguments. Fails closed: an unknown key or a bad value is an error naming it.
Result<SitePolicy> parse_site_policy(const std::vector<std::string>& args);


// What a job is, for expanding --ckpt-dir.
struct JobContext {
  std::string user;
  std::string job_id;
  std::string job_name;
  std::string array_task_id;  // empty when the job is not an array task
  std::uint32_t node_count = 1;
};

// The settings handed to every rank.
struct Settings {
  std::string dir;  // expanded, absolute, normalized
  Interval interval;
  std::uint64_t keep = BuiltinDefaults::keep;
  bool last_words = BuiltinDefaults::last_words;
  std::uint64_t mtbf_s = BuiltinDefaults::mtbf_s;
  std::uint64_t max_restarts = BuiltinDefaults::max_restarts;
  std::uint64_t grace_s = BuiltinDefaults::grace_s;
  std::uint64_t spares = BuiltinDefaults::spares;
  std::string straggler = BuiltinDefaults::straggler;
  std::string shrink = BuiltinDefaults::shrink;
  std::uint64_t max_spares = SitePolicy{}.max_spares;  // the site's bound, which ckpt-run --spares respects too
  // The site's bounds, which --ckpt-interval=auto must respect too (it picks its interval in the job).
  std::uint64_t min_interval_s = SitePolicy{}.min_interval_s;
  std::uint64_t max_interval_s = 0;  // 0: no maximum
  std::uint64_t memory_bytes = BuiltinDefaults::memory_bytes;  // within the site's max_memory; 0: off
  std::uint64_t memory_interval = BuiltinDefaults::memory_interval;
  std::string node_dir = BuiltinDefaults::node_dir;  // the site's node_dir=; empty: off
  // What the site's policy changed of the job's request, one line each without "ckpt: " ("--ckpt-memory: 8G is
  // above the site maximum of 4G: the memory tier uses 4G"): srun and sbatch show them to the user.
  std::vector<std::string> notices;
};

// True when this job gets checkpointing: it gave a --ckpt option, or the site enables it by default.
bool checkpointing_enabled(const JobOptions& user, const SitePolicy& policy);

// Merges user options over site defaults over built-ins, expands the dir and applies the policy
// (interval bounds, the spares limit, allowed dir prefixes). The error names the option and the value. A memory
// tier above max_memory is capped, not refused, with a line in `notices`.
Result<Settings> resolve_settings(const JobOptions& user, const SitePolicy& policy, const JobContext& job);

// The CKPT_* variables for the settings: CKPT_DIR, CKPT_INTERVAL, CKPT_KEEP, CKPT_LAST_WORDS, CKPT_MTBF,
// CKPT_GRACE, CKPT_MAX_RESTARTS, CKPT_MIN_INTERVAL, CKPT_MAX_INTERVAL (0s: none), CKPT_SPARES, CKPT_MAX_SPARES,
// CKPT_STRAGGLER, CKPT_SHRINK, CKPT_MEMORY (format_memory), CKPT_MEMORY_INTERVAL, CKPT_NODE_DIR (off when empty).
// Durations are exported in
// seconds ("900s").
std::vector<std::pair<std::string, std::string>> settings_environment(const Settings& settings);

// The spare nodes ckpt-run keeps warm: `given` (its --spares) when set, else CKPT_SPARES (`env_spares`) when
// above 0; nullopt when neither asks for spares (ckpt-run then relaunches steps instead). Fails with one line
// naming the source when the count is above CKPT_MAX_SPARES (`env_max_spares`, when set), or when a variable that
// is set is not a whole number.
Result<std::optional<std::uint64_t>> run_spares(std::optional<std::uint64_t> given,
                                               std::optional<std::string_view> env_spares,
                                               std::optional<std::string_view> env_max_spares);

// Expands %u %j %x %a and %% in a dir template. Values that would add a path separator are rejected.
Result<std::string> expand_dir_template(std::string_view templ, const JobContext& job);

// Lexically normalizes an absolute path ("//a/./b/" -> "/a/b"). Fails on relative paths and on "..".
Result<std::string> normalize_absolute_path(std::string_view path);

// True when `path` equals `prefix` or lies below it, comparing whole components. Both must be normalized.
bool path_within(std::string_view path, std::string_view prefix);

}  // namespace ckpt
