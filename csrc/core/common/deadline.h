// A point in time after which a wait gives up.
#pragma once

#include <chrono>

namespace weft {

class Deadline {
 public:
  using Clock = std::chrono::steady_clock;

  explicit Deadline(double seconds)
      : end_(Clock::now() +
             std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds))) {}

  bool expired() const { return Clock::now() >= end_; }

  // Milliseconds left, at least 0, for poll().
  int remaining_ms() const {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end_ - Clock::now());
    return left.count() > 0 ? static_cast<int>(left.count()) : 0;
  }

 private:
  Clock::time_point end_;
};

}  // namespace weft
