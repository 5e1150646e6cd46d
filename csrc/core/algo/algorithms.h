// Every Plan generator, one family per file:
//   ring.cc     ring reduce-scatter / allgather / allreduce
//   chain.cc    pipelined chain broadcast and reduce
//   oneshot.cc  one-shot allreduce for small messages, barrier
//   direct.cc   pairwise all-to-all, gather, scatter, local copy
// All take the rank's PlanContext and return that rank's Plan. Counts are in
// elements; "in_place" means Input and Output are the same memory.
#pragma once

#include <vector>

#include "core/algo/plan.h"

namespace weft::algo {

// Output = reduction of every rank's Input (count elements).
Plan ring_allreduce(const PlanContext& ctx, size_t count, bool in_place, bool finalize);
// Input has size*count elements; Output (count) = reduction of block `rank`.
Plan ring_reduce_scatter(const PlanContext& ctx, size_t count, bool finalize);
// Output (size*count) = every rank's Input (count) in rank order. in_place:
// Input already sits at block `rank` of Output.
Plan ring_allgather(const PlanContext& ctx, size_t count, bool in_place);

// Output at every rank = Output at root (count elements; Input is unused).
Plan chain_broadcast(const PlanContext& ctx, size_t count, int root);
// Output at root = reduction of every rank's Input; other ranks' Output is
// untouched.
Plan chain_reduce(const PlanContext& ctx, size_t count, int root, bool in_place, bool finalize);

// Every rank sends its whole Input to every peer and reduces locally in rank
// order, so every rank computes bit-identical results. Uses Scratch.
Plan oneshot_allreduce(const PlanContext& ctx, size_t count, bool in_place, bool finalize);
// Zero-byte messages to and from every peer.
Plan barrier(const PlanContext& ctx);

// Input holds send_counts[p] elements for each peer p in rank order; Output
// receives recv_counts[p] from each p in rank order.
Plan pairwise_alltoall(const PlanContext& ctx, const std::vector<size_t>& send_counts,
                       const std::vector<size_t>& recv_counts);
// Output at root (size*count) = every rank's Input (count) in rank order.
Plan direct_gather(const PlanContext& ctx, size_t count, int root);
// Output (count) at every rank = block `rank` of root's Input (size*count).
Plan direct_scatter(const PlanContext& ctx, size_t count, int root);
// Output = Input (count elements), with the Avg division when finalize.
Plan local_copy(size_t count, bool in_place, bool finalize);

}  // namespace weft::algo
