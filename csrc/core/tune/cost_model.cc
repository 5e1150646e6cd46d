#include "core/tune/cost_model.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <utility>

#include "core/algo/algorithms.h"
#include "core/common/error.h"

namespace weft {
namespace {

int log2_floor(int n) {
  int k = 0;
  while ((2 << k) <= n) ++k;
  return k;
}

int log2_ceil(int n) { return n <= 1 ? 0 : log2_floor(n - 1) + 1; }

bool has_form(Algorithm a, Collective c, const Topology& topo) {
  switch (a) {
    case Algorithm::Ring: return c != Collective::Broadcast && c != Collective::Reduce;
    case Algorithm::Tree:
      return c == Collective::Allreduce || c == Collective::Broadcast || c == Collective::Reduce;
    case Algorithm::Chain: return c == Collective::Broadcast || c == Collective::Reduce;
    case Algorithm::Rhd:
      // The reduce-scatter and allgather forms need a power-of-two world.
      return c == Collective::Allreduce ||
             ((c == Collective::ReduceScatter || c == Collective::Allgather) &&
              (topo.size & (topo.size - 1)) == 0);
    case Algorithm::Rd:
    case Algorithm::Oneshot: return c == Collective::Allreduce;
    case Algorithm::Hier:
      return c == Collective::Allreduce && topo.hosts > 1 && topo.ranks_per_host > 0;
    case Algorithm::Auto: return false;
  }
  return false;
}

// Seconds for one message of `bytes` over `link`.
double msg(const LinkCost& link, double bytes) { return link.alpha_s + bytes * link.beta_s_per_b; }

// `link` for a buffer of `bytes` (see at_buffer).
LinkCost link_at(const CostModel& model, LinkCost link, size_t bytes) {
  if (model.small_bytes == 0 || model.large_bytes <= model.small_bytes ||
      link.beta_large_s_per_b <= 0) {
    return link;
  }
  const double from = std::log2(static_cast<double>(model.small_bytes));
  const double span = std::log2(static_cast<double>(model.large_bytes)) - from;
  const double at = std::log2(std::max(1.0, static_cast<double>(bytes)));
  const double t = std::clamp((at - from) / span, 0.0, 1.0);
  link.beta_s_per_b += t * (link.beta_large_s_per_b - link.beta_s_per_b);
  return link;
}

bool power_of_two(int n) { return n > 0 && (n & (n - 1)) == 0; }

// How many parts of at most `budget` bytes `bytes` goes in (at least one).
double parts(double bytes, double budget) { return std::max(1.0, std::ceil(bytes / budget)); }

// A receiver reduces each message (at most a slice) while the next arrives:
// of a step's reductions only its last message's adds to its transfers.
double last_message(double bytes, const Topology& topo) {
  return std::min(bytes, static_cast<double>(topo.slice_bytes));
}

// A ring of `steps` steps of `chunk` bytes each over `link`, the first
// `reducing` of them reducing what they receive, cut into rounds whose chunk
// is at most a Plan step's budget. In a round each rank's link carries every
// step's messages in turn, and a step's messages go on as they come: the
// link idles before the next step only for what that step's first message
// waits for (its latency, its reduction) beyond the rest of the step's
// messages. In one message a step this is the sum of the steps' messages.
double ring_time(double steps, double reducing, double chunk, const LinkCost& link, double g,
                 const Topology& topo) {
  if (steps == 0 || chunk == 0) return 0;
  const double rounds = parts(chunk, static_cast<double>(topo.step_bytes));
  const double c = chunk / rounds;
  const double messages = parts(c, static_cast<double>(topo.slice_bytes));
  const double s = c / messages, rest = (messages - 1) * s * link.beta_s_per_b;
  const double reducing_before_last = std::min(reducing, steps - 1);
  const double idle = reducing_before_last * std::max(0.0, link.alpha_s + s * g - rest) +
                      (steps - 1 - reducing_before_last) * std::max(0.0, link.alpha_s - rest);
  const double last = link.alpha_s + (reducing >= steps ? s * g : 0);
  return rounds * (steps * c * link.beta_s_per_b + idle + last);
}

// What recursive halving leaves on its rounds' time of the reductions: the
// last message of each, from a half of `first` bytes down to one of `last`.
double halvings_reduced(double first, double last, const Topology& topo) {
  double reduced = 0;
  for (double half = first; half >= last && last > 0; half /= 2)
    reduced += last_message(half, topo);
  return reduced;
}

// A tree allreduce across hosts of several consecutive ranks each (hosts of
// one rank are double_tree_time's switch), from its trees' edges: the
// in-order tree's below kDoubleTreeMinBytes, each carrying the buffer, else
// the double tree's, each a half of every round. Each level of the
// climb and of the descent (a child's depth) costs a latency, the host link's
// where one of its edges crosses hosts, and the longer of a parent taking its
// two children's pieces on its own link and the busiest host link carrying
// that level's crossing pieces one after another; a round after the first
// costs what the busiest host link carries in a round (up and down), or a
// parent's link two rounds, and a round's reduction. On Topology.hosts from
// 2x2 to 16x8 this is 0.87-1.18 of the simulation (exact for the in-order
// tree where hosts are a power of two), but 1.5x at 16-64 MiB on 2x2 where a
// round's reduction costs as much as its transfer: the simulation overlaps
// the two.
double tree_across_hosts_time(const Topology& topo, double bytes, const LinkCost& inside,
                              const LinkCost& across, double g) {
  const int n = topo.size, per_host = topo.ranks_per_host;
  const bool one_tree = bytes < algo::kDoubleTreeMinBytes;
  std::vector<std::vector<int>> parents;
  if (one_tree) {
    parents.push_back(algo::inorder_tree_parents(n));
  } else {
    for (int t = 0; t < 2; ++t) {
      parents.emplace_back(static_cast<size_t>(n));
      for (int r = 0; r < n; ++r) parents[t][r] = algo::double_tree_parent(r, n, t);
    }
  }
  // Depths, each rank's found by climbing to a rank whose depth is known.
  std::vector<std::vector<int>> depth(parents.size(), std::vector<int>(n, -1));
  int levels = 1;
  std::vector<int> path;
  for (size_t t = 0; t < parents.size(); ++t) {
    for (int r = 0; r < n; ++r) {
      int at = r;
      for (; at >= 0 && depth[t][at] < 0; at = parents[t][at]) path.push_back(at);
      int d = at < 0 ? -1 : depth[t][at];
      for (auto it = path.rbegin(); it != path.rend(); ++it) depth[t][*it] = ++d;
      path.clear();
      levels = std::max(levels, depth[t][r] + 1);
    }
  }
  const double rounds = one_tree ? 1 : parts(bytes, 2.0 * static_cast<double>(topo.step_bytes));
  const double round = bytes / rounds, piece = one_tree ? round : round / 2;
  const auto host = [&](int r) { return r / per_host; };
  double first = 0;
  std::vector<int> up(topo.hosts), down(topo.hosts), per_round(topo.hosts, 0);
  for (int level = 1; level < levels; ++level) {
    std::fill(up.begin(), up.end(), 0);
    std::fill(down.begin(), down.end(), 0);
    for (size_t t = 0; t < parents.size(); ++t) {
      for (int r = 0; r < n; ++r) {
        const int q = parents[t][r];
        if (depth[t][r] != level || q < 0 || host(r) == host(q)) continue;
        ++up[host(r)];
        ++down[host(q)];
        ++per_round[host(r)];
        ++per_round[host(q)];
      }
    }
    for (int crossing :
         {*std::max_element(up.begin(), up.end()), *std::max_element(down.begin(), down.end())}) {
      first += (crossing > 0 ? across.alpha_s : inside.alpha_s) +
               std::max(2 * piece * inside.beta_s_per_b, crossing * piece * across.beta_s_per_b) +
               piece * g / 2;
    }
  }
  const int busiest = *std::max_element(per_round.begin(), per_round.end());
  return first + (rounds - 1) * (std::max(busiest * piece * across.beta_s_per_b,
                                          2 * round * inside.beta_s_per_b) +
                                 round * g);
}

// `flat` where several ranks of each host may cross its link at once (off a
// ring): with several hosts, its beta multiplied by the ranks per host.
LinkCost shared_by_host(const Topology& topo, LinkCost flat) {
  if (topo.hosts > 1) flat.beta_s_per_b *= std::max(1, topo.ranks_per_host);
  return flat;
}

// Whether rank r is known to be on host r / ranks_per_host of several.
bool hosts_are_blocks(const Topology& topo) {
  return topo.hosts > 1 && topo.ranks_by_host && topo.ranks_per_host > 0;
}

// Per host, how many exchanges between pairs of world ranks, all at once,
// cross its link (`each_pair(visit)` calls visit(a, b) for every pair;
// counted at both ends, a link being duplex), across hosts numbered in blocks.
template <typename EachPair>
std::vector<int> crossings_by_host(const Topology& topo, EachPair each_pair) {
  std::vector<int> crossing(static_cast<size_t>(topo.hosts), 0);
  each_pair([&](int a, int b) {
    const int host_a = a / topo.ranks_per_host, host_b = b / topo.ranks_per_host;
    if (host_a == host_b) return;
    ++crossing[host_a];
    ++crossing[host_b];
  });
  return crossing;
}

// What the rounds of recursive halving or doubling, and the fold before them
// off a power of two, put on the host links (crossings_by_host), from the
// topology alone (hosts numbered in blocks): worked out once for every family
// and size that one choose() prices (rd and rhd share the rounds).
class HostCrossings {
 public:
  explicit HostCrossings(const Topology& topo) : topo_(topo) {}

  // The power-of-two group the ranks fold into
  // (algo::halving_doubling_group): position i < size - group takes rank
  // 2i's buffer in the fold.
  const std::vector<int>& group() {
    if (group_.empty()) group_ = algo::halving_doubling_group(topo_.size);
    return group_;
  }
  // The host of each of the group's positions.
  const std::vector<int>& group_hosts() {
    if (!group_hosts_.empty()) return group_hosts_;
    for (int rank : group()) group_hosts_.push_back(rank / topo_.ranks_per_host);
    return group_hosts_;
  }

  // For each round (k pairs the group's positions 2^k apart), how many of
  // its exchanges the busiest host link carries (0: none crosses).
  const std::vector<int>& halving_rounds() {
    if (busiest_) return *busiest_;
    busiest_.emplace();
    const int p = static_cast<int>(group().size());
    for (int m = 1; m < p; m *= 2) {
      const std::vector<int> hosts = crossings_by_host(topo_, [&](auto visit) {
        for (int i = 0; i < p; ++i) {
          if (i < (i ^ m)) visit(group_[i], group_[i ^ m]);
        }
      });
      busiest_->push_back(*std::max_element(hosts.begin(), hosts.end()));
    }
    return *busiest_;
  }
  // The fold: the first 2 (size - group) ranks pair up.
  int fold() {
    const std::vector<int>& hosts = fold_hosts();
    return *std::max_element(hosts.begin(), hosts.end());
  }
  // The fold of position i (rank 2i into 2i + 1): the count of the busier
  // of its two hosts' links, 0 where it stays on one.
  int fold_pair(int i) {
    const std::vector<int>& hosts = fold_hosts();
    const int host_a = 2 * i / topo_.ranks_per_host, host_b = (2 * i + 1) / topo_.ranks_per_host;
    return host_a == host_b ? 0 : std::max(hosts[host_a], hosts[host_b]);
  }

 private:
  const std::vector<int>& fold_hosts() {
    if (fold_) return *fold_;
    const int p = 1 << log2_floor(topo_.size);
    fold_ = crossings_by_host(topo_, [&](auto visit) {
      for (int r = 0; r < 2 * (topo_.size - p); r += 2) visit(r, r + 1);
    });
    return *fold_;
  }
  const Topology& topo_;
  std::vector<int> group_, group_hosts_;
  std::optional<std::vector<int>> busiest_;
  std::optional<std::vector<int>> fold_;
};

// The link exchanges take that put `crossing` of them on the busiest host
// link (HostCrossings): across hosts numbered in blocks, shared memory
// where none crosses, else the host link, whose bandwidth they share;
// elsewhere (where `crossing` means nothing) shared_by_host.
LinkCost link_of_crossing(const Topology& topo, int crossing, const LinkCost& flat,
                          const LinkCost& inside) {
  if (!hosts_are_blocks(topo)) return shared_by_host(topo, flat);
  if (crossing == 0) return inside;
  LinkCost link = flat;
  link.beta_s_per_b *= crossing;
  return link;
}

// A folded rank's buffer of `bytes` into its partner over `link`, which
// reduces each message (at most a `piece`) as the next comes: the slower of
// the link and the reduction sets the pace, and the other adds one message's.
double fold_in_time(const LinkCost& link, double bytes, double piece, double g) {
  return link.alpha_s +
         std::max(bytes * link.beta_s_per_b + piece * g, piece * link.beta_s_per_b + bytes * g);
}

// The link of each round of recursive halving or doubling over `size` ranks.
std::vector<LinkCost> halving_round_links(const Topology& topo, HostCrossings& crossings,
                                          const LinkCost& flat, const LinkCost& inside) {
  const int rounds = log2_floor(topo.size);
  if (!hosts_are_blocks(topo)) return std::vector<LinkCost>(rounds, shared_by_host(topo, flat));
  std::vector<LinkCost> links;
  for (int crossing : crossings.halving_rounds()) {
    links.push_back(link_of_crossing(topo, crossing, flat, inside));
  }
  return links;
}

// Recursive halving then doubling in one pass over `bytes`, as its Plan runs
// off a power of two across hosts numbered in blocks, each rank at its own
// pace: the group's first size - group ranks take a folded rank's buffer
// first (a `piece` at a time, each reduced as the next comes; each fold pair
// on its own link, the busier of its two hosts' where it crosses), the others
// start at once; in each round a rank is done once its partner's part, sent
// when the partner began the round, has come (and, halving, its last message
// is reduced); after the rounds each folded rank gets the result from its
// partner. In a round an exchange waits for its own link's latency (shared
// memory's inside a host), and its bytes go at the pace of the round's
// busiest host link, whose exchanges hold up the ranks met next. Ranks away
// from the busiest links run ahead, which the rounds one after another at
// their busiest link's latency miss.
double folded_halving_doubling_time(const Topology& topo, HostCrossings& crossings, double bytes,
                                    const LinkCost& flat, const LinkCost& inside, double g) {
  const std::vector<int>& host = crossings.group_hosts();
  const int p = static_cast<int>(host.size()), folded = topo.size - p;
  const auto link = [&](int crossing) { return link_of_crossing(topo, crossing, flat, inside); };
  const double piece = last_message(bytes, topo);
  std::vector<double> done(p, 0.0), next(p);
  for (int i = 0; i < folded; ++i) {
    done[i] = fold_in_time(link(crossings.fold_pair(i)), bytes, piece, g);
  }
  const auto round = [&](int k, bool halving) {
    const int mask = 1 << k;
    const double part = bytes * mask / p;
    const double reduce = halving ? last_message(part, topo) * g : 0;
    const double carried = part * link(crossings.halving_rounds()[k]).beta_s_per_b;
    for (int i = 0; i < p; ++i) {
      const bool crosses = host[i] != host[i ^ mask];
      const double arrives = done[i ^ mask] + (crosses ? flat : inside).alpha_s + carried;
      next[i] = std::max(done[i], arrives) + reduce;
    }
    done.swap(next);
  };
  const int rounds = log2_floor(p);
  for (int k = rounds - 1; k >= 0; --k) round(k, true);
  for (int k = 0; k < rounds; ++k) round(k, false);
  double last = *std::max_element(done.begin(), done.end());
  for (int i = 0; i < folded; ++i) {
    last = std::max(last, done[i] + msg(link(crossings.fold_pair(i)), bytes));
  }
  return last;
}

// One pass of recursive halving (or doubling) of `bytes` over the ranks of
// `links` (halving_round_links): the round with its partner m positions away
// (m = p/2, ..., 1) sends m/p of them over links[log2 m].
double halving_pass(double bytes, const std::vector<LinkCost>& links) {
  const int p = 1 << links.size();
  double t = 0;
  for (int k = static_cast<int>(links.size()) - 1; k >= 0; --k) {
    t += msg(links[k], bytes * (1 << k) / p);
  }
  return t;
}

// Recursive halving/doubling's reduce-scatter and allgather over the ranks of
// `links` for `bytes`, in rounds of a Plan step's budget per rank (the Plan's
// cut, which keeps each pass in cache).
double halving_doubling_time(double bytes, const std::vector<LinkCost>& links, double g,
                             const Topology& topo) {
  const int p = 1 << links.size();
  const double rounds = parts(bytes, static_cast<double>(topo.step_bytes) * p);
  const double b = bytes / rounds;
  return rounds * (2 * halving_pass(b, links) + halvings_reduced(b / 2, b / p, topo) * g);
}

// Recursive doubling, as its Plan runs off a power of two: the group's first
// n - group ranks take a folded rank's buffer (a message over `fold` and its
// reduction, `reduce_s`) before their rounds, while the others start at
// once; the round with partners 2^k apart in the group goes over
// round_links[k] (halving_round_links). A rank finishes a round once its
// partner's message (sent when the partner began the round) has come and it
// reduced it, so ranks whose partners ran ahead wait less than a round; from
// the second round a rank begins only once its previous message was
// delivered (the Plan's wait_sends), and it is done once its last one was. A
// folded rank gets the result from its partner, which sends it after its last
// round (after that round's message was delivered where the partner copies
// the result out of scratch first, else once its one link has sent that
// round's bytes).
double folded_doubling_time(int n, double bytes, const std::vector<LinkCost>& round_links,
                            const LinkCost& fold, double reduce_s, bool partner_copies) {
  const int group = 1 << log2_floor(n), folded = n - group;
  if (folded == 0) {  // every rank in step: the rounds one after another
    double t = 0;
    for (const LinkCost& link : round_links) t += msg(link, bytes) + reduce_s;
    return t;
  }
  std::vector<double> done(group, 0.0), began(group, -1.0), begin(group);
  for (int i = 0; i < folded; ++i) done[i] = msg(fold, bytes) + reduce_s;
  double round_s = 0;  // the last round's message
  for (int k = 0, mask = 1; mask < group; ++k, mask *= 2) {
    for (int i = 0; i < group; ++i) {
      begin[i] = began[i] < 0 ? done[i] : std::max(done[i], began[i] + round_s);
    }
    round_s = msg(round_links[k], bytes);
    for (int i = 0; i < group; ++i) {
      done[i] = std::max(begin[i], begin[i ^ mask] + round_s) + reduce_s;
    }
    began.swap(begin);
  }
  const double last_beta = round_links.empty() ? 0 : round_links.back().beta_s_per_b;
  double last = 0;
  for (int i = 0; i < group; ++i) {
    const double delivered = std::max(done[i], began[i] + round_s);
    last = std::max(last, delivered);
    if (i >= folded) continue;
    const double sent =
        partner_copies ? delivered : std::max(done[i], began[i] + bytes * last_beta);
    last = std::max(last, sent + msg(fold, bytes));
  }
  return last;
}

// The binomial broadcast of `bytes` over a subtree of `n` ranks, from when its
// root has them: the root sends to its children one after another, the
// farthest (2^(k-1) ranks away, k = ceil(log2 n)) first, and the child
// 2^i away roots a subtree of min(2^i, n - 2^i) ranks. A message's latency
// holds no link, so the j-th child has the bytes j messages' bytes and one
// latency after its parent. On a power of two every path costs
// log2(n) messages; on others the shorter subtrees' paths end sooner (and
// only their chain recurses: log2(n)^2 steps).
double binomial_broadcast_time(int n, double bytes, const LinkCost& link) {
  const int k = log2_ceil(n);
  if (power_of_two(n)) return k * msg(link, bytes);
  double longest = 0;
  for (int j = 1; j <= k; ++j) {
    const int distance = 1 << (k - j);
    const int subtree = std::min(distance, n - distance);
    longest = std::max(longest, j * bytes * link.beta_s_per_b + link.alpha_s +
                                    binomial_broadcast_time(subtree, bytes, link));
  }
  return longest;
}

// The binomial reduce of `bytes` over a subtree of `n` ranks, to when its
// root has the sum: the broadcast's mirror, where a parent takes its
// children nearest first (the smallest subtree, ready first) on its one link,
// each message once it has come (its latency holds no link) and the link is
// free, and reduces each (`reduce_s`) while the next one arrives. On a power
// of two every level costs a message and a reduction.
double binomial_reduce_time(int n, double bytes, const LinkCost& link, double reduce_s) {
  if (power_of_two(n)) return log2_ceil(n) * (msg(link, bytes) + reduce_s);
  double taken = 0, reduced = 0;
  for (int distance = 1; distance < n; distance *= 2) {
    const int subtree = std::min(distance, n - distance);
    const double ready = binomial_reduce_time(subtree, bytes, link, reduce_s);
    taken = std::max(taken, ready + link.alpha_s) + bytes * link.beta_s_per_b;
    reduced = std::max(reduced, taken) + reduce_s;
  }
  return reduced;
}

// The double binary tree's allreduce of `bytes`, in rounds of a Plan step's
// budget per tree, each tree's half of a round in messages of at most a
// slice. From 4 ranks a rank is an inner node of one tree, with a parent and
// two children, and a leaf of the other: per round it receives a half from
// each child and one from its parent, and sends one to its parent and to
// each child, and one more as the other tree's leaf: twice the round each way
// (against rhd's 2(p-1)/p), which is what the rounds after the first cost (on
// 2 ranks, one root each, a round; on 3, whose roots have no parent, 1.5).
// The first climbs and descends the trees' levels: on each of two children
// a parent takes its first child's whole half before its second's (up) and
// sends its first child's whole half before its second's (down), each a half
// and a message, and a power of two's root has one child (its half up and
// down); every level adds a latency each way and a half's reduction. On
// Topology.switch, where each rank has one link as here, this is exact in
// one round of one message a half and 0.91-1.18 of the simulation from 4
// ranks (32 KiB to 64 MiB; 0.79-0.99 on 5).
double double_tree_time(const Topology& topo, double bytes, const LinkCost& link, double g) {
  const int depth = algo::double_tree_depth(topo.size);
  const double rounds = parts(bytes, 2.0 * static_cast<double>(topo.step_bytes));
  const double round = bytes / rounds, half = round / 2;
  const double message = half / parts(half, static_cast<double>(topo.slice_bytes));
  const bool one_child_root = power_of_two(topo.size);
  const double two_children_levels = one_child_root ? depth - 1 : depth;
  const double first =
      ((one_child_root ? round : 0) + two_children_levels * (round + 2 * message)) *
          link.beta_s_per_b +
      depth * (2 * link.alpha_s + half * g);
  const double per_round = topo.size == 2 ? 1 : topo.size == 3 ? 1.5 : 2;
  return first + (rounds - 1) * (per_round * round * link.beta_s_per_b + round * g);
}

}  // namespace

CostModel at_buffer(const CostModel& model, size_t bytes) {
  CostModel out = model;
  out.shm = link_at(model, model.shm, bytes);
  out.tcp = link_at(model, model.tcp, bytes);
  return out;
}

std::string format_cost_model(const CostModel& m) {
  std::ostringstream out;
  out.precision(6);
  out << "shm_alpha_s " << m.shm.alpha_s << "\nshm_beta_s_per_b " << m.shm.beta_s_per_b
      << "\ntcp_alpha_s " << m.tcp.alpha_s << "\ntcp_beta_s_per_b " << m.tcp.beta_s_per_b
      << "\ngamma_s_per_b " << m.gamma_s_per_b << "\n";
  if (m.large_bytes > 0) {
    out << "small_bytes " << m.small_bytes << "\nlarge_bytes " << m.large_bytes
        << "\nshm_beta_large_s_per_b " << m.shm.beta_large_s_per_b << "\ntcp_beta_large_s_per_b "
        << m.tcp.beta_large_s_per_b << "\n";
  }
  for (const MeasuredCost& p : m.measured) {
    out << "# measured " << to_string(p.collective) << " " << to_string(p.algorithm) << " "
        << p.bytes << " B: " << p.seconds << " s\n";
  }
  return out.str();
}

CostModel load_cost_model(const std::string& path) {
  std::ifstream file(path);
  if (!file) {
    throw InvalidArgument("WEFT_TUNE='" + path +
                          "': no such file; use measure, off, or a file written by "
                          "weft-bench --tune or weft.topo.save_cost_model");
  }
  std::map<std::string, double> values;
  std::string line;
  for (int number = 1; std::getline(file, line); ++number) {
    std::istringstream fields(line);
    std::string key;
    double value = 0;
    if (!(fields >> key) || key[0] == '#') continue;  // blank or comment
    std::string rest;
    if (!(fields >> value) || fields >> rest) {
      throw InvalidArgument("WEFT_TUNE file '" + path + "', line " + std::to_string(number) +
                            ": expected 'name value', got '" + line + "'");
    }
    values[key] = value;
  }
  CostModel m;
  double* fields[] = {&m.shm.alpha_s, &m.shm.beta_s_per_b, &m.tcp.alpha_s, &m.tcp.beta_s_per_b,
                      &m.gamma_s_per_b};
  const char* names[] = {"shm_alpha_s", "shm_beta_s_per_b", "tcp_alpha_s", "tcp_beta_s_per_b",
                         "gamma_s_per_b"};
  for (int i = 0; i < 5; ++i) {
    auto it = values.find(names[i]);
    if (it == values.end() || !(it->second > 0)) {
      throw InvalidArgument("WEFT_TUNE file '" + path + "': needs a positive " + names[i]);
    }
    *fields[i] = it->second;
  }
  // Optional (files without them hold one beta per link): the large-buffer
  // betas and the sizes both were measured at.
  double* optional[] = {&m.shm.beta_large_s_per_b, &m.tcp.beta_large_s_per_b};
  const char* optional_names[] = {"shm_beta_large_s_per_b", "tcp_beta_large_s_per_b"};
  for (int i = 0; i < 2; ++i) {
    auto it = values.find(optional_names[i]);
    if (it == values.end()) continue;
    if (!(it->second >= 0)) {
      throw InvalidArgument("WEFT_TUNE file '" + path + "': " + optional_names[i] +
                            " must be 0 (not measured) or positive");
    }
    *optional[i] = it->second;
  }
  size_t* sizes[] = {&m.small_bytes, &m.large_bytes};
  const char* size_names[] = {"small_bytes", "large_bytes"};
  for (int i = 0; i < 2; ++i) {
    auto it = values.find(size_names[i]);
    if (it == values.end()) continue;
    if (!(it->second >= 0 && it->second <= 1e15 && it->second == std::floor(it->second))) {
      throw InvalidArgument("WEFT_TUNE file '" + path + "': " + size_names[i] +
                            " must be a whole number of bytes");
    }
    *sizes[i] = static_cast<size_t>(it->second);
  }
  if (m.large_bytes > 0 && m.large_bytes <= m.small_bytes) {
    throw InvalidArgument("WEFT_TUNE file '" + path +
                          "': large_bytes must be more than small_bytes (or 0)");
  }
  return m;
}

Topology topology_of_hosts(const std::vector<int>& host_of_rank) {
  Topology topo;
  topo.size = static_cast<int>(host_of_rank.size());
  std::map<int, int> first_rank_of, ranks_on;
  for (int r = 0; r < topo.size; ++r) {
    first_rank_of.emplace(host_of_rank[r], r);
    ++ranks_on[host_of_rank[r]];
  }
  topo.hosts = static_cast<int>(ranks_on.size());
  topo.ranks_per_host = ranks_on.empty() ? 1 : ranks_on.begin()->second;
  for (const auto& [host, ranks] : ranks_on) {
    if (ranks != topo.ranks_per_host) topo.ranks_per_host = 0;
  }
  // By host: each host's ranks a block of consecutive ranks.
  for (int r = 0; r < topo.size && topo.ranks_per_host > 0; ++r) {
    const int first = first_rank_of[host_of_rank[r]];
    if (first % topo.ranks_per_host != 0 || r - first >= topo.ranks_per_host) {
      topo.ranks_by_host = false;
    }
  }
  return topo;
}

std::vector<Algorithm> algorithms_for(Collective c, const Topology& topo) {
  std::vector<Algorithm> out;
  for (Algorithm a : kAllFamilies) {
    if (has_form(a, c, topo)) out.push_back(a);
  }
  return out;
}

namespace {

double predict_with(HostCrossings& crossings, Algorithm a, Collective c, size_t bytes,
                    const Topology& topo, const CostModel& measured, bool in_place) {
  if (!has_form(a, c, topo)) {
    throw InvalidArgument(std::string("algorithm ") + to_string(a) + " has no " + to_string(c) +
                          " for this world");
  }
  CostModel model;  // the links at this size (not the measured Plans, which predict ignores)
  model.shm = link_at(measured, measured.shm, bytes);
  model.tcp = link_at(measured, measured.tcp, bytes);
  model.gamma_s_per_b = measured.gamma_s_per_b;
  const double n = topo.size, S = static_cast<double>(bytes), g = model.gamma_s_per_b;
  if (topo.size == 1) return S * g / 4;  // a local copy
  const LinkCost& flat = topo.any_tcp ? model.tcp : model.shm;
  const LinkCost shared = shared_by_host(topo, flat);
  const int p = 1 << log2_floor(topo.size);
  // The links of the rounds of recursive halving, and of doubling (the same
  // group of p ranks where each rank has a CPU of its own).
  const auto halving_links = [&] { return halving_round_links(topo, crossings, flat, model.shm); };
  // The first 2 (n - p) ranks pair up, the lower of each pair sending its
  // buffer to the upper (fold_in_time) and getting the result back.
  const auto fold_link = [&] {
    const int crossing = hosts_are_blocks(topo) ? crossings.fold() : 0;
    return link_of_crossing(topo, crossing, flat, model.shm);
  };
  const auto fold = [&] {
    if (topo.size == p) return 0.0;
    const LinkCost link = fold_link();
    return fold_in_time(link, S, last_message(S, topo), g) + msg(link, S);
  };
  // A local copy of the buffer: about half a shared-memory message, which
  // copies the bytes in and out again.
  const double copy = S * model.shm.beta_s_per_b / 2;
  // A chain forwards whole slices: the last of them leaves the root behind
  // the others and then crosses the other n - 2 links, so a buffer of one
  // slice pays n - 1 full messages (no pipelining within a slice). A slice's
  // latency (and reduction) holds no link: the n - 1 hops pay each once.
  const double slices = parts(S, static_cast<double>(topo.slice_bytes));
  const double slice = S / slices;
  const double chain_bytes = (n - 2 + slices) * slice * flat.beta_s_per_b;
  switch (c) {
    case Collective::Allreduce:
      switch (a) {
        case Algorithm::Ring: return ring_time(2 * (n - 1), n - 1, S / n, flat, g, topo);
        case Algorithm::Oneshot:
          // Staged: its own input copied in, the peers' contributions reduced
          // in a pass of their own rather than straight from their messages.
          return (n - 1) * (msg(shared, S) + S * g) +
                 (algo::oneshot_stages(topo.size, in_place, bytes, topo.step_bytes) ? 2 * copy : 0);
        case Algorithm::Rd: {
          const double copied =
              algo::recursive_doubling_copies_result(topo.size, in_place) ? copy : 0;
          const bool partner_copies =
              algo::recursive_doubling_ends_in_scratch(topo.size, in_place, true);
          return folded_doubling_time(topo.size, S, halving_links(), fold_link(),
                                      last_message(S, topo) * g, partner_copies) +
                 copied;
        }
        case Algorithm::Rhd:
          if (topo.size != p && hosts_are_blocks(topo) &&
              parts(S, static_cast<double>(topo.step_bytes) * p) == 1) {
            return folded_halving_doubling_time(topo, crossings, S, flat, model.shm, g);
          }
          return halving_doubling_time(S, halving_links(), g, topo) + fold();
        case Algorithm::Tree:
          if (S < algo::kDoubleTreeMinBytes && topo.hosts == 1) {
            // One wide tree: on each level a parent's children send to it
            // side by side (one latency), their bytes one after another.
            const double k = std::min(n - 1, static_cast<double>(algo::kWideTreeFanout));
            return algo::wide_tree_depth(topo.size) *
                   (2 * shared.alpha_s + 2 * k * S * shared.beta_s_per_b + k * S * g);
          }
          if (topo.hosts > 1 && topo.ranks_by_host && topo.ranks_per_host > 1) {
            return tree_across_hosts_time(topo, S, model.shm, model.tcp, g);
          }
          return double_tree_time(topo, S, shared, g);
        case Algorithm::Hier: {
          const double L = topo.ranks_per_host, H = topo.hosts;
          // Both local phases over shared memory, the shards' rings over the
          // host's link, which all L of them share.
          const double local = 2 * (L - 1) * msg(model.shm, S / L) + (L - 1) / L * S * g;
          const bool one_exchange = algo::hier_shard_crosses_in_one_exchange(topo.hosts, S / L);
          const double across_steps = one_exchange ? 1
                                      : algo::hier_across_halves(topo.hosts)
                                          ? 2 * log2_floor(topo.hosts)
                                          : 2 * (H - 1);
          const double across = across_steps * model.tcp.alpha_s +
                                2 * (H - 1) / H * S * model.tcp.beta_s_per_b +
                                (one_exchange ? 1 : (H - 1) / H) * S / L * g;
          // In pieces, the host phases run beside the link phase, except the
          // first piece's reduce-scatter and the last one's allgather.
          const double pieces = static_cast<double>(
              algo::hier_pieces(topo.hosts, topo.ranks_per_host, topo.step_bytes, bytes));
          return pieces > 1 ? std::max(local, across) + local / pieces : local + across;
        }
        default: break;
      }
      break;
    case Collective::ReduceScatter:
      if (a == Algorithm::Rhd) {
        return halving_pass(n * S, halving_links()) + halvings_reduced(n * S / 2, S, topo) * g;
      }
      return ring_time(n - 1, n - 1, S, flat, g, topo);
    case Collective::Allgather:
      if (a == Algorithm::Rhd) {
        return halving_pass(n * S, halving_links());
      }
      return ring_time(n - 1, 0, S, flat, g, topo);
    case Collective::Broadcast:
      if (a == Algorithm::Chain) return chain_bytes + (n - 1) * flat.alpha_s;
      return binomial_broadcast_time(topo.size, S, shared);
    case Collective::Reduce:
      if (a == Algorithm::Chain) return chain_bytes + (n - 1) * (flat.alpha_s + slice * g);
      return binomial_reduce_time(topo.size, S, shared, last_message(S, topo) * g);
    case Collective::Barrier: break;
  }
  return std::numeric_limits<double>::infinity();
}

// predict(), anchored to what `a` measured on this world (see choose()).
double expected(HostCrossings& crossings, Algorithm a, Collective c, size_t bytes,
                const Topology& topo, const CostModel& model, bool in_place) {
  const auto predict = [&](size_t at) {
    return predict_with(crossings, a, c, at, topo, model, in_place);
  };
  const MeasuredCost* below = nullptr;  // the largest size measured <= bytes
  const MeasuredCost* above = nullptr;  // the smallest size measured >= bytes
  for (const MeasuredCost& p : model.measured) {
    if (p.collective != c || p.algorithm != a) continue;
    if (p.bytes <= bytes && (!below || p.bytes > below->bytes)) below = &p;
    if (p.bytes >= bytes && (!above || p.bytes < above->bytes)) above = &p;
  }
  if (!below && !above) return predict(bytes);
  if (!below) return above->seconds;
  if (!above) {
    const double beyond = predict(bytes) - predict(below->bytes);
    return below->seconds + std::max(0.0, beyond);
  }
  if (above->bytes == below->bytes) return below->seconds;
  const double at = static_cast<double>(bytes - below->bytes) / (above->bytes - below->bytes);
  return below->seconds + at * (above->seconds - below->seconds);
}

}  // namespace

double predict(Algorithm a, Collective c, size_t bytes, const Topology& topo,
               const CostModel& measured, bool in_place) {
  HostCrossings crossings(topo);
  return predict_with(crossings, a, c, bytes, topo, measured, in_place);
}

std::vector<Choice> ranked_choices(Collective c, size_t bytes, const Topology& topo,
                                   const CostModel& model, bool in_place) {
  HostCrossings crossings(topo);
  std::vector<Choice> out;
  for (Algorithm a : algorithms_for(c, topo))
    out.push_back({a, expected(crossings, a, c, bytes, topo, model, in_place)});
  std::stable_sort(out.begin(), out.end(),
                   [](const Choice& x, const Choice& y) { return x.predicted_s < y.predicted_s; });
  return out;
}

Choice choose(Collective c, size_t bytes, const Topology& topo, const CostModel& model,
              Algorithm forced, bool in_place) {
  if (forced != Algorithm::Auto && has_form(forced, c, topo)) {
    HostCrossings crossings(topo);
    return Choice{forced, expected(crossings, forced, c, bytes, topo, model, in_place)};
  }
  const std::vector<Choice> ranked = ranked_choices(c, bytes, topo, model, in_place);
  if (ranked.empty()) return Choice{Algorithm::Auto, std::numeric_limits<double>::infinity()};
  return ranked.front();
}

}  // namespace weft
