// Trees. Binomial trees broadcast and reduce in log2(size) hops, the answer
// for small messages where a chain pays one hop per rank. The double binary
// tree allreduce (as NCCL runs it) sends each half of the buffer up and down
// its own binary tree, built so that every rank is an inner node of at most
// one of them: every rank then sends and receives about 2n of a buffer of n.
// A buffer under kDoubleTreeMinBytes takes one tree instead: a wide one on
// one host (algorithms.h), a balanced in-order tree across hosts. Large
// buffers go in rounds whose chunks fit in half a connection's buffering, as
// in the ring, and the reductions of later rounds go up while earlier ones
// come down (tree_lanes below).
#include <algorithm>
#include <optional>

#include "core/algo/algorithms.h"

namespace weft::algo {
namespace {

// Binomial tree rooted at `root`. Children are listed from the smallest
// subtree to the largest.
TreeNode binomial_node(int rank, int size, int root) {
  const int v = positive_mod(rank - root, size);
  TreeNode node;
  int low = 1;  // lowest set bit of v; above every child distance for the root
  while (low < size && (v & low) == 0) low *= 2;
  if (v != 0) node.parent = positive_mod(v - low + root, size);
  for (int k = 1; k < low && v + k < size; k *= 2)
    node.children.push_back(positive_mod(v + k + root, size));
  return node;
}

// Balanced in-order binary tree over positions [lo, hi): the middle position
// is the root of the range, under `up`.
void inorder_tree(int lo, int hi, int up, std::vector<int>& parents) {
  if (lo >= hi) return;
  const int mid = lo + (hi - lo) / 2;
  parents[mid] = up;
  inorder_tree(lo, mid, mid, parents);
  inorder_tree(mid + 1, hi, mid, parents);
}

// This rank's node in the balanced in-order binary tree over ranks 0 .. size-1
// (the middle rank is the root of a range). Its subtrees are ranges of
// ranks, so across hosts of consecutive ranks it crosses few host links.
TreeNode inorder_tree_node(int rank, int size) {
  const std::vector<int> parents = inorder_tree_parents(size);
  TreeNode node;
  node.parent = parents[rank];
  for (int r = 0; r < size; ++r) {
    if (parents[r] == rank) node.children.push_back(r);  // the left subtree's first
  }
  return node;
}

// The parent of position x (1 ... size) of a binary tree by the rule of
// NCCL's double tree: with b the lowest set bit of x, it is x + b or x - b,
// whichever has 2b as its lowest set bit (x - b where x + b is past the end);
// 0 for the root, the largest power of two. Odd positions are the leaves.
int bit_tree_parent(int x, int size) {
  const int bit = x & -x;
  const int up = (x ^ bit) | (bit << 1);
  return up <= size ? up : x ^ bit;
}

// Position x's children: x - b/2, and the first of x + b/2, x + b/4, ...
// that exists, where b is the lowest set bit of x.
std::vector<int> bit_tree_children(int x, int size) {
  std::vector<int> children;
  const int bit = x & -x;
  if (bit == 1) return children;
  children.push_back(x - bit / 2);
  for (int step = bit / 2; step >= 1; step /= 2) {
    if (x + step <= size) {
      children.push_back(x + step);
      break;
    }
  }
  return children;
}

// Tree 0 puts rank r at position r + 1, tree 1 at position r (rank 0 at
// position size).
int double_tree_position(int rank, int size, int t) {
  return t == 0 ? rank + 1 : (rank == 0 ? size : rank);
}
int double_tree_rank_at(int x, int size, int t) { return t == 0 ? x - 1 : x % size; }

// This rank's node in tree `t` (0 or 1) of the double binary tree: the odd
// ranks are tree 0's inner nodes and the even ones tree 1's, so every rank is
// a leaf of one tree and sends and receives about 2n of a buffer of n, as the
// cost model prices it.
TreeNode double_tree_node(int rank, int size, int t) {
  TreeNode node;
  node.parent = double_tree_parent(rank, size, t);
  for (int c : bit_tree_children(double_tree_position(rank, size, t), size)) {
    node.children.push_back(double_tree_rank_at(c, size, t));
  }
  return node;
}

// This rank's node in the wide tree: rank p's children are ranks
// p * kWideTreeFanout + 1 ... p * kWideTreeFanout + kWideTreeFanout, so the
// root is rank 0 and every level is full but the last. Against one binary
// tree, 8 tcp ranks on 2 CPUs take 63-71 us from 8 B to 4 KiB instead of
// 82-91: half the hops, and the children of a parent send side by side.
// Only where all ranks share a host: it ignores hosts, and 2 hosts x 2 ranks
// on a 1 Gbit/s link took 27-66 us from 16 B to 4 KiB with the root's
// children on the far host crossing the link side by side, against 23-31 for
// the in-order binary tree, which crosses it once.
TreeNode wide_tree_node(int rank, int size) {
  TreeNode node;
  if (rank > 0) node.parent = (rank - 1) / kWideTreeFanout;
  const int first = rank * kWideTreeFanout + 1;
  for (int c = first; c < first + kWideTreeFanout && c < size; ++c) node.children.push_back(c);
  return node;
}

// Which channel runs each tree's reduction and broadcast, and how many rounds
// the broadcasts are listed behind the reductions.
struct TreeLanes {
  std::vector<uint8_t> tags;  // Plan::channel_tags: empty for one channel
  int reduce[2] = {0, 0};
  int broadcast[2] = {0, 0};
  size_t lag = 0;
};

// With buffered sends the double tree runs on two channels, each pairing one
// tree's reduction with the other tree's broadcast: a rank is an inner node
// of one tree and a leaf of the other, and its leaf's one send up (or
// receive down) no longer waits behind the inner node's steps of the same
// phase. Both channels use tag 0: no rank has the same parent or a common
// child in both trees, so they never use a connection in the same direction.
// On each channel the broadcasts of round k come with the reductions of
// round k + depth (the trees' levels below the root), so a tree keeps about
// depth rounds in flight: enough to keep the links busy while a round goes
// up and comes down, and few enough that a leaf, whose sockets take
// megabytes, does not send its whole buffer at once to queue on the links
// ahead of the rounds the trees wait for. On 8 hosts of one rank with
// 1 Gbit/s links: 0.78-0.87x the ring's busbw from 4 MiB, against
// 0.72-0.77x with each tree's reduction and broadcast on a channel of its
// own (two tags) and nothing holding the leaves back. Four such channels
// with the same window were no faster, and a rank waiting on more than two
// connections naps instead of sleeping on their sockets: with 8 ranks on 2
// cores over local tcp a 64 KiB call took 1.00-1.09 ms against 0.77-0.80.
// One tree (small buffers) keeps its reduction and broadcast on tags of
// their own where the world has two.
TreeLanes tree_lanes(const PlanContext& ctx, int split) {
  TreeLanes lanes;
  if (!ctx.buffered_sends) return lanes;
  if (split == 1) {
    if (ctx.channels >= 2) {
      lanes.tags = {0, 1};
      lanes.broadcast[0] = 1;
    }
    return lanes;
  }
  lanes.tags = {0, 0};
  lanes.reduce[1] = 1;
  lanes.broadcast[0] = 1;
  lanes.lag = double_tree_depth(ctx.size);
  return lanes;
}

}  // namespace

std::vector<int> inorder_tree_parents(int size) {
  std::vector<int> parents(static_cast<size_t>(size), -1);
  inorder_tree(0, size, -1, parents);
  return parents;
}

int double_tree_parent(int rank, int size, int t) {
  const int up = bit_tree_parent(double_tree_position(rank, size, t), size);
  return up > 0 ? double_tree_rank_at(up, size, t) : -1;
}

void reduce_up(const TreeNode& node, const Span& in, const Span& acc, const Span& out,
               bool finalize, std::vector<Step>& steps) {
  if (in.count == 0 || (node.parent < 0 && node.children.empty())) return;
  if (node.children.empty()) {
    Step s = fused_step(in.count);
    s.local = in;
    s.send_peer = node.parent;
    steps.push_back(s);
    return;
  }
  for (size_t i = 0; i < node.children.size(); ++i) {
    const bool last = i + 1 == node.children.size();
    Step s = fused_step(in.count);
    s.recv_peer = node.children[i];
    s.local = i == 0 ? in : acc;
    if (!last) {
      s.dst = acc;
    } else if (node.parent >= 0) {
      s.send_peer = node.parent;
    } else {
      s.dst = out;
      s.finalize = finalize;
    }
    steps.push_back(s);
  }
}

void broadcast_down(const TreeNode& node, const Span& buf, std::vector<Step>& steps) {
  if (buf.count == 0) return;
  size_t first_plain = 0;
  if (node.parent >= 0) {
    Step s = fused_step(buf.count);
    s.recv_peer = node.parent;
    s.dst = buf;
    if (!node.children.empty()) {
      s.send_peer = node.children[0];
      first_plain = 1;
    }
    steps.push_back(s);
  }
  for (size_t i = first_plain; i < node.children.size(); ++i) {
    Step s = fused_step(buf.count);
    s.local = buf;
    s.send_peer = node.children[i];
    steps.push_back(s);
  }
}

Plan binomial_broadcast(const PlanContext& ctx, size_t count, int root) {
  Plan plan;
  plan.algorithm = "tree";
  if (ctx.size == 1 || count == 0) return plan;
  TreeNode node = binomial_node(ctx.rank, ctx.size, root);
  // The largest subtree first: it has the longest way to go.
  std::reverse(node.children.begin(), node.children.end());
  broadcast_down(node, Span{Buf::Output, 0, count}, plan.steps);
  return plan;
}

Plan binomial_reduce(const PlanContext& ctx, size_t count, int root, bool in_place, bool finalize) {
  if (ctx.size == 1) {
    Plan plan = local_copy(count, in_place, finalize);
    plan.algorithm = "tree";
    return plan;
  }
  Plan plan;
  plan.algorithm = "tree";
  const TreeNode node = binomial_node(ctx.rank, ctx.size, root);
  // Only the root's Output may change: the others accumulate in Scratch.
  const bool is_root = node.parent < 0;
  const Span acc{is_root ? Buf::Output : Buf::Scratch, 0, count};
  if (!is_root) plan.scratch_count = count;
  reduce_up(node, Span{Buf::Input, 0, count}, acc, Span{Buf::Output, 0, count}, finalize,
            plan.steps);
  return plan;
}

Plan double_tree_allreduce(const PlanContext& ctx, size_t count, bool in_place, bool finalize) {
  if (ctx.size == 1) return local_copy(count, in_place, finalize);
  Plan plan;
  plan.algorithm = "tree";
  const size_t limit = chunk_limit(ctx);
  const int split = count * ctx.elem_size < kDoubleTreeMinBytes ? 1 : 2;
  const bool one_host =
      std::all_of(ctx.host.begin(), ctx.host.end(), [&](int h) { return h == ctx.host.front(); });
  const TreeNode trees[2] = {split == 2 ? double_tree_node(ctx.rank, ctx.size, 0)
                             : one_host ? wide_tree_node(ctx.rank, ctx.size)
                                        : inorder_tree_node(ctx.rank, ctx.size),
                             double_tree_node(ctx.rank, ctx.size, 1)};
  const TreeLanes lanes = tree_lanes(ctx, split);
  plan.channel_tags = lanes.tags;
  const bool on_channels = !plan.channel_tags.empty();
  const size_t per_round = split * limit;
  const size_t rounds = (count + per_round - 1) / per_round;
  // Tree t's part of round k.
  const auto share = [&](int t, size_t k) {
    const size_t base = k * per_round, round = std::min(per_round, count - base);
    return t < split
               ? Span{Buf::Output, base + part_offset(round, split, t), part_count(round, split, t)}
               : Span{Buf::Output, base, 0};
  };
  // Puts the steps from `first` on `channel`.
  const auto on_channel = [&](size_t first, int channel) {
    for (size_t i = first; i < plan.steps.size(); ++i) plan.steps[i].channel = channel;
  };
  // Per tree and round, the index of its last reduction step (at its root,
  // the result); none where it has no steps.
  std::vector<std::optional<uint32_t>> reduced[2];
  const auto add_reductions = [&](size_t k) {
    for (int t = 0; t < 2; ++t) {
      const size_t first = plan.steps.size();
      const Span out = share(t, k);
      reduce_up(trees[t], Span{Buf::Input, out.offset, out.count}, out, out, finalize, plan.steps);
      on_channel(first, lanes.reduce[t]);
      reduced[t].push_back(first < plan.steps.size()
                               ? std::optional(static_cast<uint32_t>(plan.steps.size() - 1))
                               : std::nullopt);
    }
  };
  // In place, the broadcast overwrites Input that went up by reference;
  // the result that overwrites it exists only once that was consumed.
  const auto add_broadcasts = [&](size_t k) {
    for (int t = 0; t < 2; ++t) {
      const size_t first = plan.steps.size();
      broadcast_down(trees[t], share(t, k), plan.steps);
      on_channel(first, lanes.broadcast[t]);
      // A root's broadcast sends what its reduction wrote; elsewhere the
      // parent's message comes only after the reduction passed through.
      if (!on_channels || trees[t].parent >= 0) continue;
      for (size_t i = first; i < plan.steps.size(); ++i) plan.steps[i].after = {*reduced[t][k]};
    }
  };
  for (size_t k = 0; k < rounds + lanes.lag; ++k) {
    if (k < rounds) add_reductions(k);
    if (k >= lanes.lag) add_broadcasts(k - lanes.lag);
  }
  return plan;
}

}  // namespace weft::algo
