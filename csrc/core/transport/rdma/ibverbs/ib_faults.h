// What the async-event thread (ib_async_events.h) learned has failed, for
// the endpoints to raise on their next call: the device (or its port), or
// one QP or CQ of one endpoint.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace weft {

class IbFaults {
 public:
  void device_failed(const std::string& why);
  void object_failed(const void* object, const std::string& why);
  // An endpoint's QP or CQ is destroyed: an event about it no longer matters.
  void forget(const void* object);
  // Why the device or one of `objects` failed; empty when neither did.
  std::string failure(const std::vector<const void*>& objects) const;
  // Changes with every failure: a cheap test for "anything new?".
  uint64_t version() const { return version_.load(std::memory_order_acquire); }

 private:
  mutable std::mutex mutex_;
  std::string device_;
  std::map<const void*, std::string> objects_;
  std::atomic<uint64_t> version_{0};
};

}  // namespace weft
