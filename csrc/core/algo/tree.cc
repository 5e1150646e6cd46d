// Trees. Binomial trees broadcast and reduce in log2(size) hops, the answer
// for small messages where a chain pays one hop per rank. The double binary
// tree allreduce (as NCCL runs it) sends each half of the buffer up and down
// its own binary tree; the second tree is the first shifted by one rank, so
// most ranks that are leaves in one tree are inner nodes in the other and
// every rank's links carry about the same load. A buffer under
// kDoubleTreeMinBytes takes one tree instead: a wide one on one host
// (algorithms.h), the first binary tree across hosts. Large
// buffers go in rounds whose chunks fit in half a connection's buffering, as
// in the ring. Where the world has two channels, reductions run on one and
// broadcasts on the other, so a round's reduction goes up while the round
// before comes down, instead of waiting for it to reach the leaves. With
// four, each tree's reduction and broadcast have their own, so neither tree
// waits for the other's turn on a shared channel either.
#include <algorithm>

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
// is the root of the range. Fills `parent` and `children` of every position.
void inorder_tree(int lo, int hi, int up, std::vector<TreeNode>& nodes) {
  if (lo >= hi) return;
  const int mid = lo + (hi - lo) / 2;
  nodes[mid].parent = up;
  if (up >= 0) nodes[up].children.push_back(mid);
  inorder_tree(lo, mid, mid, nodes);
  inorder_tree(mid + 1, hi, mid, nodes);
}

// This rank's node in tree `t` (0 or 1) of the double binary tree: tree 1
// puts rank (p + 1) mod size at position p of tree 0.
TreeNode double_tree_node(int rank, int size, int t) {
  std::vector<TreeNode> nodes(size);
  inorder_tree(0, size, -1, nodes);
  const int shift = t;
  TreeNode at = nodes[positive_mod(rank - shift, size)];
  TreeNode node;
  if (at.parent >= 0) node.parent = positive_mod(at.parent + shift, size);
  for (int c : at.children) node.children.push_back(positive_mod(c + shift, size));
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

}  // namespace

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
  const TreeNode trees[2] = {split == 1 && one_host ? wide_tree_node(ctx.rank, ctx.size)
                                                    : double_tree_node(ctx.rank, ctx.size, 0),
                             double_tree_node(ctx.rank, ctx.size, 1)};
  // reduce_channel[t] and broadcast_channel[t]: tree t's.
  int reduce_channel[2] = {0, 0}, broadcast_channel[2] = {0, 0};
  if (ctx.buffered_sends && ctx.channels >= 4 && split == 2) {
    plan.channel_tags = {0, 1, 2, 3};
    reduce_channel[1] = 2;
    broadcast_channel[0] = 1;
    broadcast_channel[1] = 3;
  } else if (ctx.buffered_sends && ctx.channels >= 2) {
    plan.channel_tags = {0, 1};
    broadcast_channel[0] = broadcast_channel[1] = 1;
  }
  const bool on_channels = !plan.channel_tags.empty();
  for (size_t base = 0; base < count; base += split * limit) {
    const size_t round = std::min(split * limit, count - base);
    Span share[2];  // each tree's part of the round
    for (int t = 0; t < 2; ++t) {
      share[t] = t < split ? Span{Buf::Output, base + part_offset(round, split, t),
                                  part_count(round, split, t)}
                           : Span{Buf::Output, base, 0};
    }
    size_t reduced[2];  // index of each tree's last reduction step (at its root, the result)
    for (int t = 0; t < 2; ++t) {
      const size_t first = plan.steps.size();
      const Span in{Buf::Input, share[t].offset, share[t].count};
      reduce_up(trees[t], in, share[t], share[t], finalize, plan.steps);
      for (size_t i = first; i < plan.steps.size(); ++i) plan.steps[i].channel = reduce_channel[t];
      reduced[t] = plan.steps.size() - 1;
    }
    // In place, the broadcast overwrites Input that went up by reference;
    // the result that overwrites it exists only once that was consumed.
    for (int t = 0; t < 2; ++t) {
      const size_t first = plan.steps.size();
      broadcast_down(trees[t], share[t], plan.steps);
      if (!on_channels) continue;
      for (size_t i = first; i < plan.steps.size(); ++i) {
        plan.steps[i].channel = broadcast_channel[t];
        // A root's broadcast sends what its reduction wrote; elsewhere the
        // parent's message comes only after the reduction passed through.
        if (trees[t].parent < 0) plan.steps[i].after = {static_cast<uint32_t>(reduced[t])};
      }
    }
  }
  return plan;
}

}  // namespace weft::algo
