// The busy stretches of CPU cores during a simulation: a CPU pool's (network.h's
// CpuPool), or one rank's thread (a calendar of one core). A channel runs ahead
// of the event clock on its own (a fused step's reductions and sends take no
// event), so work is booked out of time order: a request takes the earliest
// gap of its length, from the time it can start, on whichever core has it first.
#pragma once

#include <cstddef>
#include <map>
#include <vector>

namespace weft::sim {

class CoreCalendar {
 public:
  explicit CoreCalendar(int cores) : busy_(static_cast<size_t>(cores)) {}

  struct Gap {
    double start;
    size_t core;
  };
  // The earliest gap of `seconds` from t on any core (t itself where none is
  // busy then).
  Gap earliest(double t, double seconds) const;
  void take(const Gap& gap, double seconds) {
    busy_[gap.core].emplace(gap.start, gap.start + seconds);
  }

  // Forgets the stretches that end by t: no request comes earlier (the
  // simulation's events run in time order and channels book at or after theirs).
  void forget_until(double t);

 private:
  std::vector<std::map<double, double>> busy_;  // per core: start -> end, apart
};

}  // namespace weft::sim
