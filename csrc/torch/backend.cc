#include "backend.h"

#include <ATen/core/LegacyTypeDispatch.h>

#include "errors.h"
#include "tensors.h"
#include "work.h"

namespace weft::backend {
namespace {

// torch >= 2.7 says whether the caller waits at once (async_op=False): then
// the core runs the operation on this thread. Older torch has no such flag.
template <typename Options>
auto is_async(const Options& opts, int) -> decltype(opts.asyncOp) {
  return opts.asyncOp;
}
template <typename Options>
bool is_async(const Options&, long) {
  return true;
}

// Every tensor of `tensors` has the dtype and shape of `like`.
void check_like(at::TensorList tensors, const at::Tensor& like, const char* what) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    TORCH_CHECK(tensors[i].scalar_type() == like.scalar_type(), "weft ", what,
                ": invalid tensor type at index ", i, " (expected ", like.scalar_type(), ", got ",
                tensors[i].scalar_type(), ")");
    TORCH_CHECK(tensors[i].sizes() == like.sizes(), "weft ", what,
                ": invalid tensor size at index ", i, " (expected ", like.sizes(), ", got ",
                tensors[i].sizes(), ")");
  }
}

void check_count(size_t n, size_t expected, const char* what, const char* name) {
  TORCH_CHECK(n == expected, "weft ", what, ": expected ", expected, " ", name, ", got ", n);
}

// Copies a contiguous stand-in back into a non-contiguous tensor; nothing to
// do (empty) when the tensor is its own stand-in.
std::function<void()> copy_back(const at::Tensor& tensor, const at::Tensor& dense) {
  if (dense.is_same(tensor)) return {};
  return [tensor, dense]() mutable { tensor.copy_(dense); };
}

void run_finish(const std::function<void()>& finish) {
  if (!finish) return;
  // Finishing copies write into the caller's tensors, outside autograd.
  at::AutoDispatchBelowADInplaceOrView no_autograd;
  finish();
}

size_t count_of(const at::Tensor& t) { return static_cast<size_t>(t.numel()); }

}  // namespace

WeftBackend::WeftBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                         double timeout_s, const std::string& name)
    : c10d::Backend(rank, size), store_(store) {
  try {
    comm_ = std::make_unique<Communicator>(store_, rank, size, "torch/" + name, timeout_s);
  } catch (...) {
    rethrow_as_torch_error(std::current_exception());
  }
  init();
}

WeftBackend::~WeftBackend() = default;

c10::intrusive_ptr<c10d::Work> WeftBackend::launch(c10d::OpType type, bool async,
                                                   std::vector<at::Tensor> outputs,
                                                   std::vector<at::Tensor> keep_alive,
                                                   std::function<void()> finish,
                                                   const std::function<Works(bool)>& start) {
  Works works;
  try {
    works = start(async);
  } catch (...) {
    rethrow_as_torch_error(std::current_exception());
  }
  if (!async) {
    run_finish(finish);
    const int source = works.empty() ? -1 : works.back()->source();
    return c10::make_intrusive<BackendWork>(rank_, type, std::move(outputs), source);
  }
  auto work = c10::make_intrusive<BackendWork>(rank_, type, std::move(outputs),
                                               std::move(keep_alive), std::move(finish));
  work->track(works);
  return work;
}

c10::intrusive_ptr<c10d::Work> WeftBackend::gather_then(
    c10d::OpType type, bool async, const at::Tensor& contribution, std::vector<at::Tensor> outputs,
    std::function<void(const at::Tensor&)> deliver) {
  at::Tensor mine = contribution.contiguous();
  std::vector<int64_t> shape{size_};
  shape.insert(shape.end(), mine.sizes().begin(), mine.sizes().end());
  at::Tensor gathered = at::empty(shape, mine.options());
  return launch(
      type, async, std::move(outputs), {mine, gathered},
      [gathered, deliver = std::move(deliver)] { deliver(gathered); },
      [&](bool a) {
        return Works{comm_->allgather(mine.data_ptr(), gathered.data_ptr(), mine.nbytes(),
                                      DataType::UInt8, a)};
      });
}

c10::intrusive_ptr<c10d::Work> WeftBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                      const c10d::AllreduceOptions& opts) {
  check_cpu(tensors, "allreduce");
  TORCH_CHECK(!tensors.empty(), "weft allreduce: requires at least one tensor");
  check_like(tensors, tensors[0], "allreduce");
  const Reduction how = plan_reduction(tensors[0].scalar_type(), opts.reduceOp);
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

c10::intrusive_ptr<c10d::Work> WeftBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                      const c10d::BroadcastOptions& opts) {
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

c10::intrusive_ptr<c10d::Work> WeftBackend::reduce(std::vector<at::Tensor>& tensors,
                                                   const c10d::ReduceOptions& opts) {
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

c10::intrusive_ptr<c10d::Work> WeftBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                      std::vector<at::Tensor>& inputs,
                                                      const c10d::AllgatherOptions& opts) {
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

c10::intrusive_ptr<c10d::Work> WeftBackend::barrier(const c10d::BarrierOptions& opts) {
  return launch(c10d::OpType::BARRIER, is_async(opts, 0), {}, {}, {},
                [&](bool a) { return Works{comm_->barrier(a)}; });
}

}  // namespace weft::backend
