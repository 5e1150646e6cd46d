// Hierarchical allreduce for ranks spread over hosts. Inside a host, ranks
// share memory; between hosts, links are slower. So: a ring reduce-scatter
// among the ranks of each host leaves local rank i with shard i summed over
// its host; shard i is then allreduced among the local ranks i of all hosts
// (one ring per shard, all running at once, so every rank's inter-host link
// carries 1/L of the data instead of one leader's link carrying all of it);
// a ring allgather inside each host spreads the shards back. Between two
// hosts a small shard crosses in one exchange instead of the ring's two steps.
#include <algorithm>
#include <map>
#include <string>

#include "core/algo/algorithms.h"
#include "core/common/error.h"

namespace weft::algo {
namespace {

// Allreduce of the shard at [offset, offset + count) with the one peer rank
// holding it on the other host: each side sends its whole shard and reduces
// the peer's into Scratch, then copies the result back. The link carries the
// same bytes as the two-member ring, in one step instead of two.
void exchange_allreduce_steps(int peer, Buf from, size_t offset, size_t count, bool finalize,
                              Plan& plan) {
  if (count == 0) return;
  Step s = exchange_step(peer, Span{from, offset, count}, peer, Span{Buf::Scratch, 0, count});
  s.operand = Span{from, offset, count};
  s.finalize = finalize;
  plan.steps.push_back(s);
  plan.scratch_count = std::max(plan.scratch_count, count);
  add_copy(plan.steps, Span{Buf::Scratch, 0, count}, Span{Buf::Output, offset, count});
  plan.steps.back().wait_sends = true;  // the shard went out by reference
}

}  // namespace

Plan hierarchical_allreduce(const PlanContext& ctx, size_t count, bool in_place, bool finalize) {
  if (ctx.size == 1) return local_copy(count, in_place, finalize);
  // Ranks of each host, hosts in order of their index.
  std::map<int, std::vector<int>> by_host;
  for (int r = 0; r < ctx.size; ++r) by_host[ctx.host.at(r)].push_back(r);
  const size_t local_size = by_host.begin()->second.size();
  Ring local, across;
  int host_pos = 0;
  for (const auto& [host, ranks] : by_host) {
    if (ranks.size() != local_size) {
      throw InvalidArgument(
          "the hierarchical algorithm needs the same number of ranks on every host (found " +
          std::to_string(local_size) + " and " + std::to_string(ranks.size()) +
          "); pick another WEFT_ALGO");
    }
    if (host == ctx.host[ctx.rank]) {
      local.members = ranks;
      across.pos = host_pos;
    }
    ++host_pos;
  }
  for (int i = 0; i < local.size(); ++i) {
    if (local.members[i] == ctx.rank) local.pos = i;
  }
  for (const auto& entry : by_host) across.members.push_back(entry.second[local.pos]);

  Plan plan;
  plan.algorithm = "hier";
  const int shards = local.size();
  std::vector<Span> in_shards, out_shards;
  for (int i = 0; i < shards; ++i) {
    const size_t at = part_offset(count, shards, i), len = part_count(count, shards, i);
    in_shards.push_back(Span{Buf::Input, at, len});
    out_shards.push_back(Span{Buf::Output, at, len});
  }
  const bool one_host = across.size() == 1;
  if (shards > 1) {
    ring_reduce_scatter_steps(ctx, local, in_shards, out_shards, finalize && one_host, plan.steps);
  }
  if (!one_host) {
    const Span& mine = out_shards[local.pos];
    // With one rank per host, our shard is still in Input.
    const Buf from = shards > 1 ? Buf::Output : Buf::Input;
    if (hier_shard_crosses_in_one_exchange(across.size(),
                                           static_cast<double>(mine.count * ctx.elem_size))) {
      exchange_allreduce_steps(across.next(), from, mine.offset, mine.count, finalize, plan);
    } else {
      ring_allreduce_steps(ctx, across, from, mine.offset, mine.count, finalize, plan.steps);
    }
  }
  if (shards > 1) ring_allgather_steps(ctx, local, out_shards, plan.steps);
  return plan;
}

}  // namespace weft::algo
