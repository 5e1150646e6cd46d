// 64 unpredictable bits from the system's entropy source: unique names for
// shared-memory segments, probe values no other process could guess.
#pragma once

#include <cstdint>
#include <random>

namespace weft {

inline uint64_t random_word() {
  std::random_device device;
  return (static_cast<uint64_t>(device()) << 32) ^ device();
}

}  // namespace weft
