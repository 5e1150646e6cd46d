#include "core/tune/family_trials.h"

#include <algorithm>
#include <cmath>

#include "core/common/log.h"

namespace weft {
namespace {

// Each candidate runs in blocks of calls back to back, as a workload runs
// them: a tree's leaves start the next call while its root still sends, which
// calls that alternate between families would not show. The first round is
// untimed: a communicator's connections that sat idle restart slowly (tcp's
// slow start after idle; 8 ranks at 512 KiB: a family's first block ran 1.5-
// 3.6 ms per call, then 1.0-1.1), and each family uses its own connections.
// In the timed rounds a block's first call is untimed too: it waits for the
// ranks still finishing the block before.
constexpr int kUntimedRounds = 1;
constexpr int kRounds = 3;
// Calls per block: as many as fit this budget at the model's figures, within
// [kFewestBlockCalls, kMostBlockCalls]. Calls jitter by a fifth or more
// where ranks wait for CPUs (8 ranks on 2 cores: rhd's 4 MiB calls took 9-14
// ms), so a family gets 14 timed calls where they fit. Small calls get many
// more: families 3 us apart at 25 us per call swapped places between launches
// with 8 calls a block, and a link that lets a burst through faster than its
// rate (tc tbf's bucket on the namespace hosts) ran rd's 8-call blocks of
// 4 KiB at 32 us a call, which sustained it ran at 62, behind the tree's 38.
constexpr double kTrialBudget_s = 0.25;
constexpr int kFewestBlockCalls = 4;

int log2_floor(size_t n) {
  int k = 0;
  while (n >>= 1) ++k;
  return k;
}

}  // namespace

FamilyTrials::FamilyTrials(const Topology& topo, const CostModel& model, int rank)
    : topo_(topo), model_(model), rank_(rank) {}

bool FamilyTrials::tried(Collective c) {
  return c == Collective::Allreduce || c == Collective::ReduceScatter || c == Collective::Allgather;
}

FamilyTrials::Key FamilyTrials::key(Collective c, size_t bytes, bool in_place) {
  return {c, in_place, bytes == 0 ? -1 : log2_floor(bytes)};
}

FamilyTrials::Range& FamilyTrials::range(Collective c, size_t bytes, bool in_place) {
  std::lock_guard<std::mutex> lock(mu_);
  auto [it, fresh] = ranges_.try_emplace(key(c, bytes, in_place));
  Range& r = it->second;
  if (!fresh) return r;
  const std::vector<Choice> ranked = ranked_choices(c, bytes, topo_, model_, in_place);
  if (ranked.empty()) {  // a barrier: nothing to choose
    r.decided = Choice{Algorithm::Auto, 0};
    return r;
  }
  double expected_round = 0;
  for (const Choice& choice : ranked) {
    if (choice.predicted_s > kCloseFactor * ranked.front().predicted_s) break;
    if (r.candidates.size() == kMostCandidates) break;
    r.candidates.push_back(choice.algorithm);
    expected_round += choice.predicted_s;
  }
  // Nothing to try between (or nothing to time): the model's choice stands.
  if (!tried(c) || r.candidates.size() < 2 || bytes == 0) {
    r.decided = ranked.front();
    return r;
  }
  const double fit =
      std::ceil(kTrialBudget_s / ((kRounds - kUntimedRounds) * std::max(expected_round, 1e-9)));
  r.block_calls = static_cast<int>(std::clamp<double>(fit, kFewestBlockCalls, kMostBlockCalls));
  r.timed_s.assign(r.candidates.size(), 0);
  WEFT_LOG(Info, rank_, [&] {
    std::string line = std::string(to_string(c)) + " of " + std::to_string(bytes) +
                       (in_place ? " bytes in place" : " bytes") + ": trying, " +
                       std::to_string(r.block_calls) + " calls in a row each:";
    for (size_t i = 0; i < r.candidates.size(); ++i) {
      line += std::string(" ") + to_string(ranked[i].algorithm) + " (predicted " +
              std::to_string(ranked[i].predicted_s * 1e6) + " us)";
    }
    return line;
  }());
  return r;
}

FamilyTrials::Turn FamilyTrials::next(Collective c, size_t bytes, bool in_place) {
  Range& r = range(c, bytes, in_place);
  if (r.decided) return {r.decided->algorithm, false};
  return {r.candidates[(r.calls / r.block_calls) % r.candidates.size()], true};
}

void FamilyTrials::record(Collective c, size_t bytes, bool in_place, double seconds,
                          const SlowestOverRanks& slowest) {
  Range& r = range(c, bytes, in_place);
  const int round = r.calls / (r.block_calls * static_cast<int>(r.candidates.size()));
  if (round >= kUntimedRounds && r.calls % r.block_calls > 0) {
    r.timed_s[(r.calls / r.block_calls) % r.candidates.size()] += seconds;
  }
  ++r.calls;
  if (r.calls == kRounds * r.block_calls * static_cast<int>(r.candidates.size())) {
    decide(r, c, bytes, in_place, slowest);
  }
}

void FamilyTrials::decide(Range& r, Collective c, size_t bytes, bool in_place,
                          const SlowestOverRanks& slowest) {
  // Per call: the mean, as a workload pays it (the least block would favour
  // a family whose calls vary: 8 ranks on 2 cores at 4 MiB, rhd's least block
  // was as fast as the tree's, its mean 20 % slower).
  std::vector<double> mine;
  for (double total : r.timed_s) {
    mine.push_back(total / ((kRounds - kUntimedRounds) * (r.block_calls - 1)));
  }
  const std::vector<double> agreed = slowest(mine);
  size_t best = 0;
  for (size_t i = 1; i < agreed.size(); ++i) {
    if (agreed[i] < agreed[best]) best = i;
  }
  WEFT_LOG(Info, rank_, [&] {
    std::string line = std::string(to_string(c)) + " of " + std::to_string(bytes) +
                       (in_place ? " bytes in place" : " bytes") +
                       " and its power-of-two range: trials chose " +
                       to_string(r.candidates[best]) + " (per call, back to back:";
    for (size_t i = 0; i < agreed.size(); ++i) {
      line += std::string(" ") + to_string(r.candidates[i]) + " " +
              std::to_string(agreed[i] * 1e6) + " us";
    }
    return line + ")";
  }());
  std::lock_guard<std::mutex> lock(mu_);
  r.decided = Choice{r.candidates[best], agreed[best]};
}

std::optional<Choice> FamilyTrials::decided(Collective c, size_t bytes, bool in_place) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = ranges_.find(key(c, bytes, in_place));
  if (it == ranges_.end()) return std::nullopt;
  return it->second.decided;
}

bool FamilyTrials::trying(Collective c, size_t bytes, bool in_place) const {
  if (!tried(c)) return false;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = ranges_.find(key(c, bytes, in_place));
  return it == ranges_.end() || !it->second.decided;
}

}  // namespace weft
