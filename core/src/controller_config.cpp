// The controller's config file: `key = value` lines. Fails closed: an unknown key or a bad value is an error
// that names the key, the value and the line.
#include <algorithm>
#include <cctype>
#include <set>

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
    auto eq = line.find('=');
    if (eq == std::string_view::npos) return Error{where + "expected key = value, got '" + std::string(line) + "'"};
    const std::string key(trim(line.substr(0, eq)));
    const std::string value(trim(line.substr(eq + 1)));
    if (!seen.insert(key).second) return Error{where + key + ": given twice"};
    auto bad = [&](const char* expected) {
      return Error{where + key + ": invalid value '" + value + "' (expected " + expected + ")"};
    };
    auto duration = [&](double& out, double min_s) -> bool {
      auto d = parse_duration_ms(value);
      if (!d || *d < min_s) return false;
      out = *d;
      return true;
    };
    auto on_off = [&](bool& out) -> bool {
      auto b = parse_on_off(value);
      if (!b) return false;
      out = *b;
      return true;
    };
    auto absolute = [&](std::string& out) -> bool {
      if (value.empty() || value[0] != '/') return false;
      out = value;
      return true;
    };

    if (key == "listen") {
      if (value != "off" && !parse_host_port(value)) return bad("host:port or off");
      cfg.listen = value;
    } else if (key == "spool_dir") {
      if (!absolute(cfg.spool_dir)) return bad("an absolute path");
    } else if (key == "database") {
      if (!absolute(cfg.database)) return bad("an absolute path");
    } else if (key == "backend") {
      if (value != "libslurm" && value != "rest") return bad("libslurm or rest");
      cfg.backend = value;
    } else if (key == "rest_url") {
      if (!is_url(value)) return bad("an http(s) URL");
      cfg.rest_url = value;
      while (!cfg.rest_url.empty() && cfg.rest_url.back() == '/') cfg.rest_url.pop_back();
    } else if (key == "rest_user") {
      if (value.empty()) return bad("a user name");
      cfg.rest_user = value;
    } else if (key == "rest_token_file") {
      if (!absolute(cfg.rest_token_file)) return bad("an absolute path");
    } else if (key == "munge_socket") {
      if (!absolute(cfg.munge_socket)) return bad("an absolute path");
    } else if (key == "max_restarts") {
      auto n = parse_uint(value);
      if (!n || *n > 1000000) return bad("a number of restarts");
      cfg.max_restarts = *n;
    } else if (key == "bad_node_ttl") {
      if (!duration(cfg.bad_node_ttl_s, 1)) return bad("a duration like 1h");
    } else if (key == "drain_bad_nodes") {
      if (!on_off(cfg.drain_bad_nodes)) return bad("yes or no");
    } else if (key == "down_dead_nodes") {
      if (!on_off(cfg.down_dead_nodes)) return bad("yes or no");
    } else if (key == "settle") {
      if (!duration(cfg.settle_s, 0)) return bad("a duration like 500ms");
    } else if (key == "probe_timeout") {
      if (!duration(cfg.probe_timeout_s, 0.01)) return bad("a duration like 1s");
    } else if (key == "slurmd_rpc_timeout") {
      if (!duration(cfg.slurmd_rpc_timeout_s, 0.1)) return bad("a duration like 1500ms");
    } else if (key == "hung_after") {
      if (!duration(cfg.hung_after_s, 0)) return bad("a duration like 4s (0s: no RPC check)");
    } else if (key == "down_hung_nodes") {
      if (!on_off(cfg.down_hung_nodes)) return bad("yes or no");
    } else if (key == "reconcile_interval") {
      if (!duration(cfg.reconcile_s, 0.1)) return bad("a duration like 2s");
    } else if (key == "completing_timeout") {
      if (!duration(cfg.completing_timeout_s, 1)) return bad("a duration like 2m");
    } else if (key == "webhook_url") {
      if (!is_url(value)) return bad("an http(s) URL");
      cfg.webhook_url = value;
    } else if (key == "webhook_timeout") {
      if (!duration(cfg.webhook_timeout_s, 0.1)) return bad("a duration like 5s");
    } else if (key == "admin_users") {
      cfg.admin_users.clear();
      std::size_t p = 0;
      while (p <= value.size()) {
        auto c = value.find(',', p);
        if (c == std::string::npos) c = value.size();
        std::string user(trim(std::string_view(value).substr(p, c - p)));
        if (user.empty()) return bad("user names separated by commas");
        cfg.admin_users.push_back(user);
        p = c + 1;
      }
    } else if (key == "slurm_user") {
      if (value.empty()) return bad("a user name");
      cfg.slurm_user = value;
    } else if (key == "history_max_rows") {
      auto n = parse_uint(value);
      if (!n || *n < 10 || *n > 1000000) return bad("a number of lines, 10 to 1000000");
      cfg.history_max_rows = *n;
    } else if (key == "history_max_age") {
      if (!duration(cfg.history_max_age_s, 3600)) return bad("a duration like 30d, at least 1h");
    } else if (key == "log_level") {
      if (value != "error" && value != "warning" && value != "info" && value != "debug") {
        return bad("error, warning, info or debug");
      }
      cfg.log_level = value;
    } else {
      return Error{where + "unknown key '" + key + "'"};
    }
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
