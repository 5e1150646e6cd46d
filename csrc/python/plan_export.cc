#include "plan_export.h"

#include <pybind11/stl.h>

#include <algorithm>
#include <initializer_list>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "core/algo/algorithms.h"
#include "core/common/error.h"
#include "core/tune/cost_model.h"

namespace py = pybind11;

namespace weft::python {
namespace {

const char* kind_name(Step::Kind k) {
  switch (k) {
    case Step::Kind::Fused: return "fused";
    case Step::Kind::Exchange: return "exchange";
    case Step::Kind::LocalReduce: return "local_reduce";
    case Step::Kind::Reduce: return "reduce";
  }
  return "?";
}

py::object span(const std::optional<Span>& s) {
  if (!s) return py::none();
  return py::make_tuple(to_string(s->buf), s->offset, s->count);
}

py::object peer(int p) {
  if (p < 0) return py::none();
  return py::int_(p);
}

py::dict export_plan(const Plan& plan) {
  py::list steps;
  for (const Step& s : plan.steps) {
    py::dict d;
    d["kind"] = kind_name(s.kind);
    d["recv"] = peer(s.recv_peer);
    d["send"] = peer(s.send_peer);
    d["local"] = span(s.local);
    d["dst"] = span(s.dst);
    d["operand"] = span(s.operand);
    d["count"] = s.count;
    d["finalize"] = s.finalize;
    d["wait_sends"] = s.wait_sends;
    d["copy_sends"] = s.copy_sends;
    d["channel"] = s.channel;
    d["after"] = s.after;
    steps.append(d);
  }
  py::dict out;
  out["algorithm"] = plan.algorithm;
  out["scratch"] = plan.scratch_count;
  out["steps"] = steps;
  out["channel_tags"] = plan.channel_tags;
  return out;
}

// d[key] as T, refusing conversions: a bool must be a bool, a number an int.
template <typename T>
T field(const py::dict& d, const char* key, const std::string& where) {
  if (!d.contains(key)) throw InvalidArgument(where + ": missing '" + key + "'");
  const py::handle value = d[key];
  const bool is_bool = py::isinstance<py::bool_>(value);
  bool fits = true;
  if constexpr (std::is_same_v<T, bool>) {
    fits = is_bool;
  } else if constexpr (std::is_integral_v<T>) {
    fits = py::isinstance<py::int_>(value) && !is_bool;
  }
  try {
    if (fits) return value.cast<T>();
  } catch (const py::cast_error&) {
  }
  throw InvalidArgument(where + ": '" + key + "' has the wrong type or range");
}

// Keys the executor does not know would be silently ignored: refuse them.
void only_keys(const py::dict& d, std::initializer_list<const char*> known,
               const std::string& where) {
  for (const auto& item : d) {
    const std::string key = py::str(item.first);
    bool ok = false;
    for (const char* k : known) ok = ok || key == k;
    if (!ok) throw InvalidArgument(where + ": the executor knows no '" + key + "'");
  }
}

std::optional<Span> import_span(const py::dict& d, const char* key, const std::string& where) {
  if (!d.contains(key) || d[key].is_none()) return std::nullopt;
  const auto t = field<std::tuple<std::string, size_t, size_t>>(d, key, where);
  const std::string& b = std::get<0>(t);
  if (b != "input" && b != "output" && b != "scratch") {
    throw InvalidArgument(where + ": " + key + " names buffer '" + b +
                          "': use input, output or scratch");
  }
  const Buf buf = b == "input" ? Buf::Input : b == "output" ? Buf::Output : Buf::Scratch;
  return Span{buf, std::get<1>(t), std::get<2>(t)};
}

int import_peer(const py::dict& d, const char* key, const std::string& where) {
  if (!d.contains(key) || d[key].is_none()) return -1;
  const int peer = field<int>(d, key, where);
  if (peer < 0) throw InvalidArgument(where + ": " + key + " peer " + std::to_string(peer));
  return peer;
}

// A family named for a collective whose families depend on the world must
// have a form on this one (rhd's allgather, say, needs a power of two).
void check_family_fits(const PlanRequest& q, const std::vector<int>& hosts) {
  if (q.algorithm == "auto") return;
  const auto tuned = std::find_if(std::begin(kTunedCollectives), std::end(kTunedCollectives),
                                  [&](Collective c) { return q.collective == to_string(c); });
  if (tuned == std::end(kTunedCollectives)) return;
  const Collective c = *tuned;
  const Topology world = topology_of_hosts(hosts);
  const std::vector<Algorithm> fit = algorithms_for(c, world);
  if (std::find(fit.begin(), fit.end(), parse_algorithm(q.algorithm)) != fit.end()) return;
  std::string names;
  for (Algorithm a : fit) names += (names.empty() ? "" : ", ") + std::string(to_string(a));
  throw InvalidArgument(q.collective + " has no " + q.algorithm + " form on " +
                        std::to_string(q.size) + " ranks over " + std::to_string(world.hosts) +
                        " host(s): use one of " + names);
}

}  // namespace

Plan import_plan(const py::dict& d) {
  Plan plan;
  only_keys(d, {"algorithm", "scratch", "steps", "channel_tags"}, "plan");
  plan.algorithm = field<std::string>(d, "algorithm", "plan");
  plan.scratch_count = field<size_t>(d, "scratch", "plan");
  if (d.contains("channel_tags")) {
    for (const py::handle tag : field<py::list>(d, "channel_tags", "plan")) {
      if (!py::isinstance<py::int_>(tag) || py::isinstance<py::bool_>(tag) ||
          tag.cast<long long>() < 0 || tag.cast<long long>() > 255) {
        throw InvalidArgument("plan: channel_tags must be integers from 0 to 255");
      }
      plan.channel_tags.push_back(static_cast<uint8_t>(tag.cast<int>()));
    }
  }
  const auto steps = field<py::list>(d, "steps", "plan");
  for (size_t i = 0; i < steps.size(); ++i) {
    const std::string where = "plan step " + std::to_string(i);
    if (!py::isinstance<py::dict>(steps[i])) throw InvalidArgument(where + ": not a dict");
    const auto s = steps[i].cast<py::dict>();
    only_keys(s,
              {"kind", "recv", "send", "local", "dst", "operand", "count", "finalize", "wait_sends",
               "copy_sends", "channel", "after"},
              where);
    Step step;
    const auto kind = field<std::string>(s, "kind", where);
    if (kind == "fused") {
      step.kind = Step::Kind::Fused;
    } else if (kind == "exchange") {
      step.kind = Step::Kind::Exchange;
    } else if (kind == "local_reduce") {
      step.kind = Step::Kind::LocalReduce;
    } else if (kind == "reduce") {
      step.kind = Step::Kind::Reduce;
    } else {
      throw InvalidArgument(where + ": kind '" + kind +
                            "': the executor runs fused, exchange, local_reduce and reduce steps");
    }
    step.recv_peer = import_peer(s, "recv", where);
    step.send_peer = import_peer(s, "send", where);
    step.local = import_span(s, "local", where);
    step.dst = import_span(s, "dst", where);
    step.operand = import_span(s, "operand", where);
    step.count = field<size_t>(s, "count", where);
    step.finalize = s.contains("finalize") && field<bool>(s, "finalize", where);
    step.wait_sends = s.contains("wait_sends") && field<bool>(s, "wait_sends", where);
    step.copy_sends = s.contains("copy_sends") && field<bool>(s, "copy_sends", where);
    if (s.contains("channel")) step.channel = field<uint16_t>(s, "channel", where);
    if (s.contains("after")) step.after = field<std::vector<uint32_t>>(s, "after", where);
    plan.steps.push_back(step);
  }
  return plan;
}

PlanContext plan_context(const PlanRequest& q) {
  const size_t ranks = static_cast<size_t>(q.size);
  if (q.size < 1 || q.rank < 0 || q.rank >= q.size || q.root < 0 || q.root >= q.size) {
    throw InvalidArgument("plan: rank " + std::to_string(q.rank) + " and root " +
                          std::to_string(q.root) + " must lie in a world of " +
                          std::to_string(q.size) + " ranks (size >= 1)");
  }
  std::vector<int> hosts = q.hosts.empty() ? std::vector<int>(ranks, 0) : q.hosts;
  if (hosts.size() != ranks || (!q.shared_cpu.empty() && q.shared_cpu.size() != ranks)) {
    throw InvalidArgument("plan: hosts (" + std::to_string(hosts.size()) + " entries) and " +
                          "shared_cpu (" + std::to_string(q.shared_cpu.size()) +
                          ") need one entry per rank of " + std::to_string(q.size) +
                          "; either may be empty");
  }
  if (q.elem_size == 0 || q.max_step_bytes == 0) {
    throw InvalidArgument("plan: elem_size and max_step_bytes must be positive");
  }
  check_family_fits(q, hosts);
  return PlanContext{q.rank,           q.size,           q.elem_size,
                     q.max_step_bytes, std::move(hosts), q.buffered_sends,
                     q.shared_cpu,     q.channels,       nullptr};
}

Plan build_plan(const PlanRequest& q, const PlanContext& ctx) {
  if (q.collective == "alltoall") {
    const std::vector<size_t> counts(static_cast<size_t>(ctx.size), q.count);
    return algo::pairwise_alltoall(ctx, counts, counts);
  }
  if (q.collective == "gather") return algo::direct_gather(ctx, q.count, q.root);
  if (q.collective == "scatter") return algo::direct_scatter(ctx, q.count, q.root);
  return algo::plan_for(parse_collective(q.collective), parse_algorithm(q.algorithm), ctx, q.count,
                        q.root, q.in_place, q.finalize);
}

Plan build_plan(const PlanRequest& q) { return build_plan(q, plan_context(q)); }

void bind_plan_export(py::module_& topo) {
  topo.def(
      "plan",
      [](const std::string& collective, const std::string& algorithm, int rank, int size,
         size_t count, size_t elem_size, int root, bool in_place, bool finalize,
         size_t max_step_bytes, std::vector<int> hosts, std::vector<int> shared_cpu,
         bool buffered_sends, int channels) {
        if (channels < 1) throw InvalidArgument("plan: channels must be at least 1");
        return export_plan(build_plan({collective, algorithm, rank, size, count, elem_size, root,
                                       in_place, finalize, max_step_bytes, std::move(hosts),
                                       std::move(shared_cpu), buffered_sends, channels}));
      },
      py::arg("collective"), py::arg("algorithm"), py::arg("rank"), py::arg("size"),
      py::arg("count"), py::kw_only(), py::arg("elem_size") = 4, py::arg("root") = 0,
      py::arg("in_place") = false, py::arg("finalize") = false, py::arg("max_step_bytes") = 1 << 20,
      py::arg("hosts") = std::vector<int>{}, py::arg("shared_cpu") = std::vector<int>{},
      py::arg("buffered_sends") = true, py::arg("channels") = 1,
      "Rank `rank`'s Plan of `collective` (allreduce, reduce_scatter, allgather, broadcast, "
      "reduce, barrier; alltoall, gather, scatter in the direct family) in family `algorithm`, "
      "as the executor runs it: dict(algorithm, scratch, steps), each step a dict(kind, recv, "
      "send, local, dst, operand, count, finalize, wait_sends, copy_sends, channel, after), "
      "spans as (buffer, offset, count) in elements, and channel_tags (empty: one channel). "
      "`channels` is how many channel tags the Plan may use (a communicator's WEFT_CHANNELS).");
}

}  // namespace weft::python
