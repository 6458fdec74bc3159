// ckpt-run: runs a job step inside an sbatch allocation and relaunches it there, without the bad nodes, when a
// node fails, instead of leaving the allocation:
//
//   #SBATCH -N4 --no-kill             # one spare node; --no-kill keeps the allocation when a node dies
//   ckpt-run srun -N3 --ntasks-per-node=1 python train.py
//
// The controller decides (it hears the ranks' failure reports, probes the silent nodes and applies the restart
// budget); ckpt-run polls it, kills the failed step and starts `srun --overlap --exclude=<bad nodes> ...` on the
// healthy nodes of the allocation, -N reduced only when --min-nodes allows. When too few healthy nodes remain it
// hands over to a requeue of the whole job. Without a reachable controller it runs srun once and returns its status.
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern "C" {
#include <slurm/slurm.h>
}

#include <nlohmann/json.hpp>

#include "ckpt/parse.hpp"
#include "ckpt/recovery.hpp"
#include "http.hpp"
#include "log.hpp"
#include "munge_auth.hpp"
#include "run_options.hpp"

namespace {

using namespace ckpt::controller;
using nlohmann::json;
namespace rec = ckpt::recovery;

int usage(const std::string& why) {
  std::string line = "usage: ckpt-run";
  for (const auto& spec : kRunOptions) line += std::string(" [") + spec.name + " " + spec.arg + "]";
  std::fprintf(stderr, "ckpt-run: %s\n%s [--] srun [srun options] command [args]\n", why.c_str(), line.c_str());
  return 2;
}

// srun's options that take a value (long without '=', and short), so that the command can be told apart.
bool long_takes_value(const std::string& name) {
  static const std::set<std::string> names = {
      "account", "acctg-freq", "bb", "bbf", "bcast", "bcast-exclude", "begin", "cpus-per-task", "comment",
      "cpu-freq", "dependency", "deadline", "delay-boot", "chdir", "export", "error", "epilog", "gres",
      "gres-flags", "input", "jobid", "job-name", "licenses", "clusters", "distribution", "mail-type", "mail-user",
      "mcs-label", "mpi", "ntasks", "ntasks-per-node", "nodes", "output", "het-group", "partition", "power",
      "priority", "prolog", "profile", "relative", "qos", "core-spec", "signal", "slurmd-debug", "switches",
      "task-epilog", "task-prolog", "thread-spec", "threads", "time", "time-min", "wait", "wckey",
      "cluster-constraint", "constraint", "mem", "mincpus", "reservation", "tmp", "nodelist", "exclude",
      "mem-per-cpu", "sockets-per-node", "cores-per-socket", "threads-per-core", "ntasks-per-core",
      "ntasks-per-socket", "cpus-per-gpu", "gpus", "gpu-bind", "gpu-freq", "gpus-per-node", "gpus-per-socket",
      "gpus-per-task", "mem-per-gpu", "network", "uid", "gid", "nodefile", "cpu-bind", "mem-bind", "hint",
      "accel-bind", "ntasks-per-gpu", "ntasks-per-tres", "x11", "container", "open-mode", "extra-node-info",
      "ckpt-interval", "ckpt-dir", "ckpt-keep", "ckpt-last-words", "ckpt-mtbf", "ckpt-max-restarts", "ckpt-grace"};
  return names.count(name) != 0;
}
bool short_takes_value(char c) { return std::strchr("AbcdDeiJLMmnNopqrSTtWCwxGBF", c) != nullptr; }

struct SrunLine {
  std::string srun;                    // the program, usually "srun"
  std::vector<std::string> options;    // without -N/--nodes and -x/--exclude
  std::vector<std::string> command;
  std::optional<std::string> nodes;    // the user's -N value
  std::optional<std::string> exclude;  // the user's -x value
};

ckpt::Result<SrunLine> parse_srun(const std::vector<std::string>& args) {
  if (args.empty()) return ckpt::Error{"no srun command line"};
  SrunLine line;
  line.srun = args[0];
  std::size_t i = 1;
  for (; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (a.size() < 2 || a[0] != '-') break;  // the command
    std::string name, value;
    bool has_value = false;
    bool is_long = a.rfind("--", 0) == 0;
    if (is_long) {
      auto eq = a.find('=');
      name = a.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
      if (eq != std::string::npos) {
        value = a.substr(eq + 1);
        has_value = true;
      } else if (long_takes_value(name)) {
        if (i + 1 >= args.size()) return ckpt::Error{"srun option " + a + " needs a value"};
        value = args[++i];
        has_value = true;
      }
    } else {
      name = a.substr(1, 1);
      if (short_takes_value(a[1])) {
        if (a.size() > 2) {
          value = a.substr(2);
        } else {
          if (i + 1 >= args.size()) return ckpt::Error{"srun option " + a + " needs a value"};
          value = args[++i];
        }
        has_value = true;
      }
    }
    if (name == "N" || name == "nodes") {
      line.nodes = value;
      continue;
    }
    if (name == "x" || name == "exclude") {
      line.exclude = value;
      continue;
    }
    if (is_long) {
      line.options.push_back("--" + name + (has_value ? "=" + value : ""));
    } else {
      line.options.push_back("-" + name);
      if (has_value) line.options.push_back(value);
    }
  }
  for (; i < args.size(); ++i) line.command.push_back(args[i]);
  if (line.command.empty()) return ckpt::Error{"no command after the srun options"};
  return line;
}

struct Settings {
  std::string url;
  std::optional<std::uint64_t> min_nodes;
  std::uint64_t max_relaunches = 100;
  double decision_wait_s = 5;
  double poll_s = 0.1;
};

std::string controller_url_from_config() {
  const char* path = std::getenv("CKPT_CONTROLLER_CONFIG");
  std::ifstream in(path ? path : "/etc/slurm-ckpt/controller.conf");
  if (!in) return {};
  std::stringstream ss;
  ss << in.rdbuf();
  auto cfg = rec::parse_controller_config(ss.str());
  if (!cfg || cfg->listen == "off") return {};
  return "http://" + cfg->listen;
}

std::string munge_socket_from_slurm();

// The controller's view of this job, read with a MUNGE credential (the controller shows a user only their jobs).
std::optional<json> job_view(const Settings& s, const std::string& job) {
  static const std::string socket = munge_socket_from_slurm();
  HttpRequest req;
  const std::string path = "/v1/jobs/" + job;
  req.url = s.url + path;
  req.timeout_s = 1;
  auto cred = munge_encode_payload(read_credential_payload(path), socket);
  if (!cred) {
    log_limited(LogLevel::Warning, "munge", "cannot ask the controller about job " + job + ": " + cred.error());
    return std::nullopt;
  }
  req.headers.emplace_back(kCredentialHeader, *cred);
  HttpResponse res = http_request(req);
  if (!res.ok()) return std::nullopt;
  json j = json::parse(res.body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return std::nullopt;
  return j;
}

pid_t spawn(const std::vector<std::string>& argv, unsigned attempt) {
  pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    setenv("CKPT_RUN", "1", 1);
    setenv("CKPT_RUN_ATTEMPT", std::to_string(attempt).c_str(), 1);
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

std::string munge_socket_from_slurm() {
  slurm_conf_t* conf = nullptr;
  if (slurm_load_ctl_conf(0, &conf) != SLURM_SUCCESS || conf == nullptr) return {};
  std::string info = conf->authinfo ? conf->authinfo : "";
  slurm_free_ctl_conf(conf);
  auto pos = info.find("socket=");
  if (pos == std::string::npos) return {};
  auto end = info.find(',', pos);
  return info.substr(pos + 7, end == std::string::npos ? std::string::npos : end - pos - 7);
}

// Tells the controller that relaunching inside the allocation is not possible: requeue the job.
void hand_over(const Settings& s, std::uint32_t job, const std::string& why) {
  rec::Event e;
  e.type = rec::EventType::Handover;
  e.job_id = job;
  const char* restarts = std::getenv("SLURM_RESTART_COUNT");
  auto count = ckpt::parse_uint(restarts ? restarts : "0");
  e.restart_count = count ? static_cast<std::uint32_t>(*count) : 0;
  const char* node = std::getenv("SLURMD_NODENAME");
  e.node = node ? node : "unknown";
  e.uid = getuid();
  e.time = now_s();
  e.detail = why;
  auto cred = munge_encode_payload(rec::to_json(e), munge_socket_from_slurm());
  if (!cred) {
    log_error("cannot hand over to the controller: " + cred.error());
    return;
  }
  HttpRequest req;
  req.method = "POST";
  req.url = s.url + "/v1/events";
  req.body = *cred;
  req.content_type = "text/plain";
  req.timeout_s = 2;
  HttpResponse res = http_request(req);
  if (!res.ok()) log_error("the controller did not take the hand-over: " + (res.error.empty() ? res.body : res.error));
}

}  // namespace

int main(int argc, char** argv) {
  set_log_program("ckpt-run");
  Settings s;
  std::vector<std::string> rest;
  int i = 1;
  for (; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::optional<std::string> {
      if (i + 1 >= argc) return std::nullopt;
      return std::string(argv[++i]);
    };
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
    if (a == "--controller") {
      auto v = value();
      if (!v) return usage("--controller needs a URL");
      s.url = *v;
    } else if (a == "--min-nodes") {
      auto v = value();
      auto n = v ? ckpt::parse_uint(*v) : ckpt::Result<std::uint64_t>(ckpt::Error{""});
      if (!n || *n == 0) return usage("--min-nodes: invalid value '" + v.value_or("") + "' (expected N >= 1)");
      s.min_nodes = *n;
    } else if (a == "--max-relaunches") {
      auto v = value();
      auto n = v ? ckpt::parse_uint(*v) : ckpt::Result<std::uint64_t>(ckpt::Error{""});
      if (!n) return usage("--max-relaunches: invalid value '" + v.value_or("") + "' (expected a number)");
      s.max_relaunches = *n;
    } else if (a == "--decision-wait") {
      auto v = value();
      auto d = v ? rec::parse_duration_ms(*v) : ckpt::Result<double>(ckpt::Error{""});
      if (!d) return usage("--decision-wait: invalid value '" + v.value_or("") + "' (expected a duration like 5s)");
      s.decision_wait_s = *d;
    } else {
      return usage(a + ": in kRunOptions but not parsed");  // a bug, caught by the man page test
    }
  }
  for (; i < argc; ++i) rest.emplace_back(argv[i]);
  auto line = parse_srun(rest);
  if (!line) return usage(line.error());
  const char* job_env = std::getenv("SLURM_JOB_ID");
  auto job_id = ckpt::parse_uint(job_env ? job_env : "");
  if (!job_id || *job_id == 0 || *job_id > 0xffffffffULL) {
    return usage("not inside a Slurm allocation (SLURM_JOB_ID is not set)");
  }
  const std::string job = std::to_string(*job_id);
  if (s.url.empty()) {
    const char* env = std::getenv("CKPT_CONTROLLER_URL");
    s.url = env ? env : controller_url_from_config();
  }
  while (!s.url.empty() && s.url.back() == '/') s.url.pop_back();
  const char* nodelist = std::getenv("SLURM_JOB_NODELIST");
  auto alloc = rec::expand_hostlist(nodelist ? nodelist : "");
  if (!alloc || alloc->empty()) return usage("cannot read the allocation's nodes (SLURM_JOB_NODELIST)");
  slurm_init(nullptr);
  signal(SIGPIPE, SIG_IGN);

  // Forward SIGTERM/SIGINT to srun (scancel, the end of the allocation): no relaunch after that.
  static volatile sig_atomic_t stopping = 0;
  static volatile pid_t child_group = 0;
  struct sigaction sa {};
  sa.sa_handler = [](int sig) {
    stopping = 1;
    if (child_group > 0) kill(-child_group, sig);
  };
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);

  std::set<std::string> user_excluded;
  if (line->exclude) {
    auto user = rec::expand_hostlist(*line->exclude);
    if (!user) return usage("srun --exclude: " + user.error());
    user_excluded.insert(user->begin(), user->end());
  }
  std::set<std::string> excluded = user_excluded;
  std::optional<std::uint64_t> nodes_wanted;
  if (line->nodes) {
    auto n = ckpt::parse_uint(line->nodes->substr(0, line->nodes->find('-')));
    if (n) nodes_wanted = *n;
  }
  std::set<std::uint32_t> handled_steps;
  unsigned attempt = 0;
  for (;;) {
    std::vector<std::string> argv_now = {line->srun};
    std::vector<std::string> healthy;
    for (const auto& n : *alloc) {
      if (excluded.count(n) == 0) healthy.push_back(n);
    }
    std::string nodes_arg = line->nodes.value_or("");
    if (attempt > 0) {
      argv_now.push_back("--overlap");  // the failed step may still hold CPUs on the healthy nodes
      const std::uint64_t needed = nodes_wanted.value_or(alloc->size());
      if (healthy.size() < needed) {
        if (s.min_nodes && healthy.size() >= *s.min_nodes) {
          nodes_arg = std::to_string(healthy.size());
          log_info("shrinking to " + nodes_arg + " nodes (--min-nodes " + std::to_string(*s.min_nodes) + ")");
        } else {
          std::string why = std::to_string(healthy.size()) + " healthy nodes left in the allocation, " +
                            std::to_string(needed) + " needed";
          log_info("cannot relaunch inside the allocation: " + why + "; handing over to a requeue");
          if (!s.url.empty()) hand_over(s, static_cast<std::uint32_t>(*job_id), why);
          return 1;
        }
      }
    }
    if (!nodes_arg.empty()) argv_now.push_back("--nodes=" + nodes_arg);
    std::vector<std::string> excl;  // the user's own -x, and the bad nodes of this allocation
    for (const auto& n : excluded) {
      if (user_excluded.count(n) != 0 || std::find(alloc->begin(), alloc->end(), n) != alloc->end()) excl.push_back(n);
    }
    if (!excl.empty()) argv_now.push_back("--exclude=" + rec::join_nodes(excl));
    argv_now.insert(argv_now.end(), line->options.begin(), line->options.end());
    argv_now.insert(argv_now.end(), line->command.begin(), line->command.end());

    const double started = now_s();
    pid_t pid = spawn(argv_now, attempt);
    if (pid < 0) {
      log_error(std::string("cannot fork: ") + std::strerror(errno));
      return 1;
    }
    child_group = pid;
    if (attempt > 0) {
      std::fprintf(stderr, "ckpt-run: relaunch %u: srun started at %.3f without %s\n", attempt, started,
                   excl.empty() ? "(none)" : rec::join_nodes(excl).c_str());
    }
    int status = 0;
    bool exited = false;
    std::optional<double> exited_at;
    std::optional<json> decision;
    for (;;) {
      if (!exited) {
        pid_t w = waitpid(pid, &status, WNOHANG);
        if (w == pid) {
          exited = true;
          exited_at = now_s();
          child_group = 0;
          if (exit_status(status) == 0 || stopping) return exit_status(status);
          if (s.url.empty()) return exit_status(status);
        }
      }
      if (!s.url.empty()) {
        auto view = job_view(s, job);
        if (view) {
          const std::string state = view->value("state", "");
          if (state == "relaunching" && view->contains("relaunch_step")) {
            auto step = (*view)["relaunch_step"].get<std::uint32_t>();
            if (handled_steps.count(step) == 0) {
              handled_steps.insert(step);
              decision = view;
              break;
            }
          }
          if (state == "gave-up") {
            log_error("the controller gave up on the job: " + view->value("reason", ""));
            if (!exited) kill(-pid, SIGKILL);
            if (!exited) waitpid(pid, &status, 0);
            return exited ? exit_status(status) : 1;
          }
        }
      }
      if (exited && exited_at && now_s() - *exited_at > s.decision_wait_s) {
        // No relaunch decision: a plain failure. The job's end hands it to the controller's requeue policy.
        return exit_status(status);
      }
      std::this_thread::sleep_for(std::chrono::duration<double>(s.poll_s));
    }
    // A relaunch: stop what is left of the failed step, then start again without the bad nodes.
    const double seen = now_s();
    if (!exited) {
      kill(-pid, SIGKILL);
      waitpid(pid, &status, 0);
      child_group = 0;
    }
    const std::uint32_t step = (*decision)["relaunch_step"].get<std::uint32_t>();
    slurm_kill_job_step(static_cast<std::uint32_t>(*job_id), step, SIGKILL);
    for (const auto& n : (*decision)["exclude"]) excluded.insert(n.get<std::string>());
    const double decided = (*decision)["clock"].value("decided", 0.0);
    std::fprintf(stderr, "ckpt-run: step %u failed; controller decided at %.3f, seen at %.3f; excluding %s\n", step,
                 decided, seen, rec::join_nodes({excluded.begin(), excluded.end()}).c_str());
    if (stopping) return 1;
    if (++attempt > s.max_relaunches) {
      log_error("relaunched " + std::to_string(s.max_relaunches) + " times; handing over to a requeue");
      hand_over(s, static_cast<std::uint32_t>(*job_id), "ckpt-run --max-relaunches reached");
      return 1;
    }
  }
}
