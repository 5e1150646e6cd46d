// A word in a shared-memory FIFO that one thread sleeps on (a futex) until a
// process at either end rings it. Each FIFO has one: its receiver sleeps
// there while the FIFO is empty, its sender while it is full or holds sends
// by reference not yet read; whoever changes head, tail or a closed flag rings
// it. A waiter that naps blind instead wakes up to its nap's length late (a
// millisecond after long waits, such as a rank that waits for a straggler),
// and a waiter that spins keeps a CPU from the ranks that share it.
//
// Ringing costs a fence and a load while nobody sleeps: the system call is
// made only when the other end has announced that it sleeps.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace weft::shm {

struct Doorbell {
  std::atomic<uint32_t> rings;     // the futex word: changes on every ring that wakes
  std::atomic<uint32_t> sleepers;  // threads between announcing and leaving a sleep
};
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t), "a futex word is 32 bits");

// Wakes whoever sleeps on `bell`. Call after the store that the sleeper waits
// for (head, tail, a closed flag), so that it is visible when the sleeper
// wakes.
void ring(Doorbell& bell);

// Sleeps on `bell` for at most `timeout`, unless `ready()` is already true
// once this process has announced itself (so a ring between the caller's last
// check and the sleep is not lost). Returns early when rung, on a signal, or
// when the futex word changed.
template <typename Ready>
void sleep_on(Doorbell& bell, Ready ready, std::chrono::nanoseconds timeout);

// Sleeps on two doorbells at once, as sleep_on does on one: for a waiter
// that needs either of two FIFOs to move (a message on one, room on the
// other). Returns false, without sleeping, where the kernel cannot wait on
// two words (futex_waitv came with Linux 5.16).
template <typename Ready>
bool sleep_on_either(Doorbell& first, Doorbell& second, Ready ready,
                     std::chrono::nanoseconds timeout);

namespace detail {
void futex_sleep(std::atomic<uint32_t>& word, uint32_t seen, std::chrono::nanoseconds timeout);
// False where futex_waitv is missing; true after any other outcome.
bool futex_sleep_either(std::atomic<uint32_t>& first, uint32_t first_seen,
                        std::atomic<uint32_t>& second, uint32_t second_seen,
                        std::chrono::nanoseconds timeout);
bool can_sleep_on_two();

// Counts a sleeper on `bell` for as long as it lives: a count left behind
// (ready() may throw) would make every ring a system call.
class Announced {
 public:
  explicit Announced(Doorbell& bell) : bell_(bell) {
    bell_.sleepers.fetch_add(1, std::memory_order_relaxed);
  }
  ~Announced() { bell_.sleepers.fetch_sub(1, std::memory_order_relaxed); }
  Announced(const Announced&) = delete;
  Announced& operator=(const Announced&) = delete;

 private:
  Doorbell& bell_;
};
}  // namespace detail

template <typename Ready>
void sleep_on(Doorbell& bell, Ready ready, std::chrono::nanoseconds timeout) {
  const uint32_t seen = bell.rings.load(std::memory_order_acquire);
  const detail::Announced announced(bell);
  // Pairs with ring's fence: either the ringer sees this sleeper, or this
  // check sees what the ringer published.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (!ready()) detail::futex_sleep(bell.rings, seen, timeout);
}

template <typename Ready>
bool sleep_on_either(Doorbell& first, Doorbell& second, Ready ready,
                     std::chrono::nanoseconds timeout) {
  if (!detail::can_sleep_on_two()) return false;
  const uint32_t first_seen = first.rings.load(std::memory_order_acquire);
  const uint32_t second_seen = second.rings.load(std::memory_order_acquire);
  const detail::Announced on_first(first);
  const detail::Announced on_second(second);
  std::atomic_thread_fence(std::memory_order_seq_cst);  // as in sleep_on
  if (ready()) return true;
  return detail::futex_sleep_either(first.rings, first_seen, second.rings, second_seen, timeout);
}

}  // namespace weft::shm
