// ckpt::fs::open_trusted_dir against real directories, owners and modes. The walks run in a child that has become
// an unprivileged uid, as the plugin's helper and the ranks do; setting up other users' dirs needs root.
#include <grp.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "ckpt/store.hpp"
#include "ckpt/trusted_dir.hpp"

namespace {

namespace stdfs = std::filesystem;

constexpr uid_t kUser = 23451;   // the job's user
constexpr uid_t kOther = 23452;  // a co-user

struct Scratch {
  std::string path;
  Scratch() {
    char templ[] = "/tmp/trusted-dir.XXXXXX";
    path = ::mkdtemp(templ);
    ::chmod(path.c_str(), 0755);
  }
  ~Scratch() {
    std::error_code ec;
    stdfs::remove_all(path, ec);
  }
};

void make(const std::string& path, uid_t owner, mode_t mode) {
  stdfs::create_directories(path);
  REQUIRE(::chown(path.c_str(), owner, owner) == 0);
  REQUIRE(::chmod(path.c_str(), mode) == 0);
}

// Runs open_trusted_dir as kUser in a child; returns "" on success or the error line.
std::string open_as_user(const std::string& path, std::vector<std::string> prefixes, bool create) {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(fds[0]);
    std::string out;
    if (::setgroups(0, nullptr) != 0 || ::setgid(kUser) != 0 || ::setuid(kUser) != 0) {
      out = "cannot become the test user";
    } else {
      auto fd = ckpt::fs::open_trusted_dir(path, ckpt::fs::TrustRules{kUser, prefixes}, create);
      if (fd) {
        ::close(*fd);
      } else {
        out = fd.error().empty() ? "?" : fd.error();
      }
    }
    if (::write(fds[1], out.data(), out.size()) < 0) _exit(2);
    _exit(0);
  }
  ::close(fds[1]);
  std::string text;
  char buf[512];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof buf)) > 0) text.append(buf, static_cast<std::size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  REQUIRE(WIFEXITED(status));
  return text;
}

mode_t mode_of(const std::string& path) {
  struct stat st {};
  REQUIRE(::lstat(path.c_str(), &st) == 0);
  return st.st_mode & 07777;
}

}  // namespace

TEST_CASE("trusted dir: good layouts open", "[trusted_dir][security]") {
  REQUIRE(::geteuid() == 0);  // other users' dirs can only be set up as root (the suite runs as root)
  Scratch s;
  make(s.path + "/site", 0, 01777);  // like /scratch: root's, sticky

  SECTION("missing components are created 0700 by the user") {
    REQUIRE(open_as_user(s.path + "/site/alice/ckpt/42", {}, true) == "");
    CHECK(mode_of(s.path + "/site/alice") == 0700);
    CHECK(mode_of(s.path + "/site/alice/ckpt/42") == 0700);
  }
  SECTION("the user's own symlink is followed") {
    make(s.path + "/site/alice", kUser, 0700);
    make(s.path + "/site/alice/real", kUser, 0700);
    stdfs::create_directory_symlink("real", s.path + "/site/alice/link");
    REQUIRE(::lchown((s.path + "/site/alice/link").c_str(), kUser, kUser) == 0);
    CHECK(open_as_user(s.path + "/site/alice/link", {}, false) == "");
  }
  SECTION("root's absolute symlink is followed") {
    make(s.path + "/lustre", 0, 01777);
    stdfs::create_directory_symlink(s.path + "/lustre", s.path + "/scratch");
    CHECK(open_as_user(s.path + "/scratch/alice", {}, true) == "");
    CHECK(stdfs::is_directory(s.path + "/lustre/alice"));
  }
  SECTION("components at or above a trusted prefix are the site's") {
    make(s.path + "/svc", kOther, 01777);  // a site dir owned by a service account
    CHECK_THAT(open_as_user(s.path + "/svc/alice", {}, true), Catch::Contains("belongs to neither root nor"));
    CHECK(open_as_user(s.path + "/svc/alice", {s.path + "/svc"}, true) == "");
  }
}

TEST_CASE("trusted dir: other users' components are refused", "[trusted_dir][security]") {
  REQUIRE(::geteuid() == 0);
  Scratch s;
  make(s.path + "/site", 0, 01777);

  SECTION("a parent squatted by a co-user, world-writable") {
    make(s.path + "/site/alice", kOther, 0777);
    auto err = open_as_user(s.path + "/site/alice/ckpt", {}, true);
    CHECK_THAT(err, Catch::Contains("'" + s.path + "/site/alice'") && Catch::Contains("owner uid 23452") &&
                        Catch::Contains("mode 0777"));
    CHECK_FALSE(stdfs::exists(s.path + "/site/alice/ckpt"));  // nothing created below it
  }
  SECTION("a parent of a co-user, read-only") {
    make(s.path + "/site/alice", kOther, 0755);
    CHECK_THAT(open_as_user(s.path + "/site/alice", {}, false), Catch::Contains("belongs to neither root nor"));
  }
  SECTION("a root-owned, world-writable, non-sticky parent") {
    make(s.path + "/site/open", 0, 0777);
    CHECK_THAT(open_as_user(s.path + "/site/open/alice", {}, true), Catch::Contains("writable by other users"));
  }
  SECTION("a symlink planted by a co-user") {
    make(s.path + "/site/alice", kUser, 0700);
    make(s.path + "/site/bob/fake", kOther, 0755);
    stdfs::create_directory_symlink(s.path + "/site/bob/fake", s.path + "/site/alice2");
    REQUIRE(::lchown((s.path + "/site/alice2").c_str(), kOther, kOther) == 0);
    CHECK_THAT(open_as_user(s.path + "/site/alice2", {}, false), Catch::Contains("symlink of another user"));
  }
  SECTION("the user's symlink into a co-user's dir") {
    make(s.path + "/site/bob", kOther, 0755);
    make(s.path + "/site/alice", kUser, 0700);
    stdfs::create_directory_symlink(s.path + "/site/bob", s.path + "/site/alice/ckpt");
    REQUIRE(::lchown((s.path + "/site/alice/ckpt").c_str(), kUser, kUser) == 0);
    CHECK_THAT(open_as_user(s.path + "/site/alice/ckpt", {}, false), Catch::Contains("owner uid 23452"));
  }
  SECTION("the checkpoint dir itself open to others") {
    make(s.path + "/site/alice", kUser, 0777);
    CHECK_THAT(open_as_user(s.path + "/site/alice", {}, false), Catch::Contains("is writable by other users"));
  }
  SECTION("a file where a dir should be") {
    make(s.path + "/site/alice", kUser, 0700);
    REQUIRE(std::system(("touch " + s.path + "/site/alice/ckpt").c_str()) == 0);
    CHECK_THAT(open_as_user(s.path + "/site/alice/ckpt", {}, true), Catch::Contains("not a directory"));
  }
  SECTION("a relative path") {
    CHECK_THAT(open_as_user("site/alice", {}, true), Catch::Contains("not an absolute path"));
  }
}

// Root's own tools (`ckpt ls`, `ckpt gc` run by an admin) once opened any path as given: a user's symlink made
// root list or clean another user's checkpoints. Root now walks a dir under the rules of the user who owns it.
TEST_CASE("store as root: a user's symlink to another user's dir is refused", "[trusted_dir][store][security]") {
  REQUIRE(::geteuid() == 0);
  Scratch s;
  make(s.path + "/site", 0, 0755);
  make(s.path + "/site/bob/ckpt", kOther, 0700);
  make(s.path + "/site/alice", kUser, 0755);
  REQUIRE(::symlink((s.path + "/site/bob/ckpt").c_str(), (s.path + "/site/alice/ckpt").c_str()) == 0);
  REQUIRE(::lchown((s.path + "/site/alice/ckpt").c_str(), kUser, kUser) == 0);
  auto redirected = ckpt::store::scan(s.path + "/site/alice/ckpt");
  CHECK_FALSE(redirected);
  CHECK(redirected.error().find("bob") != std::string::npos);
  CHECK(ckpt::store::scan(s.path + "/site/bob/ckpt"));  // bob's own dir, as root: read under bob's rules
  make(s.path + "/site/alice/real", kUser, 0700);
  REQUIRE(::symlink((s.path + "/site/alice/real").c_str(), (s.path + "/site/alice/mine").c_str()) == 0);
  REQUIRE(::lchown((s.path + "/site/alice/mine").c_str(), kUser, kUser) == 0);
  CHECK(ckpt::store::scan(s.path + "/site/alice/mine"));  // her symlink to her own dir
}
