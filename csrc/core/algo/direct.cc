// Direct exchanges: every rank talks to every peer itself. Pairwise
// all-to-all pairs rank r with r+k and r-k in round k, so each round is a
// permutation and no link carries two messages at once.
#include "core/algo/algorithms.h"

namespace weft::algo {
namespace {

std::vector<size_t> prefix_offsets(const std::vector<size_t>& counts) {
  std::vector<size_t> offsets(counts.size(), 0);
  for (size_t i = 1; i < counts.size(); ++i) offsets[i] = offsets[i - 1] + counts[i - 1];
  return offsets;
}

}  // namespace

Plan local_copy(size_t count, bool in_place, bool finalize) {
  Plan plan;
  plan.algorithm = "local";
  if (count == 0 || (in_place && !finalize)) return plan;
  Step s;
  s.count = count;
  s.local = Span{Buf::Input, 0, count};
  s.dst = Span{Buf::Output, 0, count};
  s.finalize = finalize;
  plan.steps.push_back(s);
  return plan;
}

Plan pairwise_alltoall(const PlanContext& ctx, const std::vector<size_t>& send_counts,
                       const std::vector<size_t>& recv_counts) {
  const int n = ctx.size, r = ctx.rank;
  const auto send_at = prefix_offsets(send_counts);
  const auto recv_at = prefix_offsets(recv_counts);
  Plan plan;
  plan.algorithm = "pairwise";
  add_copy(plan.steps, Span{Buf::Input, send_at[r], send_counts[r]},
           Span{Buf::Output, recv_at[r], recv_counts[r]});
  for (int k = 1; k < n; ++k) {
    int to = (r + k) % n, from = (r - k + n) % n;
    plan.steps.push_back(exchange_step(to, Span{Buf::Input, send_at[to], send_counts[to]}, from,
                                       Span{Buf::Output, recv_at[from], recv_counts[from]}));
  }
  return plan;
}

Plan direct_gather(const PlanContext& ctx, size_t count, int root) {
  const int n = ctx.size, r = ctx.rank;
  Plan plan;
  plan.algorithm = "direct";
  if (r != root) {
    plan.steps.push_back(exchange_step(root, Span{Buf::Input, 0, count}, -1, std::nullopt));
    return plan;
  }
  add_copy(plan.steps, Span{Buf::Input, 0, count}, Span{Buf::Output, r * count, count});
  for (int p = 0; p < n; ++p) {
    if (p == r) continue;
    plan.steps.push_back(exchange_step(-1, std::nullopt, p, Span{Buf::Output, p * count, count}));
  }
  return plan;
}

Plan direct_scatter(const PlanContext& ctx, size_t count, int root) {
  const int n = ctx.size, r = ctx.rank;
  Plan plan;
  plan.algorithm = "direct";
  if (r != root) {
    plan.steps.push_back(exchange_step(-1, std::nullopt, root, Span{Buf::Output, 0, count}));
    return plan;
  }
  for (int p = 0; p < n; ++p) {
    if (p == r) continue;
    plan.steps.push_back(exchange_step(p, Span{Buf::Input, p * count, count}, -1, std::nullopt));
  }
  add_copy(plan.steps, Span{Buf::Input, r * count, count}, Span{Buf::Output, 0, count});
  return plan;
}

}  // namespace weft::algo
