// Result<T> and Status: a failure is never read as success, whatever message it was given.
#include <catch2/catch.hpp>

#include <string>

#include "ckpt/result.hpp"

using namespace ckpt;

TEST_CASE("Status: success and failure", "[result]") {
  SECTION("good inputs") {
    CHECK(Status::success().ok());
    CHECK(Status().ok());
    CHECK(Status::success().error().empty());
    Status s = Status::failure("cannot open /x: No such file or directory");
    CHECK_FALSE(s.ok());
    CHECK_FALSE(static_cast<bool>(s));
    CHECK(s.error() == "cannot open /x: No such file or directory");
  }
  SECTION("a failure without a message is still a failure") {
    Status s = Status::failure("");
    CHECK_FALSE(s.ok());
    CHECK(s.error() == kUnknownError);
    CHECK_FALSE(s.error().empty());
    CHECK_FALSE(Status::failure(std::string()).ok());
  }
}

TEST_CASE("Result: a value or a message", "[result]") {
  SECTION("good inputs") {
    Result<int> r = 7;
    REQUIRE(r.ok());
    CHECK(*r == 7);
    CHECK(r.error().empty());
    Result<int> e = Error{"too large"};
    CHECK_FALSE(e.ok());
    CHECK(e.error() == "too large");
  }
  SECTION("an error without a message is still an error, and says so") {
    Result<int> e = Error{""};
    CHECK_FALSE(e.ok());
    CHECK(e.error() == kUnknownError);
    Result<std::string> s = Error{};
    CHECK_FALSE(s.ok());
    CHECK(s.error() == kUnknownError);
  }
}
