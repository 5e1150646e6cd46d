// Hierarchical allreduce for ranks spread over hosts. Inside a host, ranks
// share memory; between hosts, links are slower. So: a ring reduce-scatter
// among the ranks of each host leaves local rank i with shard i summed over
// its host; shard i is then allreduced among the local ranks i of all hosts
// (one ring per shard, all running at once, so every rank's inter-host link
// carries 1/L of the data instead of one leader's link carrying all of it);
// a ring allgather inside each host spreads the shards back. Between two
// hosts a small shard crosses in one exchange instead of the ring's two steps;
// across 4, 8, 16... hosts the shards go by recursive halving and doubling,
// whose latency grows with log2(hosts) rather than with the hosts.
//
// A large buffer goes through in pieces, one round of the shards' rings each,
// and the host phases of the neighbouring pieces run inside the link phase of
// the current one: the reduce-scatter of piece p+1 once piece p's first send
// has left, the allgather of piece p-1 once piece p's reduced shard has. The
// link, the slow part, then never waits for shared memory.
#include <algorithm>
#include <memory>
#include <string>

#include "core/algo/algorithms.h"
#include "core/common/error.h"

namespace weft::algo {
namespace {

// Allreduce of the shard at [offset, offset + count) with the one peer rank
// holding it on the other host: each side sends its whole shard and reduces
// the peer's into Scratch, then copies the result back. The link carries the
// same bytes as the two-member ring, in one step instead of two. Returns the
// Scratch elements it uses.
size_t exchange_allreduce_steps(int peer, Buf from, size_t offset, size_t count, bool finalize,
                                std::vector<Step>& steps) {
  if (count == 0) return 0;
  Step s = exchange_step(peer, Span{from, offset, count}, peer, Span{Buf::Scratch, 0, count});
  s.operand = Span{from, offset, count};
  s.finalize = finalize;
  steps.push_back(s);
  add_copy(steps, Span{Buf::Scratch, 0, count}, Span{Buf::Output, offset, count});
  steps.back().wait_sends = true;  // the shard went out by reference
  return count;
}

// Where a rank sits among the hosts: the ring of its host's ranks, and the
// ring of the ranks holding its shard on every host.
struct Layout {
  Ring local, across;
};

Layout layout_of(const PlanContext& ctx) {
  const std::shared_ptr<const HostGroups> groups =
      ctx.groups ? ctx.groups : std::make_shared<const HostGroups>(host_groups(ctx.host));
  const std::vector<std::vector<int>>& hosts = groups->ranks;
  const size_t local_size = hosts.front().size();
  if (!groups->same_size) {
    const auto other = std::find_if(hosts.begin(), hosts.end(), [&](const std::vector<int>& r) {
      return r.size() != local_size;
    });
    throw InvalidArgument(
        "the hierarchical algorithm needs the same number of ranks on every host (found " +
        std::to_string(local_size) + " and " + std::to_string(other->size()) +
        "); pick another WEFT_ALGO");
  }
  Layout at;
  at.local = Ring{hosts[groups->host_pos[ctx.rank]], groups->local_pos[ctx.rank]};
  at.across.pos = groups->host_pos[ctx.rank];
  at.across.members.reserve(hosts.size());
  for (const std::vector<int>& ranks : hosts) at.across.members.push_back(ranks[at.local.pos]);
  return at;
}

// The steps of one piece of the buffer, [offset, offset + count), by phase.
struct PieceSteps {
  std::vector<Step> host_reduce_scatter, across, host_allgather;
  // How many of `across` come up to the one that first sends this rank's
  // reduced shard (that one included).
  size_t reduced_sent = 0;
};

PieceSteps piece_steps(const PlanContext& ctx, const Layout& at, size_t offset, size_t count,
                       bool finalize, Plan& plan) {
  PieceSteps out;
  const int shards = at.local.size();
  std::vector<Span> in_shards, out_shards;
  for (int i = 0; i < shards; ++i) {
    const size_t from = offset + part_offset(count, shards, i), len = part_count(count, shards, i);
    in_shards.push_back(Span{Buf::Input, from, len});
    out_shards.push_back(Span{Buf::Output, from, len});
  }
  const bool one_host = at.across.size() == 1;
  if (shards > 1) {
    ring_reduce_scatter_steps(ctx, at.local, in_shards, out_shards, finalize && one_host,
                              out.host_reduce_scatter);
  }
  if (!one_host) {
    const Span& mine = out_shards[at.local.pos];
    // With one rank per host, our shard is still in Input.
    const Buf from = shards > 1 ? Buf::Output : Buf::Input;
    if (hier_shard_crosses_in_one_exchange(at.across.size(),
                                           static_cast<double>(mine.count * ctx.elem_size))) {
      const size_t scratch = exchange_allreduce_steps(at.across.next(), from, mine.offset,
                                                      mine.count, finalize, out.across);
      plan.scratch_count = std::max(plan.scratch_count, scratch);
      out.reduced_sent = out.across.size();
    } else if (hier_across_halves(at.across.size())) {
      out.reduced_sent = halving_doubling_allreduce_steps(
          at.across.members, ctx.rank, from, mine.offset, mine.count, finalize, out.across);
    } else {
      ring_allreduce_steps(ctx, at.across, from, mine.offset, mine.count, finalize, out.across);
      // The ring's reduce-scatter half takes one step per member but the
      // last, and the allgather's first step sends the reduced part.
      out.reduced_sent = std::min<size_t>(at.across.size(), out.across.size());
    }
  }
  if (shards > 1) ring_allgather_steps(ctx, at.local, out_shards, out.host_allgather);
  return out;
}

void append(std::vector<Step>& to, const std::vector<Step>& steps) {
  to.insert(to.end(), steps.begin(), steps.end());
}

// How many pieces the buffer goes through in (hier_pieces), or 1 for sends
// that wait for their receives, where a piece's first send could not wait
// past the next piece's host phase for the receive it pairs with.
size_t pieces_of(const PlanContext& ctx, const Layout& at, size_t count) {
  if (!ctx.buffered_sends) return 1;
  return hier_pieces(at.across.size(), at.local.size(), chunk_limit(ctx), count);
}

}  // namespace

Plan hierarchical_allreduce(const PlanContext& ctx, size_t count, bool in_place, bool finalize) {
  if (ctx.size == 1) return local_copy(count, in_place, finalize);
  const Layout at = layout_of(ctx);
  Plan plan;
  plan.algorithm = "hier";
  const size_t pieces = pieces_of(ctx, at, count);
  std::vector<PieceSteps> steps;
  for (size_t p = 0; p < pieces; ++p) {
    steps.push_back(piece_steps(ctx, at, part_offset(count, pieces, p),
                                part_count(count, pieces, p), finalize, plan));
  }
  append(plan.steps, steps[0].host_reduce_scatter);
  for (size_t p = 0; p < pieces; ++p) {
    // The first step of `across` sends; the previous piece's allgather goes
    // once this piece's reduced part has been sent.
    const std::vector<Step>& across = steps[p].across;
    for (size_t i = 0; i < across.size(); ++i) {
      plan.steps.push_back(across[i]);
      if (i == 0 && p + 1 < pieces) append(plan.steps, steps[p + 1].host_reduce_scatter);
      if (i + 1 == steps[p].reduced_sent && p > 0) append(plan.steps, steps[p - 1].host_allgather);
    }
  }
  append(plan.steps, steps[pieces - 1].host_allgather);
  return plan;
}

}  // namespace weft::algo
