#include "core/tune/family_probe.h"

#include <algorithm>

#include "core/algo/algorithms.h"
#include "core/common/deadline.h"

namespace weft {
namespace {

constexpr int kWindows = 4;
// Per window and Plan. The first calls after other work run slow (the ranks
// wake up, caches refill), so they go untimed.
constexpr int kUntimedCalls = 2;
constexpr int kTimedCalls = 7;

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : (values[mid - 1] + values[mid]) / 2;
}

struct Timed {
  MeasuredCost cost;
  Plan plan;
  std::vector<double> window_medians;
};

}  // namespace

std::vector<MeasuredCost> measure_families(const RunPlan& run, const PlanContext& ctx,
                                           const Topology& topo) {
  std::vector<Timed> timed;
  // Broadcast and reduce end on different ranks at different times, so calls
  // back to back overlap (a root's sends complete into slots at once) and
  // would time a hop rather than a call: the model alone prices them.
  for (Collective c : {Collective::Allreduce, Collective::ReduceScatter, Collective::Allgather}) {
    const std::vector<Algorithm> families = algorithms_for(c, topo);
    if (ctx.size < 2 || families.size() < 2) continue;
    for (size_t bytes : kMeasuredBytes) {
      for (Algorithm a : families) {
        const size_t count = bytes / ctx.elem_size;
        timed.push_back(
            {MeasuredCost{c, a, bytes, 0}, algo::plan_for(c, a, ctx, count, 0, false, false), {}});
      }
    }
  }
  if (timed.empty()) return {};
  // Room for the largest: an allgather's output, a reduce-scatter's input.
  const size_t most = *std::max_element(std::begin(kMeasuredBytes), std::end(kMeasuredBytes));
  std::vector<char> in(most * ctx.size), out(most * ctx.size);
  for (int w = 0; w < kWindows; ++w) {
    for (Timed& t : timed) {
      std::vector<double> calls;
      for (int i = 0; i < kUntimedCalls + kTimedCalls; ++i) {
        const double start = now_s();
        run(t.plan, in.data(), out.data(), DataType::Float32, ReduceOp::Sum);
        if (i >= kUntimedCalls) calls.push_back(now_s() - start);
      }
      t.window_medians.push_back(median(calls));
    }
  }
  std::vector<double> mine;
  for (const Timed& t : timed) mine.push_back(median(t.window_medians));
  const std::vector<double> slowest = max_over_ranks(run, ctx.rank, ctx.size, mine);
  std::vector<MeasuredCost> out_costs;
  for (size_t i = 0; i < timed.size(); ++i) {
    out_costs.push_back(timed[i].cost);
    out_costs.back().seconds = slowest[i];
  }
  return out_costs;
}

}  // namespace weft
