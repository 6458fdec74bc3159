// The POSIX file layer (ckpt/posix.hpp) against real files: atomic writes, exclusive creates, whole reads.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

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
