// Chains from or to the root. Every rank forwards a slice as soon as it has
// it, so for large messages the time approaches one transfer of the buffer
// regardless of the world size; small messages pay one hop per rank (the
// tree algorithms are the answer to that).
#include "core/algo/algorithms.h"

namespace weft::algo {

Plan chain_broadcast(const PlanContext& ctx, size_t count, int root) {
  Plan plan;
  plan.algorithm = "chain";
  const int n = ctx.size;
  if (n == 1 || count == 0) return plan;
  const int pos = positive_mod(ctx.rank - root, n);  // distance from the root
  Step s;
  s.count = count;
  if (pos == 0) {
    s.local = Span{Buf::Output, 0, count};
  } else {
    s.recv_peer = positive_mod(ctx.rank - 1, n);
    s.dst = Span{Buf::Output, 0, count};
  }
  if (pos < n - 1) s.send_peer = positive_mod(ctx.rank + 1, n);
  plan.steps.push_back(s);
  return plan;
}

Plan chain_reduce(const PlanContext& ctx, size_t count, int root, bool in_place, bool finalize) {
  const int n = ctx.size;
  if (n == 1) {
    Plan plan = local_copy(count, in_place, finalize);
    plan.algorithm = "chain";
    return plan;
  }
  Plan plan;
  plan.algorithm = "chain";
  if (count == 0) return plan;
  // The chain starts right after the root and ends at it.
  const int pos = positive_mod(ctx.rank - root - 1, n);
  Step s;
  s.count = count;
  s.local = Span{Buf::Input, 0, count};
  if (pos > 0) s.recv_peer = positive_mod(ctx.rank - 1, n);
  if (pos < n - 1) {
    s.send_peer = positive_mod(ctx.rank + 1, n);
  } else {
    s.dst = Span{Buf::Output, 0, count};
    s.finalize = finalize;
  }
  plan.steps.push_back(s);
  return plan;
}

}  // namespace weft::algo
