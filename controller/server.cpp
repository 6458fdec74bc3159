#include "server.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <poll.h>
#include <thread>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "ckpt/parse.hpp"
#include "engine.hpp"
#include "log.hpp"
#include "munge_auth.hpp"

namespace ckpt::controller {

using nlohmann::json;

namespace {

constexpr std::size_t kMaxBody = 64 * 1024;

void reply(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(body.dump() + "\n", "application/json");
}

void reply_verdict(httplib::Response& res, const Verdict& v) {
  json body = {{"ok", v.ok()}, {"message", v.message}};
  if (!v.ok()) body["error"] = "ckpt-controller: " + v.message;
  reply(res, v.http_status, body);
}

// Decodes an event credential and hands it to the engine. Returns the verdict.
Verdict take_event(Engine& engine, const std::string& credential, const std::string& socket, double wait_s) {
  auto decoded = munge_decode_credential(credential, socket);
  if (!decoded) {
    log_warning("event refused: " + decoded.error());
    return Verdict{403, decoded.error()};
  }
  auto event = ckpt::recovery::parse_event(decoded->payload);
  if (!event) {
    log_warning("event from uid " + std::to_string(decoded->uid) + " refused: " + event.error());
    return Verdict{400, event.error()};
  }
  return engine.submit(*event, decoded->uid, wait_s);
}

std::optional<std::uint32_t> job_id_of(const std::string& text) {
  auto id = ckpt::parse_uint(text);
  if (!id || *id == 0 || *id > 0xffffffffULL) return std::nullopt;
  return static_cast<std::uint32_t>(*id);
}

}  // namespace

struct Server::Impl {
  Engine& engine;
  std::string socket;
  httplib::Server http;
  std::thread thread;
};

Server::Server(Engine& engine, std::string munge_socket) : impl_(new Impl{engine, std::move(munge_socket), {}, {}}) {
  auto& http = impl_->http;
  Impl* impl = impl_.get();
  // httplib's default adds SO_REUSEPORT, which would let a second controller share the port unnoticed.
  http.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  http.set_payload_max_length(kMaxBody);
  http.set_read_timeout(5, 0);
  http.set_write_timeout(5, 0);
  http.set_keep_alive_max_count(100);
  http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "internal error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = std::string("internal error: ") + e.what();
    } catch (...) {
    }
    log_error(what);
    reply(res, 500, json{{"ok", false}, {"error", "ckpt-controller: " + what}});
  });
  http.Post("/v1/events", [impl](const httplib::Request& req, httplib::Response& res) {
    // Wait briefly for the verdict so that a forged event is answered 403; the plugin itself times out in 1 s
    // and never depends on the answer.
    reply_verdict(res, take_event(impl->engine, req.body, impl->socket, 2.0));
  });
  http.Post("/v1/admin", [impl](const httplib::Request& req, httplib::Response& res) {
    auto decoded = munge_decode_credential(req.body, impl->socket);
    if (!decoded) return reply_verdict(res, Verdict{403, decoded.error()});
    json payload = json::parse(decoded->payload, nullptr, false);
    if (payload.is_discarded() || !payload.is_object() || !payload["op"].is_string() || !payload["arg"].is_string()) {
      return reply_verdict(res, Verdict{400, "admin request is not {\"op\":..., \"arg\":...}"});
    }
    reply_verdict(res, impl->engine.admin(payload["op"], payload["arg"], decoded->uid, 30.0));
  });
  http.Get("/v1/status", [impl](const httplib::Request&, httplib::Response& res) {
    reply(res, 200, impl->engine.status_json(now_s()));
  });
  http.Get("/v1/jobs", [impl](const httplib::Request&, httplib::Response& res) {
    reply(res, 200, impl->engine.jobs_json(now_s()));
  });
  http.Get(R"(/v1/jobs/(\d+))", [impl](const httplib::Request& req, httplib::Response& res) {
    auto id = job_id_of(req.matches[1]);
    if (!id) return reply(res, 400, json{{"ok", false}, {"error", "ckpt-controller: bad job id"}});
    auto job = impl->engine.job_json(*id, now_s());
    if (!job) return reply(res, 404, json{{"ok", false}, {"error", "ckpt-controller: job " + std::string(req.matches[1]) + " is not tracked"}});
    reply(res, 200, *job);
  });
  http.Get(R"(/v1/jobs/(\d+)/history)", [impl](const httplib::Request& req, httplib::Response& res) {
    auto id = job_id_of(req.matches[1]);
    if (!id) return reply(res, 400, json{{"ok", false}, {"error", "ckpt-controller: bad job id"}});
    auto history = impl->engine.history_json(*id);
    if (!history) return reply(res, 500, json{{"ok", false}, {"error", "ckpt-controller: " + history.error()}});
    reply(res, 200, *history);
  });
  http.Get("/metrics", [impl](const httplib::Request&, httplib::Response& res) {
    res.set_content(impl->engine.metrics_text(now_s()), "text/plain; version=0.0.4");
  });
  http.Get("/healthz", [](const httplib::Request&, httplib::Response& res) { res.set_content("ok\n", "text/plain"); });
}

Server::~Server() { stop(); }

Status Server::listen(const std::string& host, int port) {
  if (!impl_->http.bind_to_port(host, port)) {
    return Status::failure("listen: cannot bind " + host + ":" + std::to_string(port) + ": " + std::strerror(errno));
  }
  impl_->thread = std::thread([this] { impl_->http.listen_after_bind(); });
  return Status::success();
}

void Server::stop() {
  if (!impl_) return;
  impl_->http.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

// ---- the spool directory ---------------------------------------------------------------------------------------------

struct SpoolWatcher::Impl {
  Impl(Engine& e, std::string d, std::string s) : engine(e), dir(std::move(d)), socket(std::move(s)) {}
  Engine& engine;
  std::string dir;
  std::string socket;
  std::atomic<bool> stop{false};
  int inotify_fd = -1;
  std::thread thread;

  void drain() {
    DIR* d = opendir(dir.c_str());
    if (d == nullptr) return;
    std::vector<std::string> names;
    while (dirent* e = readdir(d)) {
      std::string name = e->d_name;
      if (name.size() > 3 && name.compare(name.size() - 3, 3, ".ev") == 0 && name[0] != '.') names.push_back(name);
    }
    closedir(d);
    std::sort(names.begin(), names.end());
    for (const auto& name : names) {
      const std::string path = dir + "/" + name;
      int fd = open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
      std::string body;
      if (fd >= 0) {
        struct stat st {};
        if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size <= static_cast<off_t>(kMaxBody)) {
          char buf[8192];
          ssize_t n;
          while ((n = read(fd, buf, sizeof buf)) > 0) body.append(buf, static_cast<std::size_t>(n));
        }
        close(fd);
      }
      unlink(path.c_str());
      while (!body.empty() && (body.back() == '\n' || body.back() == '\r')) body.pop_back();
      if (!body.empty()) take_event(engine, body, socket, 0);
    }
  }

  void run() {
    while (!stop.load()) {
      drain();
      if (inotify_fd >= 0) {
        pollfd p{inotify_fd, POLLIN, 0};
        if (poll(&p, 1, 1000) > 0) {
          char buf[4096];
          while (read(inotify_fd, buf, sizeof buf) > 0) {
          }
        }
      } else {
        usleep(200 * 1000);
      }
    }
  }
};

SpoolWatcher::SpoolWatcher(Engine& engine, std::string dir, std::string munge_socket)
    : impl_(std::make_unique<Impl>(engine, std::move(dir), std::move(munge_socket))) {}

SpoolWatcher::~SpoolWatcher() { stop(); }

Status SpoolWatcher::start() {
  const std::string& dir = impl_->dir;
  if (mkdir(dir.c_str(), 01733) != 0 && errno != EEXIST) {
    return Status::failure("spool_dir: cannot create " + dir + ": " + std::strerror(errno));
  }
  struct stat st {};
  if (lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return Status::failure("spool_dir: " + dir + " is not a directory");
  chmod(dir.c_str(), 01733);
  impl_->inotify_fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  if (impl_->inotify_fd >= 0) inotify_add_watch(impl_->inotify_fd, dir.c_str(), IN_MOVED_TO | IN_CLOSE_WRITE);
  impl_->thread = std::thread([this] { impl_->run(); });
  return Status::success();
}

void SpoolWatcher::stop() {
  if (!impl_) return;
  impl_->stop = true;
  if (impl_->thread.joinable()) impl_->thread.join();
  if (impl_->inotify_fd >= 0) close(impl_->inotify_fd);
  impl_->inotify_fd = -1;
}

}  // namespace ckpt::controller
