// Times whole Plans on a live world: every family of allreduce,
// reduce-scatter and allgather that has a rival, at a few small sizes, when
// a communicator is created. For small messages the tuner goes by these
// figures rather than by the links' alpha terms (cost_model.h, MeasuredCost).
#pragma once

#include <cstddef>
#include <vector>

#include "core/algo/plan.h"
#include "core/tune/cost_model.h"
#include "core/tune/probe.h"

namespace weft {

// Bytes per rank (for allgather, each rank's block) at which families are
// timed; above the largest, the model's slope takes over. 64 KiB is timed
// because the slope is least right just above the small sizes: with more
// ranks than cores a round's bytes wait for a CPU, which the probe's
// pairwise exchanges do not see (8 ranks over tcp on 2 cores: rd grew 3.5x
// faster from 8 to 64 KiB than rhd, the model expected 1.7x).
constexpr size_t kMeasuredBytes[] = {64, 4096, 65536};

// All ranks call this with the same `topo`; each gets the same figures: per
// Plan, the slowest rank's median call. The Plans run in windows that take
// every family in turn, so that a stretch of load elsewhere on the machine
// falls on all of them alike, and a figure is the median over the windows.
// `ctx` is the world's PlanContext for float32. Takes up to 1080 calls (30
// Plans, each in 4 windows of 9 calls).
std::vector<MeasuredCost> measure_families(const RunPlan& run, const PlanContext& ctx,
                                           const Topology& topo);

}  // namespace weft
