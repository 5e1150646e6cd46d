#include "core/tune/probe.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <thread>
#include <vector>

#include "core/algo/algorithms.h"
#include "core/common/deadline.h"
#include "core/reduce/cpu_reduce.h"

namespace weft {
namespace {

// Both directions between this rank and `partner` at once (no steps when
// partner < 0: this rank sits the round out).
Plan pair_exchange(int partner, size_t bytes) {
  Plan plan;
  plan.algorithm = "probe";
  if (partner < 0) return plan;
  plan.steps.push_back(
      exchange_step(partner, Span{Buf::Input, 0, bytes}, partner, Span{Buf::Output, 0, bytes}));
  return plan;
}

// This rank's partner in round 0 (pairs 2k, 2k+1) or round 1 (pairs 2k+1,
// 2k+2, wrapping for an even size), or -1.
int partner_in(int round, int rank, int size) {
  const int shifted = (rank - round + size) % size;  // round 1 pairs as round 0 one rank on
  const int other = shifted ^ 1;
  if (other >= size ||
      (round == 1 && size % 2 == 1 && (shifted == size - 1 || other == size - 1))) {
    return -1;
  }
  return (other + round) % size;
}

// An allreduce of `count` doubles in one round (with Max, every rank's
// largest values on every rank).
Plan max_of_doubles(int rank, int size, size_t count) {
  PlanContext ctx{};
  ctx.rank = rank;
  ctx.size = size;
  ctx.elem_size = sizeof(double);
  ctx.max_step_bytes = SIZE_MAX / 2;
  return algo::oneshot_allreduce(ctx, count, false, false);
}

// Seconds per byte of output of a float32 sum that stays in cache.
double reduce_cost() {
  const size_t count = 64 * 1024;
  std::vector<float> a(count, 1.0f), b(count, 2.0f), out(count);
  reduce::reduce(out.data(), nullptr, a.data(), b.data(), count, DataType::Float32, ReduceOp::Sum,
                 0, false);
  const double start = now_s();
  for (int i = 0; i < 4; ++i) {
    reduce::reduce(out.data(), nullptr, a.data(), b.data(), count, DataType::Float32, ReduceOp::Sum,
                   0, false);
  }
  return (now_s() - start) / (4.0 * count * sizeof(float));
}

}  // namespace

std::vector<double> max_over_ranks(const RunPlan& run, int rank, int size,
                                   const std::vector<double>& values) {
  std::vector<double> agreed(values.size(), 0.0);
  run(max_of_doubles(rank, size, values.size()), values.data(), agreed.data(), DataType::Float64,
      ReduceOp::Max);
  return agreed;
}

CostModel probe_cost_model(const RunPlan& run, int rank, int size,
                           const std::function<bool(int)>& is_tcp, const CostModel& defaults,
                           const ProbeEffort& effort) {
  // measured[0..1]: shm alpha, beta; [2..3]: tcp alpha, beta; [4]: gamma.
  std::vector<double> measured(5, 0.0);
  measured[4] = reduce_cost();
  std::vector<char> in(effort.transfer_bytes), out(effort.transfer_bytes);
  // Medians: the first messages after connecting, or a descheduled peer,
  // would otherwise dominate. Every rank times the same number of windows,
  // so the exchanges stay paired.
  // Every pair starts each exchange at once, as a collective's pairs do: a
  // pair timed while the others wait would have the machine's cores to itself
  // (4 tcp ranks on 2 cores measured twice the rate their collectives get).
  const double nothing = 0;
  double ignored = 0;
  const Plan barrier = max_of_doubles(rank, size, 1);
  auto time_s = [&](int partner, size_t bytes, int times) {
    const Plan plan = pair_exchange(partner, bytes);
    const int per_window = std::max(1, times / effort.windows);
    double lowest = std::numeric_limits<double>::infinity();
    for (int w = 0; w < effort.windows; ++w) {
      // A rank that sleeps is placed afresh when it wakes: two ranks left
      // sharing one core (pings then cost a context switch) get another
      // chance at a core each.
      if (w > 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
      std::vector<double> t;
      for (int i = 0; i < per_window; ++i) {
        run(barrier, &nothing, &ignored, DataType::Float64, ReduceOp::Max);
        const double start = now_s();
        run(plan, in.data(), out.data(), DataType::UInt8, ReduceOp::Sum);
        t.push_back(now_s() - start);
      }
      std::nth_element(t.begin(), t.begin() + per_window / 2, t.end());
      lowest = std::min(lowest, t[per_window / 2]);
    }
    return lowest;
  };
  for (int round = 0; round < 2 && size > 1; ++round) {
    const int partner = partner_in(round, rank, size);
    const double alpha = time_s(partner, 1, effort.pings);
    const double transfer = time_s(partner, effort.transfer_bytes, effort.transfers);
    if (partner < 0) continue;
    const int at = is_tcp(partner) ? 2 : 0;
    measured[at] = std::max(measured[at], alpha);
    measured[at + 1] =
        std::max(measured[at + 1], std::max(transfer - alpha, alpha) / effort.transfer_bytes);
  }
  const std::vector<double> agreed = max_over_ranks(run, rank, size, measured);
  CostModel model = defaults;
  if (agreed[0] > 0) model.shm = LinkCost{agreed[0], agreed[1]};
  if (agreed[2] > 0) model.tcp = LinkCost{agreed[2], agreed[3]};
  model.gamma_s_per_b = agreed[4];
  return model;
}

}  // namespace weft
