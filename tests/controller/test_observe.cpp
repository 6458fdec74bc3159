// The checkpoint reader the controller runs as a job's owner: it must inherit nothing of the daemon's environment
// (a SLURM_JWT there would be the owner's to read in /proc/<pid>/environ).
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <cstdlib>
#include <fstream>
#include <string>

#include "observe.hpp"

TEST_CASE("checkpoint reader: runs as the owner with a minimal environment, never the daemon's token",
          "[controller][security]") {
  // It drops privileges to another uid, which only root can: the suite runs as root (tests/CMakeLists.txt).
  REQUIRE(geteuid() == 0);
  char dir[] = "/tmp/ckpt-reader-env-XXXXXX";
  REQUIRE(mkdtemp(dir) != nullptr);
  REQUIRE(chmod(dir, 0755) == 0);
  const std::string reader = std::string(dir) + "/reader.sh";
  {
    // A stand-in reader that answers with what it can see: its uid and its whole environment.
    std::ofstream out(reader);
    out << "#!/bin/sh\nprintf '{\"error\":\"uid=%s %s\"}\\n' \"$(id -u)\" \"$(env | tr '\\n\"\\\\' '   ')\"\n";
  }
  REQUIRE(chmod(reader.c_str(), 0755) == 0);
  ::setenv("SLURM_JWT", "token-the-owner-must-not-see", 1);
  ::setenv("CKPT_SOME_DAEMON_SETTING", "daemon-only", 1);
  ckpt::controller::set_checkpoint_reader(reader);
  const auto view = ckpt::controller::read_checkpoints_as(dir, "", 65534, 65534, 10);
  ckpt::controller::set_checkpoint_reader("");
  ::unsetenv("SLURM_JWT");
  ::unsetenv("CKPT_SOME_DAEMON_SETTING");
  std::remove(reader.c_str());
  rmdir(dir);
  INFO("the reader saw: " << view.error);
  CHECK(view.error.find("uid=65534 ") == 0);
  CHECK(view.error.find("PATH=") != std::string::npos);
  CHECK(view.error.find("token-the-owner-must-not-see") == std::string::npos);
  CHECK(view.error.find("daemon-only") == std::string::npos);
}
