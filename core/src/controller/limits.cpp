// The controller's defences as pure logic: bounded HTTP heads, rate-limited complaints, the cache of job ids
// Slurm did not know, the weighing of probe results and read access.
#include "ckpt/controller_limits.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "ckpt/parse.hpp"

namespace ckpt::recovery {

// ---- HTTP request heads ---------------------------------------------------------------------------------------

namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

bool token_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

HttpHeadResult refuse(int status, std::string why) {
  HttpHeadResult r;
  r.status = status;
  r.error = std::move(why);
  return r;
}

}  // namespace

std::optional<std::size_t> http_head_end(std::string_view buffer) {
  for (std::size_t i = 0; i < buffer.size(); ++i) {
    if (buffer[i] != '\n') continue;
    if (i + 1 < buffer.size() && buffer[i + 1] == '\n') return i + 2;
    if (i + 2 < buffer.size() && buffer[i + 1] == '\r' && buffer[i + 2] == '\n') return i + 3;
  }
  return std::nullopt;
}

namespace {

// The next line of `head` from `pos`, without its line end (LF or CRLF); moves `pos` past it.
std::string_view next_line(std::string_view head, std::size_t& pos) {
  auto nl = head.find('\n', pos);
  if (nl == std::string_view::npos) nl = head.size();
  std::string_view line = head.substr(pos, nl - pos);
  pos = nl + 1;
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  return line;
}

// "METHOD /path HTTP/1.x" into `head` (the path without its query); a result that is not ok() is the refusal.
HttpHeadResult parse_request_line(std::string_view line, HttpHead& head) {
  auto sp1 = line.find(' ');
  auto sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp1 == std::string_view::npos || sp2 == std::string_view::npos || line.find(' ', sp2 + 1) != std::string_view::npos) {
    return refuse(400, "malformed request line");
  }
  std::string_view method = line.substr(0, sp1);
  std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  std::string_view version = line.substr(sp2 + 1);
  if (method.empty() || !std::all_of(method.begin(), method.end(), token_char)) {
    return refuse(400, "malformed request method");
  }
  if (version != "HTTP/1.1" && version != "HTTP/1.0") return refuse(505, "only HTTP/1.0 and HTTP/1.1 are spoken");
  if (target.empty() || target.front() != '/') return refuse(400, "request target is not an absolute path");
  if (auto q = target.find('?'); q != std::string_view::npos) target = target.substr(0, q);
  if (!std::all_of(target.begin(), target.end(), [](char c) { return c > 0x20 && c < 0x7f; })) {
    return refuse(400, "request target has odd characters");
  }
  head.method = std::string(method);
  head.target = std::string(target);
  return {};
}

// One "Name: value" line into `head` (the name lower-cased); a result that is not ok() is the refusal.
HttpHeadResult parse_header_line(std::string_view line, const HttpLimits& limits, HttpHead& head) {
  if (line.front() == ' ' || line.front() == '\t') return refuse(400, "folded header lines are not accepted");
  auto colon = line.find(':');
  if (colon == std::string_view::npos || colon == 0) return refuse(400, "malformed header line");
  std::string_view name = line.substr(0, colon);
  if (!std::all_of(name.begin(), name.end(), token_char)) return refuse(400, "malformed header name");
  if (head.headers.size() >= limits.max_headers) {
    return refuse(431, "more than " + std::to_string(limits.max_headers) + " header lines");
  }
  std::string key = lower(name);
  if (!head.headers.emplace(key, std::string(trim(line.substr(colon + 1)))).second) {
    return refuse(400, "header '" + key + "' given twice");
  }
  return {};
}

// The body's length must be known before it is read: Content-Length within the limit, required for POST and
// refused for any other method; a result that is not ok() is the refusal.
HttpHeadResult parse_body_length(const HttpLimits& limits, HttpHead& head) {
  if (head.headers.count("transfer-encoding") != 0) {
    return refuse(501, "transfer codings (chunked bodies) are not accepted; send Content-Length");
  }
  bool has_length = false;
  if (auto it = head.headers.find("content-length"); it != head.headers.end()) {
    auto n = parse_uint(it->second);
    if (!n) return refuse(400, "Content-Length is not a number");
    if (*n > limits.max_body) {
      return refuse(413, "body of " + it->second + " bytes is larger than " + std::to_string(limits.max_body));
    }
    head.content_length = static_cast<std::size_t>(*n);
    has_length = true;
  }
  if (head.method == "POST" && !has_length) return refuse(411, "POST without Content-Length");
  if (head.method != "POST" && head.content_length != 0) return refuse(400, "only POST may carry a body");
  return {};
}

}  // namespace

HttpHeadResult parse_http_head(std::string_view head, const HttpLimits& limits) {
  if (head.size() > limits.max_head) {
    return refuse(431, "request head is larger than " + std::to_string(limits.max_head) + " bytes");
  }
  HttpHeadResult out;
  std::size_t pos = 0;
  bool first = true;
  while (pos < head.size()) {
    std::string_view line = next_line(head, pos);
    if (line.empty()) {
      if (first) continue;  // RFC 9112: a server may ignore empty lines before the request line
      break;
    }
    if (line.find('\0') != std::string_view::npos) return refuse(400, "request head holds a NUL byte");
    if (first) {
      first = false;
      if (HttpHeadResult refused = parse_request_line(line, out.head); !refused.ok()) return refused;
      continue;
    }
    if (HttpHeadResult refused = parse_header_line(line, limits, out.head); !refused.ok()) return refused;
  }
  if (first) return refuse(400, "empty request");
  if (HttpHeadResult refused = parse_body_length(limits, out.head); !refused.ok()) return refused;
  return out;
}

// ---- rate-limited complaints ------------------------------------------------------------------------------------

bool LogLimiter::allow(const std::string& kind, double now, std::uint64_t& suppressed) {
  suppressed = 0;
  auto it = windows_.find(kind);
  if (it == windows_.end()) {
    if (windows_.size() >= 256) windows_.erase(windows_.begin());  // kinds are few; never grow without bound
    it = windows_.emplace(kind, Window{now, 0, 0}).first;
  }
  Window& w = it->second;
  if (now - w.start >= window_s_ || now < w.start) {
    w.start = now;
    w.used = 0;
  }
  if (w.used < burst_) {
    ++w.used;
    suppressed = w.suppressed;
    w.suppressed = 0;
    return true;
  }
  ++w.suppressed;
  return false;
}

// ---- job ids Slurm did not know ---------------------------------------------------------------------------------

bool NegativeCache::known_unknown(std::uint32_t job_id, double now) const {
  auto it = when_.find(job_id);
  return it != when_.end() && !it->second.owner && now - it->second.when < ttl_s_ && now >= it->second.when;
}

std::optional<std::uint32_t> NegativeCache::known_owner(std::uint32_t job_id, double now) const {
  auto it = when_.find(job_id);
  if (it == when_.end() || now - it->second.when >= ttl_s_ || now < it->second.when) return std::nullopt;
  return it->second.owner;
}

void NegativeCache::remember(std::uint32_t job_id, double now) { put(job_id, Entry{now, std::nullopt}); }

void NegativeCache::remember_owner(std::uint32_t job_id, std::uint32_t owner, double now) {
  put(job_id, Entry{now, owner});
}

void NegativeCache::put(std::uint32_t job_id, Entry entry) {
  forget(job_id);
  while (!when_.empty() && when_.size() >= capacity_) {
    auto oldest = by_time_.begin();
    when_.erase(oldest->second);
    by_time_.erase(oldest);
  }
  if (capacity_ == 0) return;
  by_time_.emplace(entry.when, job_id);
  when_[job_id] = entry;
}

void NegativeCache::forget(std::uint32_t job_id) {
  auto it = when_.find(job_id);
  if (it == when_.end()) return;
  auto range = by_time_.equal_range(it->second.when);
  for (auto b = range.first; b != range.second; ++b) {
    if (b->second == job_id) {
      by_time_.erase(b);
      break;
    }
  }
  when_.erase(it);
}

std::vector<std::size_t> fair_batch(const std::vector<std::uint32_t>& users, std::size_t batch, std::size_t min_share) {
  std::set<std::uint32_t> waiting(users.begin(), users.end());
  const std::size_t share = waiting.empty() ? 0 : std::max(min_share, (batch + waiting.size() - 1) / waiting.size());
  std::vector<std::size_t> take;
  std::map<std::uint32_t, std::size_t> taken;
  for (std::size_t i = 0; i < users.size() && take.size() < batch; ++i) {
    if (taken[users[i]]++ < share) take.push_back(i);
  }
  return take;
}

// ---- probes of silent nodes ---------------------------------------------------------------------------------------

const char* to_string(ProbeResult result) {
  switch (result) {
    case ProbeResult::Alive: return "alive";
    case ProbeResult::Refused: return "refused";
    case ProbeResult::TimedOut: return "timed out";
    case ProbeResult::Unreachable: return "unreachable";
    case ProbeResult::Hung: return "hung";
  }
  return "?";
}

int rpc_rounds(double timeout_s, double hung_after_s) {
  if (timeout_s <= 0) return 2;
  return std::clamp(static_cast<int>(std::ceil(hung_after_s / timeout_s - 1e-9)), 2, 100);
}

ProbeResult judge_rpc(const std::vector<bool>& answered, double silent_s, double hung_after_s) {
  if (std::any_of(answered.begin(), answered.end(), [](bool a) { return a; })) return ProbeResult::Alive;
  if (answered.size() < 2 || silent_s < hung_after_s) return ProbeResult::Alive;  // too little said: benefit of doubt
  return ProbeResult::Hung;
}

NodeEvidence weigh_probes(const std::vector<std::pair<std::string, ProbeResult>>& first,
                          const std::map<std::string, ProbeResult>& second,
                          const std::vector<std::string>& slurm_down) {
  NodeEvidence out;
  auto add = [](std::vector<std::string>& v, const std::string& n) {
    if (std::find(v.begin(), v.end(), n) == v.end()) v.push_back(n);
  };
  for (const auto& [node, result] : first) {
    if (result == ProbeResult::Alive) continue;
    if (result == ProbeResult::Hung) {
      add(out.failed, node);
      add(out.mark_down, node);
      add(out.hung, node);
      continue;
    }
    auto again = second.find(node);
    // A node that answered the second probe is alive after all.
    if (again != second.end() && again->second == ProbeResult::Alive) continue;
    add(out.failed, node);
    if (result == ProbeResult::Refused && again != second.end() && again->second == ProbeResult::Refused) {
      add(out.mark_down, node);
    }
  }
  for (const auto& node : slurm_down) {
    add(out.failed, node);
    add(out.mark_down, node);  // Slurm has it down already: marking it is idempotent
  }
  return out;
}

// ---- who may read what ----------------------------------------------------------------------------------------------

ReadAccess read_access(std::optional<std::uint32_t> uid, const std::set<std::uint32_t>& privileged) {
  ReadAccess a;
  a.uid = uid;
  a.all = uid && privileged.count(*uid) != 0;
  return a;
}

JobIdentity job_identity(double record_submit, std::uint32_t record_restarts, double slurm_submit,
                         std::uint32_t slurm_restarts) {
  if (slurm_restarts < record_restarts) return JobIdentity::Reused;
  if (slurm_submit <= 0 || record_submit <= 0 || slurm_submit == record_submit) return JobIdentity::Same;
  return slurm_restarts > record_restarts ? JobIdentity::Requeued : JobIdentity::Reused;
}

std::uint64_t saturating_increment(std::uint64_t a, std::uint64_t limit) { return a >= limit ? limit : a + 1; }

}  // namespace ckpt::recovery
