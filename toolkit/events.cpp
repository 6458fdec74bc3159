// Events for the controller from a compute node: made here, signed with MUNGE, POSTed.
#include "events.hpp"

#include <unistd.h>

#include <cstdlib>

#include "ckpt/clock.hpp"
#include "http.hpp"
#include "munge_auth.hpp"

namespace ckpt::toolkit {

recovery::Event event_from_here(recovery::EventType type, std::uint32_t job, std::uint32_t restart_count) {
  recovery::Event e;
  e.type = type;
  e.job_id = job;
  e.restart_count = restart_count;
  const char* node = std::getenv("SLURMD_NODENAME");
  e.node = node != nullptr ? node : "unknown";
  e.uid = static_cast<std::uint32_t>(::getuid());
  e.time = unix_seconds();
  return e;
}

Status post_event(const std::string& url, const recovery::Event& event, const std::string& munge_socket,
                  double timeout_s) {
  auto credential = munge_encode_payload(recovery::to_json(event), munge_socket);
  if (!credential) return Status::failure("cannot sign it: " + credential.error());
  HttpResponse res = post_credential(url + "/v1/events", *credential, timeout_s);
  if (!res.ok()) return Status::failure("the controller did not take it: " + (res.error.empty() ? res.body : res.error));
  return Status::success();
}

}  // namespace ckpt::toolkit
