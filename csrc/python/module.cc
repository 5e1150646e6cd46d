// weft._C: the core API for Python. Every call validates its buffers before
// anything is sent, releases the GIL while it runs and, with async_=True,
// returns a Handle that keeps the buffers alive until the operation is done.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>

#include "buffer.h"
#include "core/comm.h"
#include "core/common/config.h"
#include "core/common/error.h"
#include "core/transport/rdma/rdma_connection.h"
#include "errors.h"
#include "fast_method.h"
#include "plan_export.h"
#include "schedule.h"
#include "sim.h"
#include "store.h"
#include "topo.h"
#include "wire.h"
#ifdef WEFT_HAVE_CUDA
#include "cuda.h"
#endif

namespace py = pybind11;

namespace weft::python {
namespace {

// The pending result of an async_ call.
class Handle {
 public:
  Handle(std::shared_ptr<Work> work, py::object result, bool returns_source,
         std::vector<BufferView> buffers)
      : work_(std::move(work)),
        result_(std::move(result)),
        returns_source_(returns_source),
        buffers_(std::move(buffers)) {}

  // The operation still uses the buffers: finish it before letting go.
  ~Handle() {
    py::gil_scoped_release nogil;
    try {
      work_->wait(-1);
    } catch (...) {
    }
  }

  py::object wait(std::optional<double> timeout) {
    {
      py::gil_scoped_release nogil;
      work_->wait(timeout.value_or(-1));
    }
    return returns_source_ ? py::int_(work_->source()) : result_;
  }

  bool test() const { return work_->test(); }

 private:
  std::shared_ptr<Work> work_;
  py::object result_;
  bool returns_source_;
  std::vector<BufferView> buffers_;
};

double seconds(const py::object& timeout) {
  if (timeout.is_none()) return 0;
  if (py::hasattr(timeout, "total_seconds")) return timeout.attr("total_seconds")().cast<double>();
  double s = timeout.cast<double>();
  if (s <= 0) throw InvalidArgument("timeout must be positive, got " + std::to_string(s));
  return s;
}

py::object empty_like(const BufferView& like, size_t count) {
  return py::module_::import("weft._buffers").attr("empty_like")(like.object(), count);
}

void check_same_dtype(const BufferView& in, const BufferView& out, const char* op) {
  if (in.dtype() != out.dtype()) {
    throw InvalidArgument(std::string(op) + ": out has dtype " + to_string(out.dtype()) +
                          " but buf has " + to_string(in.dtype()) + "; they must match");
  }
}

void check_count(const BufferView& buf, size_t expected, const char* name, const char* op) {
  if (buf.count() != expected) {
    throw InvalidArgument(std::string(op) + ": " + name + " has " + std::to_string(buf.count()) +
                          " elements but must have " + std::to_string(expected));
  }
}

// buf, then out when given (same dtype and count). Without out the result is
// written into buf, which must then be writable.
std::vector<BufferView> in_and_optional_out(const py::object& buf, const py::object& out,
                                            const char* op) {
  std::vector<BufferView> views;
  views.emplace_back(buf, "buf", out.is_none());
  if (!out.is_none()) {
    views.emplace_back(out, "out", true);
    check_same_dtype(views[0], views[1], op);
    check_count(views[1], views[0].count(), "out", op);
  }
  return views;
}

class PyCommunicator {
 public:
  PyCommunicator(py::object store, int rank, int size, const std::string& name,
                 const py::object& timeout, const std::string& algo, int channels)
      : store_(std::make_unique<PyStore>(std::move(store))) {
    if (is_algorithm_file(algo.empty() ? config().algo : algo)) {
      throw InvalidArgument(
          "WEFT_ALGO=file: (or algo=file:) is for the torch backend; on a weft.Communicator, run "
          "the Algorithm with weft.topo.run (docs/topo.md)");
    }
    double t = seconds(timeout);
    py::gil_scoped_release nogil;
    comm_ = std::make_unique<Communicator>(*store_, rank, size, name, t, algo, channels);
  }

  ~PyCommunicator() {
    py::gil_scoped_release nogil;
    comm_.reset();
  }

  int rank() const { return comm_->rank(); }
  int size() const { return comm_->size(); }
  double timeout() const { return comm_->timeout_s(); }
  void set_timeout(const py::object& timeout) { comm_->set_timeout(seconds(timeout)); }
  std::string transport_to(int peer) const { return comm_->transport_to(peer); }
  CostModel cost_model() const { return comm_->cost_model(); }
  CostModel measure_cost_model(bool thorough) {
    py::gil_scoped_release nogil;
    return comm_->measure_cost_model(thorough ? kThoroughProbe : kQuickProbe);
  }
  Topology topology() const { return comm_->topology(); }
  std::vector<int> shared_cpu() const { return comm_->shared_cpu(); }

  py::tuple algorithm(const std::string& collective, size_t nbytes, bool in_place) const {
    const Choice c = comm_->choice(parse_collective(collective), nbytes, in_place);
    return py::make_tuple(to_string(c.algorithm), c.predicted_s);
  }

  bool trying(const std::string& collective, size_t nbytes, bool in_place) const {
    return comm_->trying(parse_collective(collective), nbytes, in_place);
  }

  py::object allreduce(const py::object& buf, const std::string& op, const py::object& out,
                       bool async_) {
    ReduceOp rop = parse_reduce_op(op);
    std::vector<BufferView> views = in_and_optional_out(buf, out, "allreduce");
    const BufferView& in = views[0];
    const BufferView& dst = views.back();
    return run(std::move(views), dst.object(), async_, [&] {
      return comm_->allreduce(in.data(), dst.data(), in.count(), in.dtype(), rop, async_);
    });
  }

  py::object reduce_scatter(const py::object& buf, const std::string& op, const py::object& out,
                            bool async_) {
    ReduceOp rop = parse_reduce_op(op);
    std::vector<BufferView> views;
    views.emplace_back(buf, "buf", false);
    size_t count = views[0].count() / size();
    if (views[0].count() % size() != 0) {
      throw InvalidArgument("reduce_scatter: buf has " + std::to_string(views[0].count()) +
                            " elements, not a multiple of the world size " +
                            std::to_string(size()));
    }
    views.emplace_back(out.is_none() ? empty_like(views[0], count) : out, "out", true);
    check_same_dtype(views[0], views[1], "reduce_scatter");
    check_count(views[1], count, "out", "reduce_scatter");
    const BufferView& in = views[0];
    const BufferView& dst = views[1];
    return run(std::move(views), dst.object(), async_, [&] {
      return comm_->reduce_scatter(in.data(), dst.data(), count, in.dtype(), rop, async_);
    });
  }

  py::object allgather(const py::object& buf, const py::object& out, bool async_) {
    std::vector<BufferView> views;
    views.emplace_back(buf, "buf", false);
    size_t count = views[0].count();
    views.emplace_back(out.is_none() ? empty_like(views[0], count * size()) : out, "out", true);
    check_same_dtype(views[0], views[1], "allgather");
    check_count(views[1], count * size(), "out", "allgather");
    const BufferView& in = views[0];
    const BufferView& dst = views[1];
    return run(std::move(views), dst.object(), async_,
               [&] { return comm_->allgather(in.data(), dst.data(), count, in.dtype(), async_); });
  }

  py::object broadcast(const py::object& buf, int root, bool async_) {
    std::vector<BufferView> views;
    views.emplace_back(buf, "buf", true);
    const BufferView& b = views[0];
    return run(std::move(views), b.object(), async_,
               [&] { return comm_->broadcast(b.data(), b.count(), b.dtype(), root, async_); });
  }

  py::object reduce(const py::object& buf, int root, const std::string& op, const py::object& out,
                    bool async_) {
    ReduceOp rop = parse_reduce_op(op);
    // buf must be writable (without out) on every rank, not only at the root:
    // all ranks must refuse the same calls, or the ones that went ahead would
    // wait for the others.
    std::vector<BufferView> views = in_and_optional_out(buf, out, "reduce");
    const BufferView& in = views[0];
    const BufferView& dst = views.back();
    return run(std::move(views), dst.object(), async_, [&] {
      return comm_->reduce(in.data(), dst.data(), in.count(), in.dtype(), rop, root, async_);
    });
  }

  py::object barrier(bool async_) {
    return run({}, py::none(), async_, [&] { return comm_->barrier(async_); });
  }

  py::object alltoall(const py::object& buf, const py::object& out,
                      std::optional<std::vector<size_t>> send_counts,
                      std::optional<std::vector<size_t>> recv_counts, bool async_) {
    std::vector<BufferView> views;
    views.emplace_back(buf, "buf", false);
    views.emplace_back(out, "out", true);
    check_same_dtype(views[0], views[1], "alltoall");
    auto sends = counts_or_split(send_counts, views[0], "send_counts");
    auto recvs = counts_or_split(recv_counts, views[1], "recv_counts");
    const BufferView& in = views[0];
    const BufferView& dst = views[1];
    return run(std::move(views), dst.object(), async_, [&] {
      return comm_->alltoall(in.data(), dst.data(), sends, recvs, in.dtype(), async_);
    });
  }

  py::object gather(const py::object& buf, int root, const py::object& out, bool async_) {
    std::vector<BufferView> views;
    views.emplace_back(buf, "buf", false);
    const size_t count = views[0].count();
    const bool at_root = root == rank();
    if (at_root) {
      views.emplace_back(out.is_none() ? empty_like(views[0], count * size()) : out, "out", true);
      check_same_dtype(views[0], views[1], "gather");
      check_count(views[1], count * size(), "out", "gather");
    }
    const BufferView& in = views[0];
    void* dst = at_root ? views[1].data() : nullptr;
    py::object result = at_root ? views[1].object() : py::none();
    return run(std::move(views), result, async_,
               [&] { return comm_->gather(in.data(), dst, count, in.dtype(), root, async_); });
  }

  py::object scatter(const py::object& out, int root, const py::object& buf, bool async_) {
    std::vector<BufferView> views;
    views.emplace_back(out, "out", true);
    const size_t count = views[0].count();
    const void* src = nullptr;
    if (root == rank()) {
      if (buf.is_none()) throw InvalidArgument("scatter: the root must pass buf");
      views.emplace_back(buf, "buf", false);
      check_same_dtype(views[1], views[0], "scatter");
      check_count(views[1], count * size(), "buf", "scatter");
      src = views[1].data();
    }
    const BufferView& dst = views[0];
    return run(std::move(views), dst.object(), async_,
               [&] { return comm_->scatter(src, dst.data(), count, dst.dtype(), root, async_); });
  }

  py::object send(const py::object& buf, int peer, uint32_t tag, bool async_) {
    std::vector<BufferView> views;
    views.emplace_back(buf, "buf", false);
    const BufferView& b = views[0];
    return run(std::move(views), py::none(), async_,
               [&] { return comm_->send(b.data(), b.bytes(), peer, tag, async_, b.dtype()); });
  }

  py::object recv(const py::object& buf, std::optional<int> peer, uint32_t tag, bool async_) {
    std::vector<BufferView> views;
    views.emplace_back(buf, "buf", true);
    const BufferView& b = views[0];
    return run(
        std::move(views), py::none(), async_,
        [&] { return comm_->recv(b.data(), b.bytes(), peer.value_or(-1), tag, async_, b.dtype()); },
        /*returns_source=*/true);
  }

  py::object run_plan(const py::dict& plan, const py::object& buf, const py::object& out,
                      const std::string& op, bool async_) {
    ReduceOp rop = parse_reduce_op(op);
    Plan p = import_plan(plan);
    std::vector<BufferView> views;
    views.emplace_back(buf, "buf", false);
    views.emplace_back(out, "out", true);
    check_same_dtype(views[0], views[1], "run_plan");
    const BufferView& in = views[0];
    const BufferView& dst = views[1];
    return run(std::move(views), dst.object(), async_, [&] {
      return comm_->run_plan(std::move(p), in.data(), in.count(), dst.data(), dst.count(),
                             in.dtype(), rop, async_);
    });
  }

  void abort(const std::string& reason) { comm_->abort(reason); }

 private:
  std::vector<size_t> counts_or_split(const std::optional<std::vector<size_t>>& counts,
                                      const BufferView& buf, const char* name) const {
    size_t total = 0;
    if (counts) {
      for (size_t c : *counts) total += c;
      if (counts->size() != static_cast<size_t>(size()) || total != buf.count()) {
        throw InvalidArgument(std::string("alltoall: ") + name + " must have one entry per rank (" +
                              std::to_string(size()) + ") summing to the buffer's " +
                              std::to_string(buf.count()) + " elements");
      }
      return *counts;
    }
    if (buf.count() % size() != 0) {
      throw InvalidArgument(std::string("alltoall: ") + std::to_string(buf.count()) +
                            " elements do not split evenly over " + std::to_string(size()) +
                            " ranks; pass " + name);
    }
    return std::vector<size_t>(size(), buf.count() / size());
  }

  // Starts the operation without the GIL; waits for it (sync) or wraps it.
  template <typename Start>
  py::object run(std::vector<BufferView> views, py::object result, bool async_, Start start,
                 bool returns_source = false) {
    std::shared_ptr<Work> work;
    {
      py::gil_scoped_release nogil;
      work = start();
    }
    if (async_) {
      return py::cast(
          std::make_unique<Handle>(work, std::move(result), returns_source, std::move(views)));
    }
    return returns_source ? py::int_(work->source()) : result;
  }

  std::unique_ptr<PyStore> store_;
  std::unique_ptr<Communicator> comm_;
};

PyCommunicator& communicator(py::handle self) { return self.cast<PyCommunicator&>(); }

// The operations, bound as fast methods (fast_method.h). Defaults are Python
// literals: they are what help() shows and what a call that leaves them out gets.
// allreduce's and reduce_scatter's.
constexpr std::array<Param, kMostParams> kReducingParams{
    {{"buf"}, {"op", "'sum'"}, {"out", "None"}, {"async_", "False"}}};

constexpr FastMethod kAllreduce{
    "allreduce", kReducingParams,
    [](py::handle self, const CallArgs& a) {
      return communicator(self).allreduce(a[0], a.get<std::string>(1), a[2], a.get<bool>(3));
    },
    "Reduces buf over all ranks with op ('sum', 'prod', 'min', 'max', 'avg'); the result goes "
    "to out, or into buf without it (in place). Returns the result (a Handle with async_)."};

constexpr FastMethod kReduceScatter{
    "reduce_scatter", kReducingParams,
    [](py::handle self, const CallArgs& a) {
      return communicator(self).reduce_scatter(a[0], a.get<std::string>(1), a[2], a.get<bool>(3));
    },
    "Reduces buf (size x n elements) over all ranks; rank r's out gets block r of the result."};

constexpr FastMethod kAllgather{
    "allgather",
    {{{"buf"}, {"out", "None"}, {"async_", "False"}}},
    [](py::handle self, const CallArgs& a) {
      return communicator(self).allgather(a[0], a[1], a.get<bool>(2));
    },
    "Every rank's buf, concatenated in rank order, into out (size x n elements) on every rank."};

constexpr FastMethod kBroadcast{"broadcast",
                                {{{"buf"}, {"root", "0"}, {"async_", "False"}}},
                                [](py::handle self, const CallArgs& a) {
                                  return communicator(self).broadcast(a[0], a.get<int>(1),
                                                                      a.get<bool>(2));
                                },
                                "Copies root's buf into buf on every rank."};

constexpr FastMethod kReduce{
    "reduce",
    {{{"buf"}, {"root", "0"}, {"op", "'sum'"}, {"out", "None"}, {"async_", "False"}}},
    [](py::handle self, const CallArgs& a) {
      return communicator(self).reduce(a[0], a.get<int>(1), a.get<std::string>(2), a[3],
                                       a.get<bool>(4));
    },
    "Reduces buf over all ranks into root's out (or root's buf without it)."};

constexpr FastMethod kBarrier{
    "barrier",
    {{{"async_", "False"}}},
    [](py::handle self, const CallArgs& a) { return communicator(self).barrier(a.get<bool>(0)); },
    "Returns once every rank has called it."};

constexpr FastMethod kAlltoall{
    "alltoall",
    {{{"buf"}, {"out"}, {"send_counts", "None"}, {"recv_counts", "None"}, {"async_", "False"}}},
    [](py::handle self, const CallArgs& a) {
      using Counts = std::optional<std::vector<size_t>>;
      return communicator(self).alltoall(a[0], a[1], a.get<Counts>(2), a.get<Counts>(3),
                                         a.get<bool>(4));
    },
    "Sends block p of buf to rank p and receives rank p's block for this rank into block p of "
    "out; blocks are equal unless send_counts and recv_counts (elements per rank) say otherwise."};

constexpr FastMethod kGather{
    "gather",
    {{{"buf"}, {"root", "0"}, {"out", "None"}, {"async_", "False"}}},
    [](py::handle self, const CallArgs& a) {
      return communicator(self).gather(a[0], a.get<int>(1), a[2], a.get<bool>(3));
    },
    "Every rank's buf, in rank order, into root's out; None on the other ranks."};

constexpr FastMethod kScatter{"scatter",
                              {{{"out"}, {"root", "0"}, {"buf", "None"}, {"async_", "False"}}},
                              [](py::handle self, const CallArgs& a) {
                                return communicator(self).scatter(a[0], a.get<int>(1), a[2],
                                                                  a.get<bool>(3));
                              },
                              "Block r of root's buf into rank r's out."};

constexpr FastMethod kSend{"send",
                           {{{"buf"}, {"peer"}, {"tag", "0"}, {"async_", "False"}}},
                           [](py::handle self, const CallArgs& a) {
                             return communicator(self).send(a[0], a.get<int>(1), a.get<uint32_t>(2),
                                                            a.get<bool>(3));
                           },
                           "Sends buf to peer, matched by the peer's recv with the same tag."};

constexpr FastMethod kRecv{
    "recv",
    {{{"buf"}, {"peer", "None"}, {"tag", "0"}, {"async_", "False"}}},
    [](py::handle self, const CallArgs& a) {
      return communicator(self).recv(a[0], a.get<std::optional<int>>(1), a.get<uint32_t>(2),
                                     a.get<bool>(3));
    },
    "Receives into buf from peer (any rank when None) with tag; returns the sender's rank."};

}  // namespace
}  // namespace weft::python

PYBIND11_MODULE(_C, m) {
  using namespace weft::python;
  m.doc() = "weft core: collectives over shared memory and TCP";
  bind_topo(m);
  bind_sim(m);
  bind_wire(m);
  bind_schedule(m);
#ifdef WEFT_HAVE_CUDA
  bind_cuda(m);
#endif

  bind_errors(m);

  m.def(
      "host_id", []() { return weft::config().host_id; },
      "This process's host identity (WEFT_HOST_ID; default: hostname and boot id). Ranks with "
      "the same one share memory; the number of distinct ones is a world's number of hosts.");

  m.def(
      "rdma_writes",
      []() {
        const weft::RdmaWrites w = weft::rdma_writes();
        return std::map<std::string, uint64_t>{{"eager", w.eager},
                                               {"ready_to_send", w.ready_to_send},
                                               {"clear_to_send", w.clear_to_send},
                                               {"early_clear_to_send", w.early_clear_to_send},
                                               {"unused_clear_to_send", w.unused_clear_to_send},
                                               {"payload", w.payload},
                                               {"credit", w.credit}};
      },
      "The writes this process's RDMA (ofi, ibverbs) connections have posted so far, by what they "
      "carried (docs/rdma.md).");

  m.def(
      "algorithms",
      [](const std::string& collective, int hosts) {
        std::vector<std::string> names;
        if (collective == "alltoall" || collective == "gather" || collective == "scatter") {
          return names;  // one algorithm each, not a choice
        }
        const weft::Topology world{2 * hosts, hosts, 2, hosts > 1};
        for (weft::Algorithm a : weft::algorithms_for(weft::parse_collective(collective), world)) {
          names.push_back(to_string(a));
        }
        return names;
      },
      py::arg("collective"), py::arg("hosts") = 1,
      "The algorithm families WEFT_ALGO (or algo=) can force for `collective` ('allreduce', "
      "'reduce_scatter', 'allgather', 'broadcast', 'reduce'; empty for 'alltoall', 'gather', "
      "'scatter', which have one algorithm each) on ranks spread over `hosts` hosts.");

  py::class_<Handle>(m, "Handle", "The pending result of a call made with async_=True.")
      .def("wait", &Handle::wait, py::arg("timeout") = py::none(),
           "Waits for the operation (at most `timeout` seconds) and returns its result.")
      .def("test", &Handle::test, "True once the operation has finished.");

  py::class_<PyCommunicator> communicator_class(m, "Communicator",
                                                "A group of ranks that run collectives together.");
  communicator_class
      .def(py::init<py::object, int, int, const std::string&, const py::object&, const std::string&,
                    int>(),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::kw_only(),
           py::arg("name") = "default", py::arg("timeout") = py::none(), py::arg("algo") = "",
           py::arg("channels") = 0)
      .def_property_readonly("rank", &PyCommunicator::rank)
      .def_property_readonly("size", &PyCommunicator::size)
      .def_property("timeout", &PyCommunicator::timeout, &PyCommunicator::set_timeout,
                    "Seconds (or a timedelta) every later operation may wait for a peer.")
      .def("transport_to", &PyCommunicator::transport_to, py::arg("peer"),
           "The transport used to reach `peer`: 'shm', 'tcp', 'ofi', 'ibverbs' or 'self'.")
      .def_property_readonly("cost_model", &PyCommunicator::cost_model,
                             "The cost model the tuner uses (measured at creation by default).")
      .def("measure_cost_model", &PyCommunicator::measure_cost_model, py::arg("thorough") = true,
           "Measures the links' figures now and returns them as a cost model (every rank calls "
           "it, like a collective); thorough=False is the quick link probe a communicator runs "
           "at creation (which also times Plans; this does not). The tuner keeps its own model.")
      .def_property_readonly("topology", &PyCommunicator::topology)
      .def_property_readonly(
          "shared_cpu", &PyCommunicator::shared_cpu,
          "Where more than two ranks per CPU share a machine's CPUs and weft spreads them "
          "(WEFT_CPU_PLACEMENT), the CPU each rank runs on, as a number equal for the ranks of "
          "one CPU (-1 for a rank weft does not spread); empty where none are spread so. "
          "Recursive doubling (rd) folds the ranks of each CPU into one before its rounds.")
      .def("algorithm", &PyCommunicator::algorithm, py::arg("collective"), py::arg("nbytes"),
           py::kw_only(), py::arg("in_place") = false,
           "(algorithm, predicted seconds) of `collective` ('allreduce', 'broadcast', ...) on "
           "`nbytes` per rank, for calls in place (allreduce without out=) or not; once the "
           "trials of `nbytes`' power-of-two range ended, the family they chose and its "
           "measured mean call.")
      .def("trying", &PyCommunicator::trying, py::arg("collective"), py::arg("nbytes"),
           py::kw_only(), py::arg("in_place") = false,
           "Whether the next calls of `collective` on `nbytes` per rank, in place or not, are "
           "trials of algorithm families (the first calls in each power-of-two range of sizes, "
           "where the tuner chooses; in-place calls have trials of their own; see "
           "docs/algorithms.md).")
      .def("run_plan", &PyCommunicator::run_plan, py::arg("plan"), py::arg("buf"), py::arg("out"),
           py::kw_only(), py::arg("op") = "sum", py::arg("async_") = false,
           "Runs this rank's Plan (a dict in weft._C.topo.plan's form) on buf (input) and out, "
           "after checking every peer and span against them; every rank runs its own rank's "
           "Plan of one algorithm. weft.topo.run is the way in for an Algorithm. Returns out "
           "(a Handle with async_).")
      .def("abort", &PyCommunicator::abort, py::arg("reason") = "abort() called",
           "Fails every pending and later operation here and on the peers.");
  for (auto def : {def_fast<kAllreduce>, def_fast<kReduceScatter>, def_fast<kAllgather>,
                   def_fast<kBroadcast>, def_fast<kReduce>, def_fast<kBarrier>, def_fast<kAlltoall>,
                   def_fast<kGather>, def_fast<kScatter>, def_fast<kSend>, def_fast<kRecv>}) {
    def(communicator_class);
  }
}
