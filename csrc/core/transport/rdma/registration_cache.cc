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
      Entry{endpoint_.register_memory(reinterpret_cast<void*>(begin), end - begin), 1, 0});
  return *entries_.back().region;
}

void RegistrationCache::release(const MemoryRegion& region) {
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (entries_[i].region.get() != &region) continue;
    if (--entries_[i].refs > 0) return;
    // One larger than the bound alone would push every other one out.
    if (keep_idle_ && entries_[i].region->bytes() <= kMaxIdleBytes) {
      entries_[i].last_release = ++releases_;
      evict_idle();
    } else {
      erase(i);
    }
    return;
  }
  throw InvalidArgument("rdma registration cache: release of a region it does not hold");
}

void RegistrationCache::evict_idle() {
  for (;;) {
    size_t idle = 0, idle_bytes = 0, oldest = entries_.size();
    for (size_t i = 0; i < entries_.size(); ++i) {
      if (entries_[i].refs > 0) continue;
      ++idle;
      idle_bytes += entries_[i].region->bytes();
      if (oldest == entries_.size() || entries_[i].last_release < entries_[oldest].last_release) {
        oldest = i;
      }
    }
    if (idle <= kMaxIdle && idle_bytes <= kMaxIdleBytes) return;
    erase(oldest);
  }
}

// Deregisters entry i.
void RegistrationCache::erase(size_t i) {
  entries_[i] = std::move(entries_.back());
  entries_.pop_back();
}

}  // namespace weft
