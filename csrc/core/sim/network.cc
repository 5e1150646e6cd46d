#include "core/sim/network.h"

#include <utility>

#include "core/common/error.h"

namespace weft::sim {

Network::Network(int nodes, std::vector<int> rank_nodes, std::vector<Link> links,
                 std::vector<CpuPool> pools, std::vector<int> rank_pool)
    : nodes_(nodes),
      rank_nodes_(std::move(rank_nodes)),
      links_(std::move(links)),
      pools_(std::move(pools)),
      rank_pool_(std::move(rank_pool)) {
  if (nodes < 1) throw InvalidArgument("network: needs at least one node");
  for (size_t i = 0; i < pools_.size(); ++i) {
    if (pools_[i].cores < 1 || !(pools_[i].s_per_b >= 0)) {
      throw InvalidArgument("network: CPU pool " + std::to_string(i) +
                            " needs cores >= 1 and s_per_b >= 0");
    }
  }
  if (!rank_pool_.empty() && rank_pool_.size() != rank_nodes_.size()) {
    throw InvalidArgument("network: rank_pool needs one entry per rank (or none)");
  }
  for (size_t r = 0; r < rank_pool_.size(); ++r) {
    if (rank_pool_[r] < -1 || rank_pool_[r] >= static_cast<int>(pools_.size())) {
      throw InvalidArgument("network: rank " + std::to_string(r) + " is in CPU pool " +
                            std::to_string(rank_pool_[r]) + ", not -1 or one of 0.." +
                            std::to_string(static_cast<int>(pools_.size()) - 1));
    }
  }
  rank_node_.assign(static_cast<size_t>(nodes), false);
  for (size_t r = 0; r < rank_nodes_.size(); ++r) {
    if (rank_nodes_[r] < 0 || rank_nodes_[r] >= nodes) {
      throw InvalidArgument("network: rank " + std::to_string(r) + " sits on node " +
                            std::to_string(rank_nodes_[r]) + ", outside 0.." +
                            std::to_string(nodes - 1));
    }
    rank_node_[static_cast<size_t>(rank_nodes_[r])] = true;
  }
  std::vector<uint32_t> degree(nodes + 1, 0);
  for (size_t i = 0; i < links_.size(); ++i) {
    const Link& l = links_[i];
    if (l.a < 0 || l.a >= nodes || l.b < 0 || l.b >= nodes || l.a == l.b) {
      throw InvalidArgument("network: link " + std::to_string(i) + " joins nodes " +
                            std::to_string(l.a) + " and " + std::to_string(l.b) +
                            ": both must be distinct nodes of 0.." + std::to_string(nodes - 1));
    }
    if (!(l.latency_s >= 0) || !(l.bandwidth_bps > 0) || !(l.burst_bytes >= 0)) {
      throw InvalidArgument("network: link " + std::to_string(i) +
                            " needs latency >= 0, bandwidth > 0 and burst_bytes >= 0");
    }
    ++degree[l.a + 1];
    ++degree[l.b + 1];
  }
  for (int u = 0; u < nodes; ++u) degree[u + 1] += degree[u];
  start_ = degree;
  adj_.resize(2 * links_.size());
  std::vector<uint32_t> fill(start_.begin(), start_.end() - 1);
  for (size_t i = 0; i < links_.size(); ++i) {
    adj_[fill[links_[i].a]++] = static_cast<Hop>(2 * i);
    adj_[fill[links_[i].b]++] = static_cast<Hop>(2 * i + 1);
  }
  for (int side = 0; side < 2; ++side) {
    stamp_[side].assign(nodes, 0);
    via_[side].assign(nodes, 0);
    depth_[side].assign(nodes, 0);
  }
}

bool Network::route(int from, int to, std::vector<Hop>& hops, int salt) const {
  const int s = rank_nodes_.at(from), t = rank_nodes_.at(to);
  if (s == t) return true;
  const uint32_t q = ++query_;
  // Side 0 searches from s along hops leaving each node, side 1 from t along
  // hops arriving; the side whose frontier has fewer links expands next, so
  // a switch of many ports is crossed without listing them.
  std::vector<int> frontier[2] = {{s}, {t}};
  const int ends[2] = {s, t};
  for (int side = 0; side < 2; ++side) {
    stamp_[side][ends[side]] = q;
    depth_[side][ends[side]] = 0;
  }
  const uint64_t mix = (static_cast<uint64_t>(from) * 0x9E3779B97F4A7C15ull) ^
                       (static_cast<uint64_t>(to) * 0xC2B2AE3D27D4EB4Full) ^
                       (static_cast<uint64_t>(salt) * 0x165667B19E3779F9ull);
  auto weight = [&](const std::vector<int>& f) {
    size_t w = 0;
    for (int u : f) w += start_[u + 1] - start_[u];
    return w;
  };
  while (!frontier[0].empty() && !frontier[1].empty()) {
    const int side = weight(frontier[0]) <= weight(frontier[1]) ? 0 : 1;
    std::vector<int> next;
    int meet = -1;
    uint32_t best = UINT32_MAX;
    for (int u : frontier[side]) {
      const uint32_t deg = start_[u + 1] - start_[u];
      const uint32_t first = static_cast<uint32_t>((mix >> 17) % (deg ? deg : 1));
      for (uint32_t j = 0; j < deg; ++j) {
        const Hop h = adj_[start_[u] + (first + j) % deg];
        const int v = far_end(h);
        if (stamp_[side][v] == q) continue;
        // A rank's node that may not relay is entered only as the far end.
        if (!ranks_forward_ && rank_node_[static_cast<size_t>(v)] && v != ends[1 - side]) continue;
        stamp_[side][v] = q;
        via_[side][v] = h;
        depth_[side][v] = depth_[side][u] + 1;
        next.push_back(v);
        if (stamp_[1 - side][v] == q) {
          const uint32_t total = depth_[side][v] + depth_[1 - side][v];
          if (total < best) best = total, meet = v;
        }
      }
    }
    if (meet >= 0) {
      // Hops from s to the meeting node (side 0 recorded hops leaving each
      // node; side 1 hops leaving the node towards t, reversed).
      std::vector<Hop> head;
      for (int v = meet; v != s;) {
        const Hop h = via_[0][v];
        head.push_back(h);
        v = far_end(h ^ 1u);
      }
      hops.insert(hops.end(), head.rbegin(), head.rend());
      for (int v = meet; v != t;) {
        const Hop h = via_[1][v] ^ 1u;  // side 1 reached v from its far end: cross it towards t
        hops.push_back(h);
        v = far_end(h);
      }
      return true;
    }
    frontier[side] = std::move(next);
  }
  return false;
}

}  // namespace weft::sim
