#include "core/sim/core_calendar.h"

#include <iterator>
#include <limits>

namespace weft::sim {
namespace {

// The earliest start from t of `seconds` free on a core busy at `busy`.
double earliest_gap(const std::map<double, double>& busy, double t, double seconds) {
  double start = t;
  auto next = busy.upper_bound(start);
  if (next != busy.begin() && std::prev(next)->second > start) start = std::prev(next)->second;
  for (; next != busy.end() && next->first < start + seconds; ++next) {
    if (next->second > start) start = next->second;
  }
  return start;
}

}  // namespace

double CoreCalendar::book(double t, double seconds) {
  if (!(seconds > 0)) return t;
  double best = std::numeric_limits<double>::infinity();
  std::map<double, double>* core = nullptr;
  for (auto& busy : busy_) {
    const double start = earliest_gap(busy, t, seconds);
    if (start < best) best = start, core = &busy;
  }
  core->emplace(best, best + seconds);
  return best + seconds;
}

void CoreCalendar::forget_until(double t) {
  for (auto& busy : busy_) {
    while (!busy.empty() && busy.begin()->second <= t) busy.erase(busy.begin());
  }
}

}  // namespace weft::sim
