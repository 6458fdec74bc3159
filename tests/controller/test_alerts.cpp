// Webhook alerts against a local HTTP receiver: delivered once; retried with backoff while the receiver fails in a
// way that may pass (HTTP 503); not retried when it refuses (HTTP 400); bounded by the attempts; cut short by
// stopping.
#include <catch2/catch.hpp>

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "observe.hpp"

using ckpt::controller::Alerts;
using namespace std::chrono_literals;

namespace {

// Answers the first `fail_first` POSTs with `fail_status`, then 200, keeping the bodies it accepted.
class Receiver {
 public:
  explicit Receiver(int fail_first, int fail_status = 503) : fail_first_(fail_first), fail_status_(fail_status) {
    server_.Post("/hook", [this](const httplib::Request& req, httplib::Response& res) {
      if (++requests_ <= fail_first_) {
        res.status = fail_status_;
        return;
      }
      std::lock_guard<std::mutex> lock(mu_);
      bodies_.push_back(req.body);
      res.status = 200;
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(1ms);
  }
  ~Receiver() {
    server_.stop();
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/hook"; }
  int requests() const { return requests_; }
  std::vector<std::string> bodies() {
    std::lock_guard<std::mutex> lock(mu_);
    return bodies_;
  }

 private:
  httplib::Server server_;
  std::thread thread_;
  int port_ = 0;
  int fail_first_;
  int fail_status_;
  std::atomic<int> requests_{0};
  std::mutex mu_;
  std::vector<std::string> bodies_;
};

template <class Pred>
bool wait_for(Pred done, std::chrono::milliseconds timeout) {
  auto until = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

}  // namespace

TEST_CASE("webhook alerts: retried while the receiver may recover, never when it refuses", "[controller][alerts]") {
  SECTION("delivered at once") {
    Receiver r(0);
    {
      Alerts alerts(r.url(), 2, 5, 20ms);
      alerts.send(R"({"event": "gave_up"})");
      REQUIRE(wait_for([&] { return r.bodies().size() == 1; }, 5s));
    }
    CHECK(r.requests() == 1);
    CHECK(r.bodies().front() == R"({"event": "gave_up"})");
  }
  SECTION("HTTP 503 twice, then delivered") {
    Receiver r(2);
    Alerts alerts(r.url(), 2, 5, 20ms);
    alerts.send("{}");
    REQUIRE(wait_for([&] { return r.bodies().size() == 1; }, 5s));
    CHECK(r.requests() == 3);
  }
  SECTION("HTTP 400 is final") {
    Receiver r(100, 400);
    Alerts alerts(r.url(), 2, 5, 20ms);
    alerts.send("{}");
    REQUIRE(wait_for([&] { return r.requests() == 1; }, 5s));
    std::this_thread::sleep_for(300ms);
    CHECK(r.requests() == 1);
  }
  SECTION("the attempts bound the retries") {
    Receiver r(100);
    Alerts alerts(r.url(), 2, 3, 20ms);
    alerts.send("{}");
    REQUIRE(wait_for([&] { return r.requests() == 3; }, 5s));
    std::this_thread::sleep_for(400ms);
    CHECK(r.requests() == 3);
    CHECK(r.bodies().empty());
  }
  SECTION("stopping ends a retry wait") {
    Receiver r(100);
    auto alerts = std::make_unique<Alerts>(r.url(), 2, 5, 10s);
    alerts->send("{}");
    REQUIRE(wait_for([&] { return r.requests() == 1; }, 5s));
    auto t0 = std::chrono::steady_clock::now();
    alerts.reset();
    CHECK(std::chrono::steady_clock::now() - t0 < 2s);
    CHECK(r.requests() == 1);
  }
}
