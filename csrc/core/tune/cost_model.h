// The alpha-beta-gamma cost model the tuner chooses algorithms with: a
// message over a link costs alpha + bytes*beta, reducing costs bytes*gamma.
// Predictions are for one operation on one rank, assuming every rank runs
// the same Plan shape at once; the slowest link in use bounds flat
// algorithms, the hierarchical one pays each kind of link for its own phase.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/algo/families.h"

namespace weft {

struct LinkCost {
  double alpha_s = 0;       // seconds per message (latency)
  double beta_s_per_b = 0;  // seconds per byte (inverse bandwidth)
  // Seconds per byte for buffers of CostModel::large_bytes and more, where
  // the copies run from memory instead of the caches; 0: beta_s_per_b there.
  double beta_large_s_per_b = 0;
};

// One family's Plan of one collective, timed on a live world at `bytes` per
// rank: seconds of the slowest rank. Small messages cost what scheduling and
// links do to a whole Plan, which per-message alpha terms miss (a shared-memory
// step waiting for a CPU turn, a rate limit whose burst lets small messages
// through), so where a family was measured the tuner believes the measurement.
struct MeasuredCost {
  Collective collective;
  Algorithm algorithm;
  size_t bytes;
  double seconds;
};

// Defaults are round figures for a 2-core VM; communicators measure their own
// (see probe.h) unless WEFT_TUNE says otherwise.
struct CostModel {
  LinkCost shm{2e-6, 1.0 / 8e9};
  LinkCost tcp{20e-6, 1.0 / 2e9};
  double gamma_s_per_b = 1.0 / 10e9;  // reduction, per byte of output
  // The buffer sizes the links' two betas were measured at (0: only beta,
  // which then holds at every size). at_buffer() interpolates between them.
  size_t small_bytes = 0;
  size_t large_bytes = 0;
  // What whole Plans took on the world the model was measured on
  // (family_probe.h); empty for a model from a file or the defaults.
  std::vector<MeasuredCost> measured;
};

// The model for calls on `bytes` per rank: each link's beta up to
// small_bytes, its beta_large from large_bytes, and the line between the two
// in log2(bytes) between (the rest unchanged).
CostModel at_buffer(const CostModel& model, size_t bytes);

// A model as text ("shm_alpha_s 2e-06" lines; "#" starts a comment line),
// for WEFT_TUNE=<file>. Measured Plans are written as comments: they hold
// for the world they were measured on only.
std::string format_cost_model(const CostModel& model);
// Throws InvalidArgument naming the file and what is wrong with it.
CostModel load_cost_model(const std::string& path);

// The shape of a world, as far as the cost model cares.
struct Topology {
  int size = 1;
  int hosts = 1;
  // Ranks on every host, or 0 when hosts hold different numbers of ranks.
  int ranks_per_host = 1;
  bool any_tcp = false;  // some pair of ranks talks over tcp
  // Rank r is on host r / ranks_per_host, as launchers number them; then the
  // first rounds of recursive doubling pair ranks of one host.
  bool ranks_by_host = true;
  // A Plan step's budget (PlanContext::max_step_bytes), which sets the size of
  // hier's pieces. 512 KiB is what the default slots give across hosts.
  size_t step_bytes = 512 << 10;
  // The largest message (the smallest slot of the transports in use): a rank
  // forwards a message once all of it has arrived, so pipelines (chain) move
  // in slices of this size. 256 KiB is the default shared-memory slot.
  size_t slice_bytes = 256 << 10;
};

// The shape of the world whose rank r lies on host host_of_rank[r] (any
// numbering: hosts are told apart, not ordered); the other fields as defaults.
Topology topology_of_hosts(const std::vector<int>& host_of_rank);

// The families that implement `c` on `topo` (hier needs several hosts with
// equal rank counts).
std::vector<Algorithm> algorithms_for(Collective c, const Topology& topo);

// Predicted seconds for `bytes` per rank (the buffer each rank contributes;
// for allgather, each rank's block), from the link figures alone, in place
// (output and input one buffer) or not: the price includes the local copies
// a family's Plan makes in that form (oneshot staging its contributions, rd
// moving its result out of Scratch), with the links' figures at_buffer(bytes).
// Throws InvalidArgument when `a` has no
// form for `c` on `topo`.
double predict(Algorithm a, Collective c, size_t bytes, const Topology& topo,
               const CostModel& model, bool in_place = false);

struct Choice {
  Algorithm algorithm;
  double predicted_s;
};
// The cheapest family for `c`, or `forced` when it has a form for `c` (a
// forced family without one falls back to the cheapest). A family measured
// on this world (CostModel::measured) costs what was measured: at the
// smallest size measured and below, its figure; between sizes, the line
// between their figures; above the largest, that figure plus what predict()
// adds from there.
Choice choose(Collective c, size_t bytes, const Topology& topo, const CostModel& model,
              Algorithm forced = Algorithm::Auto, bool in_place = false);
// Every family with a form for `c`, costed as choose() costs them, cheapest first.
std::vector<Choice> ranked_choices(Collective c, size_t bytes, const Topology& topo,
                                   const CostModel& model, bool in_place = false);

}  // namespace weft
