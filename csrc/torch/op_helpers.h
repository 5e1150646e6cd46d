// Small checks and steps every backend operation shares.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <functional>
#include <vector>

namespace weft::backend {

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
inline void check_like(at::TensorList tensors, const at::Tensor& like, const char* what) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    TORCH_CHECK(tensors[i].scalar_type() == like.scalar_type(), "weft ", what,
                ": invalid tensor type at index ", i, " (expected ", like.scalar_type(), ", got ",
                tensors[i].scalar_type(), ")");
    TORCH_CHECK(tensors[i].sizes() == like.sizes(), "weft ", what,
                ": invalid tensor size at index ", i, " (expected ", like.sizes(), ", got ",
                tensors[i].sizes(), ")");
  }
}

inline void check_count(size_t n, size_t expected, const char* what, const char* name) {
  TORCH_CHECK(n == expected, "weft ", what, ": expected ", expected, " ", name, ", got ", n);
}

inline void check_root(int64_t root, int size, const char* what) {
  TORCH_CHECK(root >= 0 && root < size, "weft ", what, ": invalid root rank ", root);
}

// Copies a contiguous stand-in back into a non-contiguous tensor; nothing to
// do (empty) when the tensor is its own stand-in.
inline std::function<void()> copy_back(const at::Tensor& tensor, const at::Tensor& dense) {
  if (dense.is_same(tensor)) return {};
  return [tensor, dense]() mutable { tensor.copy_(dense); };
}

// Contiguous stand-ins for inputs and outputs paired by index, and the step
// that copies the outputs' stand-ins back (empty when there is none).
struct StagedPairs {
  std::vector<at::Tensor> ins, outs;
  std::vector<at::Tensor> keep_alive;
  std::function<void()> finish;
};

inline StagedPairs stage_pairs(const std::vector<at::Tensor>& inputs,
                               const std::vector<at::Tensor>& outputs) {
  StagedPairs staged;
  std::vector<std::function<void()>> copies;
  for (size_t i = 0; i < outputs.size(); ++i) {
    staged.ins.push_back(inputs[i].contiguous());
    staged.outs.push_back(outputs[i].contiguous());
    staged.keep_alive.insert(staged.keep_alive.end(), {staged.ins.back(), staged.outs.back()});
    if (auto copy = copy_back(outputs[i], staged.outs.back())) copies.push_back(std::move(copy));
  }
  if (!copies.empty()) {
    staged.finish = [copies] {
      for (const auto& copy : copies) copy();
    };
  }
  return staged;
}

inline size_t count_of(const at::Tensor& t) { return static_cast<size_t>(t.numel()); }

}  // namespace weft::backend
