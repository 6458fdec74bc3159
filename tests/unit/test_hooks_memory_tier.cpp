// The memory tier's partner links on a real heartbeat network of three ranks (threads of this process): a copy
// travels and is kept whole, the next replaces it, the last words freeze it, a flipped byte is caught before use,
// and what a copy may not do: exceed the budget, come from a rank that is no ward, or be bytes that are no copy.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <functional>
#include <thread>
#include <vector>

#include "heartbeat.hpp"
#include "hooks_test_util.hpp"
#include "memory_tier.hpp"
#include "node_tier.hpp"

using namespace ckpt;
using namespace ckpt::hooks;
using namespace ckpt::hooks::test;
using namespace std::chrono_literals;

namespace {

// Three ranks' meshes in one process (`hold`: each holds partner links until its tier is up).
std::vector<std::unique_ptr<heartbeat::Mesh>> start_meshes(const std::string& dir, bool hold = false) {
  std::vector<std::unique_ptr<heartbeat::Mesh>> meshes(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      heartbeat::Settings s;
      s.rank = r;
      s.world_size = 3;
      s.rendezvous_dir = dir;
      s.connect_timeout = 10s;
      s.hold_partner_links = hold;
      auto m = heartbeat::Mesh::start(s, [](const heartbeat::Event&) {});
      if (m) meshes[static_cast<std::size_t>(r)] = std::move(m).value();
    });
  }
  for (auto& t : threads) t.join();
  for (auto& m : meshes) REQUIRE(m);
  return meshes;
}

MemoryTier::Settings tier_settings(int rank, int partner, std::vector<int> wards, std::uint64_t max_bytes = 1u << 30) {
  MemoryTier::Settings s;
  s.rank = rank;
  s.world_size = 3;
  s.partner = partner;
  s.wards = std::move(wards);
  s.max_bytes = max_bytes;
  s.io_timeout = 5s;
  return s;
}

// A shard of two pieces: 9 MiB (three chunks, the last one short) of a pattern that depends on `step`, and a blob.
struct Shard {
  std::vector<std::byte> big;
  std::vector<std::byte> small;
  std::vector<Piece> pieces;
  explicit Shard(std::uint64_t step) : big((9u << 20) + 123), small(40) {
    for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<std::byte>((i * 7 + step) & 0xff);
    for (std::size_t i = 0; i < small.size(); ++i) small[i] = static_cast<std::byte>(step + i);
    pieces.push_back({"model", big.data(), big.size(), nlohmann::json{{"dtype", "uint8"}}});
    pieces.push_back({"extra/step", small.data(), small.size(), nlohmann::json::object()});
  }
};

// The copy rank `holder` keeps of `ward` at `step` is `shard`, byte for byte and range for range.
void check_copy(MemoryTier& holder, int ward, std::uint64_t step, const Shard& shard) {
  Status s = holder.with_copy(ward, step, [&](const MemoryTier::Copy& c) {
    REQUIRE(c.ranges.size() == 2);
    CHECK(c.ranges[0].name == "model");
    CHECK(c.ranges[0].meta == nlohmann::json{{"dtype", "uint8"}});
    CHECK(c.ranges[1].name == "extra/step");
    CHECK(c.ranges[1].offset == shard.big.size());
    CHECK(c.size == shard.big.size() + shard.small.size());
    CHECK(std::memcmp(c.data, shard.big.data(), shard.big.size()) == 0);
    CHECK(std::memcmp(c.data + c.ranges[1].offset, shard.small.data(), shard.small.size()) == 0);
    return Status::success();
  });
  CHECK(s);
}

// Runs `event` on another thread after `delay` while `wait` runs here; the seconds `wait` took.
double seconds_waiting_for(std::chrono::milliseconds delay, const std::function<void()>& event,
                           const std::function<void()>& wait) {
  std::thread later([&] {
    std::this_thread::sleep_for(delay);
    event();
  });
  const auto t0 = std::chrono::steady_clock::now();
  wait();
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  later.join();
  return waited;
}

}  // namespace

TEST_CASE("memory tier: a copy goes to the partner, is kept whole, and is checked again before use",
          "[hooks][memtier]") {
  TempDir dir;
  LogCapture logs;
  auto meshes = start_meshes(dir.sub("mesh"));
  // Rank 0's copies go to rank 1.
  auto ward = MemoryTier::start(tier_settings(0, 1, {}), *meshes[0]);
  auto holder = MemoryTier::start(tier_settings(1, -1, {0}), *meshes[1]);

  Shard five(5);
  REQUIRE(ward->send(5, five.pieces));
  CHECK(holder->verified_copies() == std::vector<std::pair<int, std::uint64_t>>{{0, 5}});
  check_copy(*holder, 0, 5, five);
  CHECK_FALSE(holder->with_copy(0, 4, [](const MemoryTier::Copy&) { return Status::success(); }));

  SECTION("the next copy becomes the newest; the one before stays whole until a third begins over it") {
    Shard six(6);
    REQUIRE(ward->send(6, six.pieces));
    CHECK(holder->verified_copies() == std::vector<std::pair<int, std::uint64_t>>{{0, 6}, {0, 5}});
    check_copy(*holder, 0, 6, six);
    check_copy(*holder, 0, 5, five);
    Shard seven(7);
    REQUIRE(ward->send(7, seven.pieces));
    CHECK(holder->verified_copies() == std::vector<std::pair<int, std::uint64_t>>{{0, 7}, {0, 6}});
    check_copy(*holder, 0, 7, seven);
    check_copy(*holder, 0, 6, six);
    CHECK_FALSE(holder->with_copy(0, 5, [](const MemoryTier::Copy&) { return Status::success(); }));
  }
  SECTION("once frozen by the last words, both copies held stay, and a copy is refused before it begins") {
    Shard six(6);
    REQUIRE(ward->send(6, six.pieces));
    holder->freeze();
    Shard seven(7);
    Status s = ward->send(7, seven.pieces);
    REQUIRE_FALSE(s);
    CHECK(s.error().find("the last words started") != std::string::npos);
    CHECK(holder->verified_copies() == std::vector<std::pair<int, std::uint64_t>>{{0, 6}, {0, 5}});
    check_copy(*holder, 0, 6, six);
    check_copy(*holder, 0, 5, five);
    std::vector<MemoryTier::Kept> kept = holder->release();
    REQUIRE(kept.size() == 2);
    CHECK(kept[0].step == 6);
    CHECK(kept[1].step == 5);
    CHECK(std::memcmp(kept[1].buffer.data(), five.big.data(), five.big.size()) == 0);
    CHECK(holder->verified_copies().empty());
  }
  SECTION("a byte flipped in memory after it arrived is caught, and the copy is not used") {
    REQUIRE(holder->corrupt_for_testing(0));
    CHECK_FALSE(holder->with_copy(0, 5, [](const MemoryTier::Copy&) { return Status::success(); }));
    CHECK(holder->verified_copies().empty());
    CHECK(logs.has("memory tier: the copy of rank 0's step 5 no longer matches the checksum of 'model': not used"));
  }
  ward->stop();
  holder->stop();
}

TEST_CASE("memory tier: copies over the budget, from a rank that is no ward, or that are no copy are refused",
          "[hooks][memtier][security]") {
  TempDir dir;
  LogCapture logs;
  auto meshes = start_meshes(dir.sub("mesh"));
  Shard shard(3);

  SECTION("over CKPT_MEMORY") {
    auto ward = MemoryTier::start(tier_settings(0, 1, {}), *meshes[0]);
    auto holder = MemoryTier::start(tier_settings(1, -1, {0}, 8u << 20), *meshes[1]);
    Status s = ward->send(3, shard.pieces);
    REQUIRE_FALSE(s);
    CHECK_THAT(s.error(), Catch::Contains("rank 1 cannot keep it within its CKPT_MEMORY: it would need"));
    REQUIRE(ward->partner_needs().has_value());
    CHECK(*ward->partner_needs() > (8u << 20));  // what the checkpointer turns the job's tier off with
    CHECK(holder->verified_copies().empty());
  }
  SECTION("a rank whose copies this rank does not keep") {
    auto holder = MemoryTier::start(tier_settings(1, -1, {0}), *meshes[1]);
    auto stranger = MemoryTier::start(tier_settings(2, 1, {}), *meshes[2]);
    CHECK_FALSE(stranger->send(3, shard.pieces));
    CHECK(wait_for([&] { return logs.has("memory tier: refused a partner link from rank 2"); }, 2s));
    CHECK(holder->verified_copies().empty());
  }
  SECTION("a rank that keeps no copies takes no partner link") {
    auto ward = MemoryTier::start(tier_settings(0, 2, {}), *meshes[0]);
    CHECK_FALSE(ward->send(3, shard.pieces));
    CHECK(wait_for([&] { return logs.has("offers a partner copy, and this rank keeps none"); }, 2s));
  }
  SECTION("bytes that are no copy, on an authenticated link: refused, and the next real copy is kept") {
    auto holder = MemoryTier::start(tier_settings(1, -1, {0}), *meshes[1]);
    auto fd = meshes[0]->dial_partner(1, 5000ms);
    REQUIRE(fd);
    const char junk[64] = "GET / HTTP/1.0\r\n\r\n and more bytes that are not a copy header..";
    REQUIRE(::send(*fd, junk, sizeof junk, MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof junk));
    char buf[64];
    // The holder answers with a refusal and closes the link.
    while (::recv(*fd, buf, sizeof buf, 0) > 0) {
    }
    ::close(*fd);
    CHECK(logs.has("memory tier: refused the copy of rank 0's step"));
    CHECK(logs.has("not the start of a copy"));
    CHECK(holder->verified_copies().empty());
    auto ward = MemoryTier::start(tier_settings(0, 1, {}), *meshes[0]);
    REQUIRE(ward->send(3, shard.pieces));
    CHECK(holder->verified_copies() == std::vector<std::pair<int, std::uint64_t>>{{0, 3}});
  }
  SECTION("a chunk whose bytes do not match its checksum") {
    auto holder = MemoryTier::start(tier_settings(1, -1, {0}), *meshes[1]);
    auto fd = meshes[0]->dial_partner(1, 5000ms);
    REQUIRE(fd);
    // A header, a piece, and one chunk of 16 bytes whose checksum is wrong.
    const std::uint64_t begin[4] = {0x544d454d00000001ull, 9, 16, 1};
    const std::string head = R"({"name":"model","meta":{}})";
    const std::uint64_t piece[4] = {0x544d454d00000002ull, 16, head.size(), 0};
    const std::uint64_t chunk[4] = {0x544d454d00000003ull, 16, 12345, 0};
    const char bytes[16] = "sixteen bytes!!";
    REQUIRE(::send(*fd, begin, sizeof begin, MSG_NOSIGNAL) == sizeof begin);
    REQUIRE(::send(*fd, piece, sizeof piece, MSG_NOSIGNAL) == sizeof piece);
    REQUIRE(::send(*fd, head.data(), head.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(head.size()));
    REQUIRE(::send(*fd, chunk, sizeof chunk, MSG_NOSIGNAL) == sizeof chunk);
    REQUIRE(::send(*fd, bytes, sizeof bytes, MSG_NOSIGNAL) == sizeof bytes);
    char buf[64];
    while (::recv(*fd, buf, sizeof buf, 0) > 0) {
    }
    ::close(*fd);
    CHECK(logs.has("a chunk of 'model' does not match its checksum"));
    CHECK(holder->verified_copies().empty());
  }
}

// A ward's link may come as soon as both ranks joined the network, before the holder's tier is up (its rank still
// in create()): the holder's mesh holds it until the tier takes it, or closes it when the tier is off.
TEST_CASE("memory tier: a partner link that comes before the holder's tier is up waits for it", "[hooks][memtier]") {
  TempDir dir;
  LogCapture logs;
  auto meshes = start_meshes(dir.sub("mesh"), true);
  const bool keeps = GENERATE(true, false);
  auto ward = MemoryTier::start(tier_settings(0, 1, {}), *meshes[0]);
  Shard shard(3);
  Status sent = Status::failure("not sent");
  std::thread sender([&] { sent = ward->send(3, shard.pieces); });
  std::this_thread::sleep_for(300ms);  // rank 1's mesh holds the link by now
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<MemoryTier> holder;
  if (keeps) {
    holder = MemoryTier::start(tier_settings(1, -1, {0}), *meshes[1]);
  } else {
    meshes[1]->set_partner_acceptor(nullptr);  // its tier is off
  }
  sender.join();
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(waited < 3.0);  // not the 5 s io_timeout
  if (keeps) {
    CHECK(sent);
    CHECK(holder->verified_copies() == std::vector<std::pair<int, std::uint64_t>>{{0, 3}});
    holder->stop();
  } else {
    CHECK_FALSE(sent);
  }
  CHECK_FALSE(logs.has("offers a partner copy, and this rank keeps none"));
  ward->stop();
}

// Before a snapshot overwrites the staging of the one before the last, the holder waits for its wards' copies of
// the last one: a ward that died with that copy in flight would otherwise leave only an older step here.
TEST_CASE("memory tier: a holder waits for its wards' copies of a step, and for nothing a ward no longer owes",
          "[hooks][memtier]") {
  using Clock = std::chrono::steady_clock;
  auto seconds_since = [](Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  TempDir dir;
  auto meshes = start_meshes(dir.sub("mesh"));
  auto ward = MemoryTier::start(tier_settings(0, 1, {}), *meshes[0]);
  auto holder = MemoryTier::start(tier_settings(1, -1, {0}), *meshes[1]);

  auto t0 = Clock::now();
  CHECK(holder->wait_for_wards(4, 5s).empty());  // the ward has sent nothing yet: nothing is owed
  CHECK(seconds_since(t0) < 1.0);
  Shard four(4);
  REQUIRE(ward->send(4, four.pieces));
  CHECK(holder->wait_for_wards(4, 5s).empty());
  CHECK(holder->wait_for_wards(3, 5s).empty());

  Shard five(5);
  SECTION("the copy that comes ends the wait") {
    const double waited = seconds_waiting_for(
        400ms, [&] { CHECK(ward->send(5, five.pieces)); }, [&] { CHECK(holder->wait_for_wards(5, 10s).empty()); });
    CHECK(waited >= 0.35);
    CHECK(waited < 5.0);
    CHECK(holder->verified_copies() == std::vector<std::pair<int, std::uint64_t>>{{0, 5}, {0, 4}});
  }
  SECTION("a copy refused ends it too") {
    holder->freeze();  // the last words: no copy is replaced from here on
    CHECK_FALSE(ward->send(5, five.pieces));
    t0 = Clock::now();
    CHECK(holder->wait_for_wards(5, 10s).empty());
    CHECK(seconds_since(t0) < 1.0);
  }
  SECTION("the last words' freeze ends it, the copy still owed") {
    const double waited = seconds_waiting_for(
        300ms, [&] { holder->freeze(); }, [&] { CHECK(holder->wait_for_wards(5, 10s) == std::vector<int>{0}); });
    CHECK(waited >= 0.25);
    CHECK(waited < 5.0);
  }
  SECTION("a ward whose link ended is waited for until it left the network in order") {
    ward->stop();  // its link closes: as a ward that died, whose death the last words have yet to see
    t0 = Clock::now();
    CHECK(holder->wait_for_wards(5, 10s, [&] { return seconds_since(t0) > 0.3; }) == std::vector<int>{0});
    const double waited = seconds_waiting_for(
        300ms, [&] { meshes[0]->say_bye(); }, [&] { CHECK(holder->wait_for_wards(5, 10s).empty()); });
    CHECK(waited >= 0.25);
    CHECK(waited < 5.0);
  }
  SECTION("the limit, or the caller, ends it; a ward that outlasted the limit is not waited for again") {
    t0 = Clock::now();
    CHECK(holder->wait_for_wards(5, 10s, [&] { return seconds_since(t0) > 0.2; }) == std::vector<int>{0});
    CHECK(seconds_since(t0) < 2.0);
    t0 = Clock::now();
    CHECK(holder->wait_for_wards(5, 300ms) == std::vector<int>{0});
    CHECK(seconds_since(t0) >= 0.25);
    t0 = Clock::now();
    CHECK(holder->wait_for_wards(6, 10s).empty());  // lagging: the snapshots go on
    CHECK(seconds_since(t0) < 1.0);
    REQUIRE(ward->send(5, five.pieces));  // a copy kept: waited for again
    Shard six(6);
    CHECK(seconds_waiting_for(
              300ms, [&] { CHECK(ward->send(6, six.pieces)); },
              [&] { CHECK(holder->wait_for_wards(6, 10s).empty()); }) >= 0.25);
  }
  ward->stop();
  holder->stop();
}

TEST_CASE("memory tier: stop() ends a partner dial that a frozen partner never answers", "[hooks][memtier]") {
  TempDir dir;
  LogCapture logs;
  auto meshes = start_meshes(dir.sub("mesh"));
  // A frozen rank 1: its kernel completes the connect (the listen backlog), its process never answers the handshake.
  const int frozen = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(frozen >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(frozen, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(::listen(frozen, 8) == 0);
  socklen_t len = sizeof addr;
  REQUIRE(::getsockname(frozen, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  {
    std::ofstream out(dir.sub("mesh") + "/rank-1.addr", std::ios::trunc);
    out << "127.0.0.1 " << ntohs(addr.sin_port) << " frozen-node\n";
  }
  MemoryTier::Settings s = tier_settings(0, 1, {});
  s.io_timeout = 30s;
  auto ward = MemoryTier::start(s, *meshes[0]);
  Shard shard(4);
  Status sent = Status::success();
  std::thread sender([&] { sent = ward->send(4, shard.pieces); });
  std::this_thread::sleep_for(500ms);  // the dial is in its handshake by now
  const auto t0 = std::chrono::steady_clock::now();
  ward->stop();
  const double stop_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  sender.join();
  ::close(frozen);
  CHECK(stop_s < 3.0);  // not the 30 s io_timeout
  CHECK_FALSE(sent);
}

// Rank 1 keeps rank 0's copies in its node tier; then both processes end, as a relaunch finds them: rank 1 comes
// back on its node, rank 0 on a node that holds nothing of it, and asks rank 1 for its snapshot back.
TEST_CASE("memory tier: a relaunched ward fetches back the copy its partner's earlier process kept in the node tier",
          "[hooks][memtier][node_tier][security]") {
  TempDir dir;
  LogCapture logs;
  auto meshes = start_meshes(dir.sub("mesh"));
  const std::string node_dir = dir.sub("node-of-rank-1");
  auto holder_node = [&](const std::string& launch) {
    auto node = NodeTier::open(node_dir, {"4747", 0, {}, dir.sub("ckpt"), 1, {}, launch, 3});
    REQUIRE(node.ok());
    return std::move(node).value();
  };
  enum class Case { Whole, Flipped, OtherWorld, NoWard };
  const Case c = GENERATE(Case::Whole, Case::Flipped, Case::OtherWorld, Case::NoWard);
  Shard five(5), six(6);
  {
    auto node = holder_node("launch-a");
    MemoryTier::Settings hs = tier_settings(1, -1, {0});
    hs.node = node.get();
    auto holder = MemoryTier::start(hs, *meshes[1]);
    auto ward = MemoryTier::start(tier_settings(0, 1, {}), *meshes[0]);
    REQUIRE(ward->send(5, five.pieces));
    REQUIRE(ward->send(6, six.pieces));
    CHECK(holder->verified_copies() == std::vector<std::pair<int, std::uint64_t>>{{0, 6}, {0, 5}});
    if (c == Case::Flipped) REQUIRE(holder->corrupt_for_testing(0));
    ward->stop();
    holder->stop();
  }
  auto node = holder_node("launch-b");  // the relaunched holder, on its own node again
  CHECK(logs.has("node tier: an earlier process of this job left its partner copies of rank 0's step 6, rank 0's "
                 "step 5 here"));
  // Rank 0's bytes: never a snapshot for rank 1 to resume from, nor ranges for its own restore.
  CHECK(node->found_snapshots().empty());
  CHECK(node->found().empty());
  MemoryTier::Settings hs = tier_settings(1, -1, {0});
  hs.node = node.get();
  auto holder = MemoryTier::start(hs, *meshes[1]);
  CHECK(holder->verified_copies().empty());  // another rank's bytes: never this rank's to restore or to write
  MemoryTier::Settings ws = tier_settings(0, 1, {});
  auto fetch = [&](const MemoryTier::Settings& s, int mesh) {
    auto ward = MemoryTier::start(s, *meshes[static_cast<std::size_t>(mesh)]);
    auto got = ward->fetch_own();
    ward->stop();
    return got;
  };
  auto fetch_step = [&](std::uint64_t step, const std::string& launch) {
    auto ward = MemoryTier::start(ws, *meshes[0]);
    auto got = ward->fetch_own(step, launch);
    ward->stop();
    return got;
  };
  if (c == Case::Whole) {  // the newest copy comes back whole, every range checked
    auto got = fetch(ws, 0);
    REQUIRE(got.ok());
    std::optional<MemoryTier::Fetched> f = std::move(got).value();
    REQUIRE(f.has_value());
    CHECK(f->step == 6);
    CHECK(f->launch == "launch-a");
    CHECK(f->world_size == 3);
    REQUIRE(f->ranges.size() == 2);
    CHECK(f->ranges[0].name == "model");
    CHECK(f->ranges[0].meta == nlohmann::json{{"dtype", "uint8"}});
    CHECK(std::memcmp(f->buffer.data(), six.big.data(), six.big.size()) == 0);
    CHECK(std::memcmp(f->buffer.data() + f->ranges[1].offset, six.small.data(), six.small.size()) == 0);
    CHECK(wait_for([&] { return logs.has("memory tier: sent rank 0's relaunch its step 6"); }, 2s));
    // A memory step the restore proposes: that one, of that launch, or none.
    auto older = fetch_step(5, "launch-a");
    REQUIRE(older.ok());
    REQUIRE(older.value().has_value());
    CHECK(older.value()->step == 5);
    CHECK(std::memcmp(older.value()->buffer.data(), five.big.data(), five.big.size()) == 0);
    for (auto [step, launch] : {std::make_pair(7, "launch-a"), std::make_pair(6, "launch-b")}) {
      auto none = fetch_step(static_cast<std::uint64_t>(step), launch);
      REQUIRE(none.ok());
      CHECK_FALSE(none.value().has_value());
    }
  }
  if (c == Case::Flipped) {  // a byte flipped in the kept file: the ward refuses the copy
    auto got = fetch(ws, 0);
    REQUIRE_FALSE(got.ok());
    CHECK_THAT(got.error(), Catch::Contains("rank 1's copy of this rank's step 6: range 'model' does not match its "
                                            "checksum"));
    CHECK(wait_for([&] { return logs.has("memory tier: rank 0's fetch of its step 6 ended: rank 0 refused it"); }, 2s));
  }
  if (c == Case::OtherWorld) {  // a ward of another world size gets none
    ws.world_size = 4;
    auto got = fetch(ws, 0);
    REQUIRE(got.ok());
    CHECK_FALSE(got.value().has_value());
  }
  if (c == Case::NoWard) {  // a rank that is no ward of the holder gets nothing
    MemoryTier::Settings stranger = tier_settings(2, 1, {});
    auto got = fetch(stranger, 2);
    CHECK_FALSE(got.ok());
    CHECK(logs.has("memory tier: refused a partner link from rank 2"));
    CHECK_FALSE(logs.has("memory tier: sent rank 2"));
  }
  holder->stop();
}
