#include "http.hpp"

#include <curl/curl.h>

#include <cctype>
#include <chrono>
#include <thread>
#include <map>
#include <mutex>
#include <string>

namespace ckpt::toolkit {

namespace {

std::size_t on_body(char* data, std::size_t size, std::size_t count, void* user) {
  auto* body = static_cast<std::string*>(user);
  const std::size_t n = size * count;
  if (body->size() + n > 64 * 1024 * 1024) return 0;  // refuse absurd answers
  body->append(data, n);
  return n;
}

// One response header line into the map (lower-case name, trimmed value); a server that sends more than 64 KiB
// of headers has the rest dropped.
std::size_t on_header(char* data, std::size_t size, std::size_t count, void* user) {
  auto* headers = static_cast<std::map<std::string, std::string>*>(user);
  const std::size_t n = size * count;
  std::size_t kept = 0;
  for (const auto& [k, v] : *headers) kept += k.size() + v.size();
  const std::string line(data, n);
  const auto colon = line.find(':');
  if (colon == std::string::npos || kept + n > 64 * 1024) return n;
  std::string name = line.substr(0, colon);
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  std::string value = line.substr(colon + 1);
  const auto first = value.find_first_not_of(" \t");
  const auto last = value.find_last_not_of(" \t\r\n");
  value = first == std::string::npos ? std::string() : value.substr(first, last - first + 1);
  (*headers)[name] = value;
  return n;
}

}  // namespace

void http_global_init() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

HttpResponse http_request(const HttpRequest& request) {
  http_global_init();
  HttpResponse response;
  CURL* curl = curl_easy_init();
  if (curl == nullptr) {
    response.error = "cannot initialize libcurl";
    return response;
  }
  curl_slist* headers = nullptr;
  for (const auto& [name, value] : request.headers) {
    headers = curl_slist_append(headers, (name + ": " + value).c_str());
  }
  if (!request.body.empty() || request.method == "POST") {
    headers = curl_slist_append(headers, ("Content-Type: " + request.content_type).c_str());
  }
  headers = curl_slist_append(headers, "Expect:");  // no 100-continue round trip
  const long timeout_ms = static_cast<long>(request.timeout_s * 1000);
  curl_easy_setopt(curl, CURLOPT_URL, request.url.c_str());
  curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, request.method.c_str());
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  if (request.method == "POST" || !request.body.empty()) {
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, request.body.c_str());
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(request.body.size()));
  }
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, timeout_ms);
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, timeout_ms);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);  // threads: no SIGALRM for DNS timeouts
  curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 0L);
  curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &response.body);
  curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, &response.headers);
  char error[CURL_ERROR_SIZE] = {0};
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, error);
  CURLcode rc = curl_easy_perform(curl);
  if (rc != CURLE_OK) {
    response.error = error[0] ? error : curl_easy_strerror(rc);
    response.dropped = rc == CURLE_GOT_NOTHING || rc == CURLE_RECV_ERROR || rc == CURLE_SEND_ERROR;
  } else {
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &response.status);
  }
  curl_slist_free_all(headers);
  curl_easy_cleanup(curl);
  return response;
}

HttpResponse post_credential(const std::string& url, const std::string& credential, double timeout_s, int retries) {
  HttpRequest request;
  request.method = "POST";
  request.url = url;
  request.body = credential;
  request.content_type = "text/plain";
  request.timeout_s = timeout_s;
  HttpResponse response = http_request(request);
  for (int retry = 0; retry < retries; ++retry) {
    if (!(response.dropped || response.status == 503 || response.status == 429)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100 << retry));
    response = http_request(request);
  }
  return response;
}

}  // namespace ckpt::toolkit
