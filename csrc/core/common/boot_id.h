// The running kernel's boot id: the same in every container and network
// namespace of one machine, so ranks that report the same one share its CPUs
// even where WEFT_HOST_ID names them different hosts.
#pragma once

#include <fstream>
#include <string>

namespace weft {

inline std::string boot_id() {
  std::string id;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> id;
  return id;
}

}  // namespace weft
