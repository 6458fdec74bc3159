#pragma once
// The controller's HTTP endpoint (cpp-httplib): events from the plugin and ckpt-run, the client subcommands,
// and Prometheus' /metrics. Events and admin requests carry MUNGE credentials; reads are open to whoever can
// reach the listen address (127.0.0.1 by default).
//
//   POST /v1/events                  body: a MUNGE credential whose payload is an event (JSON)
//   POST /v1/admin                   body: a MUNGE credential, payload {"op":"release"|"forget-node","arg":...}
//   GET  /v1/status | /v1/jobs | /v1/jobs/<id> | /v1/jobs/<id>/history | /metrics | /healthz
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
// engine and deletes them. Creates the directory (mode 1733: anyone may drop, nobody else may list).
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
