// Ring algorithms, as NCCL runs them: reduce-scatter passes partial sums
// around the ring so each rank ends owning one fully reduced block; allgather
// passes finished blocks around; allreduce is the two fused (the step that
// finishes a block also starts sending it). Large buffers are cut into rounds
// whose per-step chunk fits in half a connection's buffering, which keeps a
// ring where every rank sends before it receives from deadlocking.
#include <algorithm>

#include "core/algo/algorithms.h"

namespace weft::algo {

Ring Ring::world(const PlanContext& ctx) {
  Ring ring;
  for (int r = 0; r < ctx.size; ++r) ring.members.push_back(r);
  ring.pos = ctx.rank;
  return ring;
}

namespace {

// Appends the ring steps for one round: `block(c)` gives the span of chunk c
// in Input (for reduction) and `out(c)` its span in Output.
template <typename BlockFn, typename OutFn>
void reduce_scatter_round(const Ring& ring, BlockFn block, OutFn out, bool then_allgather,
                          bool finalize, std::vector<Step>& steps) {
  const int n = ring.size(), r = ring.pos;
  // Step 0: send our copy of chunk r-1 to the next rank.
  Span first = block(ring.wrap(r - 1));
  if (first.count > 0) {
    Step s = fused_step(first.count);
    s.local = first;
    s.send_peer = ring.next();
    steps.push_back(s);
  }
  // Steps 1..n-1: receive chunk r-1-k, add ours, pass it on; the last one
  // (chunk r) is complete and lands in Output.
  for (int k = 1; k < n; ++k) {
    int c = ring.wrap(r - 1 - k);
    Span mine = block(c);
    if (mine.count == 0) continue;
    Step s = fused_step(mine.count);
    s.recv_peer = ring.prev();
    s.local = mine;
    if (k < n - 1) {
      s.send_peer = ring.next();
    } else {
      s.dst = out(c);
      s.finalize = finalize;
      if (then_allgather && n > 1) s.send_peer = ring.next();
    }
    steps.push_back(s);
  }
}

// Allgather steps after chunk r is in Output (and, when `already_sent`, was
// sent on by the reduce-scatter's last step).
template <typename OutFn>
void allgather_round(const Ring& ring, OutFn out, bool already_sent, std::vector<Step>& steps) {
  const int n = ring.size(), r = ring.pos;
  if (!already_sent && out(r).count > 0) {
    Step s = fused_step(out(r).count);
    s.local = out(r);
    s.send_peer = ring.next();
    steps.push_back(s);
  }
  for (int k = 1; k < n; ++k) {
    Span dst = out(ring.wrap(r - k));
    if (dst.count == 0) continue;
    Step s = fused_step(dst.count);
    s.recv_peer = ring.prev();
    s.dst = dst;
    if (k < n - 1) s.send_peer = ring.next();
    steps.push_back(s);
  }
}

}  // namespace

void ring_allreduce_steps(const PlanContext& ctx, const Ring& ring, Buf from, size_t base,
                          size_t count, bool finalize, std::vector<Step>& steps) {
  const size_t n = ring.size();
  const size_t round_limit = chunk_limit(ctx) * n;
  for (size_t at = base; at < base + count; at += round_limit) {
    size_t round = std::min(round_limit, base + count - at);
    auto span = [&](Buf buf, int c) {
      return Span{buf, at + part_offset(round, n, c), part_count(round, n, c)};
    };
    auto in = [&](int c) { return span(from, c); };
    auto out = [&](int c) { return span(Buf::Output, c); };
    reduce_scatter_round(ring, in, out, true, finalize, steps);
    allgather_round(ring, out, true, steps);
  }
}

namespace {

// Piece `piece` (of `limit` elements) of a block, empty past its end.
Span cut(const Span& block, size_t piece, size_t limit) {
  const size_t at = std::min(piece, block.count);
  return Span{block.buf, block.offset + at, std::min(limit, block.count - at)};
}

size_t longest(const std::vector<Span>& blocks) {
  size_t most = 0;
  for (const Span& b : blocks) most = std::max(most, b.count);
  return most;
}

}  // namespace

void ring_reduce_scatter_steps(const PlanContext& ctx, const Ring& ring,
                               const std::vector<Span>& in_blocks,
                               const std::vector<Span>& out_blocks, bool finalize,
                               std::vector<Step>& steps) {
  const size_t limit = chunk_limit(ctx);
  for (size_t piece = 0; piece < longest(in_blocks); piece += limit) {
    auto in = [&](int c) { return cut(in_blocks[c], piece, limit); };
    auto out = [&](int c) { return cut(out_blocks[c], piece, limit); };
    reduce_scatter_round(ring, in, out, false, finalize, steps);
  }
}

void ring_allgather_steps(const PlanContext& ctx, const Ring& ring, const std::vector<Span>& blocks,
                          std::vector<Step>& steps) {
  const size_t limit = chunk_limit(ctx);
  for (size_t piece = 0; piece < longest(blocks); piece += limit) {
    auto out = [&](int c) { return cut(blocks[c], piece, limit); };
    allgather_round(ring, out, false, steps);
  }
}

Plan ring_allreduce(const PlanContext& ctx, size_t count, bool in_place, bool finalize) {
  if (ctx.size == 1) return local_copy(count, in_place, finalize);
  Plan plan;
  plan.algorithm = "ring";
  ring_allreduce_steps(ctx, Ring::world(ctx), Buf::Input, 0, count, finalize, plan.steps);
  return plan;
}

Plan ring_reduce_scatter(const PlanContext& ctx, size_t count, bool finalize) {
  Plan plan;
  plan.algorithm = "ring";
  if (ctx.size == 1) {
    plan.steps = local_copy(count, false, finalize).steps;
    return plan;
  }
  // Block c of Input reduces into Output on rank c.
  std::vector<Span> in_blocks, out_blocks;
  for (int c = 0; c < ctx.size; ++c) {
    in_blocks.push_back(Span{Buf::Input, c * count, count});
    out_blocks.push_back(Span{Buf::Output, 0, count});
  }
  ring_reduce_scatter_steps(ctx, Ring::world(ctx), in_blocks, out_blocks, finalize, plan.steps);
  return plan;
}

Plan ring_allgather(const PlanContext& ctx, size_t count, bool in_place) {
  Plan plan;
  plan.algorithm = "ring";
  if (!in_place) {
    add_copy(plan.steps, Span{Buf::Input, 0, count}, Span{Buf::Output, ctx.rank * count, count});
  }
  if (ctx.size == 1) return plan;
  std::vector<Span> blocks;
  for (int c = 0; c < ctx.size; ++c) blocks.push_back(Span{Buf::Output, c * count, count});
  ring_allgather_steps(ctx, Ring::world(ctx), blocks, plan.steps);
  return plan;
}

}  // namespace weft::algo
