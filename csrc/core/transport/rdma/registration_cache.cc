#include "core/transport/rdma/registration_cache.h"

#include <unistd.h>

#include "core/common/error.h"

namespace weft {
namespace {

uintptr_t page_bytes() {
  static const uintptr_t bytes = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  return bytes;
}

}  // namespace

const MemoryRegion& RegistrationCache::acquire(const void* p, size_t bytes) {
  const uintptr_t page = page_bytes();
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p) & ~(page - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + bytes + page - 1) & ~(page - 1);
  for (Entry& entry : entries_) {
    const auto base = reinterpret_cast<uintptr_t>(entry.region->base());
    if (base <= begin && base + entry.region->bytes() >= end) {
      ++entry.refs;
      return *entry.region;
    }
  }
  entries_.push_back(
      Entry{endpoint_.register_memory(reinterpret_cast<void*>(begin), end - begin), 1});
  return *entries_.back().region;
}

void RegistrationCache::release(const MemoryRegion& region) {
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (entries_[i].region.get() != &region) continue;
    if (--entries_[i].refs == 0) {
      entries_[i] = std::move(entries_.back());
      entries_.pop_back();
    }
    return;
  }
  throw InvalidArgument("rdma registration cache: release of a region it does not hold");
}

}  // namespace weft
