#include "core/exec/backoff.h"

#include <poll.h>
#include <sched.h>
#include <sys/prctl.h>
#include <time.h>

#include <sstream>

#include "core/common/error.h"
#include "core/exec/cpu_placement.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace weft {
namespace {

using std::chrono::microseconds;
// Spin while a peer on another core is likely about to answer (it does in
// about a microsecond); then yield, which costs about as much when nothing
// else wants this CPU and hands it over when a peer shares it; then nap.
constexpr auto kSpinFor = microseconds(2);
// A wait on sockets that sleeps soon (SocketWait::Sleep) polls them this
// long first: loopback TCP takes longer than this to answer anyway.
constexpr auto kSocketSpinFor = microseconds(10);
constexpr auto kYieldFor = microseconds(1000);
constexpr auto kNapLongAfter = microseconds(20000);
constexpr auto kNap = microseconds(50);
constexpr auto kLongNap = microseconds(1000);
// A yield with nothing else runnable returns in about a microsecond; one that
// took this long gave the CPU to another task.
constexpr auto kCrowdedYield = microseconds(20);
// With another task on the CPU (the training loop's compute thread, another
// rank), a yield hands it a whole time slice, milliseconds; a short sleep
// lets it run and wakes this rank to progress soon after.
constexpr auto kCrowdedNap = microseconds(20);
// A sleep that the peer ends (Connection::sleep_until_peer) only needs to end
// by itself for the checks between rounds: the timeout, a dead peer, an abort.
constexpr auto kRungNap = microseconds(10000);

// Linux lets a 20 us sleep last 70 us (the default timer slack): a nap asks
// for 1 us of slack and gives the thread its own back afterwards, however the
// nap ends.
class PreciseTimerSlack {
 public:
  PreciseTimerSlack()
      : own_(prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0)),
        changed_(own_ > 1000 && prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0) == 0) {}
  ~PreciseTimerSlack() {
    if (changed_) prctl(PR_SET_TIMERSLACK, static_cast<unsigned long>(own_), 0, 0, 0);
  }

 private:
  const long own_;
  const bool changed_;
};

}  // namespace

void Backoff::pause() {
#if defined(__x86_64__)
  _mm_pause();
#endif
}

void Backoff::wait_a_little(Clock::duration waited, std::initializer_list<Awaited> awaited) {
  pollfd sockets[2];
  const nfds_t n = awaited_sockets(awaited, sockets);
  const Clock::duration socket_spin_for =
      socket_wait_ == SocketWait::Yield ? Clock::duration(kYieldFor) : kSocketSpinFor;
  if (n > 0 && waited >= socket_spin_for) {
    for (const Awaited& a : awaited) {
      if (!a.connection->ready_to_sleep()) return;
    }
    sleep_on(sockets, n);
    return;
  }
  if (waited < kSpinFor) {
    pause();
    return;
  }
  // A crowded wait on sockets still yields (SocketWait::Yield says why).
  if (waited < kYieldFor && (!crowded_ || n > 0)) {
    phase_ = Phase::Yield;
    const Clock::time_point before = Clock::now();
    sched_yield();
    if (Clock::now() - before >= kCrowdedYield) {
      crowded_ = true;
      cpu_placement::crowded();
    }
    return;
  }
  phase_ = Phase::Nap;
  nap(waited < kNapLongAfter ? (crowded_ ? kCrowdedNap : kNap) : kLongNap, awaited);
}

void Backoff::nap(std::chrono::nanoseconds length, std::initializer_list<Awaited> awaited) {
  // A peer ends these sleeps by ringing, so they need no precise timer.
  const Awaited* a = awaited.begin();
  if (awaited.size() == 1 && a->connection->sleep_until_peer(a->receiving, kRungNap)) return;
  if (awaited.size() == 2 && a[0].connection->sleep_until_either_peer(
                                 a[0].receiving, *a[1].connection, a[1].receiving, kRungNap)) {
    return;
  }
  PreciseTimerSlack precise;
  // Waiting on a message and on room to send where the two cannot be slept
  // on together: sleep until the message, and look at the room when the nap
  // is over, as a blind nap would.
  for (const Awaited& a : awaited) {
    if (awaited.size() > 1 && a.receiving && a.connection->sleep_until_peer(true, length)) return;
  }
  timespec ts{0, static_cast<long>(length.count())};
  nanosleep(&ts, nullptr);
}

nfds_t Backoff::awaited_sockets(std::initializer_list<Awaited> awaited, pollfd* sockets) {
  nfds_t n = 0;
  for (const Awaited& a : awaited) {
    const int fd = a.connection->readiness_fd();
    if (fd < 0 || n == 2) return 0;  // shared memory: nothing to sleep on
    const bool readable = a.receiving || a.connection->readiness_by_reading();
    sockets[n++] = pollfd{fd, static_cast<short>(readable ? POLLIN : POLLOUT), 0};
  }
  return n;
}

void Backoff::sleep_on(pollfd* sockets, nfds_t n) {
  phase_ = Phase::Nap;
  timespec ts{0, 1000000};
  ::ppoll(sockets, n, &ts, nullptr);
}

void Backoff::throw_timeout(const std::string& what) const {
  std::ostringstream msg;
  msg << what << ": nothing arrived for " << timeout_s_
      << " s (the communicator's timeout; set it per communicator or with WEFT_TIMEOUT_S)";
  throw TimeoutError(msg.str());
}

}  // namespace weft
