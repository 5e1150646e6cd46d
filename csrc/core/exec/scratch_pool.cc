#include "core/exec/scratch_pool.h"

#include <utility>

#include "core/common/config.h"

namespace weft {

ScratchPool::Lease::Lease(ScratchPool* pool, std::unique_ptr<char[]> buffer, size_t bytes)
    : pool_(pool), buffer_(std::move(buffer)), bytes_(bytes) {}

ScratchPool::Lease::Lease(Lease&& other) noexcept
    : pool_(std::exchange(other.pool_, nullptr)),
      buffer_(std::move(other.buffer_)),
      bytes_(std::exchange(other.bytes_, 0)) {}

ScratchPool::Lease::~Lease() {
  if (pool_ && buffer_) pool_->keep(std::move(buffer_), bytes_);
}

ScratchPool& ScratchPool::process() {
  // Never destroyed: communicators may outlive static destruction order.
  static auto* pool = new ScratchPool(config().scratch_cache_bytes);
  return *pool;
}

ScratchPool::Lease ScratchPool::borrow(size_t bytes) {
  if (bytes == 0) return Lease();
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = kept_.lower_bound(bytes);
    if (it != kept_.end()) {
      const size_t size = it->first;
      std::unique_ptr<char[]> buffer = std::move(it->second);
      kept_.erase(it);
      kept_bytes_ -= size;
      return Lease(this, std::move(buffer), size);
    }
  }
  // Not value-initialized: a Plan writes scratch before it reads it.
  return Lease(this, std::unique_ptr<char[]>(new char[bytes]), bytes);
}

void ScratchPool::keep(std::unique_ptr<char[]> buffer, size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  kept_.emplace(bytes, std::move(buffer));
  kept_bytes_ += bytes;
  // The largest buffers serve any request, so the smallest go first.
  while (kept_bytes_ > cache_bytes_) {
    kept_bytes_ -= kept_.begin()->first;
    kept_.erase(kept_.begin());
  }
}

}  // namespace weft
