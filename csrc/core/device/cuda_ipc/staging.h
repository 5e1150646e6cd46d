// The staging buffers of cuda_ipc: one device buffer per rank, every peer's
// mapped into this process through CUDA IPC. CUDA-only (WEFT_HAVE_CUDA).
#pragma once

#include <cstddef>
#include <vector>

namespace weft {

class Communicator;

namespace cuda_ipc {

class Staging {
 public:
  Staging(Communicator& comm, int device);
  ~Staging();
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;

  // Makes every rank's buffer at least `bytes` long: a collective (every
  // rank calls it with the same bytes, outside any round). A larger buffer
  // replaces the old one: the ranks free theirs, close the peers' mappings,
  // and exchange handles of new ones.
  void reserve(size_t bytes);

  // Rank r's buffer as this process addresses it (its own for r == rank).
  char* of(int rank) const { return buffers_[rank]; }

 private:
  void exchange_handles();
  void release() noexcept;

  Communicator& comm_;
  const int device_;
  size_t bytes_ = 0;
  std::vector<char*> buffers_;  // per rank; null while none is allocated
};

}  // namespace cuda_ipc
}  // namespace weft
