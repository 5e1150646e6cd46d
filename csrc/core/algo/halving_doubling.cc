// Recursive doubling and recursive halving/doubling (Rabenseifner) allreduce,
// as MPICH runs them. Both work on a power-of-two group; other numbers of
// ranks fold first: of the first 2*rem ranks (rem = ranks - largest power of
// two), each even rank hands its whole input to the odd rank above it, sits
// out, and gets the result back at the end. The ranks are the world's, or
// for recursive doubling on crowded CPUs the first rank of each CPU (below).
//
// Recursive doubling exchanges the whole vector with partners at distance
// 1, 2, 4, ...: log2(p) rounds, best for small messages. Rabenseifner halves
// the vector at every round of a reduce-scatter, then doubles it back in an
// allgather: the ring's bandwidth in 2*log2(p) rounds instead of 2*(p-1).
//
// Where ranks take turns on CPUs (PlanContext::shared_cpu), recursive doubling
// first folds the ranks of each CPU into the first of them, and only those
// run the rounds: ranks on one CPU cannot exchange at the same time anyway,
// and a round of them all costs each CPU one turn per rank. With 8 tcp ranks
// on 2 CPUs, 8 B took 84 us so against 140-146 with all 8 in the rounds and
// 105-113 for the wide tree; with 4 ranks (two per CPU) the rounds were as
// fast as the fold over tcp and faster over shared memory, so two ranks per
// CPU do not count as taking turns.
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

// The power-of-two group that runs the rounds and how every other rank folds
// into it: it sits out under a parent, which reduces its input before the
// rounds and hands it the result after them (a small tree: `node`).
struct Fold {
  int group = 1;             // ranks in the rounds: a power of two
  std::vector<int> members;  // the world rank at each group position
  int new_rank = -1;         // position in the group; -1 for a rank that sits out
  TreeNode node;             // parent: where this rank sits out; children: who sits out here

  // `ranks` (world ranks, in order) as world rank `me`, one of them, sees
  // them: of the first 2 * rem, each even one sits out under the one above.
  Fold(const std::vector<int>& ranks, int me) {
    const int count = static_cast<int>(ranks.size());
    group = fold_group(count);
    const int rem = count - group;
    for (int i = 0; i < count; ++i) {
      const bool folds = i < 2 * rem;
      if (folds && i % 2 == 0) {
        if (ranks[i] == me) node.parent = ranks[i + 1];
        continue;
      }
      if (folds && ranks[i] == me) node.children.push_back(ranks[i - 1]);
      if (ranks[i] == me) new_rank = static_cast<int>(members.size());
      members.push_back(ranks[i]);
    }
  }

  // The world's ranks; with `by_cpu`, the first rank of each CPU only, the
  // others sitting out under it.
  static Fold of_world(const PlanContext& ctx, bool by_cpu) {
    std::vector<int> leaders;    // the first rank of each CPU, or every rank
    std::vector<int> cpu_mates;  // the ranks sitting out under this one
    int leader = ctx.rank;
    for (int r = 0; r < ctx.size; ++r) {
      const int cpu = by_cpu && !ctx.shared_cpu.empty() ? ctx.shared_cpu[r] : -1;
      const auto first = cpu < 0 ? leaders.end()
                                 : std::find_if(
                                       leaders.begin(), leaders.end(),
                                       [&](int l) { return ctx.shared_cpu[l] == cpu; });
      if (first == leaders.end()) {
        leaders.push_back(r);
      } else if (r == ctx.rank) {
        leader = *first;
      } else if (*first == ctx.rank) {
        cpu_mates.push_back(r);
      }
    }
    if (leader != ctx.rank) {
      Fold out({}, ctx.rank);
      out.group = fold_group(static_cast<int>(leaders.size()));
      out.node.parent = leader;
      return out;
    }
    Fold out(leaders, ctx.rank);
    // The leader hears from the ranks sitting out under it in rank order.
    out.node.children.insert(out.node.children.end(), cpu_mates.begin(), cpu_mates.end());
    std::sort(out.node.children.begin(), out.node.children.end());
    return out;
  }

  // The world rank at group position `pos`.
  int rank_of(int pos) const { return members[pos]; }
};

// Both directions with one partner at once.
Step swap_with(int peer, Span send, Span receive) {
  return exchange_step(peer, send, peer, receive);
}

// The first steps of a folded plan over elements [base, base + count) of
// `from` (Input, or Output holding this rank's data): the data of the ranks
// sitting out is reduced into their parents' Output (finished there, divided
// when `finalize`, if the group is that one rank). Returns the buffer that
// holds this rank's running vector afterwards.
Buf fold_in(const Fold& fold, Buf from, size_t base, size_t count, bool finalize,
            std::vector<Step>& steps) {
  const Span output{Buf::Output, base, count};
  reduce_up(fold.node, Span{from, base, count}, output, output, finalize && fold.group == 1, steps);
  return fold.node.children.empty() ? from : Buf::Output;
}

// The last steps of a folded plan: the result goes back to the ranks that
// sat out. (What they sent, perhaps their Input by reference, was consumed
// before the result exists.)
void fold_out(const Fold& fold, size_t base, size_t count, std::vector<Step>& steps) {
  broadcast_down(fold.node, Span{Buf::Output, base, count}, steps);
}

// The buffer a round of recursive doubling reduces into when the running
// vector is in `cur`: another one, so nothing is overwritten while it is sent.
Buf doubling_round_target(Buf cur, bool in_place) {
  return cur == Buf::Scratch || (cur == Buf::Input && !in_place) ? Buf::Output : Buf::Scratch;
}

}  // namespace

bool recursive_doubling_ends_in_scratch(int size, bool in_place, bool folded_in) {
  const int group = fold_group(size);
  // Ranks outside the fold start from Input; those that took a partner's
  // input in start from Output (fold_in).
  Buf cur = folded_in ? Buf::Output : Buf::Input;
  for (int mask = 1; mask < group; mask *= 2) cur = doubling_round_target(cur, in_place);
  return cur == Buf::Scratch;
}

bool recursive_doubling_copies_result(int size, bool in_place) {
  return recursive_doubling_ends_in_scratch(size, in_place, false) ||
         (size > fold_group(size) && recursive_doubling_ends_in_scratch(size, in_place, true));
}

Plan recursive_doubling_allreduce(const PlanContext& ctx, size_t count, bool in_place,
                                  bool finalize) {
  if (ctx.size == 1) return local_copy(count, in_place, finalize);
  Plan plan;
  plan.algorithm = "rd";
  if (count == 0) return plan;
  const Fold fold = Fold::of_world(ctx, /*by_cpu=*/true);
  Buf cur = fold_in(fold, Buf::Input, 0, count, finalize, plan.steps);
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

// Rabenseifner over elements [base, base + count) of `from` (see fold_in).
// Returns how many of the steps it adds come before this rank's reduced block
// first leaves (the one that sends it included); for a rank that sits out,
// those up to its send to the rank it sits out under.
size_t rabenseifner_round(const Fold& fold, Buf from, size_t base, size_t count, bool finalize,
                          std::vector<Step>& steps) {
  const size_t first = steps.size();
  const Buf start = fold_in(fold, from, base, count, finalize, steps);
  size_t reduced_sent = steps.size() - first;
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
    reduced_sent = steps.size() - first + (fold.group > 1 ? 1 : 0);
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
  return reduced_sent;
}

}  // namespace

std::vector<int> halving_doubling_group(int size) {
  std::vector<int> ranks(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) ranks[r] = r;
  return Fold(ranks, /*me=*/-1).members;
}

size_t halving_doubling_allreduce_steps(const std::vector<int>& ranks, int me, Buf from,
                                        size_t base, size_t count, bool finalize,
                                        std::vector<Step>& steps) {
  if (count == 0) return 0;
  return rabenseifner_round(Fold(ranks, me), from, base, count, finalize, steps);
}

Plan rabenseifner_allreduce(const PlanContext& ctx, size_t count, bool in_place, bool finalize) {
  if (ctx.size == 1) return local_copy(count, in_place, finalize);
  Plan plan;
  plan.algorithm = "rhd";
  const Fold fold = Fold::of_world(ctx, /*by_cpu=*/false);
  // In rounds, as the ring goes: a round's halves are reduced and sent on
  // while they are still in cache, where one pass over a large buffer per
  // halving would read each half back from memory.
  const size_t round_limit = chunk_limit(ctx) * fold.group;
  for (size_t base = 0; base < count; base += round_limit) {
    rabenseifner_round(fold, Buf::Input, base, std::min(round_limit, count - base), finalize,
                       plan.steps);
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
