// The busy stretches of one CPU pool's cores (network.h's CpuPool) during a
// simulation. A channel runs ahead of the event clock on its own (a fused
// step's reductions and sends take no event), so work is booked out of time
// order: a request takes the earliest gap of its length, from the time it can
// start, on whichever core has it first.
#pragma once

#include <cstddef>
#include <map>
#include <vector>

namespace weft::sim {

class CoreCalendar {
 public:
  explicit CoreCalendar(int cores) : busy_(static_cast<size_t>(cores)) {}

  // Books `seconds` of work that can start at t; returns when it ends.
  double book(double t, double seconds);

  // Forgets the stretches that end by t: no request comes earlier (the
  // simulation's events run in time order and channels book at or after theirs).
  void forget_until(double t);

 private:
  std::vector<std::map<double, double>> busy_;  // per core: start -> end, apart
};

}  // namespace weft::sim
