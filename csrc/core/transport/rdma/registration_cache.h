// Registrations of the caller's buffers for rendezvous transfers, shared by
// the messages that use them: page-aligned ranges, reference counted, and
// deregistered when the last message using them is done. A registration is
// never kept past its last use: weft cannot see memory being freed and
// mapped again, and a back end that pins pages would then write into pages
// that are no longer the caller's. (libfabric's providers keep their own
// caches, with memory monitors, under fi_mr_reg.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/transport/rdma/endpoint.h"

namespace weft {

class RegistrationCache {
 public:
  explicit RegistrationCache(RdmaEndpoint& endpoint) : endpoint_(endpoint) {}

  // A region covering [p, p + bytes), registered now or shared with a
  // message still using one that covers it. Pair with release().
  const MemoryRegion& acquire(const void* p, size_t bytes);
  void release(const MemoryRegion& region);

  size_t live() const { return entries_.size(); }

 private:
  struct Entry {
    std::unique_ptr<MemoryRegion> region;
    int refs;
  };
  RdmaEndpoint& endpoint_;
  // Few at a time (at most the messages in flight on one connection), so a
  // list searched in full.
  std::vector<Entry> entries_;
};

}  // namespace weft
