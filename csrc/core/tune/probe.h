// Measures the cost model's parameters on a live world, quickly when a
// communicator is created, thoroughly for weft-bench --tune: latency pings
// and large exchanges between pairs
// of ranks, in two rounds (pairs 2k,2k+1, then 2k+1,2k+2) so that every kind
// of link a world of ranks placed host by host has gets measured, all pairs
// at once as in a collective; and a local reduction. The maxima over all
// ranks (per transport) become the model, so every rank ends with the same
// one. The quick probe takes about 20 ms on an idle machine, most of it the
// pauses between its windows.
#pragma once

#include <cstddef>
#include <functional>
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
  // Each kind of exchange is timed in this many consecutive windows; the
  // figure is the lowest window's median, so a stretch when another process
  // held the CPU does not become the link's cost.
  int windows;
};
constexpr ProbeEffort kQuickProbe{16, 5, size_t{1} << 20, 3};
constexpr ProbeEffort kThoroughProbe{400, 40, size_t{4} << 20, 8};

// Runs `plan` on every rank (all ranks call it in the same order) over
// these buffers.
using RunPlan =
    std::function<void(const Plan& plan, const void* in, void* out, DataType dtype, ReduceOp op)>;

// The largest of each value over all ranks, on every rank (a collective).
std::vector<double> max_over_ranks(const RunPlan& run, int rank, int size,
                                   const std::vector<double>& values);

// `is_tcp(peer)`: this rank reaches `peer` over tcp. Parameters of a
// transport no rank measured keep `defaults`' values.
CostModel probe_cost_model(const RunPlan& run, int rank, int size,
                           const std::function<bool(int)>& is_tcp, const CostModel& defaults,
                           const ProbeEffort& effort);

}  // namespace weft
