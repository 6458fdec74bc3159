#pragma once
// A small libcurl client: one request, a hard timeout, no redirects followed, no proxy from the environment
// unless asked. Used for slurmrestd, webhooks, the client subcommands and ckpt-run. Never throws.
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace ckpt::controller {

struct HttpResponse {
  long status = 0;        // 0 when no response arrived
  std::string body;
  std::string error;      // transport error ("Connection refused", "Timeout was reached"), empty otherwise
  std::map<std::string, std::string> headers;  // names in lower case; at most 64 KiB of them kept
  bool ok() const { return error.empty() && status >= 200 && status < 300; }
};

struct HttpRequest {
  std::string method = "GET";
  std::string url;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  std::string content_type = "application/json";
  double timeout_s = 5;
};

// Calls curl_global_init once; safe from several threads.
void http_global_init();
HttpResponse http_request(const HttpRequest& request);

}  // namespace ckpt::controller
