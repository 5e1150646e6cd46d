// Reductions: allreduce (single, list, coalesced), reduce, reduce_scatter.
#include <algorithm>

#include "backend.h"
#include "op_helpers.h"
#include "tensors.h"

namespace weft::backend {

c10::intrusive_ptr<c10d::Work> WeftBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                      const c10d::AllreduceOptions& opts) {
  if (auto device = cuda_device_of(tensors)) {
    if (auto work = device_allreduce(*device, tensors, opts)) return work;
    CudaStaging s = staging(*device, "allreduce");
    std::vector<at::Tensor> host = s.twins(tensors, true, true);
    return s.run(rank_, [&] { return allreduce(host, opts); });
  }
  TORCH_CHECK(!tensors.empty(), "weft allreduce: requires at least one tensor");
  if (tensors[0].layout() == at::kSparse && tensors[0].is_cpu()) {
    return allreduce_sparse_coo(tensors, opts);
  }
  check_cpu(tensors, "allreduce");
  check_like(tensors, tensors[0], "allreduce");
  const Reduction how = plan_reduction(tensors[0].scalar_type(), opts.reduceOp);
  TORCH_CHECK(tensors.size() == 1 || opts.reduceOp != c10d::ReduceOp::AVG,
              "weft allreduce: ReduceOp.AVG over several tensors per process is not supported");
  const bool async = is_async(opts, 0);
  if (tensors.size() == 1 && how.native) {
    const at::Tensor& t = tensors[0];
    at::Tensor dense = t.contiguous();
    return launch(c10d::OpType::ALLREDUCE, async, tensors, {dense}, copy_back(t, dense),
                  [&](bool a) {
                    return Works{comm_->allreduce(dense.data_ptr(), dense.data_ptr(),
                                                  count_of(dense), how.dtype, how.op, a)};
                  });
  }
  // Several tensors per process (gloo reduces them all together), or an
  // operator the core lacks.
  return gather_then(c10d::OpType::ALLREDUCE, async, at::stack(tensors), tensors,
                     [tensors, op = opts.reduceOp](const at::Tensor& gathered) mutable {
                       at::Tensor result = reduce_locally(gathered.flatten(0, 1), op);
                       for (at::Tensor& t : tensors) t.copy_(result);
                     });
}

c10::intrusive_ptr<c10d::Work> WeftBackend::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  if (auto device = cuda_device_of(tensors)) {
    CudaStaging s = staging(*device, "allreduce_coalesced");
    std::vector<at::Tensor> host = s.twins(tensors, true, true);
    return s.run(rank_, [&] { return allreduce_coalesced(host, opts); });
  }
  check_cpu(tensors, "allreduce_coalesced");
  TORCH_CHECK(!tensors.empty(), "weft allreduce_coalesced: requires at least one tensor");
  for (const at::Tensor& t : tensors) {
    TORCH_CHECK(t.scalar_type() == tensors[0].scalar_type(),
                "weft allreduce_coalesced: tensors must all have the same type");
  }
  const Reduction how = plan_reduction(tensors[0].scalar_type(), opts.reduceOp);
  const bool async = is_async(opts, 0);
  if (!how.native) {
    std::vector<at::Tensor> flat;
    for (const at::Tensor& t : tensors) flat.push_back(t.reshape(-1));
    return gather_then(c10d::OpType::ALLREDUCE_COALESCED, async, at::cat(flat), tensors,
                       [tensors, op = opts.reduceOp](const at::Tensor& gathered) {
                         at::Tensor result = reduce_locally(gathered, op);
                         unpack_bytes(bytes_of(result), tensors);
                       });
  }
  at::Tensor packed = packed_bytes(tensors, /*copy_in=*/true);
  const size_t count = packed.nbytes() / tensors[0].element_size();
  return launch(
      c10d::OpType::ALLREDUCE_COALESCED, async, tensors, {packed},
      [packed, tensors] { unpack_bytes(packed, tensors); },
      [&](bool a) {
        return Works{
            comm_->allreduce(packed.data_ptr(), packed.data_ptr(), count, how.dtype, how.op, a)};
      });
}

c10::intrusive_ptr<c10d::Work> WeftBackend::reduce(std::vector<at::Tensor>& tensors,
                                                   const c10d::ReduceOptions& opts) {
  if (auto device = cuda_device_of(tensors)) {
    if (auto work = device_reduce(*device, tensors, opts)) return work;
    CudaStaging s = staging(*device, "reduce");
    std::vector<at::Tensor> host = s.twins(tensors, true, true);
    return s.run(rank_, [&] { return reduce(host, opts); });
  }
  check_cpu(tensors, "reduce");
  check_count(tensors.size(), 1, "reduce", "tensor");
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < size_, "weft reduce: invalid root rank ",
              opts.rootRank);
  const at::Tensor& t = tensors[0];
  const Reduction how = plan_reduction(t.scalar_type(), opts.reduceOp);
  const bool async = is_async(opts, 0);
  const int root = static_cast<int>(opts.rootRank);
  if (!how.native) {
    const bool at_root = root == rank_;
    return gather_then(c10d::OpType::REDUCE, async, t, tensors,
                       [t, at_root, op = opts.reduceOp](const at::Tensor& gathered) mutable {
                         if (at_root) t.copy_(reduce_locally(gathered, op));
                       });
  }
  at::Tensor dense = t.contiguous();
  return launch(c10d::OpType::REDUCE, async, tensors, {dense}, copy_back(t, dense), [&](bool a) {
    return Works{comm_->reduce(dense.data_ptr(), dense.data_ptr(), count_of(dense), how.dtype,
                               how.op, root, a)};
  });
}

c10::intrusive_ptr<c10d::Work> WeftBackend::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  if (auto device = cuda_device_of(outputs, inputs)) {
    if (auto work = device_reduce_scatter(*device, outputs, inputs, opts)) return work;
    CudaStaging s = staging(*device, "reduce_scatter");
    std::vector<at::Tensor> host_out = s.twins(outputs, false, true);
    std::vector<std::vector<at::Tensor>> host_in = s.twins(inputs, true, false);
    return s.run(rank_, [&] { return reduce_scatter(host_out, host_in, opts); });
  }
  check_count(outputs.size(), 1, "reduce_scatter", "output tensor");
  check_count(inputs.size(), 1, "reduce_scatter", "input tensor list");
  check_count(inputs[0].size(), size_, "reduce_scatter", "input tensors (one per rank)");
  check_cpu(outputs, "reduce_scatter");
  check_cpu(inputs[0], "reduce_scatter");
  const at::Tensor& out = outputs[0];
  check_like(inputs[0], out, "reduce_scatter");
  const Reduction how = plan_reduction(out.scalar_type(), opts.reduceOp);
  const bool async = is_async(opts, 0);
  if (!how.native) {
    const int rank = rank_;
    return gather_then(c10d::OpType::REDUCE_SCATTER, async, at::stack(inputs[0]), outputs,
                       [out, rank, op = opts.reduceOp](const at::Tensor& gathered) mutable {
                         out.copy_(reduce_locally(gathered.select(1, rank), op));
                       });
  }
  at::Tensor in = packed_bytes(inputs[0], /*copy_in=*/true);
  at::Tensor dense = out.contiguous();
  return launch(c10d::OpType::REDUCE_SCATTER, async, outputs, {in, dense}, copy_back(out, dense),
                [&](bool a) {
                  return Works{comm_->reduce_scatter(in.data_ptr(), dense.data_ptr(),
                                                     count_of(dense), how.dtype, how.op, a)};
                });
}

c10::intrusive_ptr<c10d::Work> WeftBackend::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  std::vector<at::Tensor> outputs{output};
  std::vector<at::Tensor> inputs{input};
  return reduce_scatter_tensors(outputs, inputs, opts, c10d::OpType::_REDUCE_SCATTER_BASE);
}

c10::intrusive_ptr<c10d::Work> WeftBackend::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  // OpType::REDUCE_SCATTER_TENSOR_COALESCED is new in torch 2.13; COALESCED is in every release.
  return reduce_scatter_tensors(outputs, inputs, opts, c10d::OpType::COALESCED);
}

c10::intrusive_ptr<c10d::Work> WeftBackend::reduce_scatter_tensors(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts, c10d::OpType type) {
  const char* what = "reduce_scatter_tensor";
  if (auto device = cuda_device_of(outputs, inputs)) {
    if (auto work = device_reduce_scatter_tensors(*device, outputs, inputs, opts, type))
      return work;
    CudaStaging s = staging(*device, what);
    std::vector<at::Tensor> host_out = s.twins(outputs, false, true);
    std::vector<at::Tensor> host_in = s.twins(inputs, true, false);
    return s.run(rank_, [&] { return reduce_scatter_tensors(host_out, host_in, opts, type); });
  }
  check_count(inputs.size(), outputs.size(), what, "input tensors (one per output)");
  check_cpu(outputs, what);
  check_cpu(inputs, what);
  std::vector<Reduction> hows;
  for (size_t i = 0; i < outputs.size(); ++i) {
    TORCH_CHECK(inputs[i].scalar_type() == outputs[i].scalar_type(), "weft ", what,
                ": input and output tensors must have the same type");
    TORCH_CHECK(inputs[i].numel() == outputs[i].numel() * size_, "weft ", what,
                ": input tensor must be the same size as output size times world size");
    hows.push_back(plan_reduction(outputs[i].scalar_type(), opts.reduceOp));
  }
  const bool all_native =
      std::all_of(hows.begin(), hows.end(), [](const Reduction& r) { return r.native; });
  if (!all_native) {
    TORCH_CHECK(outputs.size() == 1, "weft ", what,
                ": coalesced calls support SUM, AVG, PRODUCT, MIN and MAX only");
    at::Tensor out = outputs[0];
    const int rank = rank_;
    return gather_then(type, is_async(opts, 0), inputs[0].reshape({size_, -1}), outputs,
                       [out, rank, op = opts.reduceOp](const at::Tensor& gathered) mutable {
                         at::Tensor mine = reduce_locally(gathered.select(1, rank), op);
                         out.copy_(mine.view(out.sizes()));
                       });
  }
  StagedPairs staged = stage_pairs(inputs, outputs);
  return launch(type, is_async(opts, 0), outputs, staged.keep_alive, staged.finish, [&](bool a) {
    Works works;
    for (size_t i = 0; i < staged.ins.size(); ++i) {
      works.push_back(comm_->reduce_scatter(staged.ins[i].data_ptr(), staged.outs[i].data_ptr(),
                                            count_of(staged.outs[i]), hows[i].dtype, hows[i].op,
                                            a));
    }
    return works;
  });
}

}  // namespace weft::backend
