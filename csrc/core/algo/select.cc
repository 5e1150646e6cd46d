// The Plan of a collective in a chosen family (the switch the Communicator
// and the nccl transport's Plan executor share).
#include "core/algo/algorithms.h"
#include "core/common/error.h"

namespace weft::algo {

Plan plan_for(Collective c, Algorithm a, const PlanContext& ctx, size_t count, int root,
              bool in_place, bool finalize) {
  switch (c) {
    case Collective::Allreduce:
      switch (a) {
        case Algorithm::Oneshot: return oneshot_allreduce(ctx, count, in_place, finalize);
        case Algorithm::Tree: return double_tree_allreduce(ctx, count, in_place, finalize);
        case Algorithm::Rd: return recursive_doubling_allreduce(ctx, count, in_place, finalize);
        case Algorithm::Rhd: return rabenseifner_allreduce(ctx, count, in_place, finalize);
        case Algorithm::Hier: return hierarchical_allreduce(ctx, count, in_place, finalize);
        default: return ring_allreduce(ctx, count, in_place, finalize);
      }
    case Collective::ReduceScatter:
      if (a == Algorithm::Rhd) return halving_reduce_scatter(ctx, count, finalize);
      return ring_reduce_scatter(ctx, count, finalize);
    case Collective::Allgather:
      if (a == Algorithm::Rhd) return doubling_allgather(ctx, count, in_place);
      return ring_allgather(ctx, count, in_place);
    case Collective::Broadcast:
      if (a == Algorithm::Tree) return binomial_broadcast(ctx, count, root);
      return chain_broadcast(ctx, count, root);
    case Collective::Reduce:
      if (a == Algorithm::Tree) return binomial_reduce(ctx, count, root, in_place, finalize);
      return chain_reduce(ctx, count, root, in_place, finalize);
    case Collective::Barrier: return barrier(ctx);
  }
  throw Error("unknown collective");
}

}  // namespace weft::algo
