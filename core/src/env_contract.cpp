// The environment contract (env_contract.hpp): one row per variable.
#include "ckpt/env_contract.hpp"

#include "ckpt/log_level.hpp"

namespace ckpt::env {

const std::vector<Var>& contract() {
  using S = SetBy;
  static const std::vector<Var> table = {
      // The job's settings (options.hpp's settings_environment).
      {"dir", "CKPT_DIR", "an absolute path", S::Plugin, {}},
      {"interval", "CKPT_INTERVAL", "auto, a duration like 15m, or <N>steps", S::Plugin, {}},
      {"keep", "CKPT_KEEP", "a whole number >= 1", S::Plugin, {}},
      {"last_words", "CKPT_LAST_WORDS", "on or off", S::Plugin, {}},
      {"mtbf", "CKPT_MTBF", "a positive duration like 24h", S::Plugin, {}},
      {"grace", "CKPT_GRACE", "a duration like 120s", S::Plugin, {}},
      {"min_interval", "CKPT_MIN_INTERVAL", "a positive duration like 1m", S::Plugin, {}},
      {"max_interval", "CKPT_MAX_INTERVAL", "a duration like 6h (0s: none)", S::Plugin, {}},
      {"max_restarts", "CKPT_MAX_RESTARTS", "a whole number", S::Plugin, {}},
      {"spares", "CKPT_SPARES", "a whole number", S::Plugin, {}},
      {"max_spares", "CKPT_MAX_SPARES", "a whole number", S::Plugin, {}},
      {"straggler", "CKPT_STRAGGLER", "off, or a threshold with an optional action like 0.7,report", S::Plugin, {}},
      {"shrink", "CKPT_SHRINK", "off, on, or the fewest data-parallel replicas to go on with", S::Plugin, {}},
      {"memory", "CKPT_MEMORY", "off, or a size like 4G, 512M or 1T (bytes without a unit)", S::Plugin, {}},
      {"memory_interval", "CKPT_MEMORY_INTERVAL", "a whole number of steps >= 1, or auto", S::Plugin, {}},
      {"node_dir", "CKPT_NODE_DIR", "off, or the absolute path of a node-local memory file system like /dev/shm",
       S::Plugin, {}},
      // The job's facts, as the plugin finds them at each step's start.
      {"restart_count", "CKPT_RESTART_COUNT", "a whole number", S::Plugin, {"SLURM_RESTART_COUNT"}},
      {"job_id", "CKPT_JOB_ID", "a job id", S::Plugin, {"SLURM_JOB_ID"}},
      {"resume_step", "CKPT_RESUME_STEP", "a whole number", S::Plugin, {}},
      {"resume_path", "CKPT_RESUME_PATH", "an absolute path to a step dir", S::Plugin, {}},
      {"end_time", "CKPT_END_TIME", "unix seconds", S::Plugin, {"SLURM_JOB_END_TIME"}},
      {"kill_wait", "CKPT_KILL_WAIT", "a positive duration like 30s", S::Plugin, {}},
      {"requeue", "CKPT_REQUEUE", "controller, self or off", S::Plugin, {}},
      {"trusted_dirs", "CKPT_TRUSTED_DIRS", "the site's allowed dirs, ':'-separated", S::Plugin, {}},
      {"controller_url", "CKPT_CONTROLLER_URL", "http://host:port", S::Plugin, {}},
      {"munge_socket", "CKPT_MUNGE_SOCKET", "the path of munged's socket", S::Plugin, {}},
      // The launchers: ckpt-run for each step it starts, slurm_ckpt.torch.run for each generation.
      {"rank", "RANK", "a whole number below world_size", S::Launcher, {"SLURM_PROCID"}},
      {"world_size", "WORLD_SIZE", "a whole number >= 1", S::Launcher, {"SLURM_NTASKS"}},
      {"local_rank", "LOCAL_RANK", "a whole number", S::Launcher, {"SLURM_LOCALID"}},
      {"run_id", "CKPT_RUN_ID", "letters, digits, '.', '_' or '-'", S::Launcher, {}},
      {"generation", "CKPT_INPLACE_GENERATION", "a whole number", S::Launcher, {}},
      {"exit_grace", "CKPT_EXIT_GRACE", "a duration like 3s (0s: never end the program)", S::Launcher, {}},
      {"relaunched", "CKPT_RUN", "1 (ckpt-run relaunches this step)", S::Launcher, {}},
      {"run_attempt", "CKPT_RUN_ATTEMPT", "a whole number", S::Launcher, {}},
      {"run_spares", "CKPT_RUN_SPARES", "a whole number (the spare nodes ckpt-run keeps)", S::Launcher, {}},
      {"inplace_id", "CKPT_INPLACE_ID", "letters, digits, '.', '_' or '-'", S::Launcher, {}},
      {"inplace_world", "CKPT_INPLACE_WORLD", "a whole number >= 1", S::Launcher, {}},
      {"inplace_spare", "CKPT_INPLACE_SPARE", "1 for a spare's step", S::Launcher, {}},
      {"inplace_rank_base", "CKPT_INPLACE_RANK_BASE", "a whole number", S::Launcher, {}},
      {"inplace_notify", "CKPT_INPLACE_NOTIFY", "<address>:<port> of ckpt-run's listener", S::Launcher, {}},
      {"inplace_watch", "CKPT_INPLACE_WATCH",
       "<address>:<port>,... (the mailboxes of the generation's replacements)", S::Launcher, {}},
      {"inplace_generation_base", "CKPT_INPLACE_GENERATION_BASE",
       "a whole number (the first generation's number after ckpt-run relaunched the node steps)", S::Launcher, {}},
      // What the user or the program sets.
      {"heartbeat_timeout", "CKPT_HEARTBEAT_TIMEOUT", "a duration from 200ms to 60s like 1500ms", S::Job, {}},
      {"rendezvous", "CKPT_RENDEZVOUS", "auto, files or pmix", S::Job, {}},
      {"copy_threads", "CKPT_COPY_THREADS", "a whole number from 0 to 64", S::Job, {}},
      {"commit_timeout", "CKPT_COMMIT_TIMEOUT", "a positive duration like 10m", S::Job, {}},
      {"agree_lead", "CKPT_AGREE_LEAD", "a whole number from 1 to 1000", S::Job, {}},
      {"signals", "CKPT_SIGNALS", "on or off", S::Job, {}},
      {"log", "CKPT_LOG", kLogLevelsAccepted, S::Job, {}},
      {"layout", "CKPT_LAYOUT", "dp=<n>,tp=<n>,pp=<n>[,zero1=on|off] with dp*tp*pp = world_size", S::Job, {}},
      {"coord", "CKPT_COORD", "dp=<i>,tp=<i>,pp=<i> inside the layout", S::Job, {}},
      {"require_checkpoint", "CKPT_REQUIRE_CHECKPOINT", "on or off (a job that must resume)", S::Job, {}},
      {"addr", "CKPT_ADDR", "an IPv4 address of this host", S::Job, {}},
      {"ifname", "CKPT_IFNAME", "a network interface's name", S::Job, {}},
      {"inplace_plan_timeout", "CKPT_INPLACE_PLAN_TIMEOUT", "seconds", S::Job, {}},
      {"inplace_join_timeout", "CKPT_INPLACE_JOIN_TIMEOUT", "seconds", S::Job, {}},
      {"memory_distance", "CKPT_MEMORY_DISTANCE", "a whole number of nodes >= 1", S::Job, {}},
      {"inplace_state", "CKPT_INPLACE_STATE", "memory or files (where a restart in place takes the state from)", S::Job,
       {}},
  };
  return table;
}

const Var* by_key(std::string_view key) {
  for (const Var& v : contract()) {
    if (key == v.key) return &v;
  }
  return nullptr;
}

const Var* by_name(std::string_view name) {
  for (const Var& v : contract()) {
    if (name == v.name) return &v;
  }
  return nullptr;
}

std::string name_of(std::string_view key) {
  const Var* v = by_key(key);
  return v ? v->name : "";
}

}  // namespace ckpt::env
