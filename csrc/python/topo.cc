// weft._C.topo: the tuner's cost model for Python, so a user can ask what an
// algorithm would cost on a world no machine here has.
#include "topo.h"

#include <pybind11/stl.h>

#include <tuple>

#include "core/common/error.h"
#include "core/tune/cost_model.h"
#include "core/tune/family_probe.h"
#include "plan_export.h"
#include "plan_source.h"

namespace py = pybind11;

namespace weft::python {
namespace {

using MeasuredPoint = std::tuple<std::string, std::string, size_t, double>;

}  // namespace

void bind_topo(py::module_& parent) {
  py::module_ m = parent.def_submodule(
      "topo", "The alpha-beta-gamma cost model of the tuner, and the built-in Plans as data.");
  bind_plan_export(m);
  bind_plan_source(m);

  py::class_<LinkCost>(m, "LinkCost",
                       "Cost of one message: alpha + bytes * beta seconds (beta_large for "
                       "buffers of the model's large_bytes and more; 0: beta there too).")
      .def(py::init([](double alpha_s, double beta_s_per_b, double beta_large_s_per_b) {
             return LinkCost{alpha_s, beta_s_per_b, beta_large_s_per_b};
           }),
           py::arg("alpha_s"), py::arg("beta_s_per_b"), py::arg("beta_large_s_per_b") = 0.0)
      .def_readwrite("alpha_s", &LinkCost::alpha_s)
      .def_readwrite("beta_s_per_b", &LinkCost::beta_s_per_b)
      .def_readwrite("beta_large_s_per_b", &LinkCost::beta_large_s_per_b)
      .def("__repr__", [](const LinkCost& l) {
        return "LinkCost(alpha_s=" + std::to_string(l.alpha_s) +
               ", beta_s_per_b=" + std::to_string(l.beta_s_per_b) +
               ", beta_large_s_per_b=" + std::to_string(l.beta_large_s_per_b) + ")";
      });

  py::class_<CostModel>(m, "CostModel", "Link costs per transport and the reduction cost.")
      .def(py::init<>())
      .def_readwrite("shm", &CostModel::shm)
      .def_readwrite("tcp", &CostModel::tcp)
      .def_readwrite("gamma_s_per_b", &CostModel::gamma_s_per_b)
      .def_readwrite("small_bytes", &CostModel::small_bytes,
                     "The buffer size the links' beta was measured at (0: beta holds at every "
                     "size).")
      .def_readwrite("large_bytes", &CostModel::large_bytes,
                     "The buffer size their beta_large was measured at (0: not measured).")
      .def_property(
          "measured",
          [](const CostModel& model) {
            std::vector<MeasuredPoint> points;
            for (const MeasuredCost& p : model.measured) {
              points.emplace_back(to_string(p.collective), to_string(p.algorithm), p.bytes,
                                  p.seconds);
            }
            return points;
          },
          [](CostModel& model, const std::vector<MeasuredPoint>& points) {
            model.measured.clear();
            for (const auto& [collective, algorithm, bytes, seconds] : points) {
              model.measured.push_back(
                  {parse_collective(collective), parse_algorithm(algorithm), bytes, seconds});
            }
          },
          "Whole Plans timed on a live world: (collective, algorithm, bytes per rank, seconds) "
          "tuples, which choose() believes over the links' figures (empty unless measured). "
          "A copy: assign a new list to change it.")
      .def("__str__", &format_cost_model);

  py::class_<Topology>(m, "Topology", "The shape of a world.")
      .def(py::init([](int size, int hosts, int ranks_per_host, bool any_tcp, bool ranks_by_host,
                       size_t step_bytes, size_t slice_bytes) {
             if (size < 1 || hosts < 1 || hosts > size) {
               throw InvalidArgument("Topology needs 1 <= hosts <= size");
             }
             // By default, ranks spread evenly when they can be.
             if (ranks_per_host < 0) ranks_per_host = size % hosts == 0 ? size / hosts : 0;
             Topology topology;
             topology.size = size;
             topology.hosts = hosts;
             topology.ranks_per_host = ranks_per_host;
             topology.any_tcp = any_tcp || hosts > 1;
             topology.ranks_by_host = ranks_by_host;
             topology.step_bytes = step_bytes;
             if (slice_bytes == 0) throw InvalidArgument("Topology needs slice_bytes >= 1");
             topology.slice_bytes = slice_bytes;
             return topology;
           }),
           py::arg("size"), py::arg("hosts") = 1, py::arg("ranks_per_host") = -1,
           py::arg("any_tcp") = false, py::arg("ranks_by_host") = true,
           py::arg("step_bytes") = Topology{}.step_bytes,
           py::arg("slice_bytes") = Topology{}.slice_bytes,
           "ranks_per_host=-1: size/hosts when that divides evenly, else 0 (uneven); several "
           "hosts imply tcp. ranks_by_host: rank r is on host r // ranks_per_host, as "
           "launchers number them. step_bytes: a Plan step's budget, which sets the size of "
           "hier's pieces. slice_bytes: the largest message, in which a chain forwards.")
      .def_readwrite("size", &Topology::size)
      .def_readwrite("hosts", &Topology::hosts)
      .def_readwrite("ranks_per_host", &Topology::ranks_per_host)
      .def_readwrite("any_tcp", &Topology::any_tcp)
      .def_readwrite("ranks_by_host", &Topology::ranks_by_host)
      .def_readwrite("step_bytes", &Topology::step_bytes)
      .def_readwrite("slice_bytes", &Topology::slice_bytes)
      .def_static(
          "of_hosts",
          [](const std::vector<int>& host_of_rank) {
            if (host_of_rank.empty()) throw InvalidArgument("Topology.of_hosts needs a rank");
            Topology topology = topology_of_hosts(host_of_rank);
            topology.any_tcp = topology.hosts > 1;
            return topology;
          },
          py::arg("host_of_rank"),
          "The shape of the world whose rank r lies on host host_of_rank[r] (any numbering), as "
          "a communicator sees its own.");

  py::list tuned;
  for (Collective c : kTunedCollectives) tuned.append(to_string(c));
  m.attr("TUNED") = py::tuple(tuned);
  m.def(
      "algorithms_for",
      [](const std::string& collective, const Topology& topo) {
        std::vector<std::string> names;
        for (Algorithm a : algorithms_for(parse_collective(collective), topo)) {
          names.push_back(to_string(a));
        }
        return names;
      },
      py::arg("collective"), py::arg("topology"),
      "Algorithm families that implement `collective` on `topology`.");
  m.def(
      "predict",
      [](const std::string& algorithm, const std::string& collective, size_t nbytes,
         const Topology& topo, const CostModel& model, bool in_place) {
        return predict(parse_algorithm(algorithm), parse_collective(collective), nbytes, topo,
                       model, in_place);
      },
      py::arg("algorithm"), py::arg("collective"), py::arg("nbytes"), py::arg("topology"),
      py::arg("model") = CostModel{}, py::kw_only(), py::arg("in_place") = false,
      "Predicted seconds for `nbytes` per rank, out of place or in place.");
  m.def(
      "choose",
      [](const std::string& collective, size_t nbytes, const Topology& topo, const CostModel& model,
         bool in_place) {
        const Choice c =
            choose(parse_collective(collective), nbytes, topo, model, Algorithm::Auto, in_place);
        return py::make_tuple(to_string(c.algorithm), c.predicted_s);
      },
      py::arg("collective"), py::arg("nbytes"), py::arg("topology"), py::arg("model") = CostModel{},
      py::kw_only(), py::arg("in_place") = false,
      "(algorithm, predicted seconds) the tuner would pick, out of place or in place.");
  m.attr("MEASURED_BYTES") = py::tuple(
      py::cast(std::vector<size_t>(std::begin(kMeasuredBytes), std::end(kMeasuredBytes))));
  m.def("at_buffer", &at_buffer, py::arg("model"), py::arg("nbytes"),
        "The model for calls on nbytes per rank: each link's beta up to small_bytes, its "
        "beta_large from large_bytes, the line between them in log2(nbytes) between.");
  m.def("load_cost_model", &load_cost_model, py::arg("path"),
        "Reads a model written by save_cost_model (the format WEFT_TUNE=<file> takes).");
  m.def(
      "save_cost_model",
      [](const CostModel& model, const std::string& path) {
        py::module_::import("pathlib").attr("Path")(path).attr("write_text")(
            format_cost_model(model));
      },
      py::arg("model"), py::arg("path"));
}

}  // namespace weft::python
