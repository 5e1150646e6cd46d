// allreduce of a sparse COO tensor, as gloo does it: every rank's indices and
// values are gathered, summed here, and the coalesced sum replaces the input.
// Sizes and nnz are agreed first (one small blocking allgather), so that the
// data can go in one allgather of equal, padded contributions.
#include <algorithm>
#include <string>

#include "backend.h"
#include "core/common/error.h"
#include "errors.h"
#include "op_helpers.h"

namespace weft::backend {
namespace {

// What one rank tells the others: sparse and dense dimension counts, nnz,
// and the sizes, zero-padded.
constexpr int64_t kMaxDims = 24;
constexpr int64_t kHeader = 3;

at::Tensor describe(const at::Tensor& t) {
  at::Tensor meta = at::zeros({kHeader + kMaxDims}, at::kLong);
  int64_t* m = meta.data_ptr<int64_t>();
  m[0] = t.sparse_dim();
  m[1] = t.dense_dim();
  m[2] = t._nnz();
  for (int64_t d = 0; d < t.dim(); ++d) m[kHeader + d] = t.size(d);
  return meta;
}

// The widest element type's size (complex128).
constexpr int64_t kAlign = 16;

int64_t aligned(int64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// The bytes of `t` as a flat uint8 tensor of `length` (zero-padded).
at::Tensor as_bytes(const at::Tensor& t, int64_t length) {
  at::Tensor bytes = at::zeros({length}, at::kByte);
  bytes.narrow(0, 0, t.nbytes()).copy_(t.contiguous().view(at::kByte).flatten());
  return bytes;
}

}  // namespace

c10::intrusive_ptr<c10d::Work> WeftBackend::allreduce_sparse_coo(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  TORCH_CHECK(opts.reduceOp == c10d::ReduceOp::SUM,
              "weft allreduce: unsupported reduction operation (allreduce of sparse tensors "
              "only works with ReduceOp.SUM)");
  TORCH_CHECK(tensors.size() == 1, "weft allreduce: sparse tensors are reduced one per call");
  at::Tensor t = tensors[0];
  TORCH_CHECK(t.dim() <= kMaxDims, "weft allreduce: sparse tensors of more than ", kMaxDims,
              " dimensions are not supported");
  const at::Tensor mine = t.coalesce();

  at::Tensor meta = describe(mine);
  at::Tensor all_meta = at::empty({size_, meta.numel()}, at::kLong);
  try {
    comm_->allgather(meta.data_ptr(), all_meta.data_ptr(), meta.nbytes(), DataType::UInt8, false);
  } catch (const weft::Error&) {
    rethrow_as_torch_error(std::current_exception());
  }
  // Every rank sees every description, so every rank refuses a mismatch.
  const at::Tensor shape = meta.narrow(0, 0, 2), sizes = meta.narrow(0, kHeader, kMaxDims);
  std::vector<int64_t> nnz(size_);
  for (int r = 0; r < size_; ++r) {
    const at::Tensor theirs = all_meta[r];
    TORCH_CHECK(
        theirs.narrow(0, 0, 2).equal(shape) && theirs.narrow(0, kHeader, kMaxDims).equal(sizes),
        "weft allreduce: sparse tensors differ across ranks: rank ", r, " has sizes ",
        c10::IntArrayRef(theirs.data_ptr<int64_t>() + kHeader, t.dim()), " and ",
        theirs[0].item<int64_t>(), " sparse dimensions, this rank ", t.sizes(), " and ",
        t.sparse_dim());
    nnz[r] = theirs[2].item<int64_t>();
  }
  const int64_t most = *std::max_element(nnz.begin(), nnz.end());

  // Pad indices and values to the largest nnz and send both as bytes.
  at::Tensor indices = at::zeros({mine.sparse_dim(), most}, at::kLong);
  indices.narrow(1, 0, mine._nnz()).copy_(mine._indices());
  std::vector<int64_t> value_shape = mine._values().sizes().vec();
  value_shape[0] = most;
  at::Tensor values = at::zeros(value_shape, mine._values().options());
  values.narrow(0, 0, mine._nnz()).copy_(mine._values());
  // Each part starts a multiple of kAlign bytes into each rank's row of the
  // gathered bytes, so that it can be viewed as its type there.
  const int64_t index_bytes = indices.nbytes(), value_bytes = values.nbytes();
  const int64_t values_at = aligned(index_bytes);
  const at::Tensor contribution =
      at::cat({as_bytes(indices, values_at), as_bytes(values, aligned(value_bytes))});

  return gather_then(
      c10d::OpType::ALLREDUCE, is_async(opts, 0), contribution, tensors,
      [t, nnz, index_bytes, values_at, value_bytes, index_shape = indices.sizes().vec(),
       value_shape, no_indices = indices.narrow(1, 0, 0).clone(),
       no_values = values.narrow(0, 0, 0).clone()](const at::Tensor& gathered) mutable {
        // Empty pieces first: a sum of nothing but empty tensors has the right shape too.
        std::vector<at::Tensor> all_indices{no_indices}, all_values{no_values};
        for (size_t r = 0; r < nnz.size(); ++r) {
          if (nnz[r] == 0) continue;
          const at::Tensor row = gathered[static_cast<int64_t>(r)];
          const at::Tensor index_bytes_of_r = row.narrow(0, 0, index_bytes);
          const at::Tensor value_bytes_of_r = row.narrow(0, values_at, value_bytes);
          all_indices.push_back(
              index_bytes_of_r.view(at::kLong).view(index_shape).narrow(1, 0, nnz[r]));
          all_values.push_back(value_bytes_of_r.view(no_values.scalar_type())
                                   .view(value_shape)
                                   .narrow(0, 0, nnz[r]));
        }
        t.copy_(at::sparse_coo_tensor(at::cat(all_indices, 1), at::cat(all_values), t.sizes(),
                                      t.options())
                    .coalesce());
      });
}

}  // namespace weft::backend
