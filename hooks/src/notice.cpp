#include "notice.hpp"

#include <signal.h>

#include <atomic>
#include <mutex>

namespace ckpt::hooks::notice {

namespace {

constexpr int kSignals[] = {SIGTERM, SIGUSR1, SIGUSR2};

std::atomic<std::uint64_t> g_count{0};
std::atomic<int> g_signal{0};
static_assert(std::atomic<std::uint64_t>::is_always_lock_free && std::atomic<int>::is_always_lock_free,
              "the signal handler needs lock-free atomics");

std::mutex g_mu;
int g_users = 0;                                  // guarded by g_mu
struct sigaction g_previous[std::size(kSignals)];  // guarded by g_mu

// Async-signal-safe: lock-free atomic operations, nothing else.
void on_notice(int sig) {
  g_signal.store(sig);
  g_count.fetch_add(1);
}

}  // namespace

void acquire_handlers() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_users++ > 0) return;
  struct sigaction action {};
  action.sa_handler = on_notice;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // the training loop's blocking calls carry on; it polls at after_step
  for (std::size_t i = 0; i < std::size(kSignals); ++i) sigaction(kSignals[i], &action, &g_previous[i]);
}

void release_handlers() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_users == 0 || --g_users > 0) return;
  for (std::size_t i = 0; i < std::size(kSignals); ++i) sigaction(kSignals[i], &g_previous[i], nullptr);
}

std::uint64_t count() { return g_count.load(); }

int last_signal() { return g_signal.load(); }

}  // namespace ckpt::hooks::notice
