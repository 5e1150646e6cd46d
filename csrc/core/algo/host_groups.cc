#include "core/algo/host_groups.h"

#include <algorithm>
#include <utility>

namespace weft::algo {

HostGroups host_groups(const std::vector<int>& host) {
  const int size = static_cast<int>(host.size());
  // Ranks sorted by (host index, rank): each host's ranks end up adjacent.
  std::vector<std::pair<int, int>> by_host(host.size());
  for (int r = 0; r < size; ++r) by_host[r] = {host[r], r};
  std::sort(by_host.begin(), by_host.end());
  HostGroups g;
  g.host_pos.resize(host.size());
  g.local_pos.resize(host.size());
  for (int i = 0; i < size; ++i) {
    const auto [index, rank] = by_host[i];
    if (i == 0 || by_host[i - 1].first != index) g.ranks.emplace_back();
    g.host_pos[rank] = static_cast<int>(g.ranks.size()) - 1;
    g.local_pos[rank] = static_cast<int>(g.ranks.back().size());
    g.ranks.back().push_back(rank);
  }
  for (const std::vector<int>& ranks : g.ranks) g.same_size &= ranks.size() == g.ranks[0].size();
  return g;
}

}  // namespace weft::algo
