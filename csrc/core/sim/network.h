// The network a simulation runs on: nodes (ranks, NICs, switches) joined by
// links with a latency and a bandwidth, full duplex (each direction its own
// wire) or half duplex (both directions share one). A link can be a token
// bucket, as a rate limiter is (tc's tbf, a cloud instance's bandwidth
// allowance): its bandwidth is the sustained rate, and up to burst_bytes
// saved up while it idled pass at the pace of the hops before it. Ranks can
// share CPUs (a machine's cores, CpuPool): a message then costs its sender's
// pool CPU time before (cut-through with) its wires, and a reduction its time
// on one of the pool's cores. Routes between ranks are
// shortest paths in hops, found by a bidirectional breadth-first search and
// the same every time (ties are broken by a hash of the two ranks and a
// salt, the channel's tag, so that equal paths through a fat tree's spines,
// or a host's NICs, spread over them).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace weft::sim {

struct Link {
  int a = 0, b = 0;  // node indices
  double latency_s = 0;
  double bandwidth_bps = 1;  // bytes per second
  bool duplex = true;
  double burst_bytes = 0;  // the bucket (0: a plain link)
};

// Cores that ranks share: every message a rank of the pool sends takes one of
// them (core_calendar.h) for s_per_message + bytes x s_per_b, what a
// socket's system calls and copies cost its sender and receiver on one
// machine, and every reduction it runs takes one for its own time, one piece
// of work at a time per rank (a rank's channels share its thread). Ranks in
// no pool send and reduce without waiting for a core.
struct CpuPool {
  int cores = 1;
  double s_per_b = 0;
  double s_per_message = 0;
};

// One link crossed in one direction: link * 2 + (0 from a to b, 1 from b to a).
using Hop = uint32_t;
inline uint32_t link_of(Hop h) { return h >> 1; }

class Network {
 public:
  // rank_nodes[r] is the node of rank r; rank_pool[r] its index in pools,
  // or -1 (empty: none in a pool). Throws InvalidArgument naming a link,
  // pool or rank that is out of range.
  Network(int nodes, std::vector<int> rank_nodes, std::vector<Link> links,
          std::vector<CpuPool> pools = {}, std::vector<int> rank_pool = {});

  int ranks() const { return static_cast<int>(rank_nodes_.size()); }
  int nodes() const { return nodes_; }
  const std::vector<Link>& links() const { return links_; }
  const Link& link(Hop h) const { return links_[link_of(h)]; }
  const std::vector<CpuPool>& pools() const { return pools_; }
  int pool_of(int rank) const { return rank_pool_.empty() ? -1 : rank_pool_[rank]; }
  // What a hop waits for: its own direction, or the link's one wire.
  uint32_t wire(Hop h) const { return links_[link_of(h)].duplex ? h : h & ~1u; }

  // Appends the hops from rank `from` to rank `to` (none when equal); false
  // when no path joins them.
  bool route(int from, int to, std::vector<Hop>& hops, int salt = 0) const;

  // Whether a rank's node passes on messages between others (true unless
  // set): where not, routes go around other ranks' nodes, through switches
  // and NICs only, as between GPUs joined by direct links.
  void set_ranks_forward(bool forward) { ranks_forward_ = forward; }

 private:
  int nodes_;
  std::vector<int> rank_nodes_;
  std::vector<Link> links_;
  std::vector<CpuPool> pools_;
  std::vector<int> rank_pool_;
  bool ranks_forward_ = true;
  std::vector<bool> rank_node_;  // per node: whether a rank sits on it
  // Adjacency in CSR form: node u's neighbours are adj_[start_[u] .. start_[u+1]),
  // each a hop leaving u.
  std::vector<uint32_t> start_;
  std::vector<Hop> adj_;
  // Search state, stamped per query so it is never cleared.
  mutable std::vector<uint32_t> stamp_[2];
  mutable std::vector<Hop> via_[2];
  mutable std::vector<uint32_t> depth_[2];
  mutable uint32_t query_ = 0;
  int far_end(Hop h) const { return h & 1 ? links_[link_of(h)].a : links_[link_of(h)].b; }
};

}  // namespace weft::sim
