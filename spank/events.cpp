// Job events from slurmstepd to the recovery controller. Runs as root (task_exit, exit) or as the job's user
// (user_init); either way the MUNGE credential carries the true uid and the controller checks it.
#include "events.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <thread>

extern "C" {
#include <slurm/slurm.h>
}

#include "ckpt/clock.hpp"
#include "ckpt/env_contract.hpp"
#include "ckpt/parse.hpp"
#include "ckpt/posix.hpp"
#include "http.hpp"
#include "munge_auth.hpp"
#include "plugin_state.hpp"

namespace ckpt::spank {

namespace {

namespace rec = ckpt::recovery;

constexpr long kTimeoutMs = 1000;        // the most one report may take
constexpr long kDegradedTimeoutMs = 200; // after a failure: the controller is likely down or hung
std::atomic<double> g_degraded_until{0};

// In user_init slurmstepd runs with its effective uid set to the job's user (its real uid stays root). munged
// signs with the effective uid, and the controller trusts only what root or SlurmUser signed (the checkpoint dir
// the plugin resolved), so the plugin's own events are signed with root's effective uid restored for the call.
class SignAsPlugin {
 public:
  SignAsPlugin() : saved_(geteuid()) {
    // When this fails the event is signed as the user, and the controller ignores its checkpoint dir.
    if (getuid() == 0 && saved_ != 0 && seteuid(0) != 0) slurm_verbose("ckpt: events are signed as the job's user");
  }
  ~SignAsPlugin() {
    if (geteuid() != saved_ && seteuid(saved_) != 0) slurm_error("ckpt: cannot set the effective uid back");
  }
  SignAsPlugin(const SignAsPlugin&) = delete;
  SignAsPlugin& operator=(const SignAsPlugin&) = delete;

 private:
  uid_t saved_;
};

bool encode(const std::string& payload, std::string& credential) {
  SignAsPlugin as_plugin;
  auto cred = ckpt::toolkit::munge_encode_payload(payload, munge_socket());
  if (!cred) {
    slurm_verbose("ckpt: cannot encode a job event: %s", cred.error().c_str());
    return false;
  }
  credential = std::move(cred).value();
  return true;
}

// Posts the credential (toolkit's post_credential: asked again while the controller is busy, never waited on
// when it does not answer). After a controller that did not answer, the next reports wait 200 ms, not 1 s, for
// 30 s: it is likely down or hung, and slurmstepd must not be held up by it.
void post(const std::string& url, const std::string& credential) {
  const long timeout_ms = unix_seconds() < g_degraded_until.load() ? kDegradedTimeoutMs : kTimeoutMs;
  auto res = ckpt::toolkit::post_credential(url, credential, static_cast<double>(timeout_ms) / 1000);
  if (!res.error.empty() && !res.dropped) {
    g_degraded_until = unix_seconds() + 30;
    slurm_verbose("ckpt: controller %s unreachable: %s", url.c_str(), res.error.c_str());
  }
  if (res.status >= 300) slurm_verbose("ckpt: controller %s answered HTTP %ld", url.c_str(), res.status);
  if (res.dropped) slurm_verbose("ckpt: controller %s dropped the report 4 times", url.c_str());
}

// Writes the credential as <dir>/<time>-<pid>-<random>.ev, atomically (ckpt/posix.hpp): the controller reads
// only names that end in .ev and do not start with a dot, so it never sees the hidden temp file.
void spool(const std::string& dir, const std::string& credential) {
  std::random_device rd;
  char name[128];
  std::snprintf(name, sizeof name, "%.6f-%d-%08x.ev", unix_seconds(), static_cast<int>(getpid()), rd());
  ckpt::posix::Fd dir_fd(open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir_fd.valid()) {
    slurm_verbose("ckpt: cannot write a job event into %s: %s", dir.c_str(),
                  ckpt::posix::errno_text(errno).c_str());
    return;
  }
  ckpt::posix::AtomicWriteOptions write;
  write.mode = 0644;  // the controller need not run as the job's user
  if (Status s = ckpt::posix::write_file_atomic(dir_fd.get(), name, credential, "a job event", write); !s) {
    slurm_verbose("ckpt: %s in %s", s.error().c_str(), dir.c_str());
  }
}

// The node this slurmstepd serves. The job's environment is the submitter's (srun copies SLURMD_NODENAME of the
// batch host to every node), so a step's node is looked up by its index in the step's node list.
std::string node_name(spank_t sp, std::uint32_t step) {
  std::uint32_t index = 0;
  if (spank_get_item(sp, S_JOB_NODEID, &index) != ESPANK_SUCCESS) index = 0;
  std::string list = job_getenv(sp, step == rec::kBatchStep ? "SLURM_JOB_NODELIST" : "SLURM_STEP_NODELIST");
  if (list.empty()) list = job_getenv(sp, "SLURM_NODELIST");
  if (auto nodes = rec::expand_hostlist(list); nodes && index < nodes->size()) return (*nodes)[index];
  std::string node = job_getenv(sp, "SLURMD_NODENAME");
  if (node.empty()) {
    std::array<char, 256> host{};
    if (gethostname(host.data(), host.size() - 1) == 0) node = host.data();
    if (auto dot = node.find('.'); dot != std::string::npos) node.resize(dot);
  }
  return node;
}

// The ids every event carries. False when this is not a job step.
bool fill_ids(spank_t sp, rec::Event& e) {
  std::uint32_t job = 0, step = 0;
  uid_t uid = 0;
  if (spank_get_item(sp, S_JOB_ID, &job) != ESPANK_SUCCESS || job == 0) return false;
  if (spank_get_item(sp, S_JOB_STEPID, &step) != ESPANK_SUCCESS) step = rec::kBatchStep;
  spank_get_item(sp, S_JOB_UID, &uid);
  e.job_id = job;
  e.step_id = step;
  e.restart_count = restart_count(sp);
  e.uid = uid;
  e.node = node_name(sp, step);
  e.time = unix_seconds();
  return true;
}

// Events are only for jobs that use checkpointing, and only where the site named a controller.
bool reporting(const PluginState& state) {
  return !state.policy.controller.empty() && ckpt::checkpointing_enabled(state.user, state.policy);
}

bool truthy(const std::string& v) { return v == "1" || v == "yes" || v == "true" || v == "on"; }

}  // namespace

std::string munge_socket() {
  if (&slurm_conf == nullptr || slurm_conf.authinfo == nullptr) return {};
  return ckpt::authinfo_socket(slurm_conf.authinfo);
}

void report_event(const std::string& destination, const rec::Event& event) noexcept {
  try {
    if (destination.empty()) return;
    std::string credential;
    if (!encode(rec::to_json(event), credential)) return;
    if (ckpt::controller_is_url(destination)) {
      std::string url = destination;
      while (!url.empty() && url.back() == '/') url.pop_back();
      post(url + "/v1/events", credential);
    } else {
      spool(destination, credential);
    }
  } catch (...) {
    // Never let a report fail a job or reach Slurm as an exception.
  }
}

void report_job_start(spank_t sp, const ckpt::Settings& settings) noexcept {
  try {
    const auto& state = plugin_state();
    if (!reporting(state)) return;
    rec::Event e;
    e.type = rec::EventType::JobStart;
    if (!fill_ids(sp, e)) return;
    e.ckpt_dir = settings.dir;
    e.trusted_dirs = ckpt::join_trusted_prefixes(ckpt::trusted_prefixes_of(settings.dir, state.policy));
    e.max_restarts = settings.max_restarts;
    e.needs_checkpoint = truthy(job_getenv(sp, "CKPT_REQUIRE_CHECKPOINT"));
    e.in_allocation = !job_getenv(sp, "CKPT_RUN").empty();
    std::uint32_t nnodes = 0;
    spank_get_item(sp, S_JOB_NNODES, &nnodes);
    e.nnodes = nnodes;
    // ckpt-run's steps say how many nodes of the allocation it keeps as spares: a requeue may do without them.
    if (auto spares = ckpt::parse_uint(job_getenv(sp, ckpt::env::name_of("run_spares").c_str()));
        spares && *spares <= 1024) {
      e.spares = static_cast<std::uint32_t>(*spares);
    }
    report_event(state.policy.controller, e);
  } catch (...) {
  }
}

int report_task_exit(spank_t sp) noexcept {
  try {
    const auto& state = plugin_state();
    if (!reporting(state)) return 0;
    int status = 0;
    if (spank_get_item(sp, S_TASK_EXIT_STATUS, &status) != ESPANK_SUCCESS) return 0;
    rec::Event e;
    e.type = rec::EventType::TaskExit;
    if (WIFSIGNALED(status)) {
      e.signal = WTERMSIG(status);
    } else if (WIFEXITED(status)) {
      e.exit_code = WEXITSTATUS(status);
    }
    if (e.signal == 0 && e.exit_code == 0) return 0;  // a clean exit is not news
    if (!fill_ids(sp, e)) return 0;
    std::uint32_t rank = 0;
    if (spank_get_item(sp, S_TASK_GLOBAL_ID, &rank) == ESPANK_SUCCESS) e.rank = rank;
    report_event(state.policy.controller, e);
  } catch (...) {
  }
  return 0;
}

int report_step_exit(spank_t sp) noexcept {
  try {
    const auto& state = plugin_state();
    if (!reporting(state)) return 0;
    rec::Event e;
    e.type = rec::EventType::JobEnd;
    if (!fill_ids(sp, e) || e.step_id != rec::kBatchStep) return 0;
    report_event(state.policy.controller, e);
  } catch (...) {
  }
  return 0;
}

}  // namespace ckpt::spank
