// cuda_ipc's collectives. Every operation runs in rounds over the staging
// buffers (at most WEFT_CUDA_IPC_CHUNK_BYTES per rank; larger operations take
// several rounds). In a round each rank copies its part of the input into its
// own staging buffer, then reads the peers' (mapped) buffers with copies or
// the n-input reduction kernel. Between the phases the ranks synchronize on
// the host: cudaStreamSynchronize, then the communicator's barrier. Simple
// and correct. For ranks on different GPUs the faster next step is a
// device-side protocol (flags in the staging buffers, written and polled by
// the kernels, and double-buffered rounds) that leaves the host out of the
// loop. Ranks sharing one GPU (without MPS) pay a GPU context switch, about
// 0.27 ms on an H200, in every phase where each of them queues work; their
// kernels cannot run at once, so there fewer such phases is what helps.
#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/comm.h"
#include "core/common/config.h"
#include "core/common/cuda_check.h"
#include "core/common/log.h"
#include "core/device/cuda_ipc/chunks.h"
#include "core/device/cuda_ipc/collectives.h"
#include "core/device/cuda_ipc/staging.h"
#include "core/reduce/cuda_reduce.h"

namespace weft::cuda_ipc {
namespace {

class Collectives final : public DeviceCollectives {
 public:
  Collectives(Communicator& comm, int device)
      : comm_(comm),
        device_(device),
        rank_(comm.rank()),
        size_(comm.size()),
        staging_bytes_(config().cuda_ipc_chunk_bytes),
        staging_(comm, device) {}

  const char* name() const override { return "cuda_ipc"; }

  void allreduce(const void* in, void* out, size_t count, DataType dtype, ReduceOp op,
                 void* stream) override {
    const size_t elem = element_size(dtype);
    const bool two_shot = size_ > 1 && count * elem >= kTwoShotMinBytes;
    const size_t step = round_elements(staging_bytes_, elem, 1);
    run(two_shot ? "allreduce two-shot" : "allreduce one-shot", count * elem, rounds(count, step),
        [&] {
          staging_.reserve(std::min(count, step) * elem);
          for (size_t off = 0; off < count; off += step) {
            const size_t len = std::min(step, count - off);
            char* dst = at(out, off * elem);
            copy(staging_.of(rank_), at(in, off * elem), len * elem, stream);
            sync_all(stream);
            if (two_shot) {
              const Span mine = part(len, size_, rank_);
              const size_t skip = mine.begin * elem;
              reduce_from_all(staging_.of(rank_) + skip, dst + skip, skip, mine.count, dtype, op,
                              stream);
              sync_all(stream);
              for (int r = 0; r < size_; ++r) {
                if (r == rank_) continue;
                const Span theirs = part(len, size_, r);
                copy(dst + theirs.begin * elem, staging_.of(r) + theirs.begin * elem,
                     theirs.count * elem, stream);
              }
            } else {
              reduce_from_all(dst, nullptr, 0, len, dtype, op, stream);
            }
            sync_all(stream);
          }
        });
  }

  void broadcast(void* buf, size_t bytes, int root, void* stream) override {
    check_root(root, "broadcast");
    const size_t step = staging_bytes_;
    run("broadcast", bytes, rounds(bytes, step), [&] {
      staging_.reserve(std::min(bytes, step));
      for (size_t off = 0; off < bytes; off += step) {
        const size_t len = std::min(step, bytes - off);
        if (rank_ == root) copy(staging_.of(rank_), at(buf, off), len, stream);
        sync_all(stream);
        if (rank_ != root) copy(at(buf, off), staging_.of(root), len, stream);
        sync_all(stream);
      }
    });
  }

  void allgather(const void* in, void* out, size_t bytes, void* stream) override {
    const size_t step = staging_bytes_;
    run("allgather", bytes, rounds(bytes, step), [&] {
      staging_.reserve(std::min(bytes, step));
      for (size_t off = 0; off < bytes; off += step) {
        const size_t len = std::min(step, bytes - off);
        copy(staging_.of(rank_), at(in, off), len, stream);
        sync_all(stream);
        for (int r = 0; r < size_; ++r) {
          const char* src = r == rank_ ? at(in, off) : staging_.of(r);
          copy(at(out, r * bytes + off), src, len, stream);
        }
        sync_all(stream);
      }
    });
  }

  void reduce_scatter(const void* in, void* out, size_t count, DataType dtype, ReduceOp op,
                      void* stream) override {
    const size_t elem = element_size(dtype);
    const size_t step = round_elements(staging_bytes_, elem, size_);
    run("reduce_scatter", count * elem, rounds(count, step), [&] {
      staging_.reserve(std::min(count, step) * elem * size_);
      for (size_t off = 0; off < count; off += step) {
        const size_t len = std::min(step, count - off);
        // Block r of this round goes to offset r * len of the staging buffer.
        for (int r = 0; r < size_; ++r) {
          copy(staging_.of(rank_) + r * len * elem, at(in, (r * count + off) * elem), len * elem,
               stream);
        }
        sync_all(stream);
        reduce_from_all(at(out, off * elem), nullptr, rank_ * len * elem, len, dtype, op, stream);
        sync_all(stream);
      }
    });
  }

  void reduce(const void* in, void* out, size_t count, DataType dtype, ReduceOp op, int root,
              void* stream) override {
    check_root(root, "reduce");
    const size_t elem = element_size(dtype);
    const size_t step = round_elements(staging_bytes_, elem, 1);
    run("reduce", count * elem, rounds(count, step), [&] {
      staging_.reserve(std::min(count, step) * elem);
      for (size_t off = 0; off < count; off += step) {
        const size_t len = std::min(step, count - off);
        copy(staging_.of(rank_), at(in, off * elem), len * elem, stream);
        sync_all(stream);
        if (rank_ == root) reduce_from_all(at(out, off * elem), nullptr, 0, len, dtype, op, stream);
        sync_all(stream);
      }
    });
  }

 private:
  static char* at(void* p, size_t offset) { return static_cast<char*>(p) + offset; }
  static const char* at(const void* p, size_t offset) {
    return static_cast<const char*>(p) + offset;
  }

  void check_root(int root, const char* what) const {
    if (root < 0 || root >= size_) {
      throw InvalidArgument(std::string("cuda_ipc ") + what + ": root " + std::to_string(root) +
                            " is outside the world of size " + std::to_string(size_));
    }
  }

  // Runs one operation's rounds on this device. Any error aborts the
  // communicator, so that the peers waiting in a barrier fail too.
  template <class Body>
  void run(const char* what, size_t bytes, size_t n_rounds, Body body) {
    WEFT_LOG(
        Info, rank_,
        "cuda_ipc " << what << ": " << bytes << " bytes per rank, " << n_rounds << " round(s)");
    try {
      DeviceGuard guard(device_);
      body();
    } catch (const Error& e) {
      comm_.abort(std::string("cuda_ipc ") + what + ": " + e.what());
      throw;
    }
  }

  // Queues a device copy (nothing for empty or identical ranges).
  static void copy(void* dst, const void* src, size_t bytes, void* stream) {
    if (bytes == 0 || dst == src) return;
    check_cuda(
        cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream)),
        "cuda_ipc: cudaMemcpyAsync");
  }

  // Waits until this rank's queued work is done, then for every rank.
  void sync_all(void* stream) {
    check_cuda(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)),
               "cuda_ipc: cudaStreamSynchronize");
    comm_.barrier(/*async=*/false);
  }

  // dst (and dst2) = the reduction of `count` elements at byte `offset` of
  // every rank's staging buffer.
  void reduce_from_all(void* dst, void* dst2, size_t offset, size_t count, DataType dtype,
                       ReduceOp op, void* stream) {
    std::vector<const void*> srcs(size_);
    for (int r = 0; r < size_; ++r) srcs[r] = staging_.of(r) + offset;
    const int divisor = op == ReduceOp::Avg ? size_ : 0;
    weft::reduce::cuda::reduce(dst, dst2, srcs.data(), size_, count, dtype, op, divisor, device_,
                               stream);
  }

  Communicator& comm_;
  const int device_;
  const int rank_;
  const int size_;
  const size_t staging_bytes_;
  Staging staging_;
};

}  // namespace

std::unique_ptr<DeviceCollectives> open_collectives(Communicator& comm, int device) {
  return std::make_unique<Collectives>(comm, device);
}

}  // namespace weft::cuda_ipc
