// Ring algorithms, as NCCL runs them: reduce-scatter passes partial sums
// around the ring so each rank ends owning one fully reduced block; allgather
// passes finished blocks around; allreduce is the two fused (the step that
// finishes a block also starts sending it). Large buffers are cut into rounds
// whose per-step chunk fits in half a connection's buffering, which keeps a
// ring where every rank sends before it receives from deadlocking.
#include <algorithm>

#include "core/algo/algorithms.h"

namespace weft::algo {
namespace {

int mod(int a, int n) { return ((a % n) + n) % n; }

// Elements per chunk so that one step never pushes more than the budget.
size_t chunk_limit(const PlanContext& ctx) {
  return std::max<size_t>(1, ctx.max_step_bytes / ctx.elem_size);
}

Step fused(size_t count) {
  Step s;
  s.count = count;
  return s;
}

// Appends the ring steps for one round: `block(c)` gives the span of chunk c
// in Input (for reduction) and `out(c)` its span in Output.
template <typename BlockFn, typename OutFn>
void reduce_scatter_round(const PlanContext& ctx, BlockFn block, OutFn out, bool then_allgather,
                          bool finalize, std::vector<Step>& steps) {
  const int n = ctx.size, r = ctx.rank;
  const int next = mod(r + 1, n), prev = mod(r - 1, n);
  // Step 0: send our copy of chunk r-1 to the next rank.
  Span first = block(mod(r - 1, n));
  if (first.count > 0) {
    Step s = fused(first.count);
    s.local = first;
    s.send_peer = next;
    steps.push_back(s);
  }
  // Steps 1..n-1: receive chunk r-1-k, add ours, pass it on; the last one
  // (chunk r) is complete and lands in Output.
  for (int k = 1; k < n; ++k) {
    int c = mod(r - 1 - k, n);
    Span mine = block(c);
    if (mine.count == 0) continue;
    Step s = fused(mine.count);
    s.recv_peer = prev;
    s.local = mine;
    if (k < n - 1) {
      s.send_peer = next;
    } else {
      s.dst = out(c);
      s.finalize = finalize;
      if (then_allgather && n > 1) s.send_peer = next;
    }
    steps.push_back(s);
  }
}

// Allgather steps after chunk r is in Output (and, when `already_sent`, was
// sent on by the reduce-scatter's last step).
template <typename OutFn>
void allgather_round(const PlanContext& ctx, OutFn out, bool already_sent,
                     std::vector<Step>& steps) {
  const int n = ctx.size, r = ctx.rank;
  const int next = mod(r + 1, n), prev = mod(r - 1, n);
  if (!already_sent && out(r).count > 0) {
    Step s = fused(out(r).count);
    s.local = out(r);
    s.send_peer = next;
    steps.push_back(s);
  }
  for (int k = 1; k < n; ++k) {
    Span dst = out(mod(r - k, n));
    if (dst.count == 0) continue;
    Step s = fused(dst.count);
    s.recv_peer = prev;
    s.dst = dst;
    if (k < n - 1) s.send_peer = next;
    steps.push_back(s);
  }
}

}  // namespace

Plan ring_allreduce(const PlanContext& ctx, size_t count, bool in_place, bool finalize) {
  if (ctx.size == 1) return local_copy(count, in_place, finalize);
  Plan plan;
  plan.algorithm = "ring";
  const size_t n = ctx.size;
  const size_t round_limit = chunk_limit(ctx) * n;
  for (size_t base = 0; base < count; base += round_limit) {
    size_t round = std::min(round_limit, count - base);
    auto span = [&](Buf buf, int c) {
      return Span{buf, base + part_offset(round, n, c), part_count(round, n, c)};
    };
    auto in = [&](int c) { return span(Buf::Input, c); };
    auto out = [&](int c) { return span(Buf::Output, c); };
    reduce_scatter_round(ctx, in, out, true, finalize, plan.steps);
    allgather_round(ctx, out, true, plan.steps);
  }
  return plan;
}

Plan ring_reduce_scatter(const PlanContext& ctx, size_t count, bool finalize) {
  Plan plan;
  plan.algorithm = "ring";
  if (ctx.size == 1) {
    plan.steps = local_copy(count, false, finalize).steps;
    return plan;
  }
  const size_t limit = chunk_limit(ctx);
  for (size_t piece = 0; piece < count; piece += limit) {
    size_t len = std::min(limit, count - piece);
    auto in = [&](int c) { return Span{Buf::Input, c * count + piece, len}; };
    auto out = [&](int) { return Span{Buf::Output, piece, len}; };
    reduce_scatter_round(ctx, in, out, false, finalize, plan.steps);
  }
  return plan;
}

Plan ring_allgather(const PlanContext& ctx, size_t count, bool in_place) {
  Plan plan;
  plan.algorithm = "ring";
  if (!in_place) {
    add_copy(plan.steps, Span{Buf::Input, 0, count}, Span{Buf::Output, ctx.rank * count, count});
  }
  if (ctx.size == 1) return plan;
  const size_t limit = chunk_limit(ctx);
  for (size_t piece = 0; piece < count; piece += limit) {
    size_t len = std::min(limit, count - piece);
    auto out = [&](int c) { return Span{Buf::Output, c * count + piece, len}; };
    allgather_round(ctx, out, false, plan.steps);
  }
  return plan;
}

}  // namespace weft::algo
