// The address a process publishes to its peers: the pure rule (choose_address) and the one adapter that reads the
// host (host_facts). See ckpt/address.hpp.
#include "ckpt/address.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <sstream>

namespace ckpt::net {

namespace {

bool parse_ipv4(const std::string& text, in_addr& out) { return ::inet_pton(AF_INET, text.c_str(), &out) == 1; }

std::string dotted(const in_addr& a) {
  char buf[INET_ADDRSTRLEN] = {};
  (void)::inet_ntop(AF_INET, &a, buf, sizeof buf);
  return buf;
}

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

const char* env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

}  // namespace

bool is_loopback_ipv4(const std::string& text) {
  in_addr a{};
  return parse_ipv4(text, a) && (ntohl(a.s_addr) >> 24) == 127;
}

bool interface_matches(const std::string& spec, const std::string& name) {
  std::string s = spec;
  const bool exclude = !s.empty() && s[0] == '^';
  if (exclude) s.erase(0, 1);
  const bool exact = !s.empty() && s[0] == '=';
  if (exact) s.erase(0, 1);
  bool listed = false;
  for (const auto& item : split_commas(s)) {
    if (exact ? name == item : name.compare(0, item.size(), item) == 0) listed = true;
  }
  return exclude ? !listed : listed;
}

Result<Choice> choose_address(const HostFacts& f) {
  if (!f.ckpt_addr.empty()) {
    in_addr a{};
    if (!parse_ipv4(f.ckpt_addr, a)) {
      return Error{"ckpt: CKPT_ADDR='" + f.ckpt_addr + "' is not an IPv4 address"};
    }
    return Choice{f.ckpt_addr, "CKPT_ADDR", ""};
  }
  if (!f.ifname.empty()) {
    const Interface* loop = nullptr;
    for (const auto& i : f.interfaces) {
      if (!i.up || !interface_matches(f.ifname, i.name)) continue;
      if (!is_loopback_ipv4(i.ipv4)) return Choice{i.ipv4, "interface " + i.name + " (" + f.ifname_from + ")", ""};
      if (loop == nullptr) loop = &i;
    }
    if (loop != nullptr) {  // the user named a loopback interface: a one-host job
      return Choice{loop->ipv4, "interface " + loop->name + " (" + f.ifname_from + ")",
                    "ckpt: " + f.ifname_from + "=" + f.ifname + " is a loopback interface: peers on other hosts "
                    "cannot reach " + loop->ipv4};
    }
    return Error{"ckpt: " + f.ifname_from + "=" + f.ifname + " matches no interface with an IPv4 address"};
  }
  for (const auto& a : f.host_name_addrs) {
    if (!is_loopback_ipv4(a)) return Choice{a, "host name", ""};
  }
  if (!f.default_route_addr.empty() && !is_loopback_ipv4(f.default_route_addr)) {
    return Choice{f.default_route_addr, "default route", ""};
  }
  for (const auto& i : f.interfaces) {  // no route: any interface that is up and not loopback
    if (i.up && !is_loopback_ipv4(i.ipv4)) return Choice{i.ipv4, "interface " + i.name, ""};
  }
  return Choice{"127.0.0.1", "loopback",
                "ckpt: this host has no non-loopback IPv4 address: peers on other hosts cannot reach it; set "
                "CKPT_ADDR or CKPT_IFNAME (or GLOO_SOCKET_IFNAME)"};
}

HostFacts host_facts() {
  HostFacts f;
  f.ckpt_addr = env_or_empty("CKPT_ADDR");
  for (const char* name : {"CKPT_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"}) {
    if (*env_or_empty(name) != '\0') {
      f.ifname = env_or_empty(name);
      f.ifname_from = name;
      break;
    }
  }
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) == 0) {
    for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
      if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
      const auto* a = reinterpret_cast<const sockaddr_in*>(i->ifa_addr);
      f.interfaces.push_back(Interface{i->ifa_name, dotted(a->sin_addr), (i->ifa_flags & IFF_UP) != 0});
    }
    ::freeifaddrs(list);
  }
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) == 0) {
    addrinfo hints{};
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    if (::getaddrinfo(host, nullptr, &hints, &res) == 0) {
      for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
        f.host_name_addrs.push_back(dotted(reinterpret_cast<const sockaddr_in*>(ai->ai_addr)->sin_addr));
      }
      ::freeaddrinfo(res);
    }
  }
  // The default route's interface: a UDP connect picks the route and sends nothing.
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd >= 0) {
    sockaddr_in far{};
    far.sin_family = AF_INET;
    far.sin_port = htons(9);
    (void)::inet_pton(AF_INET, "192.0.2.1", &far.sin_addr);  // TEST-NET-1: routed like any remote host
    sockaddr_in local{};
    socklen_t len = sizeof local;
    if (::connect(fd, reinterpret_cast<sockaddr*>(&far), sizeof far) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0 && local.sin_addr.s_addr != 0) {
      f.default_route_addr = dotted(local.sin_addr);
    }
    ::close(fd);
  }
  return f;
}

Result<Choice> publish_address() { return choose_address(host_facts()); }

}  // namespace ckpt::net
