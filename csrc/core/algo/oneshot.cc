// One-shot allreduce: one round of messages, then a local reduction. For
// small messages latency is everything, and this needs a single hop. Every
// rank reduces the contributions in rank order so that all ranks get
// bit-identical floating-point results.
#include "core/algo/algorithms.h"

namespace weft::algo {

Plan oneshot_allreduce(const PlanContext& ctx, size_t count, bool in_place, bool finalize) {
  const int n = ctx.size, r = ctx.rank;
  if (n == 1) return local_copy(count, in_place, finalize);
  Plan plan;
  plan.algorithm = "oneshot";
  if (count == 0) return plan;
  const Span input{Buf::Input, 0, count};
  // Sends and receives of a round progress together, so no message size can
  // fill the connections and deadlock.
  auto exchange = [&](int to, int from, Span dst) { return exchange_step(to, input, from, dst); };
  if (!oneshot_stages(n, in_place, count * ctx.elem_size, ctx.max_step_bytes)) {
    // a + b == b + a exactly, so reducing straight from the peer's message is
    // already in rank order.
    const Span output{Buf::Output, 0, count};
    if (!in_place) {
      Step s = exchange(1 - r, 1 - r, output);
      s.operand = input;
      s.finalize = finalize;
      plan.steps.push_back(s);
      return plan;
    }
    // In place the input is sent first, as copies (a step that fits the
    // step budget completes without the peer), and then overwritten by the
    // reduction of the peer's message with it.
    Step send = fused_step(count);
    send.local = input;
    send.send_peer = 1 - r;
    send.copy_sends = true;
    Step reduce = fused_step(count);
    reduce.recv_peer = 1 - r;
    reduce.local = input;
    reduce.dst = output;
    reduce.finalize = finalize;
    plan.steps.push_back(send);
    plan.steps.push_back(reduce);
    return plan;
  }
  // Contributions land in Scratch (ours too, so that in-place Output can be
  // overwritten freely), then one ordered reduction fills Output.
  plan.scratch_count = n * count;
  add_copy(plan.steps, input, Span{Buf::Scratch, r * count, count});
  for (int k = 1; k < n; ++k) {
    const int from = (r - k + n) % n;
    plan.steps.push_back(exchange((r + k) % n, from, Span{Buf::Scratch, from * count, count}));
  }
  Step reduce;
  reduce.kind = Step::Kind::LocalReduce;
  reduce.count = count;
  reduce.dst = Span{Buf::Output, 0, count};
  reduce.local = Span{Buf::Scratch, 0, n * count};
  reduce.finalize = finalize;
  reduce.wait_sends = in_place;
  plan.steps.push_back(reduce);
  return plan;
}

Plan barrier(const PlanContext& ctx) {
  Plan plan;
  plan.algorithm = "barrier";
  // Dissemination: in round k each rank signals the rank 2^k after it and
  // waits for the one 2^k before it, so after ceil(log2 size) rounds every
  // rank has heard, through some chain, from every other. Zero-length
  // Exchange steps still send and wait for one message each way.
  for (int k = 1; k < ctx.size; k *= 2) {
    plan.steps.push_back(exchange_step((ctx.rank + k) % ctx.size, Span{Buf::Input, 0, 0},
                                       (ctx.rank - k + ctx.size) % ctx.size,
                                       Span{Buf::Output, 0, 0}));
  }
  return plan;
}

}  // namespace weft::algo
