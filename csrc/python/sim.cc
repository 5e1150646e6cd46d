// weft._C.sim: networks, Programs (every rank's Plan, compact) and the event
// simulation, for weft.topo.simulate. Built-in Plans are made here through
// build_plan(), the same plan_for() a communicator calls, a batch of ranks at
// a time, and packed at once, so no world's Plans are ever all held as Steps.
#include "sim.h"

#include <pybind11/stl.h>

#include <algorithm>
#include <exception>
#include <memory>
#include <set>
#include <thread>
#include <tuple>
#include <utility>

#include "core/common/error.h"
#include "core/sim/simulator.h"
#include "plan_export.h"

namespace py = pybind11;

namespace weft::python {
namespace {

using LinkTuple = std::tuple<int, int, double, double, bool, double>;
using PoolTuple = std::tuple<int, double, double>;  // cores, s_per_b, s_per_message
// (kind, recv, send, send_bytes, recv_bytes, compute_bytes, wait_sends, channel, after)
using StepTuple = std::tuple<std::string, int, int, uint64_t, uint64_t, uint64_t, bool, int,
                             std::vector<uint32_t>>;

sim::SimStep::Kind kind_of(const std::string& name, int rank, size_t step) {
  if (name == "fused") return sim::SimStep::Fused;
  if (name == "exchange") return sim::SimStep::Exchange;
  if (name == "compute") return sim::SimStep::Compute;
  throw InvalidArgument("simulation: rank " + std::to_string(rank) + " step " +
                        std::to_string(step) + ": kind '" + name +
                        "': use fused, exchange or compute");
}

// Every rank's Plan of a built-in, packed in rank order; returns the Plans'
// algorithm. Making them is about as long as simulating them (a 4096-rank
// ring is 33 million steps), so each batch of ranks is planned on every
// core, then packed by this thread; the world's hosts are grouped once.
std::string add_builtin_plans(sim::Programs& programs, const PlanRequest& q) {
  PlanContext world = plan_context(q);
  world.groups = std::make_shared<const algo::HostGroups>(algo::host_groups(world.host));
  const int workers = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<PlanContext> contexts(workers, world);
  constexpr int kBatch = 32;
  std::vector<Plan> plans(kBatch);
  std::string name;
  for (int first = 0; first < programs.ranks(); first += kBatch) {
    const int n = std::min(kBatch, programs.ranks() - first);
    std::vector<std::exception_ptr> failed(workers);
    auto plan_share = [&](int w) {
      try {
        for (int i = w; i < n; i += workers) {
          contexts[w].rank = first + i;
          plans[i] = build_plan(q, contexts[w]);
        }
      } catch (...) {
        failed[w] = std::current_exception();
      }
    };
    std::vector<std::thread> helpers;
    for (int w = 1; w < std::min(workers, n); ++w) helpers.emplace_back(plan_share, w);
    plan_share(0);
    for (std::thread& t : helpers) t.join();
    for (const std::exception_ptr& e : failed) {
      if (e) std::rethrow_exception(e);
    }
    for (int i = 0; i < n; ++i) {
      programs.add_plan(first + i, plans[i], q.elem_size);
      name = plans[i].algorithm;
    }
  }
  return name;
}

}  // namespace

void bind_sim(py::module_& parent) {
  py::module_ m = parent.def_submodule("sim", "Event simulation of Plans on a network.");

  py::class_<sim::Network>(m, "Network", "Nodes, links and the ranks' nodes.")
      .def(py::init([](int nodes, std::vector<int> rank_nodes, const std::vector<LinkTuple>& ls,
                       const std::vector<PoolTuple>& pools, std::vector<int> rank_pool,
                       bool ranks_forward) {
             std::vector<sim::Link> links;
             links.reserve(ls.size());
             for (const auto& [a, b, latency, bandwidth, duplex, burst] : ls) {
               links.push_back({a, b, latency, bandwidth, duplex, burst});
             }
             std::vector<sim::CpuPool> cpus;
             for (const auto& [cores, s_per_b, s_per_message] : pools) {
               cpus.push_back({cores, s_per_b, s_per_message});
             }
             sim::Network net(nodes, std::move(rank_nodes), std::move(links), std::move(cpus),
                              std::move(rank_pool));
             net.set_ranks_forward(ranks_forward);
             return net;
           }),
           py::arg("nodes"), py::arg("rank_nodes"), py::arg("links"),
           py::arg("pools") = std::vector<PoolTuple>{}, py::arg("rank_pool") = std::vector<int>{},
           py::arg("ranks_forward") = true,
           "links: (a, b, latency_s, bandwidth in bytes/s, duplex, burst_bytes) tuples; pools: "
           "(cores, s_per_b, s_per_message) CPU pools, rank_pool: each rank's pool index or -1 (or "
           "empty); "
           "ranks_forward=False: routes go around other ranks' nodes.")
      .def_property_readonly("ranks", &sim::Network::ranks)
      .def(
          "route",
          [](const sim::Network& net, int from, int to, int salt) {
            if (from < 0 || from >= net.ranks() || to < 0 || to >= net.ranks()) {
              throw InvalidArgument("route: ranks must lie in 0.." +
                                    std::to_string(net.ranks() - 1));
            }
            std::vector<sim::Hop> hops;
            if (!net.route(from, to, hops, salt)) return py::object(py::none());
            return py::object(py::cast(hops));
          },
          py::arg("from_rank"), py::arg("to_rank"), py::arg("tag") = 0,
          "The hops (link * 2 + direction, 0 from a to b) of the route a channel of tag `tag` "
          "takes, or None.");

  py::class_<sim::Programs>(m, "Programs", "Every rank's steps, compact.")
      .def(py::init<int>(), py::arg("ranks"))
      .def(
          "add_rank",
          [](sim::Programs& p, int rank, const std::vector<StepTuple>& steps,
             const std::vector<int>& tags) {
            std::vector<sim::StepSpec> specs;
            specs.reserve(steps.size());
            for (size_t i = 0; i < steps.size(); ++i) {
              const auto& [kind, recv, send, sb, rb, cb, wait_sends, channel, after] = steps[i];
              sim::StepSpec s;
              s.kind = kind_of(kind, rank, i);
              s.recv = recv;
              s.send = send;
              s.sizes.send_bytes = sb;
              s.sizes.recv_bytes = rb;
              s.sizes.compute_bytes = cb;
              s.sizes.wait_sends = wait_sends;
              s.channel = channel;
              s.after = after;
              specs.push_back(std::move(s));
            }
            p.add_rank(rank, specs, tags);
          },
          py::arg("rank"), py::arg("steps"), py::arg("tags"),
          "steps: (kind, recv, send, send_bytes, recv_bytes, compute_bytes, wait_sends, channel, "
          "after) tuples, peers -1 for none; kind fused, exchange or compute.")
      .def(
          "add_builtin",
          [](sim::Programs& p, const std::string& collective, const std::string& algorithm,
             size_t count, size_t elem_size, int root, bool in_place, bool finalize,
             size_t max_step_bytes, std::vector<int> hosts, int channels) {
            PlanRequest q{collective,       algorithm, 0,        p.ranks(), count,
                          elem_size,        root,      in_place, finalize,  max_step_bytes,
                          std::move(hosts), {},        true,     channels};
            py::gil_scoped_release release;
            return add_builtin_plans(p, q);
          },
          py::arg("collective"), py::arg("algorithm"), py::arg("count"), py::kw_only(),
          py::arg("elem_size") = 4, py::arg("root") = 0, py::arg("in_place") = false,
          py::arg("finalize") = false, py::arg("max_step_bytes") = 1 << 20,
          py::arg("hosts") = std::vector<int>{}, py::arg("channels") = 2,
          "Adds every rank's Plan of a built-in family (build_plan, as weft._C.topo.plan, for "
          "`channels` connection sets per peer); returns the Plan's algorithm name.")
      .def_property_readonly("total_steps", &sim::Programs::total_steps)
      .def_property_readonly(
          "connections",
          [](const sim::Programs& p) {
            std::set<std::pair<int, int>> pairs;
            for (const sim::ConnKey& k : p.conns()) pairs.emplace(k.src, k.dst);
            return std::vector<std::pair<int, int>>(pairs.begin(), pairs.end());
          },
          "Every (sending rank, receiving rank) pair some step sends over, sorted.");

  m.def(
      "simulate",
      [](const sim::Network& net, const sim::Programs& programs, size_t slice_bytes, int slots,
         double gamma_s_per_b, size_t trace_limit, int calls, int warmup_calls) {
        sim::SimResult r;
        {
          py::gil_scoped_release release;
          r = sim::simulate(net, programs,
                            {slice_bytes, slots, gamma_s_per_b, trace_limit, calls, warmup_calls});
        }
        py::list trace;
        for (const sim::WireUse& w : r.trace) {
          trace.append(py::make_tuple(w.hop, w.rank, w.start_s, w.end_s));
        }
        py::dict out;
        out["time_s"] = r.time_s;
        out["warmed_s"] = r.warmed_s;
        out["rank_done"] = std::move(r.rank_done);
        out["hop_bytes"] = std::move(r.hop_bytes);
        out["hop_busy_s"] = std::move(r.hop_busy_s);
        out["messages"] = r.messages;
        out["events"] = r.events;
        out["min_route_latency_s"] = r.min_route_latency_s;
        out["trace"] = trace;
        return out;
      },
      py::arg("network"), py::arg("programs"), py::kw_only(), py::arg("slice_bytes") = 256 << 10,
      py::arg("slots") = 8, py::arg("gamma_s_per_b") = 0.0, py::arg("trace_limit") = 0,
      py::arg("calls") = 1, py::arg("warmup_calls") = 0,
      "Runs the event simulation (`calls` runs of the Programs, back to back on every rank); a "
      "dict of time_s (the last call's end), warmed_s (the end of the first warmup_calls, on the "
      "slowest rank), "
      "rank_done, hop_bytes, hop_busy_s (per hop, over all calls), messages, events, "
      "min_route_latency_s, and trace: the first trace_limit wire uses as (hop, sending rank, "
      "start_s, end_s).");
}

}  // namespace weft::python
