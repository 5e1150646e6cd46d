// How the executor waits: spin first (a peer on another core answers in about
// a microsecond), then yield, then sleep in short naps so that oversubscribed
// ranks leave the cores to the ranks that have work. Once a yield has handed
// the CPU to another task (another rank, or the training loop's own compute
// next to an asynchronous operation), the operation naps instead of yielding:
// a yield would give that task a whole time slice. When the wait is for
// sockets, its naps become sleeps in ppoll() on them (the kernel wakes the
// rank when bytes arrive), and SocketWait says when they start; on shared
// memory they become sleeps that the peer ends when it posts the awaited
// message or frees the awaited slot (Connection::sleep_until_peer, or
// sleep_until_either_peer for a step that awaits both), so a rank that waited
// long for a straggler does not start a nap's length late. The phases
// are measured in time, not iterations, because the cost of a pause
// instruction varies tenfold between CPUs. Throws TimeoutError once nothing
// has progressed for the timeout.
#pragma once

#include <poll.h>

#include <chrono>
#include <initializer_list>
#include <string>

#include "core/common/deadline.h"
#include "core/transport/connection.h"

namespace weft {

class Backoff {
 public:
  using Clock = std::chrono::steady_clock;

  // How a wait on sockets passes the time before it sleeps in ppoll on them.
  enum class SocketWait {
    // Sleep after a short spin: the wait is for bytes, or the task sharing
    // the CPU is the process's own compute, which the wake-up preempts where
    // a yield would wait out its time slice.
    Sleep,
    // Yield for as long as a shared-memory wait does, even when crowded: the
    // wait is for a peer's turn on a CPU. With more ranks than cores, waking
    // a sleeping rank (an interprocessor interrupt, a VM exit here) costs more
    // than cycling through the runnable ranks, which yield back at once.
    Yield,
  };

  explicit Backoff(double timeout_s, SocketWait socket_wait = SocketWait::Sleep)
      : timeout_(wait_duration(timeout_s)), timeout_s_(timeout_s), socket_wait_(socket_wait) {}

  // Something moved: the next wait starts a fresh spin and a fresh timeout.
  void reset() { rounds_ = 0; }

  // What a wait is for: bytes from a connection (receiving) or room in it.
  struct Awaited {
    Connection* connection;
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
  // Sleeps where an awaited peer can wake this rank, else blind, for `length`.
  static void nap(std::chrono::nanoseconds length, std::initializer_list<Awaited> awaited);
  void wait_a_little(Clock::duration waited, std::initializer_list<Awaited> awaited);
  [[noreturn]] void throw_timeout(const std::string& what) const;

  const Clock::duration timeout_;
  const double timeout_s_;
  const SocketWait socket_wait_;
  unsigned rounds_ = 0;
  Phase phase_ = Phase::Spin;
  // A yield of this operation gave the CPU to another task: its waits nap
  // instead of yielding from then on.
  bool crowded_ = false;
  Clock::time_point start_;
  // The sockets of the awaited connections (at most two), or 0 when one has
  // none.
  static nfds_t awaited_sockets(std::initializer_list<Awaited> awaited, pollfd* sockets);
  void sleep_on(pollfd* sockets, nfds_t n);
};

}  // namespace weft
