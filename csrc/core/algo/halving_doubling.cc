// Recursive doubling and recursive halving/doubling (Rabenseifner) allreduce,
// as MPICH runs them. Both work on a power-of-two group; other world sizes
// fold first: of the first 2*rem ranks (rem = size - largest power of two),
// each even rank hands its whole input to the odd rank above it, sits out,
// and gets the result back at the end.
//
// Recursive doubling exchanges the whole vector with partners at distance
// 1, 2, 4, ...: log2(p) rounds, best for small messages. Rabenseifner halves
// the vector at every round of a reduce-scatter, then doubles it back in an
// allgather: the ring's bandwidth in 2*log2(p) rounds instead of 2*(p-1).
#include <algorithm>

#include "core/algo/algorithms.h"

namespace weft::algo {
namespace {

// The largest power of two <= size: the group the rounds run in.
int fold_group(int size) {
  int group = 1;
  while (group * 2 <= size) group *= 2;
  return group;
}

// The power-of-two group and this rank's place in it.
struct Fold {
  int group = 1;      // fold_group(size)
  int rem = 0;        // size - group
  int new_rank = -1;  // position in the group; -1 for a rank that sits out
  int partner = -1;   // the rank it folds with, or -1

  explicit Fold(const PlanContext& ctx) : group(fold_group(ctx.size)) {
    rem = ctx.size - group;
    const int r = ctx.rank;
    if (r < 2 * rem) {
      partner = r % 2 == 0 ? r + 1 : r - 1;
      new_rank = r % 2 == 0 ? -1 : r / 2;
    } else {
      new_rank = r - rem;
    }
  }

  // The world rank at group position `pos`.
  int rank_of(int pos) const { return pos < rem ? 2 * pos + 1 : pos + rem; }
};

// Both directions with one partner at once.
Step swap_with(int peer, Span send, Span receive) {
  return exchange_step(peer, send, peer, receive);
}

// The first steps of a folded plan over elements [base, base + count): a
// rank that sits out hands its input over; its partner reduces it into
// Output. Returns the buffer that holds this rank's running vector afterwards.
Buf fold_in(const Fold& fold, size_t base, size_t count, std::vector<Step>& steps) {
  if (fold.partner < 0) return Buf::Input;
  Step s;
  s.count = count;
  s.local = Span{Buf::Input, base, count};
  if (fold.new_rank < 0) {
    s.send_peer = fold.partner;
  } else {
    s.recv_peer = fold.partner;
    s.dst = Span{Buf::Output, base, count};
  }
  if (count > 0) steps.push_back(s);
  return Buf::Output;
}

// The last step of a folded plan: the result goes back to the rank that sat
// out. (Its Input, sent by reference, was consumed before the result exists.)
void fold_out(const Fold& fold, size_t base, size_t count, std::vector<Step>& steps) {
  if (fold.partner < 0 || count == 0) return;
  Step s;
  s.count = count;
  if (fold.new_rank < 0) {
    s.recv_peer = fold.partner;
    s.dst = Span{Buf::Output, base, count};
  } else {
    s.send_peer = fold.partner;
    s.local = Span{Buf::Output, base, count};
  }
  steps.push_back(s);
}

// The buffer a round of recursive doubling reduces into when the running
// vector is in `cur`: another one, so nothing is overwritten while it is sent.
Buf doubling_round_target(Buf cur, bool in_place) {
  return cur == Buf::Scratch || (cur == Buf::Input && !in_place) ? Buf::Output : Buf::Scratch;
}

}  // namespace

bool recursive_doubling_copies_result(int size, bool in_place) {
  const int group = fold_group(size);
  auto ends_in_scratch = [&](Buf cur) {
    for (int mask = 1; mask < group; mask *= 2) cur = doubling_round_target(cur, in_place);
    return cur == Buf::Scratch;
  };
  // Ranks outside the fold start from Input; those that took a partner's
  // input in start from Output (fold_in).
  return ends_in_scratch(Buf::Input) || (size > group && ends_in_scratch(Buf::Output));
}

Plan recursive_doubling_allreduce(const PlanContext& ctx, size_t count, bool in_place,
                                  bool finalize) {
  if (ctx.size == 1) return local_copy(count, in_place, finalize);
  Plan plan;
  plan.algorithm = "rd";
  if (count == 0) return plan;
  const Fold fold(ctx);
  Buf cur = fold_in(fold, 0, count, plan.steps);
  if (fold.new_rank >= 0) {
    plan.scratch_count = count;
    for (int mask = 1; mask < fold.group; mask *= 2) {
      const Buf next = doubling_round_target(cur, in_place);
      Step s =
          swap_with(fold.rank_of(fold.new_rank ^ mask), Span{cur, 0, count}, Span{next, 0, count});
      s.operand = Span{cur, 0, count};
      s.finalize = finalize && mask * 2 == fold.group;
      // An earlier round may have sent `next` by reference.
      s.wait_sends = mask > 1;
      plan.steps.push_back(s);
      cur = next;
    }
    if (cur == Buf::Scratch) {
      add_copy(plan.steps, Span{Buf::Scratch, 0, count}, Span{Buf::Output, 0, count});
      plan.steps.back().wait_sends = true;
    }
  }
  fold_out(fold, 0, count, plan.steps);
  return plan;
}

namespace {

// Rabenseifner over elements [base, base + count).
void rabenseifner_round(const Fold& fold, size_t base, size_t count, bool finalize,
                        std::vector<Step>& steps) {
  const Buf start = fold_in(fold, base, count, steps);
  if (fold.new_rank >= 0) {
    const size_t parts = fold.group;
    auto blocks = [&](Buf buf, size_t lo, size_t hi) {
      const size_t at = part_offset(count, parts, lo);
      return Span{buf, base + at, part_offset(count, parts, hi) - at};
    };
    // Reduce-scatter by recursive halving: keep the half of the current
    // block range that holds our position, send the other half.
    size_t lo = 0, hi = parts;
    Buf cur = start;
    for (int mask = fold.group / 2; mask >= 1; mask /= 2) {
      const size_t mid = (lo + hi) / 2;
      const bool upper = (fold.new_rank & mask) != 0;
      const size_t keep_lo = upper ? mid : lo, keep_hi = upper ? hi : mid;
      const size_t give_lo = upper ? lo : mid, give_hi = upper ? mid : hi;
      Step s = swap_with(fold.rank_of(fold.new_rank ^ mask), blocks(cur, give_lo, give_hi),
                         blocks(Buf::Output, keep_lo, keep_hi));
      s.operand = blocks(cur, keep_lo, keep_hi);
      s.finalize = finalize && mask == 1;
      steps.push_back(s);
      lo = keep_lo;
      hi = keep_hi;
      cur = Buf::Output;
    }
    // Allgather by recursive doubling: exchange what we hold for the
    // partner's equal-sized range. (A range received here is one we sent the
    // same partner while halving, so the partner has consumed that send.)
    for (int mask = 1; mask < fold.group; mask *= 2) {
      const int partner = fold.new_rank ^ mask;
      const size_t theirs = static_cast<size_t>(partner) / mask * mask;
      Step s = swap_with(fold.rank_of(partner), blocks(Buf::Output, lo, hi),
                         blocks(Buf::Output, theirs, theirs + mask));
      steps.push_back(s);
      lo = std::min(lo, theirs);
      hi = lo + 2 * static_cast<size_t>(mask);
    }
  }
  fold_out(fold, base, count, steps);
}

}  // namespace

Plan rabenseifner_allreduce(const PlanContext& ctx, size_t count, bool in_place, bool finalize) {
  if (ctx.size == 1) return local_copy(count, in_place, finalize);
  Plan plan;
  plan.algorithm = "rhd";
  const Fold fold(ctx);
  // In rounds, as the ring goes: a round's halves are reduced and sent on
  // while they are still in cache, where one pass over a large buffer per
  // halving would read each half back from memory.
  const size_t round_limit = chunk_limit(ctx) * fold.group;
  for (size_t base = 0; base < count; base += round_limit) {
    rabenseifner_round(fold, base, std::min(round_limit, count - base), finalize, plan.steps);
  }
  return plan;
}

}  // namespace weft::algo

namespace weft::algo {

Plan halving_reduce_scatter(const PlanContext& ctx, size_t count, bool finalize) {
  const int n = ctx.size, r = ctx.rank;
  if (n == 1) return ring_reduce_scatter(ctx, count, finalize);
  Plan plan;
  plan.algorithm = "rhd";
  // Halves of the block range [lo, hi) live in Input at first, then in
  // Scratch (which holds the first half kept, n/2 blocks), and the last
  // block lands in Output.
  const size_t first_lo = (r & (n / 2)) != 0 ? n / 2 : 0;
  plan.scratch_count = n / 2 * count;
  auto blocks = [&](Buf buf, size_t lo, size_t hi) {
    if (buf == Buf::Output) return Span{Buf::Output, 0, count};
    const size_t base = buf == Buf::Scratch ? first_lo : 0;
    return Span{buf, (lo - base) * count, (hi - lo) * count};
  };
  size_t lo = 0, hi = n;
  Buf cur = Buf::Input;
  for (int mask = n / 2; mask >= 1; mask /= 2) {
    const size_t mid = (lo + hi) / 2;
    const bool upper = (r & mask) != 0;
    const size_t keep_lo = upper ? mid : lo, keep_hi = upper ? hi : mid;
    const size_t give_lo = upper ? lo : mid, give_hi = upper ? mid : hi;
    const Buf next = mask == 1 ? Buf::Output : Buf::Scratch;
    Step s = swap_with(r ^ mask, blocks(cur, give_lo, give_hi), blocks(next, keep_lo, keep_hi));
    s.operand = blocks(cur, keep_lo, keep_hi);
    s.finalize = finalize && mask == 1;
    plan.steps.push_back(s);
    lo = keep_lo;
    hi = keep_hi;
    cur = next;
  }
  return plan;
}

Plan doubling_allgather(const PlanContext& ctx, size_t count, bool in_place) {
  const int n = ctx.size, r = ctx.rank;
  Plan plan;
  plan.algorithm = "rhd";
  if (!in_place)
    add_copy(plan.steps, Span{Buf::Input, 0, count}, Span{Buf::Output, r * count, count});
  for (int mask = 1; mask < n; mask *= 2) {
    const size_t mine = static_cast<size_t>(r) / mask * mask;
    const size_t theirs = static_cast<size_t>(r ^ mask) / mask * mask;
    plan.steps.push_back(swap_with(r ^ mask, Span{Buf::Output, mine * count, mask * count},
                                   Span{Buf::Output, theirs * count, mask * count}));
  }
  return plan;
}

}  // namespace weft::algo
