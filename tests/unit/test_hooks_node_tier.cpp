// The node tier (node_tier.hpp): staging in files of a node dir, which a later process of the same job restores from,
// and which nothing else uses: another job's, another checkpoint dir's, a dir that is not the user's own.
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "hooks_test_util.hpp"
#include <xxhash.h>

#include <cstring>

#include "node_tier.hpp"

using namespace ckpt;
using namespace ckpt::hooks;
namespace fs = std::filesystem;

namespace {

std::vector<unsigned char> state_at(std::size_t n, std::uint64_t step) {
  std::vector<unsigned char> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<unsigned char>((i * 2654435761u + step * 131) >> 5);
  return v;
}

Options tier_options(const std::string& dir, const std::string& node_dir, const std::string& job) {
  return test::options({{"dir", dir}, {"interval", "1steps"}, {"keep", "5"}, {"memory", "64M"},
                        {"node_dir", node_dir}, {"job_id", job}});
}

// Steps 1..last with a checkpoint at each; the process "dies" after (close() leaves the node tier as a crash would).
void train(const Options& o, std::uint64_t last) {
  auto a = state_at(1 << 20, 0), b = state_at(100, 0);
  auto cp = test::make(o);
  REQUIRE(cp->register_region({"a", a.data(), a.size()}).ok());
  REQUIRE(cp->register_region({"b", b.data(), b.size()}).ok());
  REQUIRE(*cp->restore() == 0);
  for (std::uint64_t step = 1; step <= last; ++step) {
    REQUIRE(cp->before_update().ok());
    auto na = state_at(a.size(), step), nb = state_at(b.size(), step);
    std::copy(na.begin(), na.end(), a.begin());
    std::copy(nb.begin(), nb.end(), b.begin());
    REQUIRE_FALSE(*cp->after_step(step));
  }
  REQUIRE(cp->close().ok());
}

struct Relaunch {
  Result<std::uint64_t> step = Error{"not run"};
  std::vector<unsigned char> a, b;
  Stats stats;
};

// A later process: restores, checks the bytes, takes one more checkpoint (which releases what it found).
Relaunch relaunch(const Options& o) {
  Relaunch r;
  r.a.assign(1 << 20, 0);
  r.b.assign(100, 0);
  auto cp = test::make(o);
  REQUIRE(cp->register_region({"a", r.a.data(), r.a.size()}).ok());
  REQUIRE(cp->register_region({"b", r.b.data(), r.b.size()}).ok());
  r.step = cp->restore();
  r.stats = cp->stats();
  if (r.step.ok()) {
    REQUIRE(cp->before_update().ok());
    REQUIRE_FALSE(*cp->after_step(*r.step + 1));
  }
  REQUIRE(cp->close().ok());
  return r;
}

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

TEST_CASE("node tier: a later process of the job restores from the staging files the earlier one left",
          "[hooks][node_tier]") {
  test::TempDir dir, node;
  test::LogCapture log;
  const std::string job_dir = node.path() + "/" + NodeTier::dir_name(::geteuid(), "4242");
  train(tier_options(dir.path(), node.path(), "4242"), 3);
  struct stat st {};
  REQUIRE(::lstat(job_dir.c_str(), &st) == 0);
  CHECK(S_ISDIR(st.st_mode));
  CHECK((st.st_mode & 0777) == 0700);
  CHECK(st.st_uid == ::geteuid());
  const std::vector<std::string> before = files_in(job_dir);
  const auto is_index = [](const std::string& f) { return f.size() > 11 && f.substr(f.size() - 11) == "rank-0.json"; };
  CHECK(std::count_if(before.begin(), before.end(), is_index) == 1);

  SECTION("every range is taken from the node tier, checked; nothing of the state is read") {
    Relaunch r = relaunch(tier_options(dir.path(), node.path(), "4242"));
    REQUIRE(r.step.ok());
    CHECK(*r.step == 3);
    CHECK((r.a == state_at(1 << 20, 3)));
    CHECK((r.b == state_at(100, 3)));
    CHECK(r.stats.restore_live_bytes == (1u << 20) + 100);
    CHECK(r.stats.restore_read_bytes == 0);
    CHECK(log.has("node tier: an earlier process of this job left the snapshots of step(s) 3"));
    // Its first checkpoint released the earlier process's files: only this one's remain.
    for (const std::string& f : files_in(job_dir)) {
      CHECK((std::find(before.begin(), before.end(), f) == before.end() || is_index(f)));
    }
  }
  SECTION("a flipped byte in the staging file: that range is read from the checkpoint") {
    std::string data_file;
    for (const std::string& f : before) {
      if (!is_index(f) && fs::file_size(job_dir + "/" + f) >= (1u << 20)) data_file = f;
    }
    REQUIRE_FALSE(data_file.empty());
    std::fstream io(job_dir + "/" + data_file, std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(1000);
    char c = 0;
    io.read(&c, 1);
    io.seekp(1000);
    c ^= 0x01;
    io.write(&c, 1);
    io.close();
    Relaunch r = relaunch(tier_options(dir.path(), node.path(), "4242"));
    REQUIRE(r.step.ok());
    CHECK((r.a == state_at(1 << 20, 3)));
    CHECK(r.stats.restore_live_bytes == 100);
    CHECK(r.stats.restore_read_bytes == (1u << 20));
  }
  SECTION("another job's tier in this job's dir is never used, though its bytes are the checkpoint's") {
    const std::string other = node.path() + "/" + NodeTier::dir_name(::geteuid(), "777");
    fs::rename(job_dir, other);
    Relaunch r = relaunch(tier_options(dir.path(), node.path(), "777"));
    REQUIRE(r.step.ok());
    CHECK((r.a == state_at(1 << 20, 3)));
    CHECK(r.stats.restore_live_bytes == 0);
    CHECK(r.stats.restore_read_bytes == (1u << 20) + 100);
    CHECK(log.has("rank-0.json was left by job 4242"));
    CHECK(log.has("not this run's (job 777"));
    // Removed: what is there now is this run's (its own index under the same name).
    for (const std::string& f : files_in(other)) {
      CHECK((std::find(before.begin(), before.end(), f) == before.end() || is_index(f)));
    }
  }
  SECTION("the job's next run after a requeue (same job id) does not use it") {
    auto o = tier_options(dir.path(), node.path(), "4242");
    REQUIRE(o.set("restart_count", "1").ok());
    Relaunch r = relaunch(o);
    REQUIRE(r.step.ok());
    CHECK(*r.step == 3);
    CHECK(r.stats.restore_live_bytes == 0);
    CHECK(log.has("was left by job 4242 on "));
    CHECK(log.has("not this run's (job 4242 (requeued 1 times) on "));
  }
  SECTION("a tier left for another checkpoint dir is never used") {
    test::TempDir copy;
    fs::copy(dir.path(), copy.path(), fs::copy_options::recursive | fs::copy_options::overwrite_existing);
    Relaunch r = relaunch(tier_options(copy.path(), node.path(), "4242"));
    REQUIRE(r.step.ok());
    CHECK(*r.step == 3);
    CHECK(r.stats.restore_live_bytes == 0);
    CHECK_FALSE(log.has("node tier: an earlier process"));
  }
  SECTION("an index planted under this dir's name that names another dir is never used") {
    test::TempDir copy;
    fs::copy(dir.path(), copy.path(), fs::copy_options::recursive | fs::copy_options::overwrite_existing);
    // The index and files of `dir` renamed to what `copy`'s would be called.
    const std::string theirs = NodeTier::file_prefix(dir.path(), 0), mine = NodeTier::file_prefix(copy.path(), 0);
    for (const std::string& f : before) {
      REQUIRE(f.rfind(theirs, 0) == 0);
      fs::rename(job_dir + "/" + f, job_dir + "/" + mine + f.substr(theirs.size()));
    }
    Relaunch r = relaunch(tier_options(copy.path(), node.path(), "4242"));
    REQUIRE(r.step.ok());
    CHECK(r.stats.restore_live_bytes == 0);
    CHECK(log.has("for " + dir.path() + ", not this run's"));
  }
}

TEST_CASE("node tier: a dir of the job's name that is not the user's own is refused; staging stays in memory",
          "[hooks][node_tier]") {
  test::TempDir dir, node;
  test::LogCapture log;
  const std::string job_dir = node.path() + "/" + NodeTier::dir_name(::geteuid(), "99");
  SECTION("another user's") {
    REQUIRE(::mkdir(job_dir.c_str(), 0700) == 0);
    REQUIRE(::chown(job_dir.c_str(), ::geteuid() + 4321, ::getegid()) == 0);
  }
  SECTION("a symlink to the user's own dir") {
    test::TempDir elsewhere;
    REQUIRE(::symlink(elsewhere.path().c_str(), job_dir.c_str()) == 0);
  }
  SECTION("open to others") {
    REQUIRE(::mkdir(job_dir.c_str(), 0700) == 0);
    REQUIRE(::chmod(job_dir.c_str(), 0777) == 0);
  }
  train(tier_options(dir.path(), node.path(), "99"), 2);
  CHECK(log.has("node tier off: "));
  CHECK(log.has("staging stays in this process's memory"));
  Relaunch r = relaunch(tier_options(dir.path(), node.path(), "99"));
  REQUIRE(r.step.ok());
  CHECK(*r.step == 2);
  CHECK(r.stats.restore_live_bytes == 0);
}

TEST_CASE("node tier: off without the memory tier, without a job, or with CKPT_NODE_DIR=off", "[hooks][node_tier]") {
  test::TempDir dir, node;
  auto o = tier_options(dir.path(), node.path(), "5");
  SECTION("no memory tier") { REQUIRE(o.set("memory", "off").ok()); }
  SECTION("node_dir off") { REQUIRE(o.set("node_dir", "off").ok()); }
  train(o, 1);
  CHECK(files_in(node.path()).empty());
}

TEST_CASE("node tier: an index names its buffers' steps only while they are whole", "[hooks][node_tier]") {
  test::TempDir node, ckpt_dir;
  auto tier = NodeTier::open(node.path(), {"12", 0, "host-a", ckpt_dir.path(), 3, {}, "", 1});
  REQUIRE(tier.ok());
  auto buffer = (*tier)->allocate(4096);
  REQUIRE(buffer.ok());
  std::memset(buffer->data(), 7, 4096);
  (*tier)->whole(5, {Piece{"w", buffer->data() + 64, 100, {}}}, {0});
  {
    auto later = NodeTier::open(node.path(), {"12", 0, "host-a", ckpt_dir.path(), 3, {}, "", 1});
    REQUIRE(later.ok());
    auto found = (*later)->found();
    REQUIRE(found.size() == 1);
    CHECK(found[0].name == "w");
    CHECK(found[0].size == 100);
    CHECK(static_cast<const unsigned char*>(found[0].data)[0] == 7);
  }
  (*tier)->overwriting(buffer->data());
  {
    auto later = NodeTier::open(node.path(), {"12", 0, "host-a", ckpt_dir.path(), 3, {}, "", 1});
    REQUIRE(later.ok());
    CHECK((*later)->found().empty());
  }
  (*tier)->whole(6, {Piece{"w", buffer->data(), 10, {}}}, {0});
  SECTION("another host's index is not used") {
    auto elsewhere = NodeTier::open(node.path(), {"12", 0, "host-b", ckpt_dir.path(), 3, {}, "", 1});
    REQUIRE(elsewhere.ok());
    CHECK((*elsewhere)->found().empty());
  }
  SECTION("the job's next run after a requeue (same id, restart count 1) does not use it") {
    auto requeued = NodeTier::open(node.path(), {"12", 1, "host-a", ckpt_dir.path(), 3, {}, "", 1});
    REQUIRE(requeued.ok());
    CHECK((*requeued)->found().empty());
  }
  SECTION("remove_all (a restart in place keeps its state itself): no file of the rank is left, the mapping lives") {
    (*tier)->remove_all();
    CHECK(files_in(node.path() + "/" + NodeTier::dir_name(::geteuid(), "12")).empty());
    CHECK(static_cast<unsigned char>(buffer->data()[0]) == 7);
    auto later = NodeTier::open(node.path(), {"12", 0, "host-a", ckpt_dir.path(), 3, {}, "", 1});
    REQUIRE(later.ok());
    CHECK((*later)->found().empty());
  }
  SECTION("another rank does not read it") {
    auto other = NodeTier::open(node.path(), {"12", 0, "host-a", ckpt_dir.path(), 4, {}, "", 1});
    REQUIRE(other.ok());
    CHECK((*other)->found().empty());
  }
}

TEST_CASE("node tier: after the last words a tier's files stay until the process opens its next one, which removes "
          "them first",
          "[hooks][node_tier]") {
  test::TempDir node, ckpt_dir;
  const std::string job_dir = node.path() + "/" + NodeTier::dir_name(::geteuid(), "14");
  auto tier = NodeTier::open(node.path(), {"14", 0, "host-a", ckpt_dir.path(), 2, {}, "", 1});
  REQUIRE(tier.ok());
  auto buffer = (*tier)->allocate(4096);
  REQUIRE(buffer.ok());
  std::memset(buffer->data(), 9, 4096);
  (*tier)->whole(4, {Piece{"w", buffer->data(), 100, {}}}, {0});
  NodeTier::keep_until_next_open(std::move(tier).value());
  // A process that gives up here leaves them to a relaunch (another process), which finds the snapshot.
  REQUIRE(files_in(job_dir).size() == 2);  // the buffer and the index
  // This process going on in place: its next tier removes them before it reads the index, and offers nothing.
  auto next = NodeTier::open(node.path(), {"14", 0, "host-a", ckpt_dir.path(), 2, {}, "", 1});
  REQUIRE(next.ok());
  CHECK((*next)->found().empty());
  CHECK(files_in(job_dir).empty());
  CHECK(static_cast<unsigned char>(buffer->data()[0]) == 9);  // the mapping the process holds keeps its bytes
}

TEST_CASE("node tier: a process going on in place gives its next tier the files its last one handed over, renamed",
          "[hooks][node_tier][reserve]") {
  test::TempDir node, ckpt_dir;
  const std::string job_dir = node.path() + "/" + NodeTier::dir_name(::geteuid(), "15");
  const NodeTier::Identity identity{"15", 0, "host-a", ckpt_dir.path(), 2, {}, "", 1};
  const std::size_t mib = 1u << 20;
  BufferReserve& reserve = BufferReserve::process();
  reserve.close();
  auto tier = NodeTier::open(node.path(), identity);
  REQUIRE(tier.ok());
  auto allocated_a = (*tier)->allocate(mib);
  auto allocated_b = (*tier)->allocate(2 * mib);
  REQUIRE(allocated_a.ok());
  REQUIRE(allocated_b.ok());
  HostBuffer a = std::move(allocated_a).value(), b = std::move(allocated_b).value();
  std::memset(a.data(), 9, mib);
  std::byte* a_at = a.data();
  (*tier)->whole(4, {Piece{"w", a.data(), 100, {}}}, {0});
  // The last words hand both over (Checkpointer::release_memory_copies): named on the buffers, kept by remove_all.
  reserve.open();
  (*tier)->hand_over(a);
  (*tier)->hand_over(b);
  const std::string a_file = a.file(), b_file = b.file();
  CHECK(a_file.rfind(job_dir + "/", 0) == 0);
  NodeTier::keep_until_next_open(std::move(tier).value());
  auto next = NodeTier::open(node.path(), identity);
  REQUIRE(next.ok());
  CHECK((*next)->found().empty());  // this process's own state is not offered to it
  CHECK(files_in(job_dir).size() == 2);  // the two files handed over; the index went
  // The program lets go of them: the reserve keeps them, mapped.
  reserve.give(std::move(a));
  reserve.give(std::move(b));
  CHECK(reserve.kept_bytes() == 3 * mib);
  auto again = (*next)->allocate(mib);
  REQUIRE(again.ok());
  CHECK(again->data() == a_at);  // the same pages: nothing mapped or faulted in again
  CHECK(static_cast<unsigned char>(again->data()[0]) == 9);
  CHECK_FALSE(fs::exists(a_file));  // renamed as the next tier's
  CHECK(files_in(job_dir).size() == 3);  // that file, b's, and the next tier's index
  const BufferReserve::Use use = reserve.close();
  CHECK(use.taken == mib);
  CHECK(use.unused == 2 * mib);
  CHECK_FALSE(fs::exists(b_file));  // nobody took it: it went with the reserve
  CHECK(files_in(job_dir).size() == 2);
  // The renamed file is the next tier's own: a later process finds its snapshot there.
  std::memset(again->data(), 5, mib);
  (*next)->whole(6, {Piece{"w", again->data(), 100, {}}}, {0});
  auto later = NodeTier::open(node.path(), identity);
  REQUIRE(later.ok());
  auto found = (*later)->found();
  REQUIRE(found.size() == 1);
  CHECK(static_cast<const unsigned char*>(found[0].data)[0] == 5);
}

TEST_CASE("node tier: files of a rank that no longer runs on this node, whose writer is gone: offered as ranges, "
          "then removed; another run's removed at once",
          "[hooks][node_tier]") {
  test::TempDir node, ckpt_dir;
  const std::string job_dir = node.path() + "/" + NodeTier::dir_name(::geteuid(), "31");
  // Rank 5's process on this host: it leaves a whole snapshot and dies.
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    auto tier = NodeTier::open(node.path(), {"31", 0, "host-a", ckpt_dir.path(), 5, {5}, "", 1});
    if (!tier) ::_exit(1);
    auto buffer = (*tier)->allocate(4096);
    if (!buffer) ::_exit(2);
    std::memset(buffer->data(), 3, 100);
    (*tier)->whole(9, {Piece{"w", buffer->data(), 100, {}}}, {XXH3_64bits(buffer->data(), 100)});
    ::_exit(0);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  const std::string prefix5 = NodeTier::file_prefix(ckpt_dir.path(), 5);
  auto files_of_5 = [&] {
    std::size_t n = 0;
    for (const std::string& f : files_in(job_dir)) n += f.rfind(prefix5, 0) == 0 ? 1 : 0;
    return n;
  };
  REQUIRE(files_of_5() == 2);  // its buffer and its index
  SECTION("rank 5 runs on this node in this launch: its files are its own to adopt") {
    auto tier = NodeTier::open(node.path(), {"31", 0, "host-a", ckpt_dir.path(), 3, {3, 5}, "", 1});
    REQUIRE(tier.ok());
    CHECK(files_of_5() == 2);
  }
  SECTION("this launch's ranks here are not known (no SLURM_GTIDS): nothing is removed") {
    auto tier = NodeTier::open(node.path(), {"31", 0, "host-a", ckpt_dir.path(), 3, {}, "", 1});
    REQUIRE(tier.ok());
    CHECK(files_of_5() == 2);
  }
  SECTION("another host's index is not this node's to judge") {
    auto tier = NodeTier::open(node.path(), {"31", 0, "host-b", ckpt_dir.path(), 3, {3, 4}, "", 1});
    REQUIRE(tier.ok());
    CHECK(files_of_5() == 2);
  }
  SECTION("rank 5 runs elsewhere now and its writer is gone: its ranges are offered, never as a snapshot; removed "
          "at release") {
    test::LogCapture log;
    auto tier = NodeTier::open(node.path(), {"31", 0, "host-a", ckpt_dir.path(), 3, {3, 4}, "", 1});
    REQUIRE(tier.ok());
    CHECK(log.has("node tier: rank 5, which no longer runs on this node, left the snapshots of step(s) 9 here"));
    auto found = (*tier)->found();
    REQUIRE(found.size() == 1);
    CHECK(found[0].name == "w");
    CHECK(found[0].size == 100);
    std::vector<unsigned char> threes(100, 3);
    CHECK(found[0].recorded == std::optional<std::uint64_t>(XXH3_64bits(threes.data(), threes.size())));
    CHECK(std::memcmp(found[0].data, threes.data(), threes.size()) == 0);
    CHECK((*tier)->found_snapshots().empty());  // rank 5's, not rank 3's to resume from
    CHECK(files_of_5() == 2);
    (*tier)->release_found();
    CHECK(files_of_5() == 0);
  }
  SECTION("rank 5's files of another run (the job requeued since): removed at once, nothing offered") {
    test::LogCapture log;
    auto tier = NodeTier::open(node.path(), {"31", 1, "host-a", ckpt_dir.path(), 3, {3, 4}, "", 1});
    REQUIRE(tier.ok());
    CHECK(files_of_5() == 0);
    CHECK((*tier)->found().empty());
    CHECK(log.has("node tier: removed the staging files rank 5 left on this node, where it no longer runs"));
  }
}

// A memory snapshot of step 5 newer than the dir's step 3, as a rank of a multi-node job leaves it: written here
// through the node tier itself (a job of one rank takes no memory checkpoint: its partner would share its node).
TEST_CASE("node tier: a relaunch resumes from a memory snapshot newer than the checkpoint dir's, checked",
          "[hooks][node_tier]") {
  test::TempDir dir, node;
  test::LogCapture log;
  const auto o = tier_options(dir.path(), node.path(), "4343");
  train(o, 3);  // the dir holds step 3
  int world = 1;
  std::string launch = "earlier-launch";
  bool flip = false;
  SECTION("step 5 from the node's memory: nothing read from the dir") {}
  SECTION("a flipped byte in step 5's staging: refused, every rank walks back to the dir's step 3, nothing marked") {
    flip = true;
  }
  SECTION("a snapshot of a launch with another world size is not resumed from") { world = 2; }
  {
    NodeTier::Identity id{"4343", 0, {}, dir.path(), 0, {}, launch, world};
    auto tier = NodeTier::open(node.path(), id);
    REQUIRE(tier.ok());
    auto buffer = (*tier)->allocate((1 << 20) + 4096);
    REQUIRE(buffer.ok());
    auto a = state_at(1 << 20, 5), b = state_at(100, 5);
    std::memcpy(buffer->data(), a.data(), a.size());
    std::memcpy(buffer->data() + (1 << 20), b.data(), b.size());
    const std::string blob = "a pickle";  // outside staging: inline in the index
    std::vector<Piece> pieces{{"a", buffer->data(), a.size(), {}},
                              {"b", buffer->data() + (1 << 20), b.size(), {}},
                              {"opt", reinterpret_cast<const std::byte*>(blob.data()), blob.size(), {{"k", 1}}}};
    std::vector<std::uint64_t> sums;
    for (const Piece& p : pieces) sums.push_back(XXH3_64bits(p.data, p.size));
    (*tier)->whole(5, pieces, sums);
    if (flip) buffer->data()[77] ^= std::byte{0x10};
  }
  Relaunch r = relaunch(o);
  REQUIRE(r.step.ok());
  if (world == 1 && !flip) {
    CHECK(*r.step == 5);
    CHECK((r.a == state_at(1 << 20, 5)));
    CHECK((r.b == state_at(100, 5)));
    CHECK(r.stats.restore_read_bytes == 0);
    CHECK(r.stats.restore_live_bytes == (1u << 20) + 100 + 8);
    CHECK(log.has("node tier: step 5 of launch earlier-launch is in this node's memory, newer than step 3"));
    CHECK(log.has("restored step 5 from the node tier"));
  } else {
    CHECK(*r.step == 3);
    CHECK((r.a == state_at(1 << 20, 3)));
    CHECK((r.b == state_at(100, 3)));
    if (flip) {
      CHECK(log.has("'a' in the node tier no longer matches its checksum"));
      CHECK(log.has("every rank walks back to the checkpoint dir"));
    } else {
      CHECK_FALSE(log.has("node tier: step 5"));
    }
    for (const auto& e : fs::recursive_directory_iterator(dir.path())) CHECK(e.path().filename() != "FAILED");
  }
}

// Two ranks of one job restore at once, each on its own thread as separate processes would. Rank 0's node tier
// holds a memory snapshot of step 5 of an earlier launch; rank 1's too, or nothing (its node was replaced).
TEST_CASE("node tier: a memory step is checked only once every rank holds it; a rank without it costs no hash",
          "[hooks][node_tier]") {
  test::TempDir dir, node;
  test::LogCapture log;
  bool both = false;
  SECTION("rank 1 lacks it: every rank starts at step 0, and no rank hashed the snapshot") {}
  SECTION("both hold it: asked first, then checked and loaded by each") { both = true; }
  auto plant = [&](int rank) {
    auto tier = NodeTier::open(node.path(), {"4545", 0, {}, dir.path(), rank, {}, "earlier-launch", 2});
    REQUIRE(tier.ok());
    auto buffer = (*tier)->allocate(1 << 20);
    REQUIRE(buffer.ok());
    auto a = state_at(1 << 20, 5 + static_cast<std::uint64_t>(rank));
    std::memcpy(buffer->data(), a.data(), a.size());
    (*tier)->whole(5, {Piece{"a", buffer->data(), a.size(), {}}}, {XXH3_64bits(a.data(), a.size())});
  };
  plant(0);
  if (both) plant(1);
  std::vector<Result<std::uint64_t>> steps(2, Error{"not run"});
  std::vector<std::vector<unsigned char>> regions(2, std::vector<unsigned char>(1 << 20, 0));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      Options o = tier_options(dir.path(), node.path(), "4545");
      if (!o.set("rank", std::to_string(rank)).ok() || !o.set("world_size", "2").ok() ||
          !o.set("run_id", "relaunch").ok()) {
        return;
      }
      auto& a = regions[static_cast<std::size_t>(rank)];
      auto cp = test::make(o);
      if (!cp->register_region({"a", a.data(), a.size()})) return;
      steps[static_cast<std::size_t>(rank)] = cp->restore();
      (void)cp->close();
    });
  }
  for (auto& t : threads) t.join();
  for (int rank = 0; rank < 2; ++rank) {
    CAPTURE(rank);
    const auto& step = steps[static_cast<std::size_t>(rank)];
    REQUIRE(step.ok());
    if (both) {
      CHECK(*step == 5);
      CHECK((regions[static_cast<std::size_t>(rank)] == state_at(1 << 20, 5 + static_cast<std::uint64_t>(rank))));
    } else {
      CHECK(*step == 0);
    }
  }
  if (both) {
    CHECK(log.has("node tier: every rank holds step 5 of launch earlier-launch; each checks its own now"));
    CHECK(log.has("restored step 5 from the node tier"));
  } else {
    CHECK(log.has("step 5 of launch earlier-launch: not in this rank's node tier"));
    CHECK_FALSE(log.has("from this node's memory, checked against their checksums"));
  }
}
