#include "core/exec/cpu_placement.h"

#include <sched.h>

#include <atomic>
#include <chrono>
#include <mutex>

#include "core/common/config.h"

namespace weft::cpu_placement {
namespace {

constexpr auto kMinInterval = std::chrono::milliseconds(10);

// The most ranks sharing this rank's CPUs in any communicator, and this
// rank's index among them there (-1 before any communicator); written
// together under the mutex, read alone.
std::mutex sharing_mu;
std::atomic<int> most_sharing{0};
std::atomic<int> spread_index{-1};
std::atomic<long long> last_move_ns{0};
thread_local bool worker_thread = false;

int allowed_cpus() {
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return 0;
  return CPU_COUNT(&allowed);
}

// Moves the thread onto a CPU of `to`: the kernel migrates it when its
// allowed set excludes the CPU it runs on. Restoring `allowed` right away
// leaves it where it went and free to move.
void move_to(const cpu_set_t& to, const cpu_set_t& allowed) {
  if (sched_setaffinity(0, sizeof to, &to) == 0) sched_setaffinity(0, sizeof allowed, &allowed);
}

// The calling thread's allowed set, when it has somewhere to move (2 CPUs or
// more).
bool movable_within(cpu_set_t& allowed) {
  return sched_getaffinity(0, sizeof allowed, &allowed) == 0 && CPU_COUNT(&allowed) >= 2;
}

void leave_current_cpu() {
  cpu_set_t allowed;
  if (!movable_within(allowed)) return;
  const int cpu = sched_getcpu();
  if (cpu < 0 || !CPU_ISSET(cpu, &allowed)) return;
  cpu_set_t others = allowed;
  CPU_CLR(cpu, &others);
  move_to(others, allowed);
}

// Goes to the allowed CPU that `index` spreads to: the set's CPUs in order,
// round robin.
void go_to_spread_cpu(int index) {
  cpu_set_t allowed;
  if (!movable_within(allowed)) return;
  int skip = index % CPU_COUNT(&allowed);
  int cpu = 0;
  while (!CPU_ISSET(cpu, &allowed) || skip-- > 0) ++cpu;
  if (sched_getcpu() == cpu) return;
  cpu_set_t target;
  CPU_ZERO(&target);
  CPU_SET(cpu, &target);
  move_to(target, allowed);
}

// A communicator with `ranks` ranks sharing the CPUs sets the spread when it
// has more of them than any before: a larger or earlier one decides.
bool decides(int ranks, int most_before) { return ranks > most_before; }

}  // namespace

void note_ranks_sharing_cpus(int ranks, int index) {
  if (!config().cpu_placement) return;
  {
    std::lock_guard<std::mutex> lock(sharing_mu);
    if (!decides(ranks, most_sharing.load())) return;
    most_sharing.store(ranks);
    spread_index.store(index);
  }
  if (ranks > allowed_cpus()) go_to_spread_cpu(index);
}

CpuSpread current_spread() {
  if (!config().cpu_placement) return CpuSpread{-1, -1};
  std::lock_guard<std::mutex> lock(sharing_mu);
  return CpuSpread{most_sharing.load(), spread_index.load()};
}

int spread_index_after(const CpuSpread& before, int ranks, int index) {
  if (before.ranks < 0) return -1;
  return decides(ranks, before.ranks) ? index : before.index;
}

void mark_worker_thread() { worker_thread = true; }

bool on_worker_thread() { return worker_thread; }

void crowded() {
  if (on_worker_thread() || !config().cpu_placement) return;
  const int ranks = most_sharing.load(std::memory_order_relaxed);
  if (ranks < 2) return;
  const long long now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                            std::chrono::steady_clock::now().time_since_epoch())
                            .count();
  long long last = last_move_ns.load(std::memory_order_relaxed);
  if (now - last < std::chrono::nanoseconds(kMinInterval).count()) return;
  if (!last_move_ns.compare_exchange_strong(last, now)) return;
  if (ranks > allowed_cpus()) {
    go_to_spread_cpu(spread_index.load());
  } else {
    leave_current_cpu();
  }
}

}  // namespace weft::cpu_placement
