// The address a process publishes to its peers: one rule for the heartbeat, the in-place stores and Python.
#include <catch2/catch.hpp>

#include "ckpt/address.hpp"

using ckpt::net::choose_address;
using ckpt::net::HostFacts;
using ckpt::net::interface_matches;

namespace {
// A Debian node: its name on 127.0.1.1, eth0 on the cluster network, docker0 beside it.
HostFacts debian_node() {
  HostFacts f;
  f.interfaces = {{"lo", "127.0.0.1", true}, {"docker0", "172.17.0.1", true}, {"eth0", "10.77.0.12", true}};
  f.host_name_addrs = {"127.0.1.1"};
  f.default_route_addr = "10.77.0.12";
  return f;
}
}  // namespace

TEST_CASE("address: a host name on loopback never decides", "[address]") {
  SECTION("Debian's hosts file: the default route's address, not 127.0.1.1") {
    auto f = debian_node();
    auto c = choose_address(f);
    REQUIRE(c);
    CHECK(c->address == "10.77.0.12");
    CHECK(c->how == "default route");
    CHECK(c->warning.empty());
  }
  SECTION("a host name that resolves to the cluster address is taken first") {
    auto f = debian_node();
    f.host_name_addrs = {"127.0.1.1", "10.77.0.12"};
    f.default_route_addr = "172.17.0.1";
    CHECK(choose_address(f)->address == "10.77.0.12");
    CHECK(choose_address(f)->how == "host name");
  }
  SECTION("no route and no name: any interface that is up and not loopback") {
    auto f = debian_node();
    f.default_route_addr.clear();
    f.interfaces[1].up = false;
    CHECK(choose_address(f)->address == "10.77.0.12");
  }
  SECTION("nothing but loopback: 127.0.0.1 with one line naming the variables to set") {
    HostFacts f;
    f.interfaces = {{"lo", "127.0.0.1", true}};
    f.host_name_addrs = {"127.0.1.1"};
    auto c = choose_address(f);
    REQUIRE(c);
    CHECK(c->address == "127.0.0.1");
    CHECK(c->warning.rfind("ckpt: ", 0) == 0);
    CHECK(c->warning.find("CKPT_ADDR") != std::string::npos);
    CHECK(c->warning.find("CKPT_IFNAME") != std::string::npos);
  }
}

TEST_CASE("address: what the user or site names comes first", "[address]") {
  SECTION("CKPT_ADDR as it is") {
    auto f = debian_node();
    f.ckpt_addr = "10.99.0.5";
    f.ifname = "eth0";
    f.ifname_from = "CKPT_IFNAME";
    CHECK(choose_address(f)->address == "10.99.0.5");
    CHECK(choose_address(f)->how == "CKPT_ADDR");
    f.ckpt_addr = "node12";
    CHECK_FALSE(choose_address(f));
    CHECK(choose_address(f).error() == "ckpt: CKPT_ADDR='node12' is not an IPv4 address");
  }
  SECTION("an interface: GLOO_SOCKET_IFNAME as a user sets it beside Debian's hosts file") {
    auto f = debian_node();
    f.default_route_addr = "172.17.0.1";  // the route would pick docker0
    f.ifname = "eth0";
    f.ifname_from = "GLOO_SOCKET_IFNAME";
    auto c = choose_address(f);
    REQUIRE(c);
    CHECK(c->address == "10.77.0.12");
    CHECK(c->how == "interface eth0 (GLOO_SOCKET_IFNAME)");
  }
  SECTION("NCCL's syntax: prefixes, exact names, exclusions") {
    auto f = debian_node();
    f.ifname = "^docker,lo";
    f.ifname_from = "NCCL_SOCKET_IFNAME";
    CHECK(choose_address(f)->address == "10.77.0.12");
    f.ifname = "doc";
    CHECK(choose_address(f)->address == "172.17.0.1");
    f.ifname = "=eth";
    CHECK_FALSE(choose_address(f));
    CHECK(choose_address(f).error() == "ckpt: NCCL_SOCKET_IFNAME==eth matches no interface with an IPv4 address");
  }
  SECTION("a named loopback interface is taken, with the warning") {
    auto f = debian_node();
    f.ifname = "lo";
    f.ifname_from = "CKPT_IFNAME";
    auto c = choose_address(f);
    REQUIRE(c);
    CHECK(c->address == "127.0.0.1");
    CHECK_FALSE(c->warning.empty());
  }
}

TEST_CASE("address: interface specs", "[address]") {
  CHECK(interface_matches("eth", "eth0"));
  CHECK(interface_matches("ib,eth", "eth1"));
  CHECK_FALSE(interface_matches("=eth", "eth0"));
  CHECK(interface_matches("=eth0", "eth0"));
  CHECK(interface_matches("^lo", "eth0"));
  CHECK_FALSE(interface_matches("^lo,docker", "docker0"));
  CHECK_FALSE(interface_matches("", "eth0"));
}
