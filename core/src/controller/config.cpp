// The controller's config file: `key = value` lines. Fails closed: an unknown key or a bad value is an error
// that names the key, the value and the line.
#include <algorithm>
#include <cctype>
#include <set>
#include <string>
#include <vector>

#include "ckpt/log_level.hpp"
#include "ckpt/parse.hpp"
#include "ckpt/recovery.hpp"

namespace ckpt::recovery {

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

bool is_url(std::string_view s) {
  return (s.rfind("http://", 0) == 0 && s.size() > 7) || (s.rfind("https://", 0) == 0 && s.size() > 8);
}

}  // namespace

Result<double> parse_duration_ms(std::string_view text) {
  if (text.size() > 2 && text.substr(text.size() - 2) == "ms") {
    auto ms = parse_uint(text.substr(0, text.size() - 2));
    if (!ms || *ms > 1000ULL * 1000 * 1000) return Error{"invalid duration"};
    return static_cast<double>(*ms) / 1000.0;
  }
  auto s = parse_duration(text);
  if (!s) return Error{s.error()};
  return static_cast<double>(*s);
}

Result<std::pair<std::string, int>> parse_host_port(std::string_view text) {
  auto colon = text.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return Error{"expected host:port"};
  auto port = parse_uint(text.substr(colon + 1));
  if (!port || *port == 0 || *port > 65535) return Error{"expected a port 1-65535"};
  std::string host(text.substr(0, colon));
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return std::make_pair(host, static_cast<int>(*port));
}

namespace {

// Value checks for the key table: each stores the value and returns true when it is good.
bool set_duration(double& out, const std::string& value, double min_s) {
  auto d = parse_duration_ms(value);
  if (!d || *d < min_s) return false;
  out = *d;
  return true;
}

bool set_on_off(bool& out, const std::string& value) {
  auto b = parse_on_off(value);
  if (!b) return false;
  out = *b;
  return true;
}

bool set_absolute(std::string& out, const std::string& value) {
  if (value.empty() || value[0] != '/') return false;
  out = value;
  return true;
}

// For a value its lambda has already checked.
bool set_text(std::string& out, const std::string& value) {
  out = value;
  return true;
}

// For a name: anything but empty.
bool set_name(std::string& out, const std::string& value) {
  if (value.empty()) return false;
  out = value;
  return true;
}

bool set_url(std::string& out, const std::string& value) {
  if (!is_url(value)) return false;
  out = value;
  return true;
}

// For a comma-separated list of user names, none empty.
bool set_users(std::vector<std::string>& out, const std::string& value) {
  out.clear();
  std::size_t p = 0;
  while (p <= value.size()) {
    auto c = value.find(',', p);
    if (c == std::string::npos) c = value.size();
    std::string user(trim(std::string_view(value).substr(p, c - p)));
    if (user.empty()) return false;
    out.push_back(user);
    p = c + 1;
  }
  return true;
}

// One key of the config file: its name, what a good value looks like (for the error), and its check and store.
struct ConfigKey {
  const char* name;
  const char* expected;
  bool (*set)(ControllerConfig& cfg, const std::string& value);
};

// Short names for the table's lambdas.
using C = ControllerConfig;
using V = const std::string&;

const ConfigKey kKeys[] = {
    {"listen", "host:port or off",
     [](C& c, V v) { return (v == "off" || parse_host_port(v)) && set_text(c.listen, v); }},
    {"spool_dir", "an absolute path", [](C& c, V v) { return set_absolute(c.spool_dir, v); }},
    {"database", "an absolute path", [](C& c, V v) { return set_absolute(c.database, v); }},
    {"backend", "libslurm or rest",
     [](C& c, V v) { return (v == "libslurm" || v == "rest") && set_text(c.backend, v); }},
    {"rest_url", "an http(s) URL",
     [](C& c, V v) {
       if (!set_url(c.rest_url, v)) return false;
       while (!c.rest_url.empty() && c.rest_url.back() == '/') c.rest_url.pop_back();
       return true;
     }},
    {"rest_user", "a user name", [](C& c, V v) { return set_name(c.rest_user, v); }},
    {"rest_token_file", "an absolute path", [](C& c, V v) { return set_absolute(c.rest_token_file, v); }},
    {"munge_socket", "an absolute path", [](C& c, V v) { return set_absolute(c.munge_socket, v); }},
    {"max_restarts", "a number of restarts",
     [](C& c, V v) {
       auto n = parse_uint(v);
       if (!n || *n > 1000000) return false;
       c.max_restarts = *n;
       return true;
     }},
    {"bad_node_ttl", "a duration like 1h", [](C& c, V v) { return set_duration(c.bad_node_ttl_s, v, 1); }},
    {"drain_bad_nodes", "yes or no", [](C& c, V v) { return set_on_off(c.drain_bad_nodes, v); }},
    {"down_dead_nodes", "yes or no", [](C& c, V v) { return set_on_off(c.down_dead_nodes, v); }},
    {"settle", "a duration like 500ms", [](C& c, V v) { return set_duration(c.settle_s, v, 0); }},
    {"probe_timeout", "a duration like 1s", [](C& c, V v) { return set_duration(c.probe_timeout_s, v, 0.01); }},
    {"slurmd_rpc_timeout", "a duration like 1500ms",
     [](C& c, V v) { return set_duration(c.slurmd_rpc_timeout_s, v, 0.1); }},
    {"hung_after", "a duration like 4s (0s: no RPC check)",
     [](C& c, V v) { return set_duration(c.hung_after_s, v, 0); }},
    {"down_hung_nodes", "yes or no", [](C& c, V v) { return set_on_off(c.down_hung_nodes, v); }},
    {"reconcile_interval", "a duration like 2s", [](C& c, V v) { return set_duration(c.reconcile_s, v, 0.1); }},
    {"completing_timeout", "a duration like 2m",
     [](C& c, V v) { return set_duration(c.completing_timeout_s, v, 1); }},
    {"webhook_url", "an http(s) URL", [](C& c, V v) { return set_url(c.webhook_url, v); }},
    {"webhook_timeout", "a duration like 5s", [](C& c, V v) { return set_duration(c.webhook_timeout_s, v, 0.1); }},
    {"admin_users", "user names separated by commas", [](C& c, V v) { return set_users(c.admin_users, v); }},
    {"slurm_user", "a user name", [](C& c, V v) { return set_name(c.slurm_user, v); }},
    {"history_max_rows", "a number of lines, 10 to 1000000",
     [](C& c, V v) {
       auto n = parse_uint(v);
       if (!n || *n < 10 || *n > 1000000) return false;
       c.history_max_rows = *n;
       return true;
     }},
    {"history_max_age", "a duration like 30d, at least 1h",
     [](C& c, V v) { return set_duration(c.history_max_age_s, v, 3600); }},
    {"log_level", kLogLevelsAccepted,
     [](C& c, V v) {
       auto level = parse_log_level(v);
       return level && set_text(c.log_level, ckpt::to_string(*level));
     }},
};

// Applies one `key = value` line (comment and blanks removed) to `cfg`; `where` ("FILE:LINE: ") starts the error.
Status apply_line(std::string_view line, const std::string& where, std::set<std::string>& seen,
                  ControllerConfig& cfg) {
  auto eq = line.find('=');
  if (eq == std::string_view::npos) {
    return Status::failure(where + "expected key = value, got '" + std::string(line) + "'");
  }
  const std::string key(trim(line.substr(0, eq)));
  const std::string value(trim(line.substr(eq + 1)));
  if (!seen.insert(key).second) return Status::failure(where + key + ": given twice");
  for (const ConfigKey& k : kKeys) {
    if (key != k.name) continue;
    if (!k.set(cfg, value)) {
      return Status::failure(where + key + ": invalid value '" + value + "' (expected " + k.expected + ")");
    }
    return Status::success();
  }
  return Status::failure(where + "unknown key '" + key + "'");
}

}  // namespace

Result<ControllerConfig> parse_controller_config(std::string_view text, std::string_view name) {
  ControllerConfig cfg;
  std::set<std::string> seen;
  std::size_t line_no = 0;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    auto end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (auto hash = line.find('#'); hash != std::string_view::npos) line = line.substr(0, hash);
    line = trim(line);
    if (line.empty()) {
      if (end == text.size()) break;
      continue;
    }
    const std::string where = std::string(name) + ":" + std::to_string(line_no) + ": ";
    if (Status s = apply_line(line, where, seen, cfg); !s) return Error{s.error()};
    if (end == text.size()) break;
  }
  if (cfg.backend == "rest" && cfg.rest_url.empty()) {
    return Error{std::string(name) + ": rest_url: required when backend = rest"};
  }
  if (cfg.listen == "off" && cfg.spool_dir.empty()) {
    return Error{std::string(name) + ": listen: off needs a spool_dir, or no event could arrive"};
  }
  return cfg;
}

}  // namespace ckpt::recovery
