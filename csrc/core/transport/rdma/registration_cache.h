// Registrations of the caller's buffers for rendezvous transfers, shared by
// the messages that use them: page-aligned ranges, reference counted.
//
// Where the endpoint pins what it registers, a registration goes at its last
// use: weft cannot see memory being freed and mapped again, and a pinned
// registration kept past that would let the NIC write into pages that are no
// longer the caller's. Where registrations follow the mappings (ibverbs'
// On-Demand Paging), one stays right for its range whatever becomes of the
// memory, so it is kept, idle, past its last use for a later message that it
// covers: a buffer reduced every step is registered once. At most kMaxIdle
// idle registrations of at most kMaxIdleBytes together stay per connection,
// the least recently used going first (one larger than kMaxIdleBytes goes at
// its last use). (libfabric's providers keep their own caches, with memory
// monitors, under fi_mr_reg.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/transport/rdma/endpoint.h"

namespace weft {

class RegistrationCache {
 public:
  static constexpr size_t kMaxIdle = 64;
  static constexpr size_t kMaxIdleBytes = size_t{1} << 30;

  explicit RegistrationCache(RdmaEndpoint& endpoint)
      : endpoint_(endpoint), keep_idle_(endpoint.registrations_follow_mappings()) {}

  // A region covering [p, p + bytes): one held already (by a message in
  // flight, or idle) that covers it, else registered now. Pair with release().
  const MemoryRegion& acquire(const void* p, size_t bytes);
  void release(const MemoryRegion& region);

 private:
  struct Entry {
    std::unique_ptr<MemoryRegion> region;
    int refs;
    uint64_t last_release;  // release() count when refs last fell to 0
  };
  void evict_idle();
  void erase(size_t i);

  RdmaEndpoint& endpoint_;
  const bool keep_idle_;
  // Few at a time (the messages in flight on one connection, and the idle
  // ones kept), so a list searched in full.
  std::vector<Entry> entries_;
  uint64_t releases_ = 0;
};

}  // namespace weft
