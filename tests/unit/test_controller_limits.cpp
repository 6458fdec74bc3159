// The controller's defences as pure logic: bounded HTTP heads, rate-limited complaints, the cache of unknown job
// ids, the weighing of probes, read access, and the bounds on numbers from events.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <vector>

#include "ckpt/controller_limits.hpp"
#include "ckpt/recovery.hpp"

using namespace ckpt::recovery;

TEST_CASE("http heads: good inputs", "[controller][http]") {
  const HttpLimits limits;
  SECTION("a POST with a body") {
    std::string text = "POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Length: 12\r\n\r\nbody";
    auto end = http_head_end(text);
    REQUIRE(end);
    CHECK(text.substr(*end) == "body");
    auto r = parse_http_head(std::string_view(text).substr(0, *end), limits);
    REQUIRE(r.ok());
    CHECK(r.head.method == "POST");
    CHECK(r.head.target == "/v1/events");
    CHECK(r.head.content_length == 12);
    CHECK(r.head.headers.at("host") == "x");
  }
  SECTION("a GET with bare LF line ends and a query string") {
    std::string text = "GET /v1/jobs?x=1 HTTP/1.0\nX-Ckpt-Credential:  MUNGE:abc: \n\n";
    auto end = http_head_end(text);
    REQUIRE(end);
    CHECK(*end == text.size());
    auto r = parse_http_head(text, limits);
    REQUIRE(r.ok());
    CHECK(r.head.target == "/v1/jobs");
    CHECK(r.head.headers.at("x-ckpt-credential") == "MUNGE:abc:");
  }
  SECTION("an incomplete head has no end yet") { CHECK_FALSE(http_head_end("GET / HTTP/1.1\r\nHost: x\r\n")); }
}

TEST_CASE("http heads: bad inputs", "[controller][http]") {
  const HttpLimits limits;
  auto status = [&](const std::string& text) { return parse_http_head(text, limits).status; };
  CHECK(status("POST /v1/events HTTP/1.1\r\nTransfer-Encoding: chunked\r\n") == 501);
  CHECK(status("POST /v1/events HTTP/1.1\r\nContent-Length: 536870912\r\n") == 413);
  CHECK(status("POST /v1/events HTTP/1.1\r\nHost: x\r\n") == 411);
  CHECK(status("POST /v1/events HTTP/1.1\r\nContent-Length: 12x\r\n") == 400);
  CHECK(status("POST /v1/events HTTP/1.1\r\nContent-Length: -1\r\n") == 400);
  CHECK(status("POST /v1/events HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n") == 400);
  CHECK(status("POST /v1/events HTTP/1.1\r\nContent-Length: 1\r\ncontent-length: 1\r\n") == 400);
  CHECK(status("GET /v1/jobs HTTP/1.1\r\nContent-Length: 5\r\n") == 400);
  CHECK(status("GET /v1/jobs HTTP/2.0\r\n") == 505);
  CHECK(status("GET v1/jobs HTTP/1.1\r\n") == 400);
  CHECK(status("GET /v1/jobs  HTTP/1.1\r\n") == 400);
  CHECK(status("GET /v1/jobs HTTP/1.1\r\n folded\r\n") == 400);
  CHECK(status("GET /v1/jobs HTTP/1.1\r\nno colon\r\n") == 400);
  CHECK(status(std::string("GET /v1/jobs HTTP/1.1\r\nX: a\0b\r\n", 29)) == 400);
  CHECK(status("GET /v1/jobs HTTP/1.1\r\nX-Junk: " + std::string(20000, 'z') + "\r\n") == 431);
  std::string many = "GET / HTTP/1.1\r\n";
  for (int i = 0; i < 70; ++i) many += "X-" + std::to_string(i) + ": 1\r\n";
  CHECK(status(many) == 431);
  CHECK(status("") == 400);
  CHECK_FALSE(parse_http_head("POST /v1/events HTTP/1.1\r\nTransfer-Encoding: chunked\r\n", limits).error.empty());
}

TEST_CASE("log limiter: a burst per window, then a count of what was held back", "[controller][log]") {
  LogLimiter limiter(2, 10.0);
  std::uint64_t held = 0;
  CHECK(limiter.allow("chunked", 100, held));
  CHECK(limiter.allow("chunked", 101, held));
  CHECK_FALSE(limiter.allow("chunked", 102, held));
  CHECK_FALSE(limiter.allow("chunked", 103, held));
  CHECK(limiter.allow("slow", 103, held));  // kinds are counted apart
  CHECK(held == 0);
  CHECK(limiter.allow("chunked", 111, held));
  CHECK(held == 2);
}

TEST_CASE("negative cache: one lookup per unknown id per ttl, bounded", "[controller][cache]") {
  NegativeCache cache(2, 10.0);
  CHECK_FALSE(cache.known_unknown(7, 100));
  cache.remember(7, 100);
  CHECK(cache.known_unknown(7, 105));
  CHECK_FALSE(cache.known_unknown(7, 110.5));  // expired: ask again
  cache.remember(8, 101);
  cache.remember(9, 102);  // full: 7, the oldest, goes
  CHECK(cache.size() == 2);
  CHECK_FALSE(cache.known_unknown(7, 103));
  CHECK(cache.known_unknown(8, 103));
  cache.forget(8);
  CHECK_FALSE(cache.known_unknown(8, 103));
  CHECK(cache.size() == 1);
}

TEST_CASE("negative cache: another user's untracked job is looked up once per ttl", "[controller][cache][security]") {
  NegativeCache cache(4, 10.0);
  CHECK_FALSE(cache.known_owner(7, 100));
  cache.remember_owner(7, 1234, 100);
  CHECK(cache.known_owner(7, 105) == 1234u);
  CHECK_FALSE(cache.known_unknown(7, 105));  // known, with an owner
  CHECK_FALSE(cache.known_owner(7, 110.5));  // expired: ask again
  cache.remember(8, 100);
  CHECK_FALSE(cache.known_owner(8, 101));    // unknown to Slurm has no owner
  CHECK(cache.known_unknown(8, 101));
  cache.remember_owner(8, 99, 102);          // Slurm knows it now
  CHECK_FALSE(cache.known_unknown(8, 103));
  CHECK(cache.known_owner(8, 103) == 99u);
}

// One engine cycle's share of the intake: a user's flood cannot hold another user's report back by more than a cycle.
TEST_CASE("fair batch: FIFO alone, a fair share under a flood", "[controller][intake][security]") {
  SECTION("one user: the whole batch, in arrival order") {
    CHECK(fair_batch({5, 5, 5, 5}, 3, 1) == std::vector<std::size_t>{0, 1, 2});
    CHECK(fair_batch({}, 256, 16).empty());
  }
  SECTION("a flood of 1,000 from user 7, one report of user 8 at the end: it is in this cycle") {
    std::vector<std::uint32_t> users(1000, 7);
    users.push_back(8);
    auto take = fair_batch(users, 256, 16);
    CHECK(take.size() == 129);   // 128 of the flood's (half the batch), and user 8's
    CHECK(take.back() == 1000);
    CHECK(take.front() == 0);    // in arrival order
    CHECK(std::is_sorted(take.begin(), take.end()));
  }
  SECTION("many users: at least the minimum share each") {
    std::vector<std::uint32_t> users;
    for (std::uint32_t u = 0; u < 100; ++u) users.insert(users.end(), 20, u);
    auto take = fair_batch(users, 256, 16);
    CHECK(take.size() == 256);
    std::map<std::uint32_t, int> per;
    for (auto i : take) ++per[users[i]];
    for (const auto& [u, n] : per) CHECK(n <= 16);
  }
}

TEST_CASE("probe evidence: only a confirmed refusal or Slurm's state marks a node down", "[controller][probe]") {
  using P = ProbeResult;
  SECTION("one timeout is not evidence; the job still leaves the node out") {
    auto e = weigh_probes({{"n1", P::Alive}, {"n2", P::TimedOut}}, {{"n2", P::TimedOut}}, {});
    CHECK(e.failed == std::vector<std::string>{"n2"});
    CHECK(e.mark_down.empty());
  }
  SECTION("refused twice") {
    auto e = weigh_probes({{"n3", P::Refused}}, {{"n3", P::Refused}}, {});
    CHECK(e.mark_down == std::vector<std::string>{"n3"});
  }
  SECTION("refused once, then timed out or not asked again") {
    CHECK(weigh_probes({{"n3", P::Refused}}, {{"n3", P::TimedOut}}, {}).mark_down.empty());
    CHECK(weigh_probes({{"n3", P::Refused}}, {}, {}).mark_down.empty());
  }
  SECTION("hung: its window of unanswered RPCs is the confirmation") {
    auto e = weigh_probes({{"n1", P::Alive}, {"n4", P::Hung}}, {}, {});
    CHECK(e.failed == std::vector<std::string>{"n4"});
    CHECK(e.mark_down == std::vector<std::string>{"n4"});
    CHECK(e.hung == std::vector<std::string>{"n4"});
  }
  SECTION("alive on the second probe") {
    auto e = weigh_probes({{"n3", P::Refused}}, {{"n3", P::Alive}}, {});
    CHECK(e.failed.empty());
    CHECK(e.mark_down.empty());
  }
  SECTION("Slurm's own state") {
    auto e = weigh_probes({{"n1", P::Unreachable}}, {{"n1", P::Unreachable}}, {"n4"});
    CHECK(e.failed == std::vector<std::string>{"n1", "n4"});
    CHECK(e.mark_down == std::vector<std::string>{"n4"});
  }
}

TEST_CASE("read access: like PrivateData=jobs", "[controller][auth]") {
  const std::set<std::uint32_t> privileged = {0, 64030};
  CHECK(read_access(0u, privileged).may_see(1001, true));
  CHECK(read_access(64030u, privileged).may_see(1001, false));
  auto user = read_access(1001u, privileged);
  CHECK(user.may_see(1001, true));
  CHECK_FALSE(user.may_see(1002, true));
  CHECK_FALSE(user.may_see(1001, false));  // owner not known yet: not shown
  CHECK_FALSE(read_access(std::nullopt, privileged).may_see(1001, true));
}

TEST_CASE("events: numbers are bounded so counters cannot wrap", "[controller][events]") {
  auto event = [](const std::string& extra) {
    return parse_event(R"({"v":1,"type":"job_start","job_id":5,"node":"n1")" + extra + "}");
  };
  CHECK(event(R"(,"restart_count":1000000)"));
  CHECK_FALSE(event(R"(,"restart_count":4294967295)"));
  CHECK_FALSE(event(R"(,"restart_count":4294967296)"));
  CHECK_FALSE(event(R"(,"restart_count":-1)"));
  CHECK(event(R"(,"max_restarts":1000000)"));
  CHECK_FALSE(event(R"(,"max_restarts":18446744073709551615)"));
  CHECK(saturating_increment(5, 10) == 6);
  CHECK(saturating_increment(10, 10) == 10);
}

TEST_CASE("controller config: the default port is no Slurm daemon's, history bounds", "[controller][config]") {
  auto cfg = parse_controller_config("");
  REQUIRE(cfg);
  CHECK(cfg->listen == "127.0.0.1:6830");
  auto bounded = parse_controller_config("history_max_rows = 50\nhistory_max_age = 7d\n");
  REQUIRE(bounded);
  CHECK(bounded->history_max_rows == 50);
  CHECK(bounded->history_max_age_s == 7 * 86400);
  CHECK(parse_controller_config("history_max_rows = 5\n").error() ==
        "controller.conf:1: history_max_rows: invalid value '5' (expected a number of lines, 10 to 1000000)");
  CHECK_FALSE(parse_controller_config("history_max_age = 10m\n"));
}

TEST_CASE("job identity: a requeue is the same job, a reused id is not", "[controller][record]") {
  CHECK(job_identity(100, 0, 100, 0) == JobIdentity::Same);
  CHECK(job_identity(0, 0, 100, 0) == JobIdentity::Same);          // first seen: adopt
  CHECK(job_identity(100, 0, 160, 1) == JobIdentity::Requeued);   // requeue: new submit time, count + 1
  CHECK(job_identity(100, 1, 160, 3) == JobIdentity::Requeued);
  CHECK(job_identity(100, 0, 200, 0) == JobIdentity::Reused);
  CHECK(job_identity(100, 7, 100, 0) == JobIdentity::Reused);     // restart counts never go down
  CHECK(job_identity(100, 7, 0, 2) == JobIdentity::Reused);
}

TEST_CASE("job record: submit time and group survive a round trip", "[controller][record]") {
  JobRecord r;
  r.job_id = 9;
  r.submit_time = 1764480000;
  r.gid = 1001;
  auto back = parse_job_record(to_json(r));
  REQUIRE(back);
  CHECK(back->submit_time == 1764480000);
  CHECK(back->gid == 1001);
}

TEST_CASE("RPC check: a slow slurmd is not hung, a silent one is", "[controller][probe]") {
  using P = ProbeResult;
  using ckpt::recovery::judge_rpc;
  using ckpt::recovery::rpc_rounds;
  CHECK(rpc_rounds(1.5, 4) == 3);
  CHECK(rpc_rounds(2, 4) == 2);
  CHECK(rpc_rounds(5, 4) == 2);  // never a verdict on one unanswered ask
  CHECK(rpc_rounds(0.1, 1000) == 100);
  SECTION("every ask of the window unanswered") { CHECK(judge_rpc({false, false, false}, 4.5, 4) == P::Hung); }
  SECTION("a slow slurmd answers one ask: alive") {
    CHECK(judge_rpc({false, false, true}, 3.2, 4) == P::Alive);
    CHECK(judge_rpc({true}, 0.01, 4) == P::Alive);
  }
  SECTION("too little asked, or too short a window: no verdict against the node") {
    CHECK(judge_rpc({false}, 9, 4) == P::Alive);
    CHECK(judge_rpc({false, false}, 3.9, 4) == P::Alive);
    CHECK(judge_rpc({}, 0, 4) == P::Alive);
  }
}
