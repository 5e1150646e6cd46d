// weft as a torch.distributed backend: a c10d::Backend over one core
// Communicator per process group. It maps tensors to (pointer, count,
// element type), runs the core's operation (blocking calls on the caller's
// thread, asynchronous ones on the communicator's worker) and returns a
// BackendWork whose future holds the output tensors.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <vector>

#include "core/comm.h"
#include "store_adapter.h"

namespace weft::backend {

class WeftBackend : public c10d::Backend {
 public:
  // `name` keeps the communicators of several groups on one store apart.
  WeftBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, double timeout_s,
              const std::string& name);
  ~WeftBackend() override;

  const std::string getBackendName() const override { return "weft"; }

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
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

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

  StoreAdapter store_;
  std::unique_ptr<Communicator> comm_;
};

}  // namespace weft::backend
