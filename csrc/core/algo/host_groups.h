// The ranks of each host and every rank's place among them, found once per
// world. The hierarchical generator needs them for its rings inside and
// across hosts; a caller making every rank's Plan (the simulator) hands one
// HostGroups to all of them instead of each Plan grouping the whole world
// again: at 65536 ranks that was 13.9 ms a Plan, 15 minutes for the world.
#pragma once

#include <vector>

namespace weft::algo {

struct HostGroups {
  std::vector<std::vector<int>> ranks;  // per host, hosts by index, ranks ascending
  std::vector<int> host_pos;            // per rank: its host's position in `ranks`
  std::vector<int> local_pos;           // per rank: its position on its host
  bool same_size = true;                // whether every host has as many ranks
};

// Groups ranks by host index (host[r] for rank r; equal indices share a host).
HostGroups host_groups(const std::vector<int>& host);

}  // namespace weft::algo
