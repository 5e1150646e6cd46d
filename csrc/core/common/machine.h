// What a rank's CPUs are, as ranks can compare them. The running kernel's
// boot id is the same in every container and network namespace of one
// machine, so ranks that WEFT_HOST_ID calls different hosts may share it.
#pragma once

#include <sched.h>

#include <cstdint>
#include <fstream>
#include <string>

namespace weft {

// Where a rank spreads over the CPUs it shares with other ranks
// (exec/cpu_placement.h): the most ranks that shared them in one of its
// communicators (0 before any, -1 with placement off) and its index there.
struct CpuSpread {
  int32_t ranks = 0;
  int32_t index = -1;
};

inline std::string boot_id() {
  std::string id;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> id;
  return id;
}

// The machine (boot id, or `host_id` where /proc gives none) and the CPUs the
// calling thread may use: ranks with equal identities compete for the same
// CPUs.
inline std::string cpu_identity(const std::string& host_id) {
  const std::string machine = boot_id();
  std::string id = (machine.empty() ? host_id : machine) + ":";
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return id;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &allowed)) id += std::to_string(cpu) + ",";
  }
  return id;
}

// How many CPUs a cpu_identity() names (0 where it names none).
inline int cpu_count(const std::string& identity) {
  const size_t colon = identity.rfind(':');
  int count = 0;
  for (size_t i = colon == std::string::npos ? 0 : colon + 1; i < identity.size(); ++i) {
    count += identity[i] == ',';
  }
  return count;
}

}  // namespace weft
