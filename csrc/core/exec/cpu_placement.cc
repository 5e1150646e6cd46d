#include "core/exec/cpu_placement.h"

#include <sched.h>

#include <atomic>
#include <chrono>

namespace weft::cpu_placement {
namespace {

constexpr auto kMinInterval = std::chrono::milliseconds(10);

std::atomic<int> most_ranks_on_host{0};
std::atomic<long long> last_move_ns{0};
thread_local bool worker_thread = false;

int allowed_cpus() {
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return 0;
  return CPU_COUNT(&allowed);
}

// Leaves the current CPU: the kernel migrates the thread when its allowed set
// excludes the CPU it runs on; restoring the set right away leaves it where it
// went and free to move.
void leave_current_cpu() {
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0 || CPU_COUNT(&allowed) < 2) return;
  const int cpu = sched_getcpu();
  if (cpu < 0 || !CPU_ISSET(cpu, &allowed)) return;
  cpu_set_t others = allowed;
  CPU_CLR(cpu, &others);
  if (sched_setaffinity(0, sizeof others, &others) == 0) {
    sched_setaffinity(0, sizeof allowed, &allowed);
  }
}

}  // namespace

void note_ranks_on_host(int ranks) {
  int seen = most_ranks_on_host.load();
  while (ranks > seen && !most_ranks_on_host.compare_exchange_weak(seen, ranks)) {
  }
}

void mark_worker_thread() { worker_thread = true; }

bool on_worker_thread() { return worker_thread; }

void crowded() {
  if (on_worker_thread()) return;
  const int ranks = most_ranks_on_host.load(std::memory_order_relaxed);
  if (ranks < 2 || ranks > allowed_cpus()) return;
  const long long now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                            std::chrono::steady_clock::now().time_since_epoch())
                            .count();
  long long last = last_move_ns.load(std::memory_order_relaxed);
  if (now - last < std::chrono::nanoseconds(kMinInterval).count()) return;
  if (!last_move_ns.compare_exchange_strong(last, now)) return;
  leave_current_cpu();
}

}  // namespace weft::cpu_placement
