// Every Plan generator, one family per file:
//   ring.cc              ring reduce-scatter / allgather / allreduce
//   chain.cc             pipelined chain broadcast and reduce
//   tree.cc              binomial broadcast and reduce, double binary tree allreduce
//   halving_doubling.cc  recursive doubling and Rabenseifner allreduce
//   hierarchical.cc      allreduce inside hosts, then across them
//   oneshot.cc           one-shot allreduce for small messages, barrier
//   direct.cc            pairwise all-to-all, gather, scatter, local copy
//   select.cc            plan_for(): the Plan of a collective in a family
// All take the rank's PlanContext and return that rank's Plan. Counts are in
// elements; "in_place" means Input and Output are the same memory; "finalize"
// means the op is Avg and the last reduction divides.
#pragma once

#include <algorithm>
#include <vector>

#include "core/algo/families.h"
#include "core/algo/plan.h"

namespace weft::algo {

// Output = reduction of every rank's Input (count elements).
Plan ring_allreduce(const PlanContext& ctx, size_t count, bool in_place, bool finalize);
// Input has size*count elements; Output (count) = reduction of block `rank`.
Plan ring_reduce_scatter(const PlanContext& ctx, size_t count, bool finalize);
// Output (size*count) = every rank's Input (count) in rank order. in_place:
// Input already sits at block `rank` of Output.
Plan ring_allgather(const PlanContext& ctx, size_t count, bool in_place);

// A ring over some of the ranks, for algorithms built from ring phases.
struct Ring {
  std::vector<int> members;  // world ranks in ring order
  int pos = 0;               // this rank's position in members
  static Ring world(const PlanContext& ctx);
  int size() const { return static_cast<int>(members.size()); }
  int wrap(int i) const { return ((i % size()) + size()) % size(); }
  int next() const { return members[wrap(pos + 1)]; }
  int prev() const { return members[wrap(pos - 1)]; }
};
// Ring phases over `ring`; block/chunk c belongs to ring position c.
// Allreduce of Output[base, base+count), reading this rank's data from `from`
// (Input or Output) at the same offsets.
void ring_allreduce_steps(const PlanContext& ctx, const Ring& ring, Buf from, size_t base,
                          size_t count, bool finalize, std::vector<Step>& steps);
// Position c ends with the reduction of every member's in_blocks[c] in its
// out_blocks[c].
void ring_reduce_scatter_steps(const PlanContext& ctx, const Ring& ring,
                               const std::vector<Span>& in_blocks,
                               const std::vector<Span>& out_blocks, bool finalize,
                               std::vector<Step>& steps);
// Every member ends with every position's block; block c starts at position c.
void ring_allgather_steps(const PlanContext& ctx, const Ring& ring, const std::vector<Span>& blocks,
                          std::vector<Step>& steps);

// One rank's links in a tree, for algorithms built from tree phases: at most
// one parent (-1 at the root) and the children in the order the rank hears
// from them and passes data on to them.
struct TreeNode {
  int parent = -1;
  std::vector<int> children;
};
// Reduce `in` up the tree: children's data is added to ours, the sum goes to
// the parent; at the root it lands in `out` (divided when `finalize`).
// Inner nodes accumulate in `acc`. Nothing for a rank with no links.
void reduce_up(const TreeNode& node, const Span& in, const Span& acc, const Span& out,
               bool finalize, std::vector<Step>& steps);
// Broadcast `buf` down the tree: received from the parent (unless root),
// passed to every child, the first one as it arrives.
void broadcast_down(const TreeNode& node, const Span& buf, std::vector<Step>& steps);

// Output at every rank = Output at root (count elements; Input is unused).
Plan chain_broadcast(const PlanContext& ctx, size_t count, int root);
Plan binomial_broadcast(const PlanContext& ctx, size_t count, int root);
// Output at root = reduction of every rank's Input; other ranks' Output is
// untouched.
Plan chain_reduce(const PlanContext& ctx, size_t count, int root, bool in_place, bool finalize);
Plan binomial_reduce(const PlanContext& ctx, size_t count, int root, bool in_place, bool finalize);

// Allreduce alternatives to the ring (same contract as ring_allreduce).
// The tree allreduce splits a buffer of at least kDoubleTreeMinBytes over two
// binary trees; a smaller one goes up and down one tree: on one host a tree
// in which every rank has up to kWideTreeFanout children (a parent's
// children send to it at once, so a wide tree saves hops for the price of a
// few parallel messages), across hosts the first binary tree.
// Below kDoubleTreeMinBytes a second tree only doubles the messages: the
// transfer time it saves is less than one message's latency (alpha / beta is
// 40 KB over tcp and 16 KB over shared memory in the default cost model).
constexpr size_t kDoubleTreeMinBytes = 16 << 10;
constexpr int kWideTreeFanout = 4;
// Levels below the root of the wide tree over `size` ranks.
inline int wide_tree_depth(int size) {
  int depth = 0;
  for (long reach = 1, level = 1; reach < size; ++depth) {
    level *= kWideTreeFanout;
    reach += level;
  }
  return depth;
}
// Levels below the root of the double tree's binary trees over `size` ranks.
inline int double_tree_depth(int size) {
  int depth = 0;
  while ((2 << depth) <= size) ++depth;
  return depth;
}
// The trees of the tree allreduce, for the cost model's closed form too: the
// parent of every rank in the balanced in-order binary tree over `size`
// ranks (across hosts below kDoubleTreeMinBytes), and of `rank` in tree `t`
// (0 or 1) of the double binary tree; -1 for a root.
std::vector<int> inorder_tree_parents(int size);
int double_tree_parent(int rank, int size, int t);
Plan double_tree_allreduce(const PlanContext& ctx, size_t count, bool in_place, bool finalize);
Plan recursive_doubling_allreduce(const PlanContext& ctx, size_t count, bool in_place,
                                  bool finalize);
// Whether some rank's recursive doubling ends with its result in Scratch and
// copies it to Output (its rounds alternate between two buffers, and which
// one the last fills depends on the rounds, in place or not, and the fold),
// for `size` ranks with a CPU each: like the cost model, it does not see the
// fold of ranks that take turns on a CPU (PlanContext::shared_cpu), whose
// Plans the tuner times when a communicator is created.
bool recursive_doubling_copies_result(int size, bool in_place);
// The same for a rank of the group that took a folded rank's input (it
// starts its rounds from Output), or for one that did not.
bool recursive_doubling_ends_in_scratch(int size, bool in_place, bool folded_in);
// The world rank at each position of the power-of-two group that runs the
// rounds of Rabenseifner's allreduce over `size` ranks (the others fold into
// the rank above them), for the cost model to see which rounds cross hosts.
std::vector<int> halving_doubling_group(int size);
Plan rabenseifner_allreduce(const PlanContext& ctx, size_t count, bool in_place, bool finalize);
// Rabenseifner's allreduce among `ranks` (world ranks in order; `me` is one of
// them) of Output[base, base + count), reading this rank's data from `from`
// (Input or Output) at the same offsets. Returns how many of the steps it adds
// come up to the one that first sends this rank's reduced block.
size_t halving_doubling_allreduce_steps(const std::vector<int>& ranks, int me, Buf from,
                                        size_t base, size_t count, bool finalize,
                                        std::vector<Step>& steps);
// Recursive halving reduce-scatter and recursive doubling allgather, for
// power-of-two worlds (same contracts as the ring forms).
Plan halving_reduce_scatter(const PlanContext& ctx, size_t count, bool finalize);
Plan doubling_allgather(const PlanContext& ctx, size_t count, bool in_place);
// Reduce-scatter among the ranks of each host, allreduce of each shard among
// the ranks holding it on every host, allgather inside each host. Needs the
// same number of ranks on every host (throws InvalidArgument otherwise).
// Between two hosts, shards up to 256 KiB cross in one exchange (latency-bound
// there) rather than a ring's two steps; the cost model prices the same.
inline bool hier_shard_crosses_in_one_exchange(int hosts, double shard_bytes) {
  return hosts == 2 && shard_bytes <= 256 << 10;
}
// From 4 hosts, a power of two of them, the shards are allreduced across the
// hosts by recursive halving and doubling: the ring's bytes in 2 log2(hosts)
// steps instead of 2 (hosts - 1). (Other counts would fold some hosts into
// others, sending them a whole shard more; they keep the ring.)
inline bool hier_across_halves(int hosts) { return hosts >= 4 && (hosts & (hosts - 1)) == 0; }
Plan hierarchical_allreduce(const PlanContext& ctx, size_t count, bool in_place, bool finalize);
// hier goes through `count` elements in pieces of one round of the shards'
// rings (hosts x local steps of `step` elements), overlapping the host phases
// of neighbouring pieces with the link phase of the current one; 1 when the
// buffer is a single round, or pieces would leave some rank's part empty.
inline size_t hier_pieces(size_t hosts, size_t local, size_t step, size_t count) {
  if (hosts < 2 || local < 2) return 1;
  const size_t piece = local * hosts * std::max<size_t>(1, step);
  const size_t pieces = (count + piece - 1) / piece;
  return pieces >= 2 && count / pieces >= local * hosts ? pieces : 1;
}

// Every rank sends its whole Input to every peer and reduces locally in rank
// order, so every rank computes bit-identical results. Stages in Scratch
// where oneshot_stages says so.
Plan oneshot_allreduce(const PlanContext& ctx, size_t count, bool in_place, bool finalize);
// Whether oneshot stages the contributions in Scratch (its own copied in, a
// reduction of its own afterwards). Two ranks reduce straight from the peer's
// message: out of place in one exchange, in place once copies of their own
// `bytes` have been sent, which needs them to fit under a step (`step_bytes`,
// a power of two: so a trial range of sizes runs one form).
inline bool oneshot_stages(int size, bool in_place, size_t bytes, size_t step_bytes) {
  return size > 2 || (in_place && bytes >= step_bytes);
}
// Zero-byte messages in ceil(log2 size) rounds (a dissemination barrier).
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

// The Plan of collective `c` in family `a`; a family `c` has no form in
// (Auto included) gives its default: ring, or chain for broadcast and reduce.
// `root` matters to broadcast and reduce; barrier ignores the rest.
Plan plan_for(Collective c, Algorithm a, const PlanContext& ctx, size_t count, int root,
              bool in_place, bool finalize);

}  // namespace weft::algo
