// ckpt-run: runs a job step inside an sbatch allocation and relaunches it there, without the bad nodes, when a
// node fails, instead of leaving the allocation:
//
//   #SBATCH -N4 --no-kill             # one spare node; --no-kill keeps the allocation when a node dies
//   ckpt-run srun -N3 --ntasks-per-node=1 python train.py
//
// The controller decides (it hears the ranks' failure reports, probes the silent nodes and applies the restart
// budget); ckpt-run polls it, kills the failed step and starts `srun --overlap --exclude=<bad nodes> ...` on the
// healthy nodes of the allocation, -N reduced only when --min-nodes allows. Each rank stays on its node and a bad
// node's ranks move to a free one (ckpt/placement.hpp, srun --distribution=arbitrary). When too few healthy nodes
// remain it hands over to a requeue of the whole job. Without a reachable controller it runs srun once and returns
// its status.
//
// With --spares it starts one step per node instead (restart in place, docs/inplace.md): the ranks recover in their
// own processes, a spare node's in a dead one's place. When the survivors give up in place (they mark the run
// abandoned, naming the ranks lost, and exit 75), ckpt-run relaunches the node steps inside the allocation on its
// own, each group of ranks on its node and a free node in a failed one's place, or hands over to a requeue when no
// node is free.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <variant>
#include <vector>

extern "C" {
#include <slurm/slurm.h>
}

#include <nlohmann/json.hpp>

#include "ckpt/address.hpp"
#include "ckpt/clock.hpp"
#include "ckpt/env_contract.hpp"
#include "ckpt/format.hpp"
#include "ckpt/inplace.hpp"
#include "ckpt/options.hpp"
#include "ckpt/parse.hpp"
#include "ckpt/placement.hpp"
#include "ckpt/posix.hpp"
#include "ckpt/recovery.hpp"
#include "ckpt/srun_cmdline.hpp"
#include "ckpt/store.hpp"
#include "http.hpp"
#include "log.hpp"
#include "munge_auth.hpp"
#include "run_options.hpp"
#include "run_report.hpp"

namespace {

using namespace ckpt::run;
using namespace ckpt::toolkit;  // MUNGE, HTTP
using nlohmann::json;
namespace rec = ckpt::recovery;

int usage(const std::string& why) {
  std::string line = "usage: ckpt-run";
  for (const auto& spec : kRunOptions) line += std::string(" [") + spec.name + " " + spec.arg + "]";
  std::fprintf(stderr, "ckpt-run: %s\n%s [--] srun [srun options] command [args]\n", why.c_str(), line.c_str());
  return 2;
}

// The user's srun line as each launch rebuilds it: -N and -x apart, since a relaunch sets them anew.
struct SrunLine {
  std::string srun;                    // the program, usually "srun"
  std::vector<std::string> options;    // without -N/--nodes and -x/--exclude
  std::vector<std::string> command;
  std::optional<std::string> nodes;    // the user's -N value
  std::optional<std::string> exclude;  // the user's -x value
  std::optional<std::string> ntasks_per_node;  // kept in `options` too
  bool ntasks = false;                 // -n/--ntasks was given (kept in `options`)
  bool distribution = false;           // -m/--distribution was given (kept in `options`): its placement is the user's
};

ckpt::Result<SrunLine> parse_srun(const std::vector<std::string>& args) {
  auto parsed = ckpt::parse_srun_command_line(args);
  if (!parsed) return ckpt::Error{parsed.error()};
  SrunLine line;
  line.srun = parsed->srun;
  line.command = parsed->command;
  for (const auto& option : parsed->options) {
    const std::string name = option.long_name();
    if (name == "nodes") {
      line.nodes = option.value.value_or("");
    } else if (name == "exclude") {
      line.exclude = option.value.value_or("");
    } else {
      if (name == "ntasks-per-node") line.ntasks_per_node = option.value.value_or("");
      if (name == "ntasks") line.ntasks = true;
      if (name == "distribution") line.distribution = true;
      for (auto& word : option.words()) line.options.push_back(std::move(word));
    }
  }
  return line;
}

// Starts `argv` in its own process group with `env` added.
pid_t spawn(const std::vector<std::string>& argv, const std::vector<std::pair<std::string, std::string>>& env) {
  pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    std::fprintf(stderr, "ckpt-run: cannot run %s: %s\n", args[0], std::strerror(errno));
    _exit(127);
  }
  if (pid > 0) setpgid(pid, pid);
  return pid;
}

int exit_status(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

// Sets one of ckpt-run's own options from its value (nullopt when the option was last on the line). Returns an
// exit status when the value is bad.
std::optional<int> set_run_option(const std::string& a, const std::optional<std::string>& v, Settings& s) {
  if (a == "--controller") {
    if (!v) return usage("--controller needs a URL");
    s.url = *v;
  } else if (a == "--min-nodes") {
    auto n = v ? ckpt::parse_uint(*v) : ckpt::Result<std::uint64_t>(ckpt::Error{""});
    if (!n || *n == 0) return usage("--min-nodes: invalid value '" + v.value_or("") + "' (expected N >= 1)");
    s.min_nodes = *n;
  } else if (a == "--max-relaunches") {
    auto n = v ? ckpt::parse_uint(*v) : ckpt::Result<std::uint64_t>(ckpt::Error{""});
    if (!n) return usage("--max-relaunches: invalid value '" + v.value_or("") + "' (expected a number)");
    s.max_relaunches = *n;
  } else if (a == "--spares") {
    auto n = v ? ckpt::parse_uint(*v) : ckpt::Result<std::uint64_t>(ckpt::Error{""});
    if (!n || *n > 4096) return usage("--spares: invalid value '" + v.value_or("") + "' (expected N from 0 to 4096)");
    s.spares = *n;
  } else if (a == "--decision-wait") {
    auto d = v ? rec::parse_duration_ms(*v) : ckpt::Result<double>(ckpt::Error{""});
    if (!d) return usage("--decision-wait: invalid value '" + v.value_or("") + "' (expected a duration like 5s)");
    s.decision_wait_s = *d;
  } else {
    return usage(a + ": in kRunOptions but not parsed");  // a bug, caught by the man page test
  }
  return std::nullopt;
}

// Reads ckpt-run's own options, which end at "--" or at the first word that is not one (the srun line). Leaves
// `i` at the srun line; returns an exit status when ckpt-run is done (--help, a bad option).
std::optional<int> parse_run_options(int argc, char** argv, int& i, Settings& s) {
  for (; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (a.rfind("--", 0) != 0) break;
    if (a == "--help" || a == "-h") {
      usage("relaunches a job step inside its allocation when a node fails");
      for (const auto& spec : kRunOptions) std::fprintf(stderr, "  %s %s\n      %s\n", spec.name, spec.arg, spec.usage);
      return 0;
    }
    if (run_option(a) == nullptr) return usage("unknown option " + a);
    std::optional<std::string> value;
    if (i + 1 < argc) value = argv[++i];
    if (auto done = set_run_option(a, value, s)) return done;
  }
  return std::nullopt;
}

// What the relaunch loop works from: the job, its allocation, the user's srun line and the nodes left out.
struct Run {
  Settings s;
  std::uint32_t job_id = 0;
  std::string job;
  std::vector<std::string> alloc;
  SrunLine line;
  std::set<std::string> user_excluded;  // the user's own -x
  std::set<std::string> excluded;       // the user's -x and the bad nodes found so far
  std::optional<std::uint64_t> nodes_wanted;
  std::set<std::uint32_t> handled_steps;  // failed steps whose relaunch decision was carried out
  unsigned attempt = 0;
  // The running step's rank -> node: the placement ckpt-run started it with, else (srun's own) asked of slurmctld
  // when it failed; empty where nobody could say.
  std::vector<std::string> placement;
};

// Fills `run` from the srun line and the allocation's environment; returns an exit status when it cannot.
std::optional<int> prepare(Run& run, const std::vector<std::string>& srun_args) {
  auto line = parse_srun(srun_args);
  if (!line) return usage(line.error());
  run.line = *line;
  const char* job_env = std::getenv("SLURM_JOB_ID");
  auto job_id = ckpt::parse_uint(job_env ? job_env : "");
  if (!job_id || *job_id == 0 || *job_id > 0xffffffffULL) {
    return usage("not inside a Slurm allocation (SLURM_JOB_ID is not set)");
  }
  run.job_id = static_cast<std::uint32_t>(*job_id);
  run.job = std::to_string(*job_id);
  // The plugin exports the job's --ckpt-spares and the site's max_spares; an explicit --spares is held to the
  // same limit.
  auto env_view = [](const char* name) -> std::optional<std::string_view> {
    const char* value = std::getenv(name);
    return value ? std::optional<std::string_view>(value) : std::nullopt;
  };
  auto spares = ckpt::run_spares(run.s.spares, env_view(ckpt::env::name_of("spares").c_str()),
                                   env_view(ckpt::env::name_of("max_spares").c_str()));
  if (!spares) return usage(spares.error());
  if (!run.s.spares && *spares) run.s.spares_source = "--ckpt-spares";
  run.s.spares = *spares;
  // --ckpt-shrink restarts in place without spares too: one step per node, the survivors going on without a lost one.
  if (const char* shrink = std::getenv(ckpt::env::name_of("shrink").c_str()); shrink != nullptr && !run.s.spares) {
    auto policy = ckpt::inplace::parse_shrink(shrink);
    if (!policy) return usage(ckpt::env::name_of("shrink") + ": " + policy.error());
    if (policy->on()) run.s.spares = 0;
  }
  if (run.s.url.empty()) {
    // The plugin exports the site's controller= URL to the job: never a guess from a config file.
    const char* env = std::getenv(ckpt::env::name_of("controller_url").c_str());
    run.s.url = env ? env : "";
  }
  while (!run.s.url.empty() && run.s.url.back() == '/') run.s.url.pop_back();
  const char* nodelist = std::getenv("SLURM_JOB_NODELIST");
  auto alloc = rec::expand_hostlist(nodelist ? nodelist : "");
  if (!alloc || alloc->empty()) return usage("cannot read the allocation's nodes (SLURM_JOB_NODELIST)");
  run.alloc = *alloc;
  if (run.line.exclude) {
    auto user = rec::expand_hostlist(*run.line.exclude);
    if (!user) return usage("srun --exclude: " + user.error());
    run.user_excluded.insert(user->begin(), user->end());
  }
  run.excluded = run.user_excluded;
  if (run.line.nodes) {
    auto n = ckpt::parse_uint(run.line.nodes->substr(0, run.line.nodes->find('-')));
    if (n) run.nodes_wanted = *n;
  }
  return std::nullopt;
}

// SIGTERM/SIGINT (scancel, the end of the allocation) go on to srun's process group: no relaunch after that.
volatile sig_atomic_t g_stopping = 0;
volatile pid_t g_child_group = 0;
// --spares: one srun per node, each in its own process group.
constexpr std::size_t kMaxNodeSteps = 4096 + 1024;
volatile pid_t g_node_groups[kMaxNodeSteps] = {};

void forward_stop_signals() {
  struct sigaction sa {};
  sa.sa_handler = [](int sig) {
    g_stopping = 1;
    if (g_child_group > 0) kill(-g_child_group, sig);
    for (std::size_t i = 0; i < kMaxNodeSteps && g_node_groups[i] != 0; ++i) {
      if (g_node_groups[i] > 0) kill(-g_node_groups[i], sig);
    }
  };
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

struct Launch {
  std::vector<std::string> argv;
  std::vector<std::string> excluded;  // what --exclude names
  std::string hostfile;               // SLURM_HOSTFILE of a kept placement (removed once srun ends); empty: none
  std::vector<std::string> placement;  // that placement, rank -> node
};

// The step's placement, rank -> node, from slurmctld; empty when it cannot say.
std::vector<std::string> step_placement(std::uint32_t job_id, std::uint32_t step) {
  slurm_step_id_t id{};
  id.job_id = job_id;
  id.step_id = step;
  id.step_het_comp = NO_VAL;
  slurm_step_layout_t* layout = slurm_job_step_layout_get(&id);
  if (layout == nullptr) return {};
  std::vector<std::string> out;
  auto nodes = rec::expand_hostlist(layout->node_list ? layout->node_list : "");
  if (nodes && nodes->size() == layout->node_cnt && layout->task_cnt <= (1u << 20)) {
    out.resize(layout->task_cnt);
    for (std::uint32_t n = 0; n < layout->node_cnt; ++n) {
      for (std::uint16_t t = 0; t < layout->tasks[n]; ++t) {
        if (layout->tids[n][t] < out.size()) out[layout->tids[n][t]] = (*nodes)[n];
      }
    }
  }
  slurm_job_step_layout_free(layout);
  if (std::find(out.begin(), out.end(), "") != out.end()) out.clear();
  return out;
}

// A relaunch that keeps the failed step's placement (ckpt/placement.hpp): srun --distribution=arbitrary with a
// host file of ckpt-run's own. False (srun places the ranks itself) where the user chose a distribution, slurmctld
// gave no placement, too few nodes are free, or the file cannot be written.
bool keep_placement(const Run& run, Launch& launch) {
  if (run.line.distribution || run.placement.empty()) return false;
  auto kept = ckpt::placement::keep_nodes(run.placement, run.excluded, run.alloc);
  if (!kept) return false;
  const char* tmp = std::getenv("TMPDIR");
  std::string path = std::string(tmp && *tmp ? tmp : "/tmp") + "/ckpt-run-hosts." + run.job + ".XXXXXX";
  ckpt::posix::Fd fd(::mkstemp(path.data()));  // 0600, the user's own
  if (fd.get() < 0) {
    log_error("cannot keep the ranks on their nodes: " + path + ": " + std::strerror(errno));
    return false;
  }
  const std::string text = ckpt::placement::hostfile(*kept);
  if (ckpt::Status written = ckpt::posix::write_all(fd.get(), text.data(), text.size(), path); !written) {
    log_error("cannot keep the ranks on their nodes: " + written.error());
    ::unlink(path.c_str());
    return false;
  }
  launch.hostfile = path;
  launch.placement = *kept;
  launch.argv.push_back("--distribution=arbitrary");
  if (!run.line.ntasks) launch.argv.push_back("--ntasks=" + std::to_string(kept->size()));
  std::set<std::string> moved;
  for (std::size_t r = 0; r < kept->size(); ++r) {
    if ((*kept)[r] != run.placement[r]) moved.insert(run.placement[r] + " -> " + (*kept)[r]);
  }
  std::string what;
  for (const auto& m : moved) what += (what.empty() ? "" : ", ") + m;
  log_info("relaunch: every rank keeps its node" + (what.empty() ? "" : " but those moved: " + what));
  return true;
}

// The srun command of this attempt. On a relaunch without enough healthy nodes (and no shrinking allowed) it
// hands the job over to a requeue and returns nullopt.
std::optional<Launch> next_launch(const Run& run) {
  Launch launch;
  launch.argv = {run.line.srun};
  std::vector<std::string> healthy;
  for (const auto& n : run.alloc) {
    if (run.excluded.count(n) == 0) healthy.push_back(n);
  }
  std::string nodes_arg = run.line.nodes.value_or("");
  if (run.attempt > 0) {
    launch.argv.push_back("--overlap");  // the failed step may still hold CPUs on the healthy nodes
    const std::uint64_t needed = run.nodes_wanted.value_or(run.alloc.size());
    if (healthy.size() < needed) {
      if (run.s.min_nodes && healthy.size() >= *run.s.min_nodes) {
        nodes_arg = std::to_string(healthy.size());
        log_info("shrinking to " + nodes_arg + " nodes (--min-nodes " + std::to_string(*run.s.min_nodes) + ")");
      } else {
        std::string why = std::to_string(healthy.size()) + " healthy nodes left in the allocation, " +
                          std::to_string(needed) + " needed";
        log_info("cannot relaunch inside the allocation: " + why + "; handing over to a requeue");
        if (!run.s.url.empty()) hand_over(run.s, run.job_id, why);
        return std::nullopt;
      }
    }
  }
  if (!nodes_arg.empty()) launch.argv.push_back("--nodes=" + nodes_arg);
  for (const auto& n : run.excluded) {  // the user's own -x, and the bad nodes of this allocation
    if (run.user_excluded.count(n) != 0 || std::find(run.alloc.begin(), run.alloc.end(), n) != run.alloc.end()) {
      launch.excluded.push_back(n);
    }
  }
  if (!launch.excluded.empty()) launch.argv.push_back("--exclude=" + rec::join_nodes(launch.excluded));
  if (run.attempt > 0 && nodes_arg == run.line.nodes.value_or("")) keep_placement(run, launch);
  launch.argv.insert(launch.argv.end(), run.line.options.begin(), run.line.options.end());
  launch.argv.insert(launch.argv.end(), run.line.command.begin(), run.line.command.end());
  return launch;
}

struct Decision {
  JobView view;  // the controller's view of the job, state "relaunching"
  double seen;  // when ckpt-run saw it
};

// True for a relaunch decision about a failed step not handled yet; marks the step handled.
bool take_relaunch(const JobView& view, std::set<std::uint32_t>& handled_steps) {
  if (view.state != "relaunching" || !view.relaunch_step) return false;
  return handled_steps.insert(*view.relaunch_step).second;
}

// Watches the step and polls the controller until its ending is settled: an exit status for ckpt-run, or the
// controller's relaunch decision, with what is left of the failed step then killed.
std::variant<int, Decision> wait_for_decision(Run& run, pid_t pid) {
  int status = 0;
  bool exited = false;
  double exited_at = 0;
  for (;;) {
    if (!exited && waitpid(pid, &status, WNOHANG) == pid) {
      exited = true;
      exited_at = ckpt::unix_seconds();
      g_child_group = 0;
      if (exit_status(status) == 0 || g_stopping || run.s.url.empty()) return exit_status(status);
    }
    std::optional<JobView> view;
    if (!run.s.url.empty()) view = read_job_view(run.s.url, run.job);
    if (view && take_relaunch(*view, run.handled_steps)) {
      Decision decision{*view, ckpt::unix_seconds()};
      if (!exited) {
        kill(-pid, SIGKILL);
        waitpid(pid, &status, 0);
        g_child_group = 0;
      }
      return decision;
    }
    if (view && view->state == "gave-up") {
      log_error("the controller gave up on the job: " + ckpt::printable(view->reason));
      if (exited) return exit_status(status);
      kill(-pid, SIGKILL);
      waitpid(pid, &status, 0);
      return 1;
    }
    if (exited && ckpt::unix_seconds() - exited_at > run.s.decision_wait_s) {
      // No relaunch decision: a plain failure. The job's end hands it to the controller's requeue policy.
      return exit_status(status);
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(run.s.poll_s));
  }
}

// Carries out a relaunch decision: the failed step is cancelled and its bad nodes left out from now on. Returns
// an exit status when no relaunch follows (stopping, or the relaunches are used up).
std::optional<int> apply_decision(Run& run, Decision& decision) {
  const std::uint32_t step = *decision.view.relaunch_step;
  // srun's own placement is asked of slurmctld before the kill, while the step exists. Never an arbitrary step's
  // layout: nothing says its node list keeps the host file's order, and ckpt-run knows the one it chose.
  if (run.placement.empty()) run.placement = step_placement(run.job_id, step);
  slurm_kill_job_step(run.job_id, step, SIGKILL);
  for (const auto& n : decision.view.exclude) run.excluded.insert(n);
  const double decided = decision.view.decided;
  std::fprintf(stderr, "ckpt-run: step %u failed; controller decided at %.3f, seen at %.3f; excluding %s\n", step,
               decided, decision.seen, rec::join_nodes({run.excluded.begin(), run.excluded.end()}).c_str());
  if (g_stopping) return 1;
  if (++run.attempt > run.s.max_relaunches) {
    log_error("relaunched " + std::to_string(run.s.max_relaunches) + " times; handing over to a requeue");
    hand_over(run.s, run.job_id, "ckpt-run --max-relaunches reached");
    return 1;
  }
  return std::nullopt;
}

// Runs the step, and again without the bad nodes after each relaunch decision, until ckpt-run has a status.
int relaunch_loop(Run& run) {
  for (;;) {
    auto launch = next_launch(run);
    if (!launch) return 1;
    const double started = ckpt::unix_seconds();
    std::vector<std::pair<std::string, std::string>> env{
        {ckpt::env::name_of("relaunched"), "1"}, {ckpt::env::name_of("run_attempt"), std::to_string(run.attempt)}};
    if (!launch->hostfile.empty()) env.emplace_back("SLURM_HOSTFILE", launch->hostfile);
    pid_t pid = spawn(launch->argv, env);
    if (pid < 0) {
      log_error(std::string("cannot fork: ") + std::strerror(errno));
      return 1;
    }
    g_child_group = pid;
    run.placement = launch->placement;
    if (run.attempt > 0) {
      std::fprintf(stderr, "ckpt-run: relaunch %u: srun started at %.3f without %s\n", run.attempt, started,
                   launch->excluded.empty() ? "(none)" : rec::join_nodes(launch->excluded).c_str());
    }
    auto ending = wait_for_decision(run, pid);
    if (!launch->hostfile.empty()) ::unlink(launch->hostfile.c_str());
    if (const int* status = std::get_if<int>(&ending)) return *status;
    if (auto done = apply_decision(run, std::get<Decision>(ending))) return *done;
  }
}

// ---- --spares: one step per node, restart in place -----------------------------------------------------------------

struct NodeStep {
  std::string node;
  bool spare = false;
  pid_t pid = -1;
  std::optional<int> status;
};

// The per-node steps of the first launch: the first -N healthy nodes train (ranks node_index * K + SLURM_PROCID),
// the next --spares wait. Fails with one line when the srun line or the allocation does not allow it.
ckpt::Result<ckpt::placement::NodeSteps> plan_node_steps(const Run& run) {
  const std::string& source = run.s.spares_source;
  if (!run.line.ntasks_per_node) return ckpt::Error{source + " needs srun --ntasks-per-node=K (K ranks per node)"};
  if (run.line.ntasks) return ckpt::Error{source + ": give srun --ntasks-per-node, not -n/--ntasks"};
  if (!run.nodes_wanted) return ckpt::Error{source + " needs srun -N (the nodes that train)"};
  std::vector<std::string> healthy;
  for (const auto& n : run.alloc) {
    if (run.excluded.count(n) == 0) healthy.push_back(n);
  }
  const std::uint64_t wanted = *run.nodes_wanted;
  if (healthy.size() < wanted) {
    return ckpt::Error{source + ": -N " + std::to_string(wanted) + " but the allocation has " +
                       std::to_string(healthy.size()) + " usable nodes"};
  }
  if (wanted + *run.s.spares > kMaxNodeSteps) return ckpt::Error{source + ": too many nodes for one ckpt-run"};
  auto steps = ckpt::placement::node_steps({healthy.begin(), healthy.begin() + static_cast<std::ptrdiff_t>(wanted)},
                                           run.excluded, run.alloc, *run.s.spares);
  if (!steps) return ckpt::Error{source + ": no node steps for -N " + std::to_string(wanted)};
  if (steps->spares.size() < *run.s.spares) {
    log_info(source + " " + std::to_string(*run.s.spares) + ": the allocation holds " +
             std::to_string(steps->spares.size()) + " spare nodes beyond -N " + std::to_string(wanted));
  }
  return std::move(*steps);
}

constexpr int kExitPeerLost = ckpt::inplace::kExitPeerLost;  // a survivor that could not go on

void kill_node_steps(std::vector<NodeStep>& steps) {
  for (std::size_t i = 0; i < steps.size(); ++i) {
    if (!steps[i].status && steps[i].pid > 0) kill(-steps[i].pid, SIGKILL);
  }
}

// The Slurm steps ckpt-run's sruns started that still run (known by the srun's pid and the step's one node).
std::vector<std::uint32_t> running_step_ids(const Run& run, const std::vector<NodeStep>& steps) {
  std::vector<std::uint32_t> ids;
  job_step_info_response_msg_t* info = nullptr;
  if (slurm_get_job_steps(0, run.job_id, NO_VAL, &info, SHOW_ALL) != SLURM_SUCCESS || info == nullptr) return ids;
  for (std::uint32_t k = 0; k < info->job_step_count; ++k) {
    const job_step_info_t& st = info->job_steps[k];
    for (const NodeStep& step : steps) {
      if (!step.status && step.pid > 0 && st.srun_pid == static_cast<std::uint32_t>(step.pid) && st.nodes != nullptr &&
          step.node == st.nodes) {
        ids.push_back(st.step_id.step_id);
      }
    }
  }
  slurm_free_job_step_info_response_msg(info);
  return ids;
}

// Ends what is left of the node steps before a relaunch: each Slurm step in `ids` is cancelled, so that its tasks
// end on their nodes too (a frozen node's when it thaws), then the srun processes are killed and reaped.
void cancel_node_steps(const Run& run, std::vector<NodeStep>& steps, const std::vector<std::uint32_t>& ids) {
  for (std::uint32_t id : ids) slurm_kill_job_step(run.job_id, id, SIGKILL);
  kill_node_steps(steps);
  for (std::size_t i = 0; i < steps.size(); ++i) {
    if (steps[i].status || steps[i].pid <= 0) continue;
    int status = 0;
    if (waitpid(steps[i].pid, &status, 0) == steps[i].pid) steps[i].status = exit_status(status);
    g_node_groups[i] = -1;
  }
}

// Where the steps tell ckpt-run to look at the run's records now: a listener on the address the nodes reach,
// named to them in CKPT_INPLACE_NOTIFY. A notice is a connection that carries nothing: a stranger who connects
// makes ckpt-run read a few small records sooner, never act; the records decide. Without notices (none could be
// sent, or no listener) the records are read every kLookEvery_s.
class Notices {
 public:
  // The listener; an empty address when none could be made (a warning says why).
  void open() {
    auto chosen = ckpt::net::publish_address();
    if (!chosen) {
      log_error("no in-place notices (the records are read every 2 s): " + chosen.error());
      return;
    }
    ckpt::posix::Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    socklen_t len = sizeof a;
    if (!fd.valid() || ::inet_pton(AF_INET, chosen->address.c_str(), &a.sin_addr) != 1 ||
        ::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd.get(), 64) != 0 ||
        ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      log_error("no in-place notices (the records are read every 2 s): cannot listen on " + chosen->address + ": " +
                std::strerror(errno));
      return;
    }
    listener_ = std::move(fd);
    address_ = chosen->address + ":" + std::to_string(ntohs(a.sin_port));
  }
  const std::string& address() const { return address_; }

  // Waits up to `timeout_ms` for a notice; true when one or more came (each connection is accepted and closed).
  bool wait(int timeout_ms) {
    if (!listener_.valid()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(timeout_ms));
      return false;
    }
    pollfd p{listener_.get(), POLLIN, 0};
    if (::poll(&p, 1, timeout_ms) <= 0) return false;
    bool any = false;
    for (int n = 0; n < 256; ++n) {  // bounded: a flood of connections cannot keep ckpt-run here
      int c = ::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) break;
      ::close(c);
      any = true;
    }
    return any;
  }

 private:
  ckpt::posix::Fd listener_;
  std::string address_;
};

constexpr double kLookEvery_s = 2.0;

// The recoveries the program makes in place, read from its records when a step says so, for the controller.
struct InPlaceWatch {
  std::string dir;                       // $CKPT_DIR/.control/inplace-<id>; empty: CKPT_DIR unknown, not watched
  std::map<int, std::string> node_of_rank;
  std::uint32_t next = 1;                // the next recovery's generation
  double next_view = 0;                  // when to look at the controller's view of the job again
  double next_look = 0;                  // when to read the records without a notice
  bool look_now = false;                 // a notice came
  bool finished = false, abandoned = false;  // the markers, as last read
  std::set<std::string> failed_nodes;    // the nodes that lost all their ranks in a recovery reported so far
};

void read_markers(const ckpt::inplace::Records& records, InPlaceWatch& watch) {
  watch.finished = records.marked("finished");
  watch.abandoned = records.marked("abandoned");
}

// After a recovery that dropped `lost` (--ckpt-shrink): each survivor's node under its rank now, the survivors
// renumbered in order as the plan did (ckpt::inplace::rank_after).
std::map<int, std::string> renumbered(const std::map<int, std::string>& node_of_rank, const std::vector<int>& lost) {
  ckpt::inplace::Plan plan;
  plan.lost = lost;
  plan.world_before = static_cast<int>(node_of_rank.size());
  std::map<int, std::string> out;
  for (const auto& [rank, node] : node_of_rank) {
    if (int now = ckpt::inplace::rank_after(plan, rank); now >= 0) out[now] = node;
  }
  return out;
}

// Reads the markers; once the first process made the dir.
void read_markers(InPlaceWatch& watch) {
  if (watch.dir.empty()) return;
  if (auto records = ckpt::inplace::Records::open(watch.dir, /*create=*/false)) read_markers(*records, watch);
}

// Reports each recovery made in place once its first step is done; true when the controller gave up on the job
// (its restart budget is spent), which ends the steps.
bool watch_in_place(const Run& run, InPlaceWatch& watch) {
  if (watch.dir.empty()) return false;
  if (watch.look_now || ckpt::unix_seconds() >= watch.next_look) {
    watch.look_now = false;
    watch.next_look = ckpt::unix_seconds() + kLookEvery_s;
    // One look: the dir opened once, the markers and the next recovery's phases read from it.
    auto records = ckpt::inplace::Records::open(watch.dir, /*create=*/false);
    if (records) read_markers(*records, watch);
    std::optional<ckpt::inplace::Phases> phases;
    if (records) phases = records->read_phases(watch.next);
    if (phases) {
      if (auto r = read_in_place_phases(*records, watch.next, *phases, watch.node_of_rank)) {
        std::string ranks;
        for (int rank : r->lost_ranks) ranks += (ranks.empty() ? "" : ",") + std::to_string(rank);
        const std::string what = r->world_before > 0 ? "dropped, " + std::to_string(r->world) + " of " +
                                                           std::to_string(r->world_before) + " ranks go on"
                                                     : std::string("replaced");
        std::fprintf(stderr, "ckpt-run: in-place recovery %u: ranks %s %s (failed nodes: %s); training ran "
                     "again %.3f s after the failure was detected\n", r->generation, ranks.c_str(), what.c_str(),
                     r->failed_nodes.empty() ? "none" : rec::join_nodes(r->failed_nodes).c_str(),
                     r->phases.resumed - r->phases.detected);
        if (!run.s.url.empty()) report_in_place(run.s.url, run.job_id, *r);
        for (const auto& [rank, node] : r->replacement_node) watch.node_of_rank[rank] = node;
        watch.failed_nodes.insert(r->failed_nodes.begin(), r->failed_nodes.end());
        if (r->world_before > 0) watch.node_of_rank = renumbered(watch.node_of_rank, r->lost_ranks);
        watch.next_view = ckpt::unix_seconds() + 0.5;
      } else {
        log_error("cannot read in-place recovery " + std::to_string(watch.next) + " in " + watch.dir);
      }
      ++watch.next;
      watch.look_now = true;  // the next recovery may be done already
    }
  }
  if (run.s.url.empty() || watch.next == 1 || ckpt::unix_seconds() < watch.next_view) return false;
  watch.next_view = ckpt::unix_seconds() + 2;
  auto view = read_job_view(run.s.url, run.job);
  if (!view || view->state != "gave-up") return false;
  log_error("the controller gave up on the job: " + ckpt::printable(view->reason));
  return true;
}

// How the node steps of one launch ended: ckpt-run's exit status, or a relaunch inside the allocation.
struct Ending {
  int status = 0;
  std::optional<ckpt::placement::NodeSteps> relaunch;
};

// The newest complete checkpoint in CKPT_DIR, for the controller's restart budget (progress); nullopt when none.
std::optional<std::uint64_t> newest_complete_step() {
  const char* dir = std::getenv(ckpt::env::name_of("dir").c_str());
  if (dir == nullptr || *dir != '/') return std::nullopt;
  auto entries = ckpt::store::scan(dir);
  if (!entries) return std::nullopt;
  auto candidates = ckpt::store::resume_candidates(*entries);
  if (candidates.empty()) return std::nullopt;
  return candidates.front();
}

// The nodes a relaunch leaves out (placement::failed_nodes), the lost ranks as the abandoned marker names them.
std::set<std::string> failed_nodes(const InPlaceWatch& watch, const std::vector<NodeStep>& steps, int world) {
  std::vector<int> lost;
  if (auto records = ckpt::inplace::Records::open(watch.dir, /*create=*/false)) {
    if (auto abandoned = records->read_abandoned(world)) lost = abandoned->lost;
  }
  std::vector<ckpt::placement::StepEnd> ends;
  for (const NodeStep& step : steps) ends.push_back({step.node, step.status});
  return ckpt::placement::failed_nodes(watch.node_of_rank, lost, watch.failed_nodes, ends, kExitPeerLost);
}

// After the survivors gave up in place, with `failed` the nodes to leave out (failed_nodes): the node steps of a
// relaunch inside the allocation (each group of ranks on its node, a free node of the allocation in a failed node's
// place; run.excluded grows by the failed nodes), or why there is none (the job then goes to a requeue). A
// relaunch resumes from what the ranks left: the terminal checkpoint their last words wrote, each rank's own
// snapshots in its node tier, a moved rank's copy from its partner's node, with no queue wait and no read of the
// checkpoint dir where the tiers hold the step.
ckpt::Result<ckpt::placement::NodeSteps> plan_relaunch(Run& run, const InPlaceWatch& watch,
                                                       const std::set<std::string>& failed,
                                                       const ckpt::placement::NodeSteps& launched) {
  if (watch.dir.empty()) return ckpt::Error{"the run's records are unknown (CKPT_DIR)"};
  if (run.attempt + 1 > run.s.max_relaunches) return ckpt::Error{"ckpt-run --max-relaunches reached"};
  if (failed.empty()) return ckpt::Error{"the survivors named no lost rank, and no node's step failed"};
  std::set<std::string> excluded = run.excluded;
  excluded.insert(failed.begin(), failed.end());
  auto next = ckpt::placement::node_steps(launched.training, excluded, run.alloc, *run.s.spares);
  if (!next) {
    return ckpt::Error{"no free node in the allocation for the ranks of " +
                       rec::join_nodes({failed.begin(), failed.end()})};
  }
  run.excluded = std::move(excluded);
  return std::move(*next);
}

// The survivors gave up in place (`why`): the node steps relaunched inside the allocation (plan_relaunch), told to
// the controller first and the old steps cancelled; or, where that cannot be, the job handed over to a requeue
// (nullopt: the steps end on their own).
std::optional<ckpt::placement::NodeSteps> on_abandoned(Run& run, std::vector<NodeStep>& steps,
                                                       const ckpt::placement::NodeSteps& launched,
                                                       const InPlaceWatch& watch, const std::string& why) {
  const std::set<std::string> failed = failed_nodes(watch, steps, static_cast<int>(watch.node_of_rank.size()));
  auto next = plan_relaunch(run, watch, failed, launched);
  if (next) {
    // The controller hears of it before the steps end: their tasks' exits are then no new failure to it.
    const std::vector<std::uint32_t> ids = running_step_ids(run, steps);
    if (!run.s.url.empty() && !ids.empty()) {
      report_relaunch(run.s.url, run.job_id, {failed.begin(), failed.end()}, *std::max_element(ids.begin(), ids.end()),
                      newest_complete_step());
    }
    cancel_node_steps(run, steps, ids);
    return std::move(next).value();
  }
  log_info(why + ", and the node steps cannot be relaunched inside the allocation (" + next.error() +
           "); handing over to a requeue");
  if (!run.s.url.empty()) hand_over(run.s, run.job_id, "no spare left for a recovery in place");
  return std::nullopt;
}

// Waits for the per-node steps. Training is done once `wanted` of them exited 0 (the training nodes, or spares in
// a dead node's place) or rank 0 marked it finished: what is left then (a dead node's step Slurm has not ended yet;
// idle spares leave on their own within a second) gets 3 s and is killed.
// Survivors that could not recover in place mark it (`abandoned`) and exit 75: on the marker, read when a step
// ends or at a look (kLookEvery_s), on_abandoned relaunches the node steps or hands the job over. A step's status
// does not say it: with several ranks on a node srun ends the others once one exits 75 (status 137), and a survivor
// stuck in a collective leaves while the others on its node wait for it to join the next generation (30 s).
Ending wait_node_steps(Run& run, std::vector<NodeStep>& steps, const ckpt::placement::NodeSteps& launched,
                       InPlaceWatch& watch, Notices& notices) {
  const std::uint64_t wanted = launched.training.size();
  std::uint64_t zeros = 0;
  std::optional<int> failure;
  bool handed_over = false;
  double done_at = 0;
  for (std::size_t running = steps.size(); running > 0;) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid < 0 && errno == ECHILD) break;
    for (std::size_t i = 0; pid > 0 && i < steps.size(); ++i) {
      if (steps[i].pid != pid) continue;
      const int code = exit_status(status);
      steps[i].status = code;
      g_node_groups[i] = -1;
      --running;
      if (code == 0) {
        ++zeros;
        continue;
      }
      std::fprintf(stderr, "ckpt-run: the step on %s ended with status %d at %.3f\n", steps[i].node.c_str(), code,
                   ckpt::unix_seconds());
      if (!failure) failure = code;
      // The survivors gave up when they marked it (a step of several ranks then ends killed: srun ends the rest
      // once one exits 75); a stale rank that thawed after a recovery in place exits 75 unmarked, and the job goes
      // on without it. Without records, 75 alone says it.
      read_markers(watch);  // a marker is written before its writer exits
      // Once rank 0 marked training finished, a rank that gave up as the others left has nothing to recover.
      if (!handed_over && !g_stopping && !watch.finished &&
          (watch.abandoned || (code == kExitPeerLost && watch.dir.empty()))) {
        handed_over = true;
        auto next = on_abandoned(run, steps, launched, watch, "survivors on " + steps[i].node +
                                                               " could not recover in place");
        if (next) return Ending{0, std::move(next)};
      }
    }
    if (pid > 0) continue;
    if (watch_in_place(run, watch) && !g_stopping) {
      kill_node_steps(steps);
      handed_over = true;  // not to a requeue: the controller gave up; the status says the job failed
    }
    // The marker read at a look, or when a stuck survivor told it.
    if (watch.abandoned && !watch.finished && !handed_over && !g_stopping) {
      handed_over = true;
      std::fprintf(stderr, "ckpt-run: the survivors gave up in place (their marker, read at %.3f)\n",
                   ckpt::unix_seconds());
      auto next = on_abandoned(run, steps, launched, watch, "the survivors could not recover in place");
      if (next) return Ending{0, std::move(next)};
    }
    // Done: training ended, or it was handed over (idle spares and stuck steps have nothing left to do).
    if (done_at == 0 && (zeros >= wanted || handed_over || watch.finished)) done_at = ckpt::unix_seconds();
    if (done_at > 0 && ckpt::unix_seconds() - done_at > 3) {
      kill_node_steps(steps);
      done_at = 1e300;  // once
    }
    if (notices.wait(50)) watch.look_now = true;
  }
  read_markers(watch);
  if ((zeros >= wanted || watch.finished) && !handed_over) return Ending{0, std::nullopt};
  return Ending{failure.value_or(1), std::nullopt};
}

// Starts one srun per node of `plan` for launch `run.attempt` (a relaunch: --overlap, since a cancelled step may
// still hold CPUs, and generations counting on from `generation_base`); fills the fresh `watch` for it.
ckpt::Result<std::vector<NodeStep>> start_node_steps(const Run& run, const ckpt::placement::NodeSteps& plan,
                                                     std::uint64_t per_node, std::uint32_t generation_base,
                                                     Notices& notices, InPlaceWatch& watch) {
  const char* restarts = std::getenv("SLURM_RESTART_COUNT");
  std::string id = run.job + ".r" + (restarts ? restarts : "0") + "." + std::to_string(getpid());
  if (run.attempt > 0) id += ".a" + std::to_string(run.attempt);
  const std::uint64_t wanted = plan.training.size();
  std::vector<NodeStep> steps;
  for (const auto& node : plan.training) steps.push_back(NodeStep{node, false, -1, std::nullopt});
  for (const auto& node : plan.spares) steps.push_back(NodeStep{node, true, -1, std::nullopt});
  for (std::size_t i = 0; i < steps.size(); ++i) {
    NodeStep& step = steps[i];
    // --ntasks: the batch script's SLURM_NTASKS (sbatch --ntasks-per-node) counts the whole allocation's tasks,
    // and srun would take it over and refuse one node's step.
    std::vector<std::string> argv = {run.line.srun, "--nodes=1", "--ntasks=" + std::to_string(per_node),
                                     "--nodelist=" + step.node};
    if (run.attempt > 0) argv.push_back("--overlap");
    argv.insert(argv.end(), run.line.options.begin(), run.line.options.end());
    argv.insert(argv.end(), run.line.command.begin(), run.line.command.end());
    namespace env = ckpt::env;
    std::vector<std::pair<std::string, std::string>> vars = {
        {env::name_of("inplace_id"), id}, {env::name_of("inplace_world"), std::to_string(wanted * per_node)},
        {env::name_of("inplace_notify"), notices.address()},
        {env::name_of("run_spares"), std::to_string(steps.size() - wanted)}};  // the controller's MinNodes
    if (generation_base > 0) {
      vars.emplace_back(env::name_of("inplace_generation_base"), std::to_string(generation_base));
    }
    if (step.spare) {
      vars.emplace_back(env::name_of("inplace_spare"), "1");
    } else {
      vars.emplace_back(env::name_of("inplace_rank_base"), std::to_string(i * per_node));
    }
    step.pid = spawn(argv, vars);  // without CKPT_RUN: the controller does not relaunch these steps
    if (step.pid < 0) return ckpt::Error{std::string("cannot fork: ") + std::strerror(errno)};
    g_node_groups[i] = step.pid;
  }
  std::string spares;
  for (const auto& st : steps) {
    if (st.spare) spares += (spares.empty() ? "" : ",") + st.node;
  }
  if (run.attempt > 0) {
    std::fprintf(stderr, "ckpt-run: relaunch %u: the node steps started at %.3f on %s without %s\n", run.attempt,
                 ckpt::unix_seconds(), rec::join_nodes(plan.training).c_str(),
                 rec::join_nodes({run.excluded.begin(), run.excluded.end()}).c_str());
  }
  std::fprintf(stderr, "ckpt-run: %llu nodes train, %s (in-place id %s)\n", static_cast<unsigned long long>(wanted),
               spares.empty() ? "no spare" : ("spares " + spares).c_str(), id.c_str());
  if (const char* dir = std::getenv(ckpt::env::name_of("dir").c_str()); dir != nullptr && *dir == '/') {
    watch.dir = ckpt::inplace::records_dir(dir, id);
  }
  for (std::size_t i = 0; i < plan.training.size(); ++i) {
    for (std::uint64_t k = 0; k < per_node; ++k) watch.node_of_rank[static_cast<int>(i * per_node + k)] = steps[i].node;
  }
  return steps;
}

// The generations a launch used: its plan records are numbered from 0 without gaps. A relaunch counts on from there.
std::uint32_t generations_used(const InPlaceWatch& watch) {
  auto records = ckpt::inplace::Records::open(watch.dir, /*create=*/false);
  if (!records) return 1;
  std::uint32_t g = 0;
  while (g < (1u << 20) && records->has_plan(g)) ++g;
  return std::max<std::uint32_t>(g, 1);
}

int inplace_loop(Run& run) {
  auto planned = plan_node_steps(run);
  if (!planned) return usage(planned.error());
  ckpt::placement::NodeSteps plan = std::move(planned).value();
  auto per_node = ckpt::parse_uint(*run.line.ntasks_per_node);
  if (!per_node || *per_node == 0) {
    return usage("srun --ntasks-per-node: invalid value '" + *run.line.ntasks_per_node + "'");
  }
  Notices notices;
  notices.open();
  std::uint32_t generation_base = 0;
  for (;;) {
    InPlaceWatch watch;
    auto started = start_node_steps(run, plan, *per_node, generation_base, notices, watch);
    if (!started) {
      log_error(started.error());
      return 1;
    }
    std::vector<NodeStep> steps = std::move(started).value();
    Ending ending = wait_node_steps(run, steps, plan, watch, notices);
    if (!ending.relaunch) return ending.status;
    generation_base += generations_used(watch);
    plan = std::move(*ending.relaunch);
    ++run.attempt;
    // a stop signal that came while the steps were cancelled: no relaunch after it
    if (g_stopping) return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  set_log_program("ckpt-run");
  Run run;
  int i = 1;
  if (auto done = parse_run_options(argc, argv, i, run.s)) return *done;
  if (auto done = prepare(run, std::vector<std::string>(argv + i, argv + argc))) return *done;
  slurm_init(nullptr);
  signal(SIGPIPE, SIG_IGN);
  forward_stop_signals();
  if (run.s.spares) return inplace_loop(run);
  return relaunch_loop(run);
}
