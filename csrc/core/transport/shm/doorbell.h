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

namespace detail {
void futex_sleep(std::atomic<uint32_t>& word, uint32_t seen, std::chrono::nanoseconds timeout);
}

template <typename Ready>
void sleep_on(Doorbell& bell, Ready ready, std::chrono::nanoseconds timeout) {
  const uint32_t seen = bell.rings.load(std::memory_order_acquire);
  bell.sleepers.fetch_add(1, std::memory_order_relaxed);
  // Leaves the count however the sleep ends (ready() may throw): a count
  // left behind would make every ring a system call.
  struct Announced {
    Doorbell& bell;
    ~Announced() { bell.sleepers.fetch_sub(1, std::memory_order_relaxed); }
  } announced{bell};
  // Pairs with ring's fence: either the ringer sees this sleeper, or this
  // check sees what the ringer published.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (!ready()) detail::futex_sleep(bell.rings, seen, timeout);
}

}  // namespace weft::shm
