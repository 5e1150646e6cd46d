#include "core/transport/shm/doorbell.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <climits>

namespace weft::shm {

namespace {

// The word is in memory that several processes map, so the futex is a shared
// one (no FUTEX_PRIVATE_FLAG).
long futex(std::atomic<uint32_t>& word, int op, uint32_t value, const timespec* timeout) {
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), op, value, timeout, nullptr, 0);
}

}  // namespace

void ring(Doorbell& bell) {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (bell.sleepers.load(std::memory_order_relaxed) == 0) return;
  bell.rings.fetch_add(1, std::memory_order_release);
  futex(bell.rings, FUTEX_WAKE, INT_MAX, nullptr);
}

namespace detail {

void futex_sleep(std::atomic<uint32_t>& word, uint32_t seen, std::chrono::nanoseconds timeout) {
  const timespec ts{static_cast<time_t>(timeout.count() / 1000000000),
                    static_cast<long>(timeout.count() % 1000000000)};
  // EAGAIN (the word changed: rung since `seen`), EINTR and ETIMEDOUT all
  // mean "check again", which the caller does.
  futex(word, FUTEX_WAIT, seen, &ts);
}

}  // namespace detail
}  // namespace weft::shm
