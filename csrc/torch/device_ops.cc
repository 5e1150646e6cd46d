// CUDA tensors over a GPU transport (cuda_ipc or nccl, chosen per device by
// device_path.cc): allreduce, broadcast, reduce, allgather (list and into
// one tensor), reduce_scatter (list and tensor forms). The operation runs on
// weft's stream of the device after the caller's current stream, like the
// staging path (cuda_staging.h), but the bytes never leave the GPU. cuda_ipc
// returns once every rank is done, nccl once the work is queued; either way
// the copies back into non-contiguous tensors are queued on weft's stream,
// which Work.wait() and the future make the caller wait for.
#include <c10/core/StreamGuard.h>

#include "backend.h"
#include "device_work.h"
#include "errors.h"
#include "op_helpers.h"
#include "tensors.h"
#include "torch_compat.h"
#include "work.h"

namespace weft::backend {
namespace {

// Every tensor a dense tensor on `device`.
bool all_on(c10::Device device, at::TensorList tensors) {
  for (const at::Tensor& t : tensors) {
    if (!t.defined() || t.device() != device || t.layout() != at::kStrided) return false;
  }
  return true;
}

std::vector<at::Tensor> joined(std::initializer_list<at::TensorList> lists) {
  std::vector<at::Tensor> all;
  for (at::TensorList list : lists) all.insert(all.end(), list.begin(), list.end());
  return all;
}

}  // namespace

c10::intrusive_ptr<c10d::Work> WeftBackend::on_device(
    c10::Device device, c10d::OpType type, std::vector<at::Tensor> outputs,
    const std::function<std::vector<at::Tensor>(void* stream)>& body) {
  const c10::Stream stream = stream_for(device);
  try {
    wait_for_current_stream(stream);
    c10::StreamGuard guard(stream);
    for (const at::Tensor& t : body(torch_compat::native_handle(stream))) t.record_stream(stream);
  } catch (...) {
    rethrow_as_torch_error(std::current_exception());
  }
  return c10::make_intrusive<DeviceWork>(rank_, type, stream, std::move(outputs));
}

c10::intrusive_ptr<c10d::Work> WeftBackend::on_device_in_place(
    c10::Device device, c10d::OpType type, std::vector<at::Tensor>& tensors,
    const std::function<void(const at::Tensor& dense, void* stream)>& body) {
  const at::Tensor t = tensors[0];
  return on_device(device, type, tensors, [&](void* stream) {
    at::Tensor dense = t.contiguous();
    body(dense, stream);
    run_finishing_step(copy_back(t, dense));
    return std::vector<at::Tensor>{t, dense};
  });
}

c10::intrusive_ptr<c10d::Work> WeftBackend::device_allreduce(c10::Device device,
                                                             std::vector<at::Tensor>& tensors,
                                                             const c10d::AllreduceOptions& opts) {
  if (tensors.size() != 1 || !all_on(device, tensors)) return {};
  const at::Tensor t = tensors[0];
  const Reduction how = plan_reduction(t.scalar_type(), opts.reduceOp);
  if (!how.native) return {};
  DeviceCollectives* gpu = collectives_for(device);
  if (!gpu) return {};
  return on_device_in_place(device, c10d::OpType::ALLREDUCE, tensors,
                            [&](const at::Tensor& dense, void* stream) {
                              gpu->allreduce(dense.data_ptr(), dense.data_ptr(), count_of(dense),
                                             how.dtype, how.op, stream);
                            });
}

c10::intrusive_ptr<c10d::Work> WeftBackend::device_broadcast(c10::Device device,
                                                             std::vector<at::Tensor>& tensors,
                                                             const c10d::BroadcastOptions& opts) {
  if (tensors.size() != 1 || opts.rootTensor != 0 || opts.rootRank < 0 || opts.rootRank >= size_ ||
      !all_on(device, tensors)) {
    return {};
  }
  DeviceCollectives* gpu = collectives_for(device);
  if (!gpu) return {};
  return on_device_in_place(
      device, c10d::OpType::BROADCAST, tensors, [&](const at::Tensor& dense, void* stream) {
        gpu->broadcast(dense.data_ptr(), dense.nbytes(), static_cast<int>(opts.rootRank), stream);
      });
}

c10::intrusive_ptr<c10d::Work> WeftBackend::device_reduce(c10::Device device,
                                                          std::vector<at::Tensor>& tensors,
                                                          const c10d::ReduceOptions& opts) {
  if (tensors.size() != 1 || opts.rootRank < 0 || opts.rootRank >= size_ ||
      !all_on(device, tensors)) {
    return {};
  }
  const at::Tensor t = tensors[0];
  const Reduction how = plan_reduction(t.scalar_type(), opts.reduceOp);
  if (!how.native) return {};
  DeviceCollectives* gpu = collectives_for(device);
  if (!gpu) return {};
  return on_device_in_place(
      device, c10d::OpType::REDUCE, tensors, [&](const at::Tensor& dense, void* stream) {
        gpu->reduce(dense.data_ptr(), dense.data_ptr(), count_of(dense), how.dtype, how.op,
                    static_cast<int>(opts.rootRank), stream);
      });
}

c10::intrusive_ptr<c10d::Work> WeftBackend::device_allgather(
    c10::Device device, std::vector<std::vector<at::Tensor>>& outputs,
    std::vector<at::Tensor>& inputs) {
  if (inputs.size() != 1 || outputs.size() != 1 ||
      outputs[0].size() != static_cast<size_t>(size_) || !all_on(device, inputs) ||
      !all_on(device, outputs[0])) {
    return {};
  }
  const at::Tensor input = inputs[0];
  const std::vector<at::Tensor> outs = outputs[0];
  for (const at::Tensor& out : outs) {
    if (out.scalar_type() != input.scalar_type() || out.sizes() != input.sizes()) return {};
  }
  DeviceCollectives* gpu = collectives_for(device);
  if (!gpu) return {};
  return on_device(device, c10d::OpType::ALLGATHER, outs, [&](void* stream) {
    at::Tensor in = input.contiguous();
    at::Tensor gathered = at::empty({size_, in.numel()}, in.options());
    gpu->allgather(in.data_ptr(), gathered.data_ptr(), in.nbytes(), stream);
    run_finishing_step([&] {
      for (int r = 0; r < size_; ++r) outs[r].copy_(gathered[r].view(outs[r].sizes()));
    });
    return joined({outs, {input, in, gathered}});
  });
}

c10::intrusive_ptr<c10d::Work> WeftBackend::device_allgather_base(c10::Device device,
                                                                  at::Tensor& output,
                                                                  at::Tensor& input) {
  if (!all_on(device, {output, input}) || output.scalar_type() != input.scalar_type() ||
      output.numel() != input.numel() * size_) {
    return {};
  }
  DeviceCollectives* gpu = collectives_for(device);
  if (!gpu) return {};
  return on_device(device, c10d::OpType::_ALLGATHER_BASE, {output}, [&](void* stream) {
    at::Tensor in = input.contiguous();
    at::Tensor out = output.contiguous();
    gpu->allgather(in.data_ptr(), out.data_ptr(), in.nbytes(), stream);
    run_finishing_step(copy_back(output, out));
    return std::vector<at::Tensor>{output, input, in, out};
  });
}

c10::intrusive_ptr<c10d::Work> WeftBackend::device_reduce_scatter(
    c10::Device device, std::vector<at::Tensor>& outputs,
    std::vector<std::vector<at::Tensor>>& inputs, const c10d::ReduceScatterOptions& opts) {
  if (outputs.size() != 1 || inputs.size() != 1 || inputs[0].size() != static_cast<size_t>(size_) ||
      !all_on(device, outputs) || !all_on(device, inputs[0])) {
    return {};
  }
  const at::Tensor out = outputs[0];
  for (const at::Tensor& in : inputs[0]) {
    if (in.scalar_type() != out.scalar_type() || in.sizes() != out.sizes()) return {};
  }
  const Reduction how = plan_reduction(out.scalar_type(), opts.reduceOp);
  if (!how.native) return {};
  DeviceCollectives* gpu = collectives_for(device);
  if (!gpu) return {};
  return on_device(device, c10d::OpType::REDUCE_SCATTER, outputs, [&](void* stream) {
    at::Tensor stacked = at::stack(inputs[0]);
    at::Tensor dense = out.contiguous();
    gpu->reduce_scatter(stacked.data_ptr(), dense.data_ptr(), count_of(dense), how.dtype, how.op,
                        stream);
    run_finishing_step(copy_back(out, dense));
    return joined({inputs[0], {out, stacked, dense}});
  });
}

c10::intrusive_ptr<c10d::Work> WeftBackend::device_reduce_scatter_tensors(
    c10::Device device, std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts, c10d::OpType type) {
  if (inputs.size() != outputs.size() || !all_on(device, outputs) || !all_on(device, inputs)) {
    return {};
  }
  std::vector<Reduction> hows;
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (inputs[i].scalar_type() != outputs[i].scalar_type() ||
        inputs[i].numel() != outputs[i].numel() * size_) {
      return {};
    }
    hows.push_back(plan_reduction(outputs[i].scalar_type(), opts.reduceOp));
    if (!hows.back().native) return {};
  }
  DeviceCollectives* gpu = collectives_for(device);
  if (!gpu) return {};
  return on_device(device, type, outputs, [&](void* stream) {
    StagedPairs staged = stage_pairs(inputs, outputs);
    for (size_t i = 0; i < staged.ins.size(); ++i) {
      gpu->reduce_scatter(staged.ins[i].data_ptr(), staged.outs[i].data_ptr(),
                          count_of(staged.outs[i]), hows[i].dtype, hows[i].op, stream);
    }
    run_finishing_step(staged.finish);
    return joined({inputs, outputs, staged.keep_alive});
  });
}

}  // namespace weft::backend
