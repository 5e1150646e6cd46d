// Measures the cost model's parameters on a live world, once, when a
// communicator is created: latency pings and 1 MiB exchanges between pairs
// of ranks, in two rounds (pairs 2k,2k+1, then 2k+1,2k+2) so that every kind
// of link a world of ranks placed host by host has gets measured, all pairs
// at once as in a collective; and a local reduction. The maxima over all
// ranks (per transport) become the model, so every rank ends with the same
// one. A few milliseconds on an idle machine.
#pragma once

#include <functional>

#include "core/algo/plan.h"
#include "core/common/types.h"
#include "core/tune/cost_model.h"

namespace weft {

// Runs `plan` on every rank (all ranks call it in the same order) over
// these buffers.
using RunPlan =
    std::function<void(const Plan& plan, const void* in, void* out, DataType dtype, ReduceOp op)>;

// `is_tcp(peer)`: this rank reaches `peer` over tcp. Parameters of a
// transport no rank measured keep `defaults`' values.
CostModel probe_cost_model(const RunPlan& run, int rank, int size,
                           const std::function<bool(int)>& is_tcp, const CostModel& defaults);

}  // namespace weft
