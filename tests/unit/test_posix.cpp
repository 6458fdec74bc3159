// The POSIX file layer (ckpt/posix.hpp) against real files: atomic writes, exclusive creates, whole reads.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>

#include <filesystem>
#include <string>

#include "ckpt/posix.hpp"
#include "store_test_util.hpp"

using namespace ckpt;
namespace fs = std::filesystem;

namespace {

using store::test::slurp;
using store::test::TempDir;

// The names in a dir, hidden ones (temp files) included.
std::size_t entries(const std::string& dir) {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) ++n;
  return n;
}

posix::Fd open_dir(const std::string& dir) {
  posix::Fd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  REQUIRE(fd.valid());
  return fd;
}

}  // namespace

TEST_CASE("posix: write_file_atomic replaces a file whole and leaves no temp file", "[posix]") {
  TempDir tmp;
  auto dir = open_dir(tmp.path());
  REQUIRE(posix::write_file_atomic(dir.get(), "f", "one\n", "f"));
  REQUIRE(posix::write_file_atomic(dir.get(), "f", "two\n", "f"));
  CHECK(slurp(tmp.path() + "/f") == "two\n");
  CHECK(entries(tmp.path()) == 1);

  SECTION("the mode is set whatever the umask") {
    posix::AtomicWriteOptions options;
    options.mode = 0644;
    mode_t old = ::umask(077);
    Status s = posix::write_file_atomic(dir.get(), "g", "x", "g", options);
    ::umask(old);
    REQUIRE(s);
    struct stat st {};
    REQUIRE(::stat((tmp.path() + "/g").c_str(), &st) == 0);
    CHECK((st.st_mode & 0777) == 0644);
  }
  SECTION("a failed last check leaves the old file and no temp file") {
    posix::AtomicWriteOptions options;
    options.hooks.before_publish = [] { return Status::failure("fenced"); };
    Status s = posix::write_file_atomic(dir.get(), "f", "three\n", "f", options);
    CHECK(s.error() == "fenced");
    CHECK(slurp(tmp.path() + "/f") == "two\n");
    CHECK(entries(tmp.path()) == 1);
  }
}

TEST_CASE("posix: create_file_exclusive lets the first creator win", "[posix]") {
  TempDir tmp;
  auto dir = open_dir(tmp.path());
  bool existed = true;
  REQUIRE(posix::create_file_exclusive(dir.get(), "req", "first\n", "req", {}, &existed));
  CHECK_FALSE(existed);
  REQUIRE(posix::create_file_exclusive(dir.get(), "req", "second\n", "req", {}, &existed));
  CHECK(existed);
  CHECK(slurp(tmp.path() + "/req") == "first\n");
  CHECK(entries(tmp.path()) == 1);
}

TEST_CASE("posix: reads", "[posix]") {
  TempDir tmp;
  auto dir = open_dir(tmp.path());
  REQUIRE(posix::write_file_atomic(dir.get(), "f", "abc", "f"));

  SECTION("read_small_file: whole, bounded, no symlink") {
    auto text = posix::read_small_file(dir.get(), "f", 3);
    REQUIRE(text.ok());
    CHECK(*text.value == "abc");
    CHECK_FALSE(posix::read_small_file(dir.get(), "f", 2).ok());
    REQUIRE(::symlink("f", (tmp.path() + "/link").c_str()) == 0);
    auto link = posix::read_small_file(dir.get(), "link", 3);
    CHECK_FALSE(link.ok());
    CHECK(link.error.message == "link is a symlink");
    CHECK(posix::read_small_file(dir.get(), "none", 3).error.err == ENOENT);
  }
  SECTION("read_exactly: a file that ends early is an error") {
    auto file = posix::open_regular(dir.get(), "f", nullptr);
    REQUIRE(file.ok());
    char buf[4];
    Status s = posix::read_exactly(file.value->get(), buf, sizeof buf, "f");
    CHECK(s.error() == "f ended early");
  }
}

TEST_CASE("posix: errno_text and join", "[posix]") {
  CHECK(posix::errno_text(ENOENT) == "No such file or directory");
  CHECK(posix::join("/a", "b") == "/a/b");
  CHECK(posix::join("/a/", "b") == "/a/b");
}

TEST_CASE("posix: read_within reads a child's pipe to its end, within its time and cap", "[posix]") {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  SECTION("to the end, capped") {
    REQUIRE(::write(fds[1], "hello world", 11) == 11);
    ::close(fds[1]);
    std::string text;
    CHECK(posix::read_within(fds[0], 5, 5, text));
    CHECK(text == "hello");
  }
  SECTION("a writer that never closes runs out the time") {
    std::string text;
    const auto t0 = std::chrono::steady_clock::now();
    CHECK_FALSE(posix::read_within(fds[0], 0.2, 100, text));
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2));
    ::close(fds[1]);
  }
  ::close(fds[0]);
}

TEST_CASE("posix: drop_privileges leaves a child no way back to root", "[posix][security]") {
  if (::geteuid() != 0) {
    WARN("not root: privileges cannot be dropped here");
    return;
  }
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const gid_t groups[] = {65534};
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    const bool dropped = posix::drop_privileges(65534, 65534, groups, 1);
    char report[3] = {dropped ? 'd' : '-', ::setuid(0) == 0 ? 'r' : '-', ::seteuid(0) == 0 ? 'e' : '-'};
    (void)::write(fds[1], report, sizeof report);
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string text;
  CHECK(posix::read_within(fds[0], 10, 16, text));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  CHECK(text == "d--");  // dropped, and neither setuid(0) nor seteuid(0) works afterwards
}
