// The address a process publishes to its peers (heartbeat mesh, in-place stores, mailboxes, spare sockets) and binds.
// One rule for C++ and Python (which calls it through _native), decided purely from what the host offers:
//   1. CKPT_ADDR: an IPv4 address, taken as it is (the site or user knows best; loopback allowed here only);
//   2. an interface: CKPT_IFNAME, else GLOO_SOCKET_IFNAME, else NCCL_SOCKET_IFNAME (NCCL's syntax: a comma list of
//      name prefixes, `=name` exact, `^` to exclude), its first IPv4 address;
//   3. the first non-loopback IPv4 address the host name resolves to;
//   4. the address of the interface of the default route;
//   5. else 127.0.0.1 with a `ckpt:` warning that names the variables to set: peers on other hosts cannot reach it.
// A host name that resolves to loopback (Debian's "127.0.1.1 <host>") never decides the address.
#pragma once

#include <string>
#include <vector>

#include "ckpt/result.hpp"

namespace ckpt::net {

struct Interface {
  std::string name;
  std::string ipv4;  // dotted quad
  bool up = true;
};

// What the host offers, gathered by host_facts() (or written by a test).
struct HostFacts {
  std::string ckpt_addr;                 // CKPT_ADDR
  std::string ifname;                    // the first of CKPT_IFNAME, GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME set
  std::string ifname_from;               // which of them, for messages
  std::vector<Interface> interfaces;     // every IPv4 address of every interface
  std::vector<std::string> host_name_addrs;  // what the host name resolves to, in order
  std::string default_route_addr;        // the local address of the default route; empty when none
};

struct Choice {
  std::string address;
  std::string how;      // "CKPT_ADDR", "interface eth0 (GLOO_SOCKET_IFNAME)", "host name", "default route", ...
  std::string warning;  // a `ckpt:` line when peers on other hosts cannot reach `address`; else empty
};

bool is_loopback_ipv4(const std::string& dotted);
// True when interface `name` matches an NCCL-style interface spec ("eth0", "eth,ib", "=eth0", "^docker,lo").
bool interface_matches(const std::string& spec, const std::string& name);

// The rule above. An error (one `ckpt:` line) only for a CKPT_ADDR that is no IPv4 address or an interface spec
// that matches no interface with an IPv4 address: what the user asked for cannot be had.
Result<Choice> choose_address(const HostFacts& facts);

// The adapter: reads the environment, getifaddrs(), the host name's resolution and the default route.
HostFacts host_facts();
// choose_address(host_facts()).
Result<Choice> publish_address();

}  // namespace ckpt::net
