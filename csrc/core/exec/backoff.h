// How the executor waits: spin first (a peer on another core answers in about
// a microsecond), then yield, then sleep in short naps so that oversubscribed
// ranks leave the cores to the ranks that have work. Once a yield has handed
// the CPU to another task (another rank, or the training loop's own compute
// next to an asynchronous operation), the operation naps instead of yielding:
// a yield would give that task a whole time slice. When the wait is for
// sockets, the yields and naps become sleeps in ppoll() on them: the kernel
// wakes the rank when bytes arrive. The phases are measured in time, not
// iterations, because the cost of a pause instruction varies tenfold between
// CPUs. Throws TimeoutError once nothing has progressed for the timeout.
#pragma once

#include <chrono>
#include <initializer_list>
#include <string>

#include "core/common/deadline.h"
#include "core/transport/connection.h"

namespace weft {

class Backoff {
 public:
  using Clock = std::chrono::steady_clock;

  explicit Backoff(double timeout_s) : timeout_(wait_duration(timeout_s)), timeout_s_(timeout_s) {}

  // Something moved: the next wait starts a fresh spin and a fresh timeout.
  void reset() { rounds_ = 0; }

  // What a wait is for: bytes from a connection (receiving) or room in it.
  struct Awaited {
    const Connection* connection;
    bool receiving;
  };

  // One idle round. Throws TimeoutError with `describe()` (what we wait for)
  // once the timeout has passed since the last reset(). When every awaited
  // connection has a socket (Connection::readiness_fd), the round may sleep on
  // them.
  template <typename Describe>
  void idle(Describe describe, std::initializer_list<Awaited> awaited = {}) {
    if (rounds_++ == 0) {
      start_ = Clock::now();
      phase_ = Phase::Spin;
    }
    // A round on sockets costs syscalls (microseconds), so its clock is read
    // every round; shared-memory rounds cost nanoseconds and read it rarely.
    if (phase_ == Phase::Spin && (rounds_ % kRoundsPerClockRead) != 0 && !on_sockets(awaited)) {
      pause();
      return;
    }
    Clock::duration waited = Clock::now() - start_;
    if (waited >= timeout_) throw_timeout(describe());
    wait_a_little(waited, awaited);
  }

 private:
  enum class Phase { Spin, Yield, Nap };
  static constexpr unsigned kRoundsPerClockRead = 32;

  static void pause();
  static bool on_sockets(std::initializer_list<Awaited> awaited) {
    return awaited.size() > 0 && awaited.begin()->connection->readiness_fd() >= 0;
  }
  static void nap(std::chrono::nanoseconds length);
  void wait_a_little(Clock::duration waited, std::initializer_list<Awaited> awaited);
  [[noreturn]] void throw_timeout(const std::string& what) const;

  const Clock::duration timeout_;
  const double timeout_s_;
  unsigned rounds_ = 0;
  Phase phase_ = Phase::Spin;
  // A yield of this operation gave the CPU to another task: its waits nap
  // instead of yielding from then on.
  bool crowded_ = false;
  Clock::time_point start_;
  bool sleep_on_sockets(std::initializer_list<Awaited> awaited);
};

}  // namespace weft
