#pragma once
// Helpers shared by the hooks tests: a scratch dir, a log capture, building checkpointers from settings, and
// reading a region back out of a committed shard without going through the hooks.
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <optional>
#include <vector>

#include "ckpt/hooks.hpp"
#include "ckpt/store.hpp"

namespace ckpt::hooks::test {

// Polls `done` every 5 ms until it holds or `timeout` has passed; returns its last answer.
template <class Pred>
bool wait_for(Pred done, std::chrono::milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < until) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return done();
}

// A fresh directory under $TMPDIR (or /tmp), removed with everything in it at the end of the scope.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string templ = std::string(base != nullptr && *base != '\0' ? base : "/tmp") + "/ckpt-hooks-XXXXXX";
    if (::mkdtemp(templ.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = templ;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string sub(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Sets environment variables for one scope and restores them after.
class ScopedEnv {
 public:
  explicit ScopedEnv(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (const auto& [name, value] : vars) {
      const char* old = std::getenv(name);
      saved_.emplace_back(name, old ? std::optional<std::string>(old) : std::nullopt);
      if (value != nullptr) ::setenv(name, value, 1); else ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    for (const auto& [name, value] : saved_) {
      if (value) ::setenv(name.c_str(), value->c_str(), 1); else ::unsetenv(name.c_str());
    }
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

// Captures every log line for the scope (and keeps them out of the test output).
class LogCapture {
 public:
  LogCapture() {
    previous_ = set_log_sink([this](LogLevel, std::string_view line) {
      std::lock_guard<std::mutex> lock(mu_);
      lines_.emplace_back(line);
    });
  }
  ~LogCapture() { set_log_sink(std::move(previous_)); }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;
  std::vector<std::string> lines() const {
    std::lock_guard<std::mutex> lock(mu_);
    return lines_;
  }
  // True when some line contains `text`.
  bool has(const std::string& text) const {
    for (const std::string& l : lines()) {
      if (l.find(text) != std::string::npos) return true;
    }
    return false;
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::string> lines_;
  LogSink previous_;
};

// Options from key=value pairs; a bad key throws (tests only).
inline Options options(std::initializer_list<std::pair<const char*, std::string>> kv) {
  Options o;
  o.set("signals", "off");  // tests raise notices explicitly where they mean to
  o.set("log", "info");
  for (const auto& [k, v] : kv) {
    if (Status s = o.set(k, v); !s) throw std::runtime_error(s.error());
  }
  return o;
}

inline std::unique_ptr<Checkpointer> make(const Options& o) {
  auto cp = Checkpointer::create(o);
  if (!cp) throw std::runtime_error(cp.error());
  return std::move(cp).value();
}

// The bytes of region `name` in `rank`'s shard of a committed step, read straight from the file.
inline std::vector<unsigned char> read_region(const std::string& root, std::uint64_t step, int rank,
                                              const std::string& name) {
  auto records = store::read_records(root, step);
  if (!records) throw std::runtime_error(records.error());
  for (const store::ShardRecord& r : *records) {
    if (r.rank != rank) continue;
    for (const store::StateRange& s : r.states) {
      if (s.name != name) continue;
      std::ifstream in(root + "/" + store::step_dir_name(step) + "/" + r.file, std::ios::binary);
      in.seekg(static_cast<std::streamoff>(s.offset));
      std::vector<unsigned char> bytes(static_cast<std::size_t>(s.length));
      in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
      if (!in) throw std::runtime_error("short read of " + name);
      return bytes;
    }
  }
  throw std::runtime_error("no region " + name + " for rank " + std::to_string(rank) + " at step " +
                           std::to_string(step));
}

// Steps with a manifest (committed), oldest first.
inline std::vector<std::uint64_t> committed_steps(const std::string& root) {
  std::vector<std::uint64_t> out;
  auto entries = store::scan(root);
  if (!entries) return out;
  for (const store::Entry& e : *entries) {
    if (e.state == store::State::Complete) out.push_back(e.step);
  }
  return out;
}

}  // namespace ckpt::hooks::test

namespace ckpt::hooks::test {

// A gate threads block on until it opens; `arrived` counts the threads that reached it.
class Gate {
 public:
  void wait() {
    std::unique_lock<std::mutex> lock(mu_);
    ++arrived_;
    cv_.notify_all();
    cv_.wait(lock, [&] { return open_; });
  }
  void open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  void close() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = false;
  }
  // Blocks until at least n threads arrived (or ~5 s passed); returns whether they did.
  bool await_arrivals(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(5), [&] { return arrived_ >= n; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
  int arrived_ = 0;
};

}  // namespace ckpt::hooks::test

namespace ckpt::hooks::test {

// A rank that joins the job's network and does nothing else until the test lets it go: the partner a rank of a
// multi-rank job needs to start at all (every rank joins the heartbeat network at creation). Start it before the
// rank under test is created, which blocks until both joined.
class IdleRank {
 public:
  explicit IdleRank(Options options)
      : thread_([this, o = std::move(options)] {
          auto cp = Checkpointer::create(o);
          if (!cp) error_ = cp.error();
          gate_.wait();
        }) {}
  ~IdleRank() { release(); }
  IdleRank(const IdleRank&) = delete;
  IdleRank& operator=(const IdleRank&) = delete;
  // Lets it go (its checkpointer is destroyed without a close) and waits for it; the error of its creation, if any.
  std::string release() {
    gate_.open();
    if (thread_.joinable()) thread_.join();
    return error_;
  }

 private:
  Gate gate_;
  std::string error_;
  std::thread thread_;
};

}  // namespace ckpt::hooks::test
