// Scratch memory for Plans, shared by every communicator of the process.
// An operation borrows a buffer for as long as it runs and gives it back.
// Returned buffers are kept for the next operation up to a total of
// WEFT_SCRATCH_CACHE_BYTES (the largest first); the rest is freed, so
// neither many communicators nor one huge call pin memory for good.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>

namespace weft {

class ScratchPool {
 public:
  // A borrowed buffer of at least the requested size, returned on destruction.
  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& other) noexcept;
    ~Lease();
    char* data() const { return buffer_.get(); }

   private:
    friend class ScratchPool;
    Lease(ScratchPool* pool, std::unique_ptr<char[]> buffer, size_t bytes);

    ScratchPool* pool_ = nullptr;
    std::unique_ptr<char[]> buffer_;
    size_t bytes_ = 0;
  };

  explicit ScratchPool(size_t cache_bytes) : cache_bytes_(cache_bytes) {}
  static ScratchPool& process();  // the pool every communicator uses

  // The smallest kept buffer that is large enough, or a new one. 0 bytes
  // borrows nothing.
  Lease borrow(size_t bytes);

 private:
  void keep(std::unique_ptr<char[]> buffer, size_t bytes);

  const size_t cache_bytes_;
  std::mutex mu_;
  std::multimap<size_t, std::unique_ptr<char[]>> kept_;  // by size
  size_t kept_bytes_ = 0;
};

}  // namespace weft
