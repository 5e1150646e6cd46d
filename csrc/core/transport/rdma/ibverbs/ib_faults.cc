#include "core/transport/rdma/ibverbs/ib_faults.h"

namespace weft {

void IbFaults::device_failed(const std::string& why) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (device_.empty()) device_ = why;
  version_.fetch_add(1, std::memory_order_release);
}

void IbFaults::object_failed(const void* object, const std::string& why) {
  std::lock_guard<std::mutex> lock(mutex_);
  objects_.emplace(object, why);
  version_.fetch_add(1, std::memory_order_release);
}

void IbFaults::forget(const void* object) {
  std::lock_guard<std::mutex> lock(mutex_);
  objects_.erase(object);
}

std::string IbFaults::failure(const std::vector<const void*>& objects) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!device_.empty()) return device_;
  for (const void* object : objects) {
    auto found = objects_.find(object);
    if (found != objects_.end()) return found->second;
  }
  return {};
}

}  // namespace weft
