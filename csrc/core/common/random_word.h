// 64 unpredictable bits from the kernel's entropy source: unique names for
// shared-memory segments, probe values and memory keys no other process could
// guess. One getrandom call (std::random_device opens and closes a device
// file each time it is made, which showed in profiles of a key per message).
#pragma once

#include <sys/random.h>

#include <cstdint>

#include "core/common/error.h"

namespace weft {

inline uint64_t random_word() {
  uint64_t word = 0;
  // Up to 256 bytes never come back short once the pool is initialized.
  if (getrandom(&word, sizeof(word), 0) != static_cast<ssize_t>(sizeof(word))) {
    throw Error("getrandom failed: the kernel gave no random bytes for a key or a name");
  }
  return word;
}

}  // namespace weft
