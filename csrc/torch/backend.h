// weft as a torch.distributed backend: a c10d::Backend over one core
// Communicator per process group. It maps tensors to (pointer, count,
// element type), runs the core's operation (see OpQueue for which thread)
// and returns a BackendWork whose future holds the output tensors.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <vector>

#include "core/comm.h"
#include "core/device/device_collectives.h"
#include "cuda_staging.h"
#include "store_adapter.h"

namespace weft::backend {

class WeftBackend : public c10d::Backend {
 public:
  // `name` keeps the communicators of several groups on one store apart.
  WeftBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, double timeout_s,
              const std::string& name);
  ~WeftBackend() override;

  const std::string getBackendName() const override { return "weft"; }
  // The core communicator (weft.topo installs WEFT_ALGO=file: Plans on it).
  Communicator& communicator() { return *comm_; }
  // ProcessGroup.abort(): fails the operations in flight and every later one
  // at once, and the peers' with them. The GPU transports (cuda_ipc, nccl)
  // are left as they are.
  void abort() override;
  // destroy_process_group(): aborts as abort() does while an operation is in
  // flight (another thread waits in one of this group's collectives), so
  // that it and the peers' return; an idle group is left as it is and closes
  // when its last reference goes (aborting it would fail peers still
  // finishing their last operation).
  void shutdown() override;
  // ProcessGroup.set_timeout(): the timeout of every later operation.
  void setTimeout(std::chrono::milliseconds timeout) override;

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& output_lists, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override;

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst_rank,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src_rank,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;

 private:
  using Works = std::vector<std::shared_ptr<weft::Work>>;
  // Starts the core operation(s) with start(async). A blocking call runs
  // `finish` and returns a finished Work; an asynchronous one returns a Work
  // that runs `finish` once the core is done, holding `keep_alive` until then.
  c10::intrusive_ptr<c10d::Work> launch(c10d::OpType type, bool async,
                                        std::vector<at::Tensor> outputs,
                                        std::vector<at::Tensor> keep_alive,
                                        std::function<void()> finish,
                                        const std::function<Works(bool async)>& start);
  // Gathers every rank's `contribution`; `deliver` receives them stacked
  // along a new first dimension. For reductions the core has no kernel for.
  c10::intrusive_ptr<c10d::Work> gather_then(
      c10d::OpType type, bool async, const at::Tensor& contribution,
      std::vector<at::Tensor> outputs, std::function<void(const at::Tensor& gathered)> deliver);

  // allreduce of one sparse COO tensor (SUM only, as gloo).
  c10::intrusive_ptr<c10d::Work> allreduce_sparse_coo(std::vector<at::Tensor>& tensors,
                                                      const c10d::AllreduceOptions& opts);

  // _reduce_scatter_base and reduce_scatter_tensor_coalesced.
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensors(std::vector<at::Tensor>& outputs,
                                                        std::vector<at::Tensor>& inputs,
                                                        const c10d::ReduceScatterOptions& opts,
                                                        c10d::OpType type);

  // weft's stream on `device`: one per device for this backend.
  c10::Stream stream_for(c10::Device device);
  // Staging of the CUDA tensors of one operation on `device` (cuda_staging.h)
  // on weft's stream there.
  CudaStaging staging(c10::Device device, const char* what);

  // CUDA tensors over a GPU transport (device_ops.cc). Each returns a null
  // Work when the operation keeps the staging path: WEFT_CUDA_PATH, a world
  // that no GPU transport serves, or a form they do not take (lists of
  // several tensors, reductions without a kernel, malformed arguments, which
  // the staging path then reports).
  c10::intrusive_ptr<c10d::Work> device_allreduce(c10::Device device,
                                                  std::vector<at::Tensor>& tensors,
                                                  const c10d::AllreduceOptions& opts);
  c10::intrusive_ptr<c10d::Work> device_broadcast(c10::Device device,
                                                  std::vector<at::Tensor>& tensors,
                                                  const c10d::BroadcastOptions& opts);
  c10::intrusive_ptr<c10d::Work> device_reduce(c10::Device device, std::vector<at::Tensor>& tensors,
                                               const c10d::ReduceOptions& opts);
  c10::intrusive_ptr<c10d::Work> device_allgather(c10::Device device,
                                                  std::vector<std::vector<at::Tensor>>& outputs,
                                                  std::vector<at::Tensor>& inputs);
  c10::intrusive_ptr<c10d::Work> device_allgather_base(c10::Device device, at::Tensor& output,
                                                       at::Tensor& input);
  c10::intrusive_ptr<c10d::Work> device_reduce_scatter(c10::Device device,
                                                       std::vector<at::Tensor>& outputs,
                                                       std::vector<std::vector<at::Tensor>>& inputs,
                                                       const c10d::ReduceScatterOptions& opts);
  c10::intrusive_ptr<c10d::Work> device_reduce_scatter_tensors(
      c10::Device device, std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts, c10d::OpType type);
  // The GPU transport of `device` (device_path.cc), chosen and opened on
  // first use from WEFT_CUDA_PATH and facts every rank agrees on; null when
  // CUDA tensors take the staging path. A forced path (ipc, nccl) that
  // cannot serve this group throws why.
  DeviceCollectives* collectives_for(c10::Device device);
  std::unique_ptr<DeviceCollectives> open_collectives(int device);
  // Runs `body` (given weft's stream as a cudaStream_t) on weft's stream of
  // `device`, after the caller's current stream; body returns the tensors it
  // used, recorded on weft's stream.
  c10::intrusive_ptr<c10d::Work> on_device(
      c10::Device device, c10d::OpType type, std::vector<at::Tensor> outputs,
      const std::function<std::vector<at::Tensor>(void* stream)>& body);
  // on_device for an operation on tensors[0] in place: body works on a
  // contiguous version of it, copied back when that is a copy.
  c10::intrusive_ptr<c10d::Work> on_device_in_place(
      c10::Device device, c10d::OpType type, std::vector<at::Tensor>& tensors,
      const std::function<void(const at::Tensor& dense, void* stream)>& body);

  StoreAdapter store_;
  std::mutex streams_mutex_;
  std::vector<c10::Stream> streams_;
  // One byte per rank for the monitored barrier's messages.
  std::vector<char> monitored_barrier_bytes_;
  uint32_t monitored_barriers_ = 0;  // calls so far: tags each call's messages
  std::unique_ptr<Communicator> comm_;
  // Per device index: the GPU transport chosen (null: staging); destroyed
  // before the communicator.
  std::mutex device_mutex_;
  std::map<int, std::unique_ptr<DeviceCollectives>> device_paths_;
};

}  // namespace weft::backend
