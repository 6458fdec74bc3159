#include "server.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/inotify.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <list>
#include <mutex>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt/clock.hpp"
#include "ckpt/controller_limits.hpp"
#include "ckpt/parse.hpp"
#include "engine.hpp"
#include "log.hpp"
#include "munge_auth.hpp"
#include "status_page.hpp"
#include "task_pool.hpp"

namespace ckpt::controller {
using namespace ckpt::toolkit;  // MUNGE, HTTP

using nlohmann::json;
namespace rec = ckpt::recovery;

namespace {

constexpr std::size_t kMaxConnections = 256;
constexpr double kRequestDeadline_s = 2.0;   // the whole request, from accept to its last byte
constexpr double kWriteDeadline_s = 5.0;     // the whole answer
constexpr std::size_t kEventWorkers = 4;
constexpr std::size_t kOtherWorkers = 2;
constexpr std::size_t kQueueLimit = 256;
const rec::HttpLimits kLimits{};

struct Response {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::string headers;  // extra header lines, each ending in \r\n
};

const char* reason_phrase(int status) {
  switch (status) {
    case 200: return "OK";
    case 202: return "Accepted";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Status";
  }
}

std::string serialize(const Response& r) {
  std::string out = "HTTP/1.1 " + std::to_string(r.status) + " " + reason_phrase(r.status) + "\r\n";
  out += "Content-Type: " + r.content_type + "\r\nContent-Length: " + std::to_string(r.body.size()) +
         "\r\nConnection: close\r\n" + r.headers + "\r\n";
  out += r.body;
  return out;
}

Response json_reply(int status, const json& body) { return Response{status, "application/json", body.dump() + "\n", {}}; }

Response error_reply(int status, const std::string& message) {
  return json_reply(status, json{{"ok", false}, {"error", "ckpt-controller: " + message}});
}

Response verdict_reply(const Verdict& v) {
  json body = {{"ok", v.ok()}, {"message", v.message}};
  if (!v.ok()) body["error"] = "ckpt-controller: " + v.message;
  return json_reply(v.http_status, body);
}

// Writes all of `data` within the deadline (the socket is non-blocking), then closes it.
void write_and_close(int fd, const std::string& data, double deadline_s) {
  std::size_t off = 0;
  const double end = unix_seconds() + deadline_s;
  while (off < data.size()) {
    ssize_t n = send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n > 0) {
      off += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      const double left = end - unix_seconds();
      if (left <= 0) break;
      pollfd p{fd, POLLOUT, 0};
      poll(&p, 1, static_cast<int>(left * 1000) + 1);
      continue;
    }
    break;
  }
  shutdown(fd, SHUT_WR);
  close(fd);
}

// Decodes an event credential, then parses the event, then hands it to the engine: nothing about the event is
// looked at before MUNGE vouched for its sender.
Verdict take_event(Engine& engine, const std::string& credential, const std::string& socket, double wait_s) {
  auto decoded = munge_decode_credential(credential, socket);
  if (!decoded) {
    log_limited(LogLevel::Warning, "event-credential", "event refused: " + decoded.error());
    return Verdict{403, decoded.error()};
  }
  auto event = rec::parse_event(decoded->payload);
  if (!event) {
    log_limited(LogLevel::Warning, "event-parse",
                "event from uid " + std::to_string(decoded->uid) + " refused: " + event.error());
    return Verdict{400, event.error()};
  }
  return engine.submit(*event, decoded->uid, wait_s);
}

std::optional<std::uint32_t> job_id_of(const std::string& text) {
  auto id = ckpt::parse_uint(text);
  if (!id || *id == 0 || *id > 0xffffffffULL) return std::nullopt;
  return static_cast<std::uint32_t>(*id);
}

// The status page (status_page.hpp), under the read endpoints' access rules: / and /status list the reader's
// jobs (none without a credential), /status/<id> is one job's page (401 without a credential, as /v1/jobs/<id>).
Response page_reply(Engine& engine, const std::string& path, const rec::ReadAccess& access) {
  std::optional<std::uint32_t> job;
  const std::string prefix = "/status/";
  const std::string rest = path.rfind(prefix, 0) == 0 ? path.substr(prefix.size()) : "";
  if (path.rfind(prefix, 0) == 0) {
    job = job_id_of(rest);
    if (!job) return error_reply(400, "bad job id '" + rest.substr(0, 32) + "'");
    if (!access.uid) {
      return error_reply(401, "reading job " + rest + " needs a MUNGE credential (" + kCredentialHeader + " header)");
    }
  }
  auto html = render_status_page(engine, access, unix_seconds(), job);
  if (!html) return error_reply(404, "job " + rest + " is not tracked, or not yours");
  return Response{200, "text/html; charset=utf-8", std::move(*html), kStatusPageHeaders};
}

struct Connection {
  int fd = -1;
  double accepted = 0;
  std::string buffer;
  std::optional<std::size_t> body_start;
  rec::HttpHead head;
};

}  // namespace

struct Server::Impl {
  Impl(Engine& e, std::string s) : engine(e), socket(std::move(s)), events(kEventWorkers, kQueueLimit),
                                   others(kOtherWorkers, kQueueLimit) {}
  Engine& engine;
  std::string socket;
  int listen_fd = -1;
  int wake[2] = {-1, -1};
  std::atomic<bool> stopping{false};
  std::thread thread;
  std::list<Connection> connections;
  TaskPool events;  // bounded: a full queue answers 503
  TaskPool others;

  void loop();
  void accept_all();
  // Reads what is there; returns false when the connection was answered or closed.
  bool read_some(Connection& c);
  void refuse(Connection& c, int status, const std::string& why, const char* kind);
  void dispatch(Connection& c);
  Response handle(const rec::HttpHead& head, const std::string& body);
  Response handle_read(const rec::HttpHead& head);
  Response handle_signed_read(const rec::HttpHead& head);
  std::optional<std::uint32_t> reader_uid(const rec::HttpHead& head, std::string& error);
};

void Server::Impl::refuse(Connection& c, int status, const std::string& why, const char* kind) {
  log_limited(LogLevel::Warning, kind, "request refused (HTTP " + std::to_string(status) + "): " + why);
  // The answer is small: it fits the socket buffer, so the reading thread never waits for a slow client.
  const std::string data = serialize(error_reply(status, why));
  (void)!send(c.fd, data.data(), data.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  shutdown(c.fd, SHUT_RDWR);
  close(c.fd);
  c.fd = -1;
}

void Server::Impl::accept_all() {
  for (int i = 0; i < 64; ++i) {
    int fd = accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    if (connections.size() >= kMaxConnections) {
      // Full: the oldest unfinished request has had the longest to arrive; it gives its place up.
      Connection& oldest = connections.front();
      log_limited(LogLevel::Warning, "connections",
                  "request refused: " + std::to_string(kMaxConnections) +
                      " connections are open; closed the oldest unfinished one");
      close(oldest.fd);
      connections.pop_front();
    }
    Connection c;
    c.fd = fd;
    c.accepted = unix_seconds();
    connections.push_back(std::move(c));
  }
}

bool Server::Impl::read_some(Connection& c) {
  char buf[16384];
  for (;;) {
    std::size_t want = sizeof buf;
    if (c.body_start) {
      want = std::min(want, *c.body_start + c.head.content_length - c.buffer.size());
    } else {
      want = std::min(want, kLimits.max_head + 4 - c.buffer.size());
    }
    if (want == 0) break;
    ssize_t n = recv(c.fd, buf, want, 0);
    if (n == 0) {  // the client gave up
      close(c.fd);
      c.fd = -1;
      return false;
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
      close(c.fd);
      c.fd = -1;
      return false;
    }
    c.buffer.append(buf, static_cast<std::size_t>(n));
    if (!c.body_start) {
      auto end = rec::http_head_end(c.buffer);
      if (!end) {
        if (c.buffer.size() > kLimits.max_head) {
          refuse(c, 431, "request head is larger than " + std::to_string(kLimits.max_head) + " bytes", "head-size");
          return false;
        }
        continue;
      }
      auto parsed = rec::parse_http_head(std::string_view(c.buffer).substr(0, *end), kLimits);
      if (!parsed.ok()) {
        refuse(c, parsed.status, parsed.error, "head");
        return false;
      }
      c.head = std::move(parsed.head);
      c.body_start = *end;
      if (c.buffer.size() > *end + c.head.content_length) {
        refuse(c, 400, "more bytes than Content-Length (one request per connection)", "head");
        return false;
      }
    }
    if (c.buffer.size() == *c.body_start + c.head.content_length) break;
  }
  if (c.body_start && c.buffer.size() == *c.body_start + c.head.content_length) {
    dispatch(c);
    return false;
  }
  return true;
}

void Server::Impl::dispatch(Connection& c) {
  const int fd = c.fd;
  c.fd = -1;
  const bool event = c.head.target == "/v1/events";
  if (c.head.target == "/healthz") {  // cheap and lock-free: answered by the reading thread itself
    write_and_close(fd, serialize(Response{200, "text/plain", "ok\n", {}}), 0.1);
    return;
  }
  auto head = std::make_shared<rec::HttpHead>(std::move(c.head));
  auto body = std::make_shared<std::string>(c.buffer.substr(*c.body_start));
  c.buffer.clear();
  auto task = [this, fd, head, body] {
    Response r;
    try {
      r = handle(*head, *body);
    } catch (const std::exception& e) {
      log_error(std::string("internal error: ") + e.what());
      r = error_reply(500, std::string("internal error: ") + e.what());
    }
    write_and_close(fd, serialize(r), kWriteDeadline_s);
  };
  if (!(event ? events : others).post(task)) {
    log_limited(LogLevel::Warning, "queue", std::string("request refused (HTTP 503): the ") +
                                                (event ? "event" : "read") + " queue is full");
    const std::string data = serialize(error_reply(503, "busy; try again"));
    (void)!send(fd, data.data(), data.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    close(fd);
  }
}

std::optional<std::uint32_t> Server::Impl::reader_uid(const rec::HttpHead& head, std::string& error) {
  auto it = head.headers.find(header_key(kCredentialHeader));
  if (it == head.headers.end()) return std::nullopt;
  auto decoded = munge_decode_credential(it->second, socket);
  if (!decoded) {
    error = decoded.error();
    return std::nullopt;
  }
  if (decoded->payload != read_credential_payload(head.target)) {
    error = std::string(kCredentialHeader) + " was made for another request";
    return std::nullopt;
  }
  return decoded->uid;
}

// A read that came with a credential is answered with one of the controller's own, bound to that credential and
// to the body (munge_auth.hpp): ckpt-run on a compute node believes no answer without it.
Response Server::Impl::handle_signed_read(const rec::HttpHead& head) {
  Response r = handle_read(head);
  auto it = head.headers.find(header_key(kCredentialHeader));
  if (it == head.headers.end()) return r;
  auto signature = munge_encode_payload(reply_credential_payload(it->second, r.body), socket);
  if (!signature) {
    log_limited(LogLevel::Warning, "reply-credential", "cannot sign the answer to " + head.target + ": " + signature.error());
    return r;
  }
  r.headers += std::string(kReplyCredentialHeader) + ": " + *signature + "\r\n";
  return r;
}

Response Server::Impl::handle_read(const rec::HttpHead& head) {
  const std::string& path = head.target;
  if (path == "/metrics") {
    return Response{200, "text/plain; version=0.0.4", engine.metrics_text(unix_seconds()), {}};
  }
  std::string error;
  auto uid = reader_uid(head, error);
  if (!error.empty()) {
    log_limited(LogLevel::Warning, "read-credential", "read of " + path + " refused: " + error);
    return error_reply(403, error);
  }
  const rec::ReadAccess access = engine.read_access(uid);
  if (path == "/" || path == "/status" || path.rfind("/status/", 0) == 0) return page_reply(engine, path, access);
  if (path == "/v1/status") return json_reply(200, engine.status_json(unix_seconds(), access));
  if (path == "/v1/jobs") return json_reply(200, engine.jobs_json(unix_seconds(), access));
  const std::string prefix = "/v1/jobs/";
  if (path.rfind(prefix, 0) != 0) return error_reply(404, "no such page: " + path);
  std::string rest = path.substr(prefix.size());
  bool history = false;
  if (auto slash = rest.find('/'); slash != std::string::npos) {
    if (rest.substr(slash) != "/history") return error_reply(404, "no such page: " + path);
    history = true;
    rest.resize(slash);
  }
  auto id = job_id_of(rest);
  if (!id) return error_reply(400, "bad job id '" + rest.substr(0, 32) + "'");
  if (!access.uid) {
    return error_reply(401, "reading job " + rest + " needs a MUNGE credential (" + kCredentialHeader + " header)");
  }
  const std::string unknown = "job " + rest + " is not tracked, or not yours";
  if (history) {
    auto lines = engine.history_json(*id, access);
    if (!lines) return error_reply(500, lines.error());
    if (!*lines) return error_reply(404, unknown);
    return json_reply(200, **lines);
  }
  auto job = engine.job_json(*id, unix_seconds(), access);
  if (!job) return error_reply(404, unknown);
  return json_reply(200, *job);
}

Response Server::Impl::handle(const rec::HttpHead& head, const std::string& body) {
  const std::string& path = head.target;
  if (path == "/v1/events" || path == "/v1/admin") {
    if (head.method != "POST") return error_reply(405, path + " takes POST");
    std::string credential = body;
    while (!credential.empty() && (credential.back() == '\n' || credential.back() == '\r')) credential.pop_back();
    if (path == "/v1/events") {
      // Wait briefly for the verdict so that a forged event is answered 403; the plugin itself times out in 1 s
      // and never depends on the answer.
      return verdict_reply(take_event(engine, credential, socket, 2.0));
    }
    auto decoded = munge_decode_credential(credential, socket);
    if (!decoded) {
      log_limited(LogLevel::Warning, "admin-credential", "admin request refused: " + decoded.error());
      return verdict_reply(Verdict{403, decoded.error()});
    }
    json payload = json::parse(decoded->payload, nullptr, false);
    if (payload.is_discarded() || !payload.is_object() || !payload["op"].is_string() || !payload["arg"].is_string()) {
      return verdict_reply(Verdict{400, "admin request is not {\"op\":..., \"arg\":...}"});
    }
    return verdict_reply(engine.admin(payload["op"], payload["arg"], decoded->uid, 30.0));
  }
  if (head.method != "GET") return error_reply(405, path + " takes GET");
  return handle_signed_read(head);
}

void Server::Impl::loop() {
  std::vector<pollfd> fds;
  while (!stopping.load()) {
    fds.clear();
    fds.push_back(pollfd{listen_fd, POLLIN, 0});
    fds.push_back(pollfd{wake[0], POLLIN, 0});
    double next_deadline = unix_seconds() + 1.0;
    for (const auto& c : connections) {
      fds.push_back(pollfd{c.fd, POLLIN, 0});
      next_deadline = std::min(next_deadline, c.accepted + kRequestDeadline_s);
    }
    const int timeout_ms = std::max(0, static_cast<int>((next_deadline - unix_seconds()) * 1000) + 1);
    int n = poll(fds.data(), fds.size(), timeout_ms);
    if (n < 0 && errno != EINTR) {
      log_error(std::string("listen: poll failed: ") + std::strerror(errno));
      return;
    }
    if (stopping.load()) break;
    // Connections first (their poll entries are in order), then new ones, so that accepting cannot evict a
    // connection whose data is already here.
    std::size_t i = 2;
    const double now = unix_seconds();
    for (auto it = connections.begin(); it != connections.end(); ++i) {
      Connection& c = *it;
      bool keep = true;
      if (n > 0 && i < fds.size() && fds[i].fd == c.fd && fds[i].revents != 0) keep = read_some(c);
      if (keep && now - c.accepted > kRequestDeadline_s) {
        refuse(c, 408, "request not complete within " + ckpt::format_duration(static_cast<std::uint64_t>(kRequestDeadline_s)) +
                           " of connecting (" + std::to_string(c.buffer.size()) + " bytes arrived)", "slow");
        keep = false;
      }
      if (keep) {
        ++it;
      } else {
        if (c.fd >= 0) close(c.fd);
        it = connections.erase(it);
      }
    }
    if (n > 0 && (fds[0].revents & POLLIN) != 0) accept_all();
  }
  for (auto& c : connections) close(c.fd);
  connections.clear();
}

Server::Server(Engine& engine, std::string munge_socket) : impl_(new Impl(engine, std::move(munge_socket))) {}

Server::~Server() { stop(); }

Status Server::listen(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string where = host + ":" + std::to_string(port);
  if (int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), std::to_string(port).c_str(), &hints, &res); rc != 0) {
    return Status::failure("listen: cannot bind " + where + ": " + gai_strerror(rc));
  }
  int fd = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int yes = 1;
  // SO_REUSEADDR only: SO_REUSEPORT would let a second controller share the port unnoticed.
  if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  if (fd < 0 || bind(fd, res->ai_addr, res->ai_addrlen) != 0 || ::listen(fd, 512) != 0) {
    const int err = errno;
    if (fd >= 0) close(fd);
    freeaddrinfo(res);
    return Status::failure("listen: cannot bind " + where + ": " + std::strerror(err));
  }
  freeaddrinfo(res);
  if (pipe2(impl_->wake, O_CLOEXEC | O_NONBLOCK) != 0) {
    close(fd);
    return Status::failure(std::string("listen: cannot create a pipe: ") + std::strerror(errno));
  }
  impl_->listen_fd = fd;
  impl_->thread = std::thread([this] { impl_->loop(); });
  return Status::success();
}

void Server::stop() {
  if (!impl_) return;
  impl_->stopping = true;
  if (impl_->wake[1] >= 0) (void)!write(impl_->wake[1], "x", 1);
  if (impl_->thread.joinable()) impl_->thread.join();
  impl_->events.stop();
  impl_->others.stop();
  for (int* fd : {&impl_->listen_fd, &impl_->wake[0], &impl_->wake[1]}) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
  }
}

// ---- the spool directory ---------------------------------------------------------------------------------------------

struct SpoolWatcher::Impl {
  Impl(Engine& e, std::string d, std::string s) : engine(e), dir(std::move(d)), socket(std::move(s)) {}
  Engine& engine;
  std::string dir;
  std::string socket;
  std::atomic<bool> stop{false};
  int dir_fd = -1;
  int inotify_fd = -1;
  std::thread thread;

  void drain() {
    int list_fd = openat(dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (list_fd < 0) return;
    DIR* d = fdopendir(list_fd);
    if (d == nullptr) {
      close(list_fd);
      return;
    }
    std::vector<std::string> names;
    while (dirent* e = readdir(d)) {
      std::string name = e->d_name;
      if (name.size() > 3 && name.compare(name.size() - 3, 3, ".ev") == 0 && name[0] != '.') names.push_back(name);
      if (names.size() >= 10000) break;  // the rest on the next round
    }
    closedir(d);
    std::sort(names.begin(), names.end());
    for (const auto& name : names) {
      int fd = openat(dir_fd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
      std::string body;
      if (fd >= 0) {
        struct stat st {};
        if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size <= static_cast<off_t>(kLimits.max_body)) {
          char buf[8192];
          ssize_t n;
          while ((n = read(fd, buf, sizeof buf)) > 0 && body.size() <= kLimits.max_body) {
            body.append(buf, static_cast<std::size_t>(n));
          }
        } else {
          log_limited(LogLevel::Warning, "spool-file", "spool file " + name + " ignored: not a regular file of at most " +
                                                           std::to_string(kLimits.max_body) + " bytes");
        }
        close(fd);
      }
      unlinkat(dir_fd, name.c_str(), 0);
      while (!body.empty() && (body.back() == '\n' || body.back() == '\r')) body.pop_back();
      if (!body.empty() && body.size() <= kLimits.max_body) take_event(engine, body, socket, 0);
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
  const mode_t old = umask(0);
  const bool created = mkdir(dir.c_str(), 01733) == 0;
  const int mkdir_errno = errno;
  umask(old);
  if (!created && mkdir_errno != EEXIST) {
    return Status::failure("spool_dir: cannot create " + dir + ": " + std::strerror(mkdir_errno));
  }
  // From here on the directory is reached only through this descriptor: a rename or a symlink swapped in later
  // changes nothing.
  int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    return Status::failure("spool_dir: cannot open " + dir + ": " + std::strerror(errno) +
                           (errno == ELOOP || errno == ENOTDIR ? " (it must be a directory, not a link)" : ""));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISDIR(st.st_mode)) {
    close(fd);
    return Status::failure("spool_dir: " + dir + " is not a directory");
  }
  if (st.st_uid != geteuid()) {
    close(fd);
    return Status::failure("spool_dir: " + dir + " is owned by uid " + std::to_string(st.st_uid) +
                           ", not by the controller (uid " + std::to_string(geteuid()) + "): refusing it");
  }
  if ((st.st_mode & 07777) != 01733 && fchmod(fd, 01733) != 0) {
    close(fd);
    return Status::failure("spool_dir: cannot set mode 1733 on " + dir + ": " + std::strerror(errno));
  }
  impl_->dir_fd = fd;
  impl_->inotify_fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  if (impl_->inotify_fd >= 0) {
    const std::string self = "/proc/self/fd/" + std::to_string(fd);
    inotify_add_watch(impl_->inotify_fd, self.c_str(), IN_MOVED_TO | IN_CLOSE_WRITE);
  }
  impl_->thread = std::thread([this] { impl_->run(); });
  return Status::success();
}

void SpoolWatcher::stop() {
  if (!impl_) return;
  impl_->stop = true;
  if (impl_->thread.joinable()) impl_->thread.join();
  if (impl_->inotify_fd >= 0) close(impl_->inotify_fd);
  impl_->inotify_fd = -1;
  if (impl_->dir_fd >= 0) close(impl_->dir_fd);
  impl_->dir_fd = -1;
}

}  // namespace ckpt::controller
