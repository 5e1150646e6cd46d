#include "core/tune/probe.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <string>
#include <thread>
#include <unordered_map>
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

// At most how many of `round`'s pairs leave one host at once, in one
// direction (at least 1). They share that host's link, and the model's tcp
// beta is a lone flow's: the simulator and the closed form divide a link
// among the flows that cross it.
int flows_leaving_a_host(int round, int size, const std::function<std::string(int)>& host_of) {
  std::unordered_map<std::string, int> leaving;
  int most = 1;
  for (int r = 0; r < size; ++r) {
    const int partner = partner_in(round, r, size);
    if (partner < 0) continue;
    const std::string host = host_of(r);
    if (host != host_of(partner)) most = std::max(most, ++leaving[host]);
  }
  return most;
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
                           const std::function<bool(int)>& is_tcp,
                           const std::function<std::string(int)>& host_of,
                           const CostModel& defaults, const ProbeEffort& effort) {
  // measured[0..1]: shm alpha, beta; [2..3]: tcp alpha, beta; [4]: gamma;
  // [5..6]: shm, tcp beta past the caches.
  std::vector<double> measured(7, 0.0);
  measured[4] = reduce_cost();
  const size_t longest = std::max(effort.transfer_bytes, effort.large_bytes);
  std::vector<char> in(longest), out(longest);
  // Each window is timed as a collective's steps run: every pair exchanging
  // at once, back to back, and the window costing what its slowest rank
  // took. (Pairs timed one exchange at a time measure the machine's cores to
  // themselves whenever the other pairs are between exchanges: 4 tcp ranks on
  // 2 cores got twice the rate their collectives get.) Of the windows, the
  // lowest counts, so the first messages after connecting or a stretch when
  // another process held the CPU do not become the link's cost. Returns, per
  // kind of link (shm, tcp), seconds per exchange, or 0 where no pair used it.
  const Plan barrier = max_of_doubles(rank, size, 1);
  const double nothing = 0;
  double ignored = 0;
  auto time_s = [&](int partner, size_t bytes, int times) {
    const Plan plan = pair_exchange(partner, bytes);
    const int windows = std::max(1, std::min(effort.windows, times));
    const int per_window = std::max(1, times / windows);
    const int kind = partner < 0 ? -1 : is_tcp(partner) ? 1 : 0;
    // [k * windows + w]: this rank's seconds per exchange in window w over
    // links of kind k.
    std::vector<double> seconds(2 * windows, 0.0);
    for (int w = 0; w < windows; ++w) {
      // A rank that sleeps is placed afresh when it wakes: two ranks left
      // sharing one core (pings then cost a context switch) get another
      // chance at a core each.
      if (w > 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
      run(barrier, &nothing, &ignored, DataType::Float64, ReduceOp::Max);
      const double start = now_s();
      for (int i = 0; i < per_window; ++i) {
        run(plan, in.data(), out.data(), DataType::UInt8, ReduceOp::Sum);
      }
      if (kind >= 0) seconds[kind * windows + w] = (now_s() - start) / per_window;
    }
    const std::vector<double> slowest = max_over_ranks(run, rank, size, seconds);
    std::array<double, 2> lowest{};
    for (int k = 0; k < 2; ++k) {
      const auto first = slowest.begin() + k * windows;
      lowest[k] = *std::min_element(first, first + windows);
    }
    return lowest;
  };
  auto beta = [](double transfer, double alpha, size_t bytes) {
    return std::max(transfer - alpha, alpha) / static_cast<double>(bytes);
  };
  for (int round = 0; round < 2 && size > 1; ++round) {
    const int partner = partner_in(round, rank, size);
    const std::array<double, 2> alpha = time_s(partner, 1, effort.pings);
    const std::array<double, 2> transfer = time_s(partner, effort.transfer_bytes, effort.transfers);
    std::array<double, 2> large{};
    if (effort.large_bytes > 0) large = time_s(partner, effort.large_bytes, effort.large_transfers);
    const int sharing = flows_leaving_a_host(round, size, host_of);
    for (int k = 0; k < 2; ++k) {
      if (alpha[k] <= 0) continue;
      const double flows = k == 1 ? sharing : 1;  // tcp between hosts: per flow
      measured[2 * k] = std::max(measured[2 * k], alpha[k]);
      measured[2 * k + 1] =
          std::max(measured[2 * k + 1], beta(transfer[k], alpha[k], effort.transfer_bytes) / flows);
      if (large[k] > 0) {
        measured[5 + k] =
            std::max(measured[5 + k], beta(large[k], alpha[k], effort.large_bytes) / flows);
      }
    }
  }
  const std::vector<double> agreed = max_over_ranks(run, rank, size, measured);
  CostModel model = defaults;
  if (agreed[0] > 0) model.shm = LinkCost{agreed[0], agreed[1], agreed[5]};
  if (agreed[2] > 0) model.tcp = LinkCost{agreed[2], agreed[3], agreed[6]};
  model.gamma_s_per_b = agreed[4];
  if (effort.large_bytes > 0) {
    model.small_bytes = effort.transfer_bytes;
    model.large_bytes = effort.large_bytes;
  }
  return model;
}

}  // namespace weft
