// Collectives that move data without reducing it: they move bytes, so any
// element type works.
#include <cstdint>

#include "backend.h"
#include "op_helpers.h"
#include "tensors.h"

namespace weft::backend {

c10::intrusive_ptr<c10d::Work> WeftBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                      const c10d::BroadcastOptions& opts) {
  if (auto device = cuda_device_of(tensors)) {
    if (auto work = device_broadcast(*device, tensors, opts)) return work;
    CudaStaging s = staging(*device, "broadcast");
    std::vector<at::Tensor> host = s.twins(tensors, true, true);
    return s.run(rank_, [&] { return broadcast(host, opts); });
  }
  check_cpu(tensors, "broadcast");
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < size_, "weft broadcast: invalid root rank ",
              opts.rootRank);
  TORCH_CHECK(opts.rootTensor >= 0 && opts.rootTensor < static_cast<int64_t>(tensors.size()),
              "weft broadcast: invalid root tensor ", opts.rootTensor);
  check_like(tensors, tensors[0], "broadcast");
  const at::Tensor& src = tensors[opts.rootTensor];
  at::Tensor dense = src.contiguous();
  std::function<void()> finish = copy_back(src, dense);
  if (tensors.size() > 1) {
    finish = [tensors, dense]() mutable {
      for (at::Tensor& t : tensors) t.copy_(dense);
    };
  }
  return launch(c10d::OpType::BROADCAST, is_async(opts, 0), tensors, {dense}, std::move(finish),
                [&](bool a) {
                  return Works{comm_->broadcast(dense.data_ptr(), dense.nbytes(), DataType::UInt8,
                                                static_cast<int>(opts.rootRank), a)};
                });
}

c10::intrusive_ptr<c10d::Work> WeftBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                      std::vector<at::Tensor>& inputs,
                                                      const c10d::AllgatherOptions& opts) {
  if (auto device = cuda_device_of(outputs, inputs)) {
    if (auto work = device_allgather(*device, outputs, inputs)) return work;
    CudaStaging s = staging(*device, "allgather");
    std::vector<std::vector<at::Tensor>> host_out = s.twins(outputs, false, true);
    std::vector<at::Tensor> host_in = s.twins(inputs, true, false);
    return s.run(rank_, [&] { return allgather(host_out, host_in, opts); });
  }
  check_count(inputs.size(), 1, "allgather", "input tensor");
  check_count(outputs.size(), 1, "allgather", "output tensor list");
  check_count(outputs[0].size(), size_, "allgather", "output tensors (one per rank)");
  check_cpu(inputs, "allgather");
  check_cpu(outputs[0], "allgather");
  check_like(outputs[0], inputs[0], "allgather");
  at::Tensor in = inputs[0].contiguous();
  std::vector<at::Tensor> outs = outputs[0];
  at::Tensor packed = packed_bytes(outs, /*copy_in=*/false);
  return launch(
      c10d::OpType::ALLGATHER, is_async(opts, 0), outs, {in, packed},
      [packed, outs] { unpack_bytes(packed, outs); },
      [&](bool a) {
        return Works{
            comm_->allgather(in.data_ptr(), packed.data_ptr(), in.nbytes(), DataType::UInt8, a)};
      });
}

c10::intrusive_ptr<c10d::Work> WeftBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                            const c10d::AllgatherOptions& opts) {
  if (auto device = cuda_device_of(output, input)) {
    if (auto work = device_allgather_base(*device, output, input)) return work;
    CudaStaging s = staging(*device, "all_gather_into_tensor");
    at::Tensor host_out = s.twin(output, false, true);
    at::Tensor host_in = s.twin(input, true, false);
    return s.run(rank_, [&] { return _allgather_base(host_out, host_in, opts); });
  }
  check_cpu({output, input}, "all_gather_into_tensor");
  TORCH_CHECK(output.scalar_type() == input.scalar_type(),
              "weft all_gather_into_tensor: output and input tensors must have the same type");
  TORCH_CHECK(output.numel() == input.numel() * size_,
              "weft all_gather_into_tensor: output tensor size must be equal to world_size times "
              "input tensor size");
  at::Tensor in = input.contiguous();
  at::Tensor out = output.contiguous();
  return launch(c10d::OpType::_ALLGATHER_BASE, is_async(opts, 0), {output}, {in, out},
                copy_back(output, out), [&](bool a) {
                  return Works{comm_->allgather(in.data_ptr(), out.data_ptr(), in.nbytes(),
                                                DataType::UInt8, a)};
                });
}

c10::intrusive_ptr<c10d::Work> WeftBackend::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  if (auto device = cuda_device_of(outputs, inputs)) {
    CudaStaging s = staging(*device, "allgather_into_tensor_coalesced");
    std::vector<at::Tensor> host_out = s.twins(outputs, false, true);
    std::vector<at::Tensor> host_in = s.twins(inputs, true, false);
    return s.run(rank_, [&] { return allgather_into_tensor_coalesced(host_out, host_in, opts); });
  }
  const char* what = "allgather_into_tensor_coalesced";
  check_count(inputs.size(), outputs.size(), what, "input tensors (one per output)");
  check_cpu(outputs, what);
  check_cpu(inputs, what);
  for (size_t i = 0; i < outputs.size(); ++i) {
    TORCH_CHECK(outputs[i].scalar_type() == inputs[i].scalar_type(), "weft ", what,
                ": output and input tensors must have the same type");
    TORCH_CHECK(outputs[i].numel() == inputs[i].numel() * size_, "weft ", what,
                ": output tensor size must be equal to world_size times input tensor size");
  }
  StagedPairs staged = stage_pairs(inputs, outputs);
  return launch(
      c10d::OpType::COALESCED, is_async(opts, 0), outputs, staged.keep_alive, staged.finish,
      [&](bool a) {
        Works works;
        for (size_t i = 0; i < staged.ins.size(); ++i) {
          works.push_back(comm_->allgather(staged.ins[i].data_ptr(), staged.outs[i].data_ptr(),
                                           staged.ins[i].nbytes(), DataType::UInt8, a));
        }
        return works;
      });
}

c10::intrusive_ptr<c10d::Work> WeftBackend::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& output_lists, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  if (auto device = cuda_device_of(output_lists, inputs)) {
    CudaStaging s = staging(*device, "allgather_coalesced");
    std::vector<std::vector<at::Tensor>> host_out = s.twins(output_lists, false, true);
    std::vector<at::Tensor> host_in = s.twins(inputs, true, false);
    return s.run(rank_, [&] { return allgather_coalesced(host_out, host_in, opts); });
  }
  const char* what = "allgather_coalesced";
  check_count(output_lists.size(), size_, what, "output tensor lists (one per rank)");
  check_cpu(inputs, what);
  std::vector<at::Tensor> outputs;
  for (const auto& list : output_lists) {
    check_count(list.size(), inputs.size(), what, "output tensors per rank (one per input)");
    check_cpu(list, what);
    for (size_t i = 0; i < list.size(); ++i) check_like({list[i]}, inputs[i], what);
    outputs.insert(outputs.end(), list.begin(), list.end());
  }
  at::Tensor in = packed_bytes(inputs, /*copy_in=*/true);
  at::Tensor out = packed_bytes(outputs, /*copy_in=*/false);
  return launch(
      c10d::OpType::ALLGATHER_COALESCED, is_async(opts, 0), outputs, {in, out},
      [out, outputs] { unpack_bytes(out, outputs); },
      [&](bool a) {
        return Works{
            comm_->allgather(in.data_ptr(), out.data_ptr(), in.nbytes(), DataType::UInt8, a)};
      });
}

c10::intrusive_ptr<c10d::Work> WeftBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                   std::vector<at::Tensor>& inputs,
                                                   const c10d::GatherOptions& opts) {
  if (auto device = cuda_device_of(outputs, inputs)) {
    CudaStaging s = staging(*device, "gather");
    std::vector<std::vector<at::Tensor>> host_out = s.twins(outputs, false, true);
    std::vector<at::Tensor> host_in = s.twins(inputs, true, false);
    return s.run(rank_, [&] { return gather(host_out, host_in, opts); });
  }
  check_root(opts.rootRank, size_, "gather");
  check_count(inputs.size(), 1, "gather", "input tensor");
  check_cpu(inputs, "gather");
  const int root = static_cast<int>(opts.rootRank);
  at::Tensor in = inputs[0].contiguous();
  std::vector<at::Tensor> outs;
  at::Tensor out;
  if (root == rank_) {
    check_count(outputs.size(), 1, "gather", "output tensor list");
    check_count(outputs[0].size(), size_, "gather", "output tensors (one per rank)");
    check_cpu(outputs[0], "gather");
    check_like(outputs[0], inputs[0], "gather");
    outs = outputs[0];
    out = packed_bytes(outs, /*copy_in=*/false);
  } else {
    TORCH_CHECK(outputs.empty(), "weft gather: requires empty output on non-root");
  }
  std::function<void()> finish;
  if (out.defined()) finish = [out, outs] { unpack_bytes(out, outs); };
  return launch(
      c10d::OpType::GATHER, is_async(opts, 0), outs, {in, out}, std::move(finish), [&](bool a) {
        void* dst = out.defined() ? out.data_ptr() : nullptr;
        return Works{comm_->gather(in.data_ptr(), dst, in.nbytes(), DataType::UInt8, root, a)};
      });
}

c10::intrusive_ptr<c10d::Work> WeftBackend::scatter(std::vector<at::Tensor>& outputs,
                                                    std::vector<std::vector<at::Tensor>>& inputs,
                                                    const c10d::ScatterOptions& opts) {
  if (auto device = cuda_device_of(outputs, inputs)) {
    CudaStaging s = staging(*device, "scatter");
    std::vector<at::Tensor> host_out = s.twins(outputs, false, true);
    std::vector<std::vector<at::Tensor>> host_in = s.twins(inputs, true, false);
    return s.run(rank_, [&] { return scatter(host_out, host_in, opts); });
  }
  check_root(opts.rootRank, size_, "scatter");
  check_count(outputs.size(), 1, "scatter", "output tensor");
  check_cpu(outputs, "scatter");
  const int root = static_cast<int>(opts.rootRank);
  at::Tensor in;
  if (root == rank_) {
    check_count(inputs.size(), 1, "scatter", "input tensor list");
    check_count(inputs[0].size(), size_, "scatter", "input tensors (one per rank)");
    check_cpu(inputs[0], "scatter");
    check_like(inputs[0], outputs[0], "scatter");
    in = packed_bytes(inputs[0], /*copy_in=*/true);
  } else {
    TORCH_CHECK(inputs.empty(), "weft scatter: requires empty input on non-root");
  }
  const at::Tensor& out = outputs[0];
  at::Tensor dense = out.contiguous();
  return launch(c10d::OpType::SCATTER, is_async(opts, 0), outputs, {in, dense},
                copy_back(out, dense), [&](bool a) {
                  const void* src = in.defined() ? in.data_ptr() : nullptr;
                  return Works{comm_->scatter(src, dense.data_ptr(), dense.nbytes(),
                                              DataType::UInt8, root, a)};
                });
}

c10::intrusive_ptr<c10d::Work> WeftBackend::alltoall(std::vector<at::Tensor>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllToAllOptions& opts) {
  if (auto device = cuda_device_of(outputs, inputs)) {
    CudaStaging s = staging(*device, "alltoall");
    std::vector<at::Tensor> host_out = s.twins(outputs, false, true);
    std::vector<at::Tensor> host_in = s.twins(inputs, true, false);
    return s.run(rank_, [&] { return alltoall(host_out, host_in, opts); });
  }
  check_count(outputs.size(), size_, "alltoall", "output tensors (one per rank)");
  check_count(inputs.size(), size_, "alltoall", "input tensors (one per rank)");
  check_cpu(outputs, "alltoall");
  check_cpu(inputs, "alltoall");
  std::vector<size_t> send_bytes, recv_bytes;
  for (int r = 0; r < size_; ++r) {
    TORCH_CHECK(inputs[r].scalar_type() == outputs[r].scalar_type(),
                "weft alltoall: input and output tensors must have the same type");
    send_bytes.push_back(inputs[r].nbytes());
    recv_bytes.push_back(outputs[r].nbytes());
  }
  at::Tensor in = packed_bytes(inputs, /*copy_in=*/true);
  at::Tensor out = packed_bytes(outputs, /*copy_in=*/false);
  return launch(
      c10d::OpType::ALLTOALL, is_async(opts, 0), outputs, {in, out},
      [out, outputs] { unpack_bytes(out, outputs); },
      [&](bool a) {
        return Works{comm_->alltoall(in.data_ptr(), out.data_ptr(), send_bytes, recv_bytes,
                                     DataType::UInt8, a)};
      });
}

namespace {

// Bytes per rank of a tensor split along dim 0 (evenly when `splits` is empty).
std::vector<size_t> split_bytes(const at::Tensor& t, const std::vector<int64_t>& splits, int size,
                                const char* name) {
  const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
  const size_t row_bytes = rows == 0 ? 0 : t.nbytes() / static_cast<size_t>(rows);
  if (splits.empty()) {
    TORCH_CHECK(rows % size == 0, "weft alltoall_base: ", name,
                " tensor's dim 0 does not divide equally across group size");
    return std::vector<size_t>(size, static_cast<size_t>(rows / size) * row_bytes);
  }
  check_count(splits.size(), size, "alltoall_base", "split sizes (one per rank)");
  int64_t total = 0;
  std::vector<size_t> bytes;
  for (int64_t s : splits) {
    TORCH_CHECK(s >= 0, "weft alltoall_base: split sizes must not be negative");
    total += s;
    bytes.push_back(static_cast<size_t>(s) * row_bytes);
  }
  TORCH_CHECK(total == rows, "weft alltoall_base: ", name,
              " split sizes do not add up to the tensor's dim 0 (", total, " vs ", rows, ")");
  return bytes;
}

}  // namespace

c10::intrusive_ptr<c10d::Work> WeftBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                          std::vector<int64_t>& output_splits,
                                                          std::vector<int64_t>& input_splits,
                                                          const c10d::AllToAllOptions& opts) {
  if (auto device = cuda_device_of(output, input)) {
    CudaStaging s = staging(*device, "alltoall_base");
    at::Tensor host_out = s.twin(output, false, true);
    at::Tensor host_in = s.twin(input, true, false);
    return s.run(
        rank_, [&] { return alltoall_base(host_out, host_in, output_splits, input_splits, opts); });
  }
  check_cpu({output, input}, "alltoall_base");
  TORCH_CHECK_VALUE(output.is_contiguous() && input.is_contiguous(), "Tensors must be contiguous");
  TORCH_CHECK(output.scalar_type() == input.scalar_type(),
              "weft alltoall_base: input and output tensors must have the same type");
  std::vector<size_t> send_bytes = split_bytes(input, input_splits, size_, "input");
  std::vector<size_t> recv_bytes = split_bytes(output, output_splits, size_, "output");
  return launch(c10d::OpType::ALLTOALL_BASE, is_async(opts, 0), {output}, {input, output}, {},
                [&](bool a) {
                  return Works{comm_->alltoall(input.data_ptr(), output.data_ptr(), send_bytes,
                                               recv_bytes, DataType::UInt8, a)};
                });
}

}  // namespace weft::backend
