#pragma once
// The clocks: wall time as seconds since the Unix epoch (what records and files store and compare across nodes),
// and elapsed seconds on the steady clock (what timeouts and measured durations use).
#include <chrono>

namespace ckpt {

// Seconds since the Unix epoch, with a fraction; the wall clock, so it may step.
inline double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The steady clock as seconds (since an arbitrary start): for durations a pure function is handed as numbers.
inline double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Seconds elapsed since `t` on the steady clock; never negative.
inline double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace ckpt
