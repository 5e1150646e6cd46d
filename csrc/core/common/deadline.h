// A point in time after which a wait gives up, and the steady clock in
// seconds for timing.
#pragma once

#include <algorithm>
#include <chrono>
#include <climits>

namespace weft {

// `seconds` as a steady-clock duration. Waits longer than a year (a timeout
// of timedelta.max or inf) are a year: the clock's nanoseconds would overflow.
inline std::chrono::steady_clock::duration wait_duration(double seconds) {
  constexpr double kLongestWait_s = 365.0 * 24 * 3600;
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(std::min(seconds, kLongestWait_s)));
}

// Seconds on the steady clock: differences time a piece of work.
inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

class Deadline {
 public:
  using Clock = std::chrono::steady_clock;

  explicit Deadline(double seconds) : end_(Clock::now() + wait_duration(seconds)) {}

  bool expired() const { return Clock::now() >= end_; }

  // Milliseconds left, at least 0, for poll().
  int remaining_ms() const {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end_ - Clock::now());
    return static_cast<int>(std::clamp<long long>(left.count(), 0, INT_MAX));
  }

 private:
  Clock::time_point end_;
};

}  // namespace weft
