#pragma once
// A small libcurl client: one request, a hard timeout, no redirects followed, no signals. Used for slurmrestd,
// webhooks, the client subcommands, ckpt-run and the plugin's reports. Never throws.
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace ckpt::toolkit {

struct HttpResponse {
  long status = 0;        // 0 when no response arrived
  std::string body;
  std::string error;      // transport error ("Connection refused", "Timeout was reached"), empty otherwise
  std::map<std::string, std::string> headers;  // names in lower case; at most 64 KiB of them kept
  bool dropped = false;   // the server took the connection and closed it unanswered (its connection limit)
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

// POSTs a MUNGE credential (text/plain) to `url`. A server that answers "busy" (503, 429: its intake is full, as
// another user's flood can make it) or drops the connection is asked again after 100, 200 and 400 ms (`retries`
// times at most), so that a report is not lost to a moment's load; one that does not answer at all is not asked
// again (it is down or cut off, and the caller must not wait on it).
HttpResponse post_credential(const std::string& url, const std::string& credential, double timeout_s,
                             int retries = 3);

}  // namespace ckpt::toolkit
