#pragma once
// The controller's HTTP endpoint: events from the plugin and ckpt-run, the client subcommands, and Prometheus'
// /metrics. A small HTTP/1.1 reader of its own, because everything that reaches it comes from users' jobs:
//
//   - one thread reads every connection (poll); a request must arrive whole within 2 s of the connection, with a
//     head of at most 16 KiB and a Content-Length body of at most 64 KiB (no chunked bodies): memory is bounded
//     by the connection limit times those sizes, whatever a client sends;
//   - at most 256 connections; when full, the oldest unfinished one is closed for the new one, so slow clients
//     cannot lock anyone out;
//   - a complete request goes to a worker pool: events have their own workers, reads and admin requests others,
//     so that reads cannot starve event intake; a full queue answers 503 at once;
//   - one request per connection (Connection: close).
//
//   POST /v1/events                  body: a MUNGE credential whose payload is an event (JSON)
//   POST /v1/admin                   body: a MUNGE credential, payload {"op":"release"|"forget-node","arg":...}
//   GET  /v1/status | /v1/jobs | /v1/jobs/<id> | /v1/jobs/<id>/history
//                                    header X-Ckpt-Credential: a MUNGE credential with payload "GET <path>";
//                                    each user sees their own jobs, root, SlurmUser and admin_users all; without
//                                    one, status has counts only, jobs is empty and a job's pages answer 401
//   GET  / | /status | /status/<id>  the status page (status_page.hpp): HTML with the same access rules
//   GET  /metrics | /healthz         open: counts by state and node names, no job ids or users
#include <memory>
#include <string>

#include "ckpt/result.hpp"

namespace ckpt::controller {

class Engine;

class Server {
 public:
  Server(Engine& engine, std::string munge_socket);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;
  // Binds host:port; the error names the address.
  Status listen(const std::string& host, int port);
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Watches a spool directory for event files (<anything>.ev holding one MUNGE credential), hands them to the
// engine and deletes them. Creates the directory (mode 1733: anyone may drop, nobody else may list), opens it
// once by descriptor and refuses one that another user owns; every file is opened relative to it.
class SpoolWatcher {
 public:
  SpoolWatcher(Engine& engine, std::string dir, std::string munge_socket);
  ~SpoolWatcher();
  SpoolWatcher(const SpoolWatcher&) = delete;
  SpoolWatcher& operator=(const SpoolWatcher&) = delete;
  Status start();
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ckpt::controller
