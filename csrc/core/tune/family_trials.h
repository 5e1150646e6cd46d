// Trials of algorithm families on a communicator's own calls. The model and
// the Plans timed at creation (family_probe.h) stop at 64 KiB; above it the
// model cannot tell apart families that move the same bytes (ring and rhd on
// 4 ranks), nor see a pipelined tree beat both where ranks crowd the CPUs.
// So the first calls of allreduce, reduce-scatter and allgather in each
// power-of-two range of sizes run, in turns of a few calls each, every family
// the model expects within kCloseFactor of the cheapest; then the ranks agree
// on the one whose slowest rank took least per call on average, and run it
// from then on. In-place calls have ranges of their own: families that must
// keep the input until it is sent copy it first there (2 ranks at 32 MiB:
// oneshot 5.0 ms out of place, 16.4 in place; the ring 3.1-3.4 both ways).
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <tuple>
#include <vector>

#include "core/tune/cost_model.h"

namespace weft {

// Families expected to cost more than this many times the cheapest are not tried.
constexpr double kCloseFactor = 1.5;
constexpr size_t kMostCandidates = 4;
// The most calls of one family in a row; trials take at most kMostCandidates x
// 3 rounds x this many calls per range of sizes (weft-bench's MAX_TRIAL_CALLS).
constexpr int kMostBlockCalls = 64;

class FamilyTrials {
 public:
  // The largest of each value over all ranks (a collective: every rank calls
  // it at the same point of the same operation).
  using SlowestOverRanks = std::function<std::vector<double>(const std::vector<double>&)>;

  // `topo` and `model` are the communicator's, the same on every rank.
  FamilyTrials(const Topology& topo, const CostModel& model, int rank);

  // Whether calls of `c` are tried at all (broadcast and reduce are not:
  // back to back their calls overlap, so a call's time is not its cost).
  static bool tried(Collective c);

  struct Turn {
    Algorithm algorithm;
    bool trial;  // the call is a trial, to be timed and recorded
  };
  // The family to run the next call of `c` on `bytes` per rank (for a
  // collective not tried, the model's choice).
  Turn next(Collective c, size_t bytes, bool in_place);
  // That trial call took `seconds` on this rank. After the last trial call of
  // its range this agrees with the other ranks through `slowest`.
  void record(Collective c, size_t bytes, bool in_place, double seconds,
              const SlowestOverRanks& slowest);
  // The family the trials of `bytes`' range chose and its mean call, once they ended.
  std::optional<Choice> decided(Collective c, size_t bytes, bool in_place) const;
  // Whether calls of `bytes`' range are still trials (or have not begun).
  bool trying(Collective c, size_t bytes, bool in_place) const;

 private:
  struct Range {
    std::vector<Algorithm> candidates;
    int block_calls = 0;  // calls in a row of one candidate (family_trials.cc)
    int calls = 0;
    std::vector<double> timed_s;  // per candidate, its timed calls on this rank
    std::optional<Choice> decided;
  };
  // The collective, in place or not, log2 of the bytes.
  using Key = std::tuple<Collective, bool, int>;

  static Key key(Collective c, size_t bytes, bool in_place);
  Range& range(Collective c, size_t bytes, bool in_place);
  void decide(Range& r, Collective c, size_t bytes, bool in_place, const SlowestOverRanks& slowest);

  const Topology& topo_;
  const CostModel& model_;
  const int rank_;
  mutable std::mutex mu_;  // decided() and trying() run on callers' threads
  std::map<Key, Range> ranges_;
};

}  // namespace weft
