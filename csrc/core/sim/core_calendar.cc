#include "core/sim/core_calendar.h"

#include <iterator>

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

CoreCalendar::Gap CoreCalendar::earliest(double t, double seconds) const {
  Gap best{earliest_gap(busy_[0], t, seconds), 0};
  for (size_t c = 1; c < busy_.size() && best.start > t; ++c) {
    const double start = earliest_gap(busy_[c], t, seconds);
    if (start < best.start) best = {start, c};
  }
  return best;
}

void CoreCalendar::forget_until(double t) {
  for (auto& busy : busy_) {
    while (!busy.empty() && busy.begin()->second <= t) busy.erase(busy.begin());
  }
}

}  // namespace weft::sim
