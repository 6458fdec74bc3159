// ckpt-controller: the job-level recovery controller. `ckpt-controller run` is the daemon (foreground, logs to
// stderr, SIGTERM stops it, sd_notify READY when systemd asks); the other subcommands are its clients.
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>
#include <thread>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "backend.hpp"
#include "ckpt/clock.hpp"
#include "ckpt/parse.hpp"
#include "ckpt/recovery.hpp"
#include "db.hpp"
#include "engine.hpp"
#include "probe.hpp"
#include "http.hpp"
#include "log.hpp"
#include "munge_auth.hpp"
#include "observe.hpp"
#include "server.hpp"

namespace {

using namespace ckpt::controller;
using namespace ckpt::toolkit;  // MUNGE, HTTP
using nlohmann::json;
namespace rec = ckpt::recovery;

constexpr const char* kDefaultConfig = "/etc/slurm-ckpt/controller.conf";

int fail(const std::string& line, int code = 1) {
  std::fprintf(stderr, "ckpt-controller: %s\n", line.c_str());
  return code;
}

ckpt::Result<rec::ControllerConfig> load_config(const std::string& path, bool must_exist) {
  std::ifstream in(path);
  if (!in) {
    if (!must_exist) return rec::ControllerConfig{};
    return ckpt::Error{path + ": " + std::strerror(errno)};
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return rec::parse_controller_config(ss.str(), path);
}

// The JWT for slurmrestd: rest_token_file (read again when it changes, see RestSettings), else the SLURM_JWT
// environment variable. Never printed.
ckpt::Result<std::string> read_token(const rec::ControllerConfig& cfg) {
  std::string token;
  if (!cfg.rest_token_file.empty()) return read_rest_token_file(cfg.rest_token_file);
  if (const char* env = std::getenv("SLURM_JWT"); env != nullptr) token = env;
  ::unsetenv("SLURM_JWT");  // held in memory from here on: no child of the daemon inherits it
  if (token.rfind("SLURM_JWT=", 0) == 0) token = token.substr(10);
  while (!token.empty() && std::isspace(static_cast<unsigned char>(token.back()))) token.pop_back();
  if (token.empty()) {
    return ckpt::Error{"backend = rest needs a token: set rest_token_file or SLURM_JWT (refusing to start without one)"};
  }
  if (token.find_first_of(" \t\r\n") != std::string::npos) return ckpt::Error{"SLURM_JWT: the token has spaces"};
  return token;
}

void sd_notify_ready() {
  const char* path = std::getenv("NOTIFY_SOCKET");
  if (path == nullptr || path[0] == '\0') return;
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path, sizeof(addr.sun_path) - 1);
  if (addr.sun_path[0] == '@') addr.sun_path[0] = '\0';  // abstract namespace
  const char msg[] = "READY=1";
  sendto(fd, msg, sizeof msg - 1, 0, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  close(fd);
}

// Blocks the stop signals in this thread and so in every thread it starts; one thread waits for them.
sigset_t block_stop_signals() {
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  return stop_signals;
}

// The config's backend: slurmrestd (with its token) or libslurm.
ckpt::Result<std::unique_ptr<SlurmBackend>> make_backend(const rec::ControllerConfig& cfg) {
  if (cfg.backend == "rest") {
    auto token = read_token(cfg);
    if (!token) return ckpt::Error{token.error()};
    return make_rest_backend(RestSettings{cfg.rest_url, cfg.rest_user, *token, 5, cfg.rest_token_file});
  }
  return make_libslurm_backend();
}

// Runs the engine's cycles until a stop signal, then stops the intake.
void serve_until_stopped(Engine& engine, Server& server, SpoolWatcher& spool, const sigset_t& stop_signals) {
  std::atomic<bool> stop{false};
  std::thread waiter([&] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    log_info(std::string("stopping on ") + (sig == SIGTERM ? "SIGTERM" : "SIGINT"));
    stop = true;
    engine.wake();
  });
  sd_notify_ready();
  engine.run(stop);
  server.stop();
  spool.stop();
  if (waiter.joinable()) waiter.join();
  log_info("stopped");
}

int run_daemon(const rec::ControllerConfig& cfg) {
  set_log_level(cfg.log_level);
  const sigset_t stop_signals = block_stop_signals();
  signal(SIGPIPE, SIG_IGN);

  set_checkpoint_reader("/proc/self/exe");
  auto made = make_backend(cfg);
  if (!made) return fail(made.error(), 2);
  std::unique_ptr<SlurmBackend> backend = std::move(made).value();
  auto db = Database::open(cfg.database);
  if (!db) return fail(db.error(), 2);
  Metrics metrics;
  Alerts alerts(cfg.webhook_url, cfg.webhook_timeout_s);
  if (auto warning = proctrack_warning(backend->proctrack_type()); !warning.empty()) log_warning(warning);
  Engine engine(cfg, *backend, **db, metrics, alerts);
  if (cfg.backend == "libslurm") {
    // slurm.conf gives every node's slurmd address: a silent node is asked RPCs, not only probed by TCP.
    engine.set_slurmd_ask([](const std::string& node, double timeout_s) {
      return ask_slurmd("/proc/self/exe", node, timeout_s);
    });
  }
  if (auto s = engine.start(ckpt::unix_seconds()); !s) return fail(s.error(), 2);

  Server server(engine, cfg.munge_socket);
  if (cfg.listen != "off") {
    auto hp = rec::parse_host_port(cfg.listen);
    if (auto s = server.listen(hp->first, hp->second); !s) return fail(s.error(), 2);
  }
  SpoolWatcher spool(engine, cfg.spool_dir, cfg.munge_socket);
  if (!cfg.spool_dir.empty()) {
    if (auto s = spool.start(); !s) return fail(s.error(), 2);
  }
  log_info(std::string("running: backend ") + backend->name() + ", listen " + cfg.listen +
           (cfg.spool_dir.empty() ? "" : ", spool " + cfg.spool_dir) + ", database " + cfg.database +
           (cfg.webhook_url.empty() ? "" : ", alerts to " + cfg.webhook_url));
  serve_until_stopped(engine, server, spool, stop_signals);
  return 0;
}

// ---- clients ---------------------------------------------------------------------------------------------------------

struct Client {
  std::string url;
  std::string munge_socket;

  // A GET of `path` with a MUNGE credential naming it (left in `cred`, or why there is none), so the controller
  // knows whose jobs to show.
  HttpResponse read(const std::string& path, double timeout_s, ckpt::Result<std::string>& cred) const {
    HttpRequest req;
    req.url = url + path;
    req.timeout_s = timeout_s;
    cred = munge_encode_payload(read_credential_payload(path), munge_socket);
    if (cred) req.headers.emplace_back(kCredentialHeader, *cred);
    return http_request(req);
  }

  // Reads carry a MUNGE credential naming the path, so the controller knows whose jobs to show. Without one
  // (no munged here) the controller shows only what anyone may see; say so once.
  ckpt::Result<json> get(const std::string& path) const {
    ckpt::Result<std::string> cred = ckpt::Error{""};
    HttpResponse res = read(path, 10, cred);
    if (!res.error.empty()) return ckpt::Error{"cannot reach the controller at " + url + ": " + res.error};
    json body = json::parse(res.body, nullptr, false);
    if (body.is_discarded()) return ckpt::Error{"the controller at " + url + " answered HTTP " + std::to_string(res.status)};
    if (res.status != 200) {
      std::string e = body.value("error", "HTTP " + std::to_string(res.status));
      if (!cred) e += " (" + cred.error() + ")";
      return ckpt::Error{e};
    }
    if (!cred) std::fprintf(stderr, "ckpt-controller: %s: shown what anyone may see (no jobs)\n", cred.error().c_str());
    return body;
  }

  // The status page as this caller may see it (HTML), with the same credential as get().
  ckpt::Result<std::string> page(const std::string& path) const {
    ckpt::Result<std::string> cred = ckpt::Error{""};
    HttpResponse res = read(path, 20, cred);
    if (!res.error.empty()) return ckpt::Error{"cannot reach the controller at " + url + ": " + res.error};
    if (res.status != 200) {
      json body = json::parse(res.body, nullptr, false);
      std::string e = body.is_object() ? body.value("error", "") : "";
      if (e.rfind("ckpt-controller: ", 0) == 0) e = e.substr(17);
      return ckpt::Error{(e.empty() ? "HTTP " + std::to_string(res.status) : e) + (cred ? "" : " (" + cred.error() + ")")};
    }
    if (!cred) std::fprintf(stderr, "ckpt-controller: %s: the page shows what anyone may see (no jobs)\n", cred.error().c_str());
    return res.body;
  }

  ckpt::Result<std::string> admin(const std::string& op, const std::string& arg) const {
    auto cred = munge_encode_payload(json{{"op", op}, {"arg", arg}}.dump(), munge_socket);
    if (!cred) return ckpt::Error{cred.error()};
    HttpResponse res = post_credential(url + "/v1/admin", *cred, 40, /*retries=*/0);
    if (!res.error.empty()) return ckpt::Error{"cannot reach the controller at " + url + ": " + res.error};
    json body = json::parse(res.body, nullptr, false);
    if (body.is_discarded()) return ckpt::Error{"HTTP " + std::to_string(res.status)};
    if (!body.value("ok", false)) {
      std::string e = body.value("error", body.value("message", "refused"));
      if (e.rfind("ckpt-controller: ", 0) == 0) e = e.substr(17);
      return ckpt::Error{e};
    }
    return body.value("message", std::string("done"));
  }
};

std::string when(double t) {
  if (t <= 0) return "-";
  std::time_t secs = static_cast<std::time_t>(t);
  std::tm tm{};
  localtime_r(&secs, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  char out[80];
  std::snprintf(out, sizeof out, "%s.%03d", buf, static_cast<int>((t - static_cast<double>(secs)) * 1000));
  return out;
}

std::string nodes_text(const json& list) {
  std::string out;
  for (const auto& n : list) out += (out.empty() ? "" : ",") + n.get<std::string>();
  return out.empty() ? "-" : out;
}

// "n2:0.48,n4:0.61": the job's slow nodes with their speed relative to the job's best ("-" for none).
std::string slow_text(const json& list) {
  std::string out;
  for (const auto& s : list) {
    char score[32];
    std::snprintf(score, sizeof score, "%.2f", s["score"].get<double>());
    out += (out.empty() ? "" : ",") + s["node"].get<std::string>() + ":" + score;
  }
  return out.empty() ? "-" : out;
}

int cmd_status(const Client& c, bool as_json) {
  auto s = c.get("/v1/status");
  if (!s) return fail(s.error());
  if (as_json) {
    std::printf("%s\n", s->dump(2).c_str());
    return 0;
  }
  const json& j = *s;
  std::printf("controller: backend %s%s, up %s\n", j["backend"].get<std::string>().c_str(),
              j["can_requeue"].get<bool>() ? "" : " (cannot requeue: relies on Slurm's own requeue)",
              ckpt::format_duration(static_cast<std::uint64_t>(j["uptime_s"].get<double>())).c_str());
  std::string counts;
  for (const auto& [state, n] : j["jobs"].items()) counts += (counts.empty() ? "" : ", ") + std::to_string(n.get<int>()) + " " + state;
  std::printf("jobs: %s\n", counts.empty() ? "none" : counts.c_str());
  if (!j["gave_up"].empty()) {
    std::printf("gave up:\n");
    for (const auto& g : j["gave_up"]) {
      std::printf("  job %u: %s\n", g["job_id"].get<unsigned>(), g["reason"].get<std::string>().c_str());
    }
  }
  if (!j["excluded_nodes"].empty()) {
    std::printf("excluded nodes:\n");
    for (const auto& n : j["excluded_nodes"]) {
      std::string jobs;
      for (const auto& id : n["jobs"]) jobs += (jobs.empty() ? "" : ",") + std::to_string(id.get<unsigned>());
      std::printf("  %s (jobs %s) until %s: %s\n", n["node"].get<std::string>().c_str(), jobs.c_str(),
                  when(n["expires"].get<double>()).c_str(), n["reason"].get<std::string>().c_str());
    }
  }
  return 0;
}

int cmd_jobs(const Client& c, bool as_json) {
  auto s = c.get("/v1/jobs");
  if (!s) return fail(s.error());
  if (as_json) {
    std::printf("%s\n", s->dump(2).c_str());
    return 0;
  }
  std::printf("%-10s %-12s %-8s %-11s %-12s %-12s %s\n", "JOB", "STATE", "RESTARTS", "NO-PROGRESS", "EXCLUDED", "SLOW",
              "REASON");
  for (const auto& j : *s) {
    std::string budget = std::to_string(j["restarts_without_progress"].get<std::uint64_t>()) + "/" +
                         std::to_string(j["max_restarts"].get<std::uint64_t>());
    std::printf("%-10u %-12s %-8llu %-11s %-12s %-12s %s\n", j["job_id"].get<unsigned>(),
                j["state"].get<std::string>().c_str(), static_cast<unsigned long long>(j["restarts"].get<std::uint64_t>()),
                budget.c_str(), nodes_text(j["excluded_nodes"]).c_str(),
                slow_text(j.value("slow_nodes", json::array())).c_str(), j["reason"].get<std::string>().c_str());
  }
  return 0;
}

int cmd_history(const Client& c, const std::string& job, bool as_json) {
  auto s = c.get("/v1/jobs/" + job + "/history");
  if (!s) return fail(s.error());
  if (as_json) {
    std::printf("%s\n", s->dump(2).c_str());
    return 0;
  }
  if (s->empty()) return fail("job " + job + " has no history");
  for (const auto& h : *s) {
    std::printf("%s run %u %-10s %s\n", when(h["time"].get<double>()).c_str(), h["restart_count"].get<unsigned>(),
                h["kind"].get<std::string>().c_str(), h["text"].get<std::string>().c_str());
  }
  return 0;
}

// Saves the status page (one job's with `job`) to `out` (mode 0600: it may show private jobs), or prints it.
int cmd_page(const Client& c, const std::string& job, const std::string& out) {
  auto html = c.page(job.empty() ? "/status" : "/status/" + job);
  if (!html) return fail(html.error());
  if (out.empty() || out == "-") {
    std::fwrite(html->data(), 1, html->size(), stdout);
    return 0;
  }
  int fd = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return fail(out + ": " + std::strerror(errno));
  std::size_t off = 0;
  while (off < html->size()) {
    ssize_t n = write(fd, html->data() + off, html->size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      close(fd);
      return fail(out + ": " + std::strerror(err));
    }
    off += static_cast<std::size_t>(n);
  }
  if (close(fd) != 0) return fail(out + ": " + std::strerror(errno));
  std::printf("%s\n", out.c_str());
  return 0;
}

// What the command line asked for: the options, and the subcommands to ask CLI11 about once it has parsed.
struct CommandLine {
  std::string config_path;
  std::string url;
  bool as_json = false;
  std::string job;
  std::string node;
  std::string page_out;
  CLI::App* run = nullptr;
  CLI::App* check = nullptr;
  CLI::App* status = nullptr;
  CLI::App* jobs = nullptr;
  CLI::App* history = nullptr;
  CLI::App* page = nullptr;
  CLI::App* release = nullptr;
  CLI::App* forget = nullptr;
};

// Declares every option and subcommand of `app`, bound to `cl`.
void define_command_line(CLI::App& app, CommandLine& cl) {
  app.set_help_all_flag("--help-all");
  // -c and --url may also follow the subcommand: `ckpt-controller run -c FILE` as well as `-c FILE run`.
  app.fallthrough();
  app.add_option("-c,--config", cl.config_path, "config file (default " + std::string(kDefaultConfig) +
                                                     ", or $CKPT_CONTROLLER_CONFIG)");
  app.add_option("--url", cl.url, "the controller's URL for client commands (default: from the config's listen)");
  cl.run = app.add_subcommand("run", "run the controller in the foreground (the default)");
  cl.check = app.add_subcommand("check-config", "parse the config file and exit");
  cl.status = app.add_subcommand("status", "the controller's state, jobs it gave up on, excluded nodes");
  cl.status->add_flag("--json", cl.as_json, "print JSON");
  cl.jobs = app.add_subcommand("jobs", "every tracked job");
  cl.jobs->add_flag("--json", cl.as_json, "print JSON");
  cl.history = app.add_subcommand("history", "what happened to one job");
  cl.history->add_option("JOB", cl.job, "job id")->required();
  cl.history->add_flag("--json", cl.as_json, "print JSON");
  cl.page = app.add_subcommand("page", "save the status page (HTML, your jobs and their timelines) to a file");
  cl.page->add_option("JOB", cl.job, "one job only");
  cl.page->add_option("-o,--output", cl.page_out, "file to write (mode 0600; default: standard output)");
  cl.release = app.add_subcommand("release", "restart a job the controller gave up on (admins), budget reset");
  cl.release->add_option("JOB", cl.job, "job id")->required();
  cl.forget =
      app.add_subcommand("forget-node", "stop excluding a node (admins); resumes it if the controller drained it");
  cl.forget->add_option("NODE", cl.node, "node name")->required();
  app.require_subcommand(0, 1);
}

// check-config: the config parsed; on libslurm, a warning when Slurm's process tracking cannot see every task.
// Slurm is asked only where its config exists: libslurm retries a missing slurm.conf for a minute, then exits.
int cmd_check_config(const std::string& config_path, const rec::ControllerConfig& cfg) {
  std::printf("%s: ok\n", config_path.c_str());
  if (cfg.backend != "rest") {
    const char* env = std::getenv("SLURM_CONF");
    const std::string slurm_conf = env != nullptr && *env != '\0' ? env : "/etc/slurm/slurm.conf";
    if (::access(slurm_conf.c_str(), R_OK) != 0) {
      std::printf("note: no Slurm config at %s (set SLURM_CONF); Slurm's settings were not checked\n",
                  slurm_conf.c_str());
      return 0;
    }
    if (auto warning = proctrack_warning(make_libslurm_backend()->proctrack_type()); !warning.empty()) {
      std::printf("warning: %s\n", warning.c_str());
    }
  }
  return 0;
}

// The client subcommands, against the controller at --url or the config's listen address.
int run_client(const CLI::App& app, const CommandLine& cl, const rec::ControllerConfig& cfg) {
  Client client;
  client.munge_socket = cfg.munge_socket;
  if (!cl.url.empty()) {
    client.url = cl.url;
  } else {
    if (cfg.listen == "off") return fail("listen = off in " + cl.config_path + ": give --url");
    client.url = "http://" + cfg.listen;
  }
  while (!client.url.empty() && client.url.back() == '/') client.url.pop_back();
  if (app.got_subcommand(cl.status)) return cmd_status(client, cl.as_json);
  if (app.got_subcommand(cl.jobs)) return cmd_jobs(client, cl.as_json);
  if (app.got_subcommand(cl.history)) return cmd_history(client, cl.job, cl.as_json);
  if (app.got_subcommand(cl.page)) return cmd_page(client, cl.job, cl.page_out);
  if (app.got_subcommand(cl.release) || app.got_subcommand(cl.forget)) {
    auto r = app.got_subcommand(cl.release) ? client.admin("release", cl.job) : client.admin("forget-node", cl.node);
    if (!r) return fail(r.error());
    std::printf("%s\n", r->c_str());
    return 0;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // The checkpoint reader, run with a job owner's permissions (see read_checkpoints_as): not a user command.
  if ((argc == 3 || argc == 4) && std::string(argv[1]) == "--read-checkpoints") {
    return checkpoint_reader_main(argv[2], argc == 4 ? argv[3] : "");
  }
  // One RPC to a node's slurmd (see ask_slurmd): the probe of a silent node, and an admin's check by hand.
  if (argc == 3 && std::string(argv[1]) == "--ask-slurmd") return ask_slurmd_main(argv[2]);
  CLI::App app{"ckpt-controller: restarts failed Slurm jobs fast, off bad nodes, within a budget"};
  CommandLine cl;
  define_command_line(app, cl);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  // The config: -c, else $CKPT_CONTROLLER_CONFIG, else the default, which may be absent for a client command.
  bool explicit_config = !cl.config_path.empty();
  if (cl.config_path.empty()) {
    const char* env = std::getenv("CKPT_CONTROLLER_CONFIG");
    cl.config_path = env ? env : kDefaultConfig;
    explicit_config = env != nullptr;
  }
  const bool daemon = app.got_subcommand(cl.run) || app.get_subcommands().empty();
  auto cfg = load_config(cl.config_path, daemon || app.got_subcommand(cl.check) || explicit_config);
  if (!cfg) return fail(cfg.error(), 2);
  if (app.got_subcommand(cl.check)) return cmd_check_config(cl.config_path, *cfg);
  try {
    if (daemon) return run_daemon(*cfg);
    return run_client(app, cl, *cfg);
  } catch (const std::exception& e) {
    return fail(std::string("internal error: ") + e.what());
  }
}
