// weft's Plans over NCCL point-to-point: each operation's Plan (the one the
// CPU executor would run, chosen by the tuner or WEFT_ALGO) is rewritten by
// group::schedule() into batches of ncclSend/ncclRecv (one ncclGroupStart/
// End each) and weft's reduction kernels, all queued on the caller's stream.
// Scratch and temporaries live in one device buffer owned by the transport.
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>

#include "core/comm.h"
#include "core/common/config.h"
#include "core/common/cuda_check.h"
#include "core/common/error.h"
#include "core/common/log.h"
#include "core/device/nccl/nccl_comm.h"
#include "core/exec/group_schedule.h"
#include "core/reduce/cuda_reduce.h"

namespace weft::nccl {
namespace {

constexpr size_t kGranule = 2 << 20;  // buffer sizes are rounded up to this
constexpr size_t kAlign = 256;

size_t aligned(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// A Plan rewritten for NCCL, and the scratch its steps use.
struct Compiled {
  std::string algorithm;
  group::Schedule schedule;
  size_t scratch_bytes = 0;
};

class Plans final : public DeviceCollectives {
 public:
  explicit Plans(std::shared_ptr<NcclComm> comm)
      : comm_(std::move(comm)), step_bytes_(config().nccl_step_bytes) {}

  ~Plans() override {
    if (buffer_ == nullptr) return;
    int previous = 0;
    if (cudaGetDevice(&previous) != cudaSuccess) previous = comm_->device();
    cudaSetDevice(comm_->device());
    cudaFree(buffer_);
    cudaGetLastError();
    cudaSetDevice(previous);
  }

  const char* name() const override { return "nccl plans"; }

  void allreduce(const void* in, void* out, size_t count, DataType dtype, ReduceOp op,
                 void* stream) override {
    run(Collective::Allreduce, "allreduce", in, out, count * element_size(dtype), count, dtype, op,
        0, stream);
  }

  void broadcast(void* buf, size_t bytes, int root, void* stream) override {
    check_root(root, "broadcast");
    run(Collective::Broadcast, "broadcast", buf, buf, bytes, bytes, DataType::UInt8, ReduceOp::Sum,
        root, stream);
  }

  void allgather(const void* in, void* out, size_t bytes, void* stream) override {
    run(Collective::Allgather, "allgather", in, out, bytes * comm_->size(), bytes, DataType::UInt8,
        ReduceOp::Sum, 0, stream);
  }

  void reduce_scatter(const void* in, void* out, size_t count, DataType dtype, ReduceOp op,
                      void* stream) override {
    run(Collective::ReduceScatter, "reduce_scatter", in, out, count * element_size(dtype), count,
        dtype, op, 0, stream);
  }

  void reduce(const void* in, void* out, size_t count, DataType dtype, ReduceOp op, int root,
              void* stream) override {
    check_root(root, "reduce");
    run(Collective::Reduce, "reduce", in, out, count * element_size(dtype), count, dtype, op, root,
        stream);
  }

 private:
  using Key = std::tuple<Collective, size_t, size_t, int, std::optional<size_t>, bool>;

  void check_root(int root, const char* what) const {
    if (root < 0 || root >= comm_->size()) {
      throw InvalidArgument(std::string("nccl plans ") + what + ": root " + std::to_string(root) +
                            " is outside the world of size " + std::to_string(comm_->size()));
    }
  }

  // Where Input lies in Output, when it does (the operation is in place).
  static std::optional<size_t> input_in_output(const void* in, const void* out, size_t out_bytes) {
    const char* i = static_cast<const char*>(in);
    const char* o = static_cast<const char*>(out);
    if (i >= o && i < o + out_bytes) return static_cast<size_t>(i - o);
    return std::nullopt;
  }

  const Compiled& compiled(Collective c, size_t count, DataType dtype, int root,
                           std::optional<size_t> alias, bool finalize) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    const size_t elem = element_size(dtype);
    const Key key{c, count, elem, root, alias, finalize};
    auto it = cache_.find(key);
    if (it != cache_.end()) return it->second;
    // In place as the Communicator means it: Input is Output (allgather:
    // Output's block `rank`).
    const size_t own = c == Collective::Allgather ? comm_->rank() * count * elem : 0;
    const bool in_place = alias && *alias == own;
    const Plan plan = comm_->weft().plan(c, count, dtype, root, in_place, finalize, step_bytes_);
    Compiled entry;
    entry.algorithm = plan.algorithm;
    entry.scratch_bytes = aligned(plan.scratch_count * elem);
    entry.schedule = group::schedule(plan, elem, alias, reduce::cuda::kMaxInputs);
    return cache_.emplace(key, std::move(entry)).first->second;
  }

  // The buffer holds scratch, then the two temporary arenas. Growing it
  // waits for the device, since earlier operations may still use the old one.
  void reserve(size_t bytes) {
    if (bytes <= buffer_bytes_) return;
    const size_t rounded = (bytes + kGranule - 1) / kGranule * kGranule;
    if (buffer_ != nullptr) {
      check_cuda(cudaDeviceSynchronize(), "nccl plans: cudaDeviceSynchronize");
      check_cuda(cudaFree(buffer_), "nccl plans: cudaFree");
      buffer_ = nullptr;
      buffer_bytes_ = 0;
    }
    check_cuda(cudaMalloc(&buffer_, rounded),
               "nccl plans: cudaMalloc of " + std::to_string(rounded) + " bytes");
    buffer_bytes_ = rounded;
  }

  void run(Collective c, const char* name, const void* in, void* out, size_t out_bytes,
           size_t count, DataType dtype, ReduceOp op, int root, void* stream) {
    const char* i = static_cast<const char*>(in);
    const char* o = static_cast<const char*>(out);
    const size_t in_bytes = c == Collective::ReduceScatter
                                ? out_bytes * comm_->size()
                                : (c == Collective::Allgather ? count : out_bytes);
    if (i < o && o < i + in_bytes) {
      throw InvalidArgument(std::string("nccl plans ") + name +
                            ": the output lies inside the input; only the forms in place the "
                            "Communicator takes (input == output, allgather's own block) work");
    }
    const bool finalize = op == ReduceOp::Avg;
    const Compiled& compiled =
        this->compiled(c, count, dtype, root, input_in_output(in, out, out_bytes), finalize);
    const group::Schedule& schedule = compiled.schedule;
    WEFT_LOG_CALL(comm_->rank(), this,
                  "nccl plans " << name << ": " << out_bytes << " bytes out, algorithm "
                                << compiled.algorithm << ", " << schedule.actions.size()
                                << " actions");
    const int divisor = op == ReduceOp::Avg ? comm_->size() : 0;
    comm_->run(std::string(name) + " (" + compiled.algorithm + ")", stream, [&](ncclComm_t h) {
      reserve(compiled.scratch_bytes + 2 * schedule.temp_bytes);
      char* const base[] = {const_cast<char*>(i), static_cast<char*>(out), buffer_,
                            buffer_ + compiled.scratch_bytes,
                            buffer_ + compiled.scratch_bytes + schedule.temp_bytes};
      auto address = [&](const group::Ref& ref) {
        return base[static_cast<int>(ref.region)] + ref.offset;
      };
      cudaStream_t s = static_cast<cudaStream_t>(stream);
      std::vector<const void*> srcs;
      for (const group::Action& a : schedule.actions) {
        if (a.kind == group::Action::Kind::Reduce) {
          srcs.clear();
          for (const group::Ref& r : a.srcs) srcs.push_back(address(r));
          reduce::cuda::reduce(address(a.dst), nullptr, srcs.data(), static_cast<int>(srcs.size()),
                               a.count, dtype, op, a.finalize ? divisor : 0, comm_->device(),
                               stream);
          continue;
        }
        comm_->call(ncclGroupStart(), "ncclGroupStart");
        for (const group::Transfer& t : a.transfers) {
          if (t.send) {
            comm_->call(ncclSend(address(t.at), t.bytes, ncclUint8, t.peer, h, s), "ncclSend");
          } else {
            comm_->call(ncclRecv(address(t.at), t.bytes, ncclUint8, t.peer, h, s), "ncclRecv");
          }
        }
        comm_->call(ncclGroupEnd(), "ncclGroupEnd");
      }
    });
  }

  std::shared_ptr<NcclComm> comm_;
  const size_t step_bytes_;  // the Plans' largest step: their rounds pipeline
  std::mutex cache_mu_;
  std::map<Key, Compiled> cache_;  // entries are never removed: references stay valid
  char* buffer_ = nullptr;         // touched only inside comm_->run (locked)
  size_t buffer_bytes_ = 0;
};

}  // namespace

std::unique_ptr<DeviceCollectives> open_plans(std::shared_ptr<NcclComm> comm) {
  return std::make_unique<Plans>(std::move(comm));
}

}  // namespace weft::nccl
