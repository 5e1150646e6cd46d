// NCCL's own collectives on the caller's stream. Avg: ncclAvg for floating
// types; integers take ncclSum and weft's division kernel, so that they
// truncate toward zero like every other weft path.
#include <string>

#include "core/common/error.h"
#include "core/device/nccl/nccl_comm.h"
#include "core/reduce/cuda_reduce.h"

namespace weft::nccl {
namespace {

bool is_integral(DataType dtype) {
  switch (dtype) {
    case DataType::Int8:
    case DataType::UInt8:
    case DataType::Int32:
    case DataType::Int64: return true;
    default: return false;
  }
}

class Native final : public DeviceCollectives {
 public:
  explicit Native(std::shared_ptr<NcclComm> comm) : comm_(std::move(comm)) {}

  const char* name() const override { return "nccl"; }

  void allreduce(const void* in, void* out, size_t count, DataType dtype, ReduceOp op,
                 void* stream) override {
    comm_->run("allreduce", stream, [&](ncclComm_t c) {
      comm_->call(
          ncclAllReduce(in, out, count, nccl_type(dtype), nccl_op(dtype, op), c, cuda(stream)),
          "ncclAllReduce");
      divide_after_sum(out, count, dtype, op, stream);
    });
  }

  void broadcast(void* buf, size_t bytes, int root, void* stream) override {
    check_root(root, "broadcast");
    comm_->run("broadcast", stream, [&](ncclComm_t c) {
      comm_->call(ncclBroadcast(buf, buf, bytes, ncclUint8, root, c, cuda(stream)),
                  "ncclBroadcast");
    });
  }

  void allgather(const void* in, void* out, size_t bytes, void* stream) override {
    comm_->run("allgather", stream, [&](ncclComm_t c) {
      comm_->call(ncclAllGather(in, out, bytes, ncclUint8, c, cuda(stream)), "ncclAllGather");
    });
  }

  void reduce_scatter(const void* in, void* out, size_t count, DataType dtype, ReduceOp op,
                      void* stream) override {
    comm_->run("reduce_scatter", stream, [&](ncclComm_t c) {
      comm_->call(
          ncclReduceScatter(in, out, count, nccl_type(dtype), nccl_op(dtype, op), c, cuda(stream)),
          "ncclReduceScatter");
      divide_after_sum(out, count, dtype, op, stream);
    });
  }

  void reduce(const void* in, void* out, size_t count, DataType dtype, ReduceOp op, int root,
              void* stream) override {
    check_root(root, "reduce");
    comm_->run("reduce", stream, [&](ncclComm_t c) {
      comm_->call(
          ncclReduce(in, out, count, nccl_type(dtype), nccl_op(dtype, op), root, c, cuda(stream)),
          "ncclReduce");
      if (comm_->rank() == root) divide_after_sum(out, count, dtype, op, stream);
    });
  }

 private:
  static cudaStream_t cuda(void* stream) { return static_cast<cudaStream_t>(stream); }

  static ncclRedOp_t nccl_op(DataType dtype, ReduceOp op) {
    switch (op) {
      case ReduceOp::Sum: return ncclSum;
      case ReduceOp::Prod: return ncclProd;
      case ReduceOp::Min: return ncclMin;
      case ReduceOp::Max: return ncclMax;
      case ReduceOp::Avg: return is_integral(dtype) ? ncclSum : ncclAvg;
    }
    throw InvalidArgument("nccl: unknown reduce op");
  }

  // Integer Avg: the sum NCCL left in out, divided in place.
  void divide_after_sum(void* out, size_t count, DataType dtype, ReduceOp op, void* stream) {
    if (op != ReduceOp::Avg || !is_integral(dtype) || count == 0) return;
    const void* srcs[] = {out};
    reduce::cuda::reduce(out, nullptr, srcs, 1, count, dtype, op, comm_->size(), comm_->device(),
                         stream);
  }

  void check_root(int root, const char* what) const {
    if (root < 0 || root >= comm_->size()) {
      throw InvalidArgument(std::string("nccl ") + what + ": root " + std::to_string(root) +
                            " is outside the world of size " + std::to_string(comm_->size()));
    }
  }

  std::shared_ptr<NcclComm> comm_;
};

}  // namespace

std::unique_ptr<DeviceCollectives> open_native(std::shared_ptr<NcclComm> comm) {
  return std::make_unique<Native>(std::move(comm));
}

}  // namespace weft::nccl
