#pragma once
// Observability: Prometheus counters and a histogram, webhook alerts, and what a job's checkpoints say.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/recovery.hpp"

namespace ckpt::controller {

// Counters and the recovery-latency histogram, rendered in Prometheus' text format. Thread-safe.
class Metrics {
 public:
  // Declares, at zero, the labelled series that dashboards and alerting rules use (restarts by ending and path,
  // give-ups by ending, the recovery histogram and its phases by path): Prometheus' increase() and rate() do not
  // count a series' first sample, so a counter that first appeared at 1 would hide the first give-up from an alert.
  Metrics();
  void add(const std::string& name, const std::string& labels, double value = 1);
  // Recovery latency (failure report to the new run's first step), per path ("requeue", "relaunch", "in-place").
  void observe_recovery(const std::string& path, double seconds);
  // One phase of a recovery ("agreement", "last_words", ...: see recovery_phases()) on `path`.
  void observe_phase(const std::string& path, const std::string& phase, double seconds);
  // Counters and the histograms, with HELP and TYPE lines; gauges are rendered by the caller.
  std::string render() const;

 private:
  mutable std::mutex mutex_;
  std::map<std::string, std::map<std::string, double>> counters_;  // name -> labels -> value
  struct Histogram {
    std::vector<std::uint64_t> buckets;
    std::uint64_t count = 0;
    double sum = 0;
  };
  static void observe_into(Histogram& h, const std::vector<double>& bounds, double seconds);
  static void render_histogram(std::string& out, const std::string& name, const std::string& labels,
                               const Histogram& h, const std::vector<double>& bounds);
  std::map<std::string, Histogram> recovery_;  // path -> histogram
  std::map<std::string, Histogram> phases_;    // 'path="...",phase="..."' -> histogram
};

inline const std::vector<double>& recovery_buckets() {
  static const std::vector<double> b = {1, 2, 5, 10, 15, 30, 60, 120, 300, 600};
  return b;
}

// A phase of an in-place recovery takes from milliseconds (agreement) to a minute (a large state's load).
inline const std::vector<double>& phase_buckets() {
  static const std::vector<double> b = {0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60};
  return b;
}

// Webhook alerts: a JSON POST per alert from a worker thread, so that a slow receiver never stalls decisions.
class Alerts {
 public:
  // A failure that may pass (no connection, a timeout, HTTP 429 or 5xx) is retried after `first_retry`, doubling
  // up to 60 s, for `attempts` in all; any other answer is final. Stopping ends the retries.
  Alerts(std::string url, double timeout_s, int attempts = 5,
         std::chrono::milliseconds first_retry = std::chrono::seconds(1));
  ~Alerts();
  Alerts(const Alerts&) = delete;
  Alerts& operator=(const Alerts&) = delete;
  // Queues one alert (a JSON object's text); does nothing when no webhook_url is configured.
  void send(const std::string& json);

 private:
  void worker();
  // Sends one alert, retrying as above; returns when it was delivered, refused, given up on, or stopping.
  void deliver(const std::string& body);
  std::string url_;
  double timeout_s_;
  int attempts_;
  std::chrono::milliseconds first_retry_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::string> queue_;
  bool stop_ = false;
  std::thread thread_;
};

// The newest complete checkpoint under a job's CKPT_DIR, as the store's index sees it.
struct CheckpointView {
  std::optional<std::uint64_t> newest_complete;
  double newest_wall_time = 0;  // when it was committed (manifest), 0 when unknown
  std::string error;            // set when the dir could not be read
  std::optional<ckpt::recovery::TimeLimitStop> time_limit_stop;  // the last run's record, when there is one
  std::optional<ckpt::recovery::PeerLost> peer_lost;  // the survivors' record of lost peers, when there is one
};
// Reads in this process, with this process's permissions.
CheckpointView read_checkpoints(const std::string& dir);

// Reads a job's CKPT_DIR with the job owner's permissions. When the controller runs as root, a child drops to
// `uid`, `gid` and the owner's supplementary groups and execs the reader registered with
// set_checkpoint_reader(), which prints the view as JSON; after `timeout_s` it is killed and the view says so.
// Unprivileged, it reads in this thread. Call it from a thread that holds no lock the engine needs.
// `trusted_dirs` (':'-separated, from the plugin) are the site's prefixes where the reader's checks of the dir's
// components start (ckpt/trusted_dir.hpp), as they did when the plugin created it.
CheckpointView read_checkpoints_as(const std::string& dir, const std::string& trusted_dirs, std::uint32_t uid,
                                   std::uint32_t gid, double timeout_s);
// The program run by read_checkpoints_as as `<exe> --read-checkpoints DIR [TRUSTED_DIRS]` (ckpt-controller itself).
void set_checkpoint_reader(const std::string& exe);
// The reader's side: prints read_checkpoints(dir) as one JSON line; returns the exit status.
int checkpoint_reader_main(const std::string& dir, const std::string& trusted_dirs);

}  // namespace ckpt::controller
