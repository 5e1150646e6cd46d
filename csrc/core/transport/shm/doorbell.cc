#include "core/transport/shm/doorbell.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>

namespace weft::shm {

namespace {

// The word is in memory that several processes map, so the futex is a shared
// one (no FUTEX_PRIVATE_FLAG).
long futex(std::atomic<uint32_t>& word, int op, uint32_t value, const timespec* timeout) {
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), op, value, timeout, nullptr, 0);
}

timespec to_timespec(std::chrono::nanoseconds t) {
  return timespec{static_cast<time_t>(t.count() / 1000000000),
                  static_cast<long>(t.count() % 1000000000)};
}

// Cleared once futex_waitv turns out to be missing (ENOSYS).
std::atomic<bool> waitv_works{true};

}  // namespace

void ring(Doorbell& bell) {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (bell.sleepers.load(std::memory_order_relaxed) == 0) return;
  bell.rings.fetch_add(1, std::memory_order_release);
  futex(bell.rings, FUTEX_WAKE, INT_MAX, nullptr);
}

namespace detail {

void futex_sleep(std::atomic<uint32_t>& word, uint32_t seen, std::chrono::nanoseconds timeout) {
  const timespec ts = to_timespec(timeout);
  // EAGAIN (the word changed: rung since `seen`), EINTR and ETIMEDOUT all
  // mean "check again", which the caller does.
  futex(word, FUTEX_WAIT, seen, &ts);
}

bool can_sleep_on_two() { return waitv_works.load(std::memory_order_relaxed); }

bool futex_sleep_either(std::atomic<uint32_t>& first, uint32_t first_seen,
                        std::atomic<uint32_t>& second, uint32_t second_seen,
                        std::chrono::nanoseconds timeout) {
#if defined(SYS_futex_waitv)
  // 32-bit words (FUTEX2_SIZE_U32, once named FUTEX_32), shared between
  // processes (no FUTEX2_PRIVATE).
  constexpr uint32_t kWord32 = 2;
  futex_waitv waiters[2] = {};
  waiters[0].val = first_seen;
  waiters[0].uaddr = reinterpret_cast<uintptr_t>(&first);
  waiters[0].flags = kWord32;
  waiters[1].val = second_seen;
  waiters[1].uaddr = reinterpret_cast<uintptr_t>(&second);
  waiters[1].flags = kWord32;
  // futex_waitv takes an absolute time on the given clock (steady_clock
  // reads CLOCK_MONOTONIC).
  const timespec deadline =
      to_timespec(std::chrono::steady_clock::now().time_since_epoch() + timeout);
  // As in futex_sleep, every outcome but a missing system call means "check
  // again".
  if (syscall(SYS_futex_waitv, waiters, 2, 0, &deadline, CLOCK_MONOTONIC) >= 0 || errno != ENOSYS) {
    return true;
  }
#else
  (void)first, (void)first_seen, (void)second, (void)second_seen, (void)timeout;
#endif
  waitv_works.store(false, std::memory_order_relaxed);
  return false;
}

}  // namespace detail
}  // namespace weft::shm
