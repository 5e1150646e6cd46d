// Measures the cost model's parameters on a live world, quickly when a
// communicator is created, thoroughly for weft-bench --tune: latency pings
// and large exchanges (thoroughly: in cache and past it) between pairs of ranks, in two rounds
// (pairs 2k,2k+1, then 2k+1,2k+2) so that every kind of link a world of ranks placed host by host
// has gets measured, all pairs at once as in a collective; and a local reduction. The slowest
// rank's figures (per transport) become the model, so every rank ends with the same one. The quick
// probe takes about 20 ms on an idle machine, most of it the pauses between its windows.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "core/algo/plan.h"
#include "core/common/types.h"
#include "core/tune/cost_model.h"

namespace weft {

// How long to look. A communicator takes the quick probe when it is
// created; weft-bench --tune takes the thorough one (about a second) and
// saves the result for WEFT_TUNE=<file>.
struct ProbeEffort {
  int pings;              // 1-byte exchanges per pairing
  int transfers;          // large exchanges per pairing
  size_t transfer_bytes;  // their size
  // Each kind of exchange is timed in this many consecutive windows, all
  // pairs exchanging back to back; the figure is the lowest window's time per
  // exchange on its slowest rank, so a stretch when another process held the
  // CPU does not become the link's cost.
  int windows;
  // Exchanges of a buffer past the caches, whose copies run from memory
  // (the model's beta_large; none when 0).
  int large_transfers;
  size_t large_bytes;
};
constexpr ProbeEffort kQuickProbe{16, 5, size_t{1} << 20, 3, 0, 0};
constexpr ProbeEffort kThoroughProbe{400, 40, size_t{4} << 20, 8, 4, size_t{64} << 20};

// Runs `plan` on every rank (all ranks call it in the same order) over
// these buffers.
using RunPlan =
    std::function<void(const Plan& plan, const void* in, void* out, DataType dtype, ReduceOp op)>;

// The largest of each value over all ranks, on every rank (a collective).
std::vector<double> max_over_ranks(const RunPlan& run, int rank, int size,
                                   const std::vector<double>& values);

// `is_tcp(peer)`: this rank reaches `peer` over tcp; `host_of(rank)`: the
// host a rank runs on. Where several pairs leave one host at once over tcp,
// the tcp beta is a lone flow's: the measured seconds per byte divided by
// the flows that shared the host's link. Parameters of a transport no rank
// measured keep `defaults`' values.
CostModel probe_cost_model(const RunPlan& run, int rank, int size,
                           const std::function<bool(int)>& is_tcp,
                           const std::function<std::string(int)>& host_of,
                           const CostModel& defaults, const ProbeEffort& effort);

}  // namespace weft
