// How the executor waits: spin briefly (a peer on another core answers in
// well under a microsecond), then yield, then sleep in short naps so that
// oversubscribed ranks leave the cores to the ranks that have work. Throws
// TimeoutError once nothing has progressed for the timeout.
#pragma once

#include <string>

#include "core/common/deadline.h"

namespace weft {

class Backoff {
 public:
  explicit Backoff(double timeout_s) : timeout_s_(timeout_s) {}

  // Something moved: the next wait starts a fresh spin and a fresh timeout.
  void reset() { idle_rounds_ = 0; }

  // One idle round while waiting for `what`. Throws TimeoutError built by
  // `describe()` when the timeout has passed without a reset().
  template <typename Describe>
  void idle(Describe describe) {
    if (idle_rounds_ == 0) deadline_ = Deadline(timeout_s_);
    ++idle_rounds_;
    if (idle_rounds_ < kSpinRounds) {
      pause();
      return;
    }
    if (deadline_.expired()) throw_timeout(describe());
    nap(idle_rounds_ - kSpinRounds);
  }

  double timeout_s() const { return timeout_s_; }

 private:
  static constexpr unsigned kSpinRounds = 2048;

  static void pause();
  static void nap(unsigned rounds);
  [[noreturn]] void throw_timeout(const std::string& what) const;

  double timeout_s_;
  unsigned idle_rounds_ = 0;
  Deadline deadline_{0};
};

}  // namespace weft
