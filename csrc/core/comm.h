// The Communicator: the one entry point of the core. It bootstraps through a
// Store, connects to every peer over the transport chosen for the pair, and
// runs collectives as Plans on its executor, in issue order.
//
// Buffers are raw host pointers with element counts; validation of what the
// caller passes (sizes, dtypes, writability) happens in the layers above,
// which know the caller's objects.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "core/algo/plan.h"
#include "core/bootstrap/mesh.h"
#include "core/bootstrap/store.h"
#include "core/common/error.h"
#include "core/common/flight_recorder.h"
#include "core/common/types.h"
#include "core/exec/executor.h"
#include "core/exec/op_queue.h"
#include "core/exec/p2p.h"
#include "core/exec/work.h"
#include "core/transport/connection.h"
#include "core/tune/cost_model.h"
#include "core/tune/family_trials.h"
#include "core/tune/probe.h"

namespace weft {

// WEFT_ALGO=file:PATH (and algo= alike): an Algorithm file, for the torch
// backend to install as a PlanSource.
inline bool is_algorithm_file(const std::string& algo) { return algo.rfind("file:", 0) == 0; }

class Communicator {
 public:
  // `name` keeps several communicators on one store apart. timeout_s <= 0
  // takes WEFT_TIMEOUT_S. `algorithm` forces an algorithm family where an
  // operation has one ("" takes WEFT_ALGO; "auto" lets the tuner choose).
  // `channels` is how many connection sets per peer carry collectives, and so
  // how many channel tags a Plan may use (0 takes WEFT_CHANNELS).
  Communicator(Store& store, int rank, int size, const std::string& name, double timeout_s,
               const std::string& algorithm = "", int channels = 0);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  double timeout_s() const { return timeout_s_.load(); }
  // The timeout of every later operation and point-to-point wait (torch's
  // ProcessGroup.set_timeout); an operation already running keeps its own.
  void set_timeout(double timeout_s);
  // "shm" or "tcp" for each peer, "self" for this rank.
  std::string transport_to(int peer) const;
  // The algorithm an operation of `bytes` per rank runs, in place or not,
  // and its predicted time (the same on every rank); once the trials of
  // `bytes`' range ended (family_trials.h), the family they chose and its
  // mean call.
  Choice choice(Collective c, size_t bytes, bool in_place) const;
  // Whether calls of `c` on `bytes` per rank are still trials of families
  // (or would begin them).
  bool trying(Collective c, size_t bytes, bool in_place) const;
  const Topology& topology() const { return topology_; }
  // PlanContext::shared_cpu of this world's Plans.
  const std::vector<int>& shared_cpu() const { return shared_cpu_; }
  // This rank's Plan of `c` over `count` elements of `dtype`, in the family
  // the tuner (or WEFT_ALGO) picks by the link model alone, for executors of
  // Plans elsewhere whose sends wait for the peer's receive (the nccl
  // transport's group schedules; PlanContext::buffered_sends). max_step_bytes
  // bounds a step (PlanContext; 0: what this communicator's connections
  // allow). Not cached; safe from any thread.
  Plan plan(Collective c, size_t count, DataType dtype, int root, bool in_place, bool finalize,
            size_t max_step_bytes = 0) const;
  const CostModel& cost_model() const { return cost_model_; }
  // Measures a cost model now (a collective: every rank calls it, in issue
  // order with the others) and returns it; the tuner keeps its own.
  CostModel measure_cost_model(const ProbeEffort& effort);

  // Every call returns once the operation finished when async=false (and
  // throws its error), or at once with its Work when async=true. Buffers
  // must stay valid until the Work completes. Input == Output is in place.
  std::shared_ptr<Work> allreduce(const void* in, void* out, size_t count, DataType dtype,
                                  ReduceOp op, bool async);
  // in: size*count elements; out: count.
  std::shared_ptr<Work> reduce_scatter(const void* in, void* out, size_t count, DataType dtype,
                                       ReduceOp op, bool async);
  // in: count elements; out: size*count (in may be out's block `rank`).
  std::shared_ptr<Work> allgather(const void* in, void* out, size_t count, DataType dtype,
                                  bool async);
  std::shared_ptr<Work> broadcast(void* buf, size_t count, DataType dtype, int root, bool async);
  std::shared_ptr<Work> reduce(const void* in, void* out, size_t count, DataType dtype, ReduceOp op,
                               int root, bool async);
  std::shared_ptr<Work> barrier(bool async);
  // Counts in elements, one per rank.
  std::shared_ptr<Work> alltoall(const void* in, void* out, std::vector<size_t> send_counts,
                                 std::vector<size_t> recv_counts, DataType dtype, bool async);
  // out (root only): size*count; in: count.
  std::shared_ptr<Work> gather(const void* in, void* out, size_t count, DataType dtype, int root,
                               bool async);
  // in (root only): size*count; out: count.
  std::shared_ptr<Work> scatter(const void* in, void* out, size_t count, DataType dtype, int root,
                                bool async);
  // A Plan from outside (weft.topo.run): validated against this rank's
  // buffers (in_count and out_count elements of dtype), then run like any
  // collective, in issue order. Every rank must run its rank's Plan of the
  // same algorithm; ranks out of step fail as with built-in Plans.
  std::shared_ptr<Work> run_plan(Plan plan, const void* in, size_t in_count, void* out,
                                 size_t out_count, DataType dtype, ReduceOp op, bool async);
  std::shared_ptr<Work> send(const void* buf, size_t bytes, int peer, uint32_t tag, bool async,
                             std::optional<DataType> dtype = std::nullopt);
  // Point-to-point calls do not wait for earlier collectives: they progress
  // on their own channel. peer < 0 receives from any rank; Work::source()
  // tells which. A blocking call waits up to the timeout, then withdraws
  // its request and throws TimeoutError (Work::wait_or_withdraw). `dtype`
  // says what the bytes are, where the caller knows: with WEFT_DEBUG_CHECKS a
  // receive refuses a message its sender typed otherwise.
  std::shared_ptr<Work> recv(void* buf, size_t bytes, int peer, uint32_t tag, bool async,
                             std::optional<DataType> dtype = std::nullopt);
  // Fails this and every later operation and wakes the peers with an error.
  void abort(const std::string& reason);
  // Leaves the group (torch's destroy_process_group): during an operation,
  // as abort(); between operations, this rank takes no more, and peers that
  // reach the next one fail it at once, naming this rank and why.
  void leave(const std::string& reason);

  // What a PlanSource is asked: the call of its collective, and this
  // communicator's message size and FIFO depth (the checker's slot_bytes and
  // slots).
  struct PlanQuery {
    size_t count;  // per rank, or per block (reduce_scatter, allgather)
    size_t elem_size;
    int root;
    bool in_place;
    bool avg;
    size_t slot_bytes;
    int slots;
  };
  // Plans from outside for every call of one collective (the torch backend's
  // WEFT_ALGO=file:): a Plan it returns runs instead of the built-in choice,
  // validated as run_plan's are; nullopt keeps the built-in. Every rank must
  // be given sources that agree. Called on the calling thread; install it
  // before the first call of `c`.
  using PlanSource = std::function<std::optional<Plan>(const PlanQuery&)>;
  void set_plan_source(Collective c, PlanSource source);

 private:
  // What a cached Plan depends on.
  using PlanKey = std::tuple<Collective, size_t, size_t, int, bool, bool>;

  void connect(Store& store, const std::string& name);
  void agree_on_sizes();
  void learn_topology();
  CostModel tuned_cost_model();
  CostModel probe(const ProbeEffort& effort, uint64_t seq);
  // Runs the tuner's Plans as operation `seq` (one sequence number for all).
  RunPlan tuning_runner(uint64_t seq);
  PlanContext plan_context(DataType dtype) const;
  const Plan& cached_plan(const PlanKey& key, Algorithm a, DataType dtype);
  Plan make_plan(const PlanKey& key, Algorithm a, DataType dtype, size_t max_step_bytes = 0,
                 bool buffered_sends = true) const;
  void check_root(int root, const char* what) const;
  void check_peer(int peer, const char* what, bool allow_any) const;

  // Runs `body` as operation `seq` in the flight recorder: what the caller
  // asked for (count and root as the caller gave them), and whether it
  // failed; with WEFT_DEBUG_CHECKS, after the ranks agreed on the call.
  template <typename Body>
  void recorded(uint64_t seq, const char* name, DataType dtype, ReduceOp op, size_t count, int root,
                Body body);
  // WEFT_DEBUG_CHECKS: every rank's call of operation `seq`, gathered from
  // all; throws OutOfStepError listing them where they differ.
  void agree_on_call(uint64_t seq, const char* name, DataType dtype, ReduceOp op, size_t count,
                     int root);
  // WEFT_DEBUG_CHECKS for alltoall: every rank's counts, gathered from all;
  // throws OutOfStepError listing the pairs where what one rank sends is not
  // what the other expects.
  void agree_on_alltoall_counts(uint64_t seq, DataType dtype,
                                const std::vector<size_t>& send_counts,
                                const std::vector<size_t>& recv_counts);
  // Queues a collective; `make` builds its Plan when it runs.
  // `debug_check`, where given, runs with WEFT_DEBUG_CHECKS after the ranks
  // agreed on the call, before any byte of it moves.
  template <typename MakePlan>
  std::shared_ptr<Work> submit(const char* name, const void* in, void* out, DataType dtype,
                               ReduceOp op, size_t count, int root, size_t out_bytes, bool async,
                               MakePlan make,
                               std::function<void(uint64_t seq)> debug_check = nullptr);
  // Queues a collective whose family is chosen per call: by the trials
  // while they run (timing the call for them), then by what they chose.
  std::shared_ptr<Work> submit_chosen(const char* name, const PlanKey& key, const void* in,
                                      void* out, DataType dtype, ReduceOp op, size_t out_bytes,
                                      bool async);
  // submit_chosen's operation, on the queue's thread.
  void run_chosen(const char* name, uint64_t seq, const PlanKey& key, const void* in, void* out,
                  DataType dtype, ReduceOp op, size_t out_bytes);
  // `root`: the caller's (0 where the collective has none); in the
  // messages' signature, so that ranks given different roots fail.
  void execute(const char* name, uint64_t seq, const Plan& plan, const void* in, void* out,
               DataType dtype, ReduceOp op, size_t out_bytes, int root);
  OpContext op_context(const char* name, uint64_t seq, const Plan& plan, DataType dtype,
                       ReduceOp op, size_t out_bytes, int root) const;
  void check_usable() const;
  // Why this communicator was aborted; empty while it is not.
  std::string abort_reason() const;
  // Aborts this communicator; `kind` tells the peers what failed (comm.cc).
  void fail(const std::string& reason, char kind);
  // Records why the communicator is aborted: false if it already was.
  bool mark_aborted(const std::string& reason);
  // An abort notice of `kind` on every control socket.
  void tell_peers(char kind, const std::string& text);
  // After a wait on `peer` timed out: whom that peer waited for in turn, and
  // so on, from their abort notices, to the rank that sent nothing.
  std::string blame_chain(int peer) const;
  // Rethrows a lost peer's error with why that peer aborted, if it said.
  [[noreturn]] void rethrow_explained(const PeerError& e);

  const int rank_;
  const int size_;
  const int channels_;  // connection sets per peer for collectives
  std::atomic<double> timeout_s_;
  FlightRecorder recorder_;
  // Message and step sizes every rank derives alike from the transports in
  // use anywhere in the world, so that all ranks build matching Plans.
  size_t slice_bytes_ = 0;
  size_t step_limit_bytes_ = 0;
  size_t yielding_step_bytes_ = 0;  // OpContext::yielding_step_bytes
  // Every tcp connection's staging geometry (agree_on_sizes()).
  size_t tcp_slot_bytes_ = 0;
  int tcp_slots_ = 0;
  // What the tuner chooses algorithms from: the same on every rank.
  std::vector<int> host_of_rank_;
  std::vector<int> shared_cpu_;  // PlanContext::shared_cpu
  Topology topology_;
  CostModel cost_model_;
  Algorithm forced_algorithm_ = Algorithm::Auto;
  std::unique_ptr<FamilyTrials> trials_;  // null where a family is forced or WEFT_TUNE=off
  std::unique_ptr<Mesh> mesh_;
  // collective_conns_[t][p]: channel tag t's connection to rank p.
  std::vector<std::vector<std::unique_ptr<Connection>>> collective_conns_;
  std::vector<std::unique_ptr<Connection>> p2p_conns_;
  std::unique_ptr<Executor> executor_;
  std::unique_ptr<P2pEngine> p2p_;
  std::map<std::pair<PlanKey, Algorithm>, Plan> plans_;  // touched only by the running op
  std::map<Collective, PlanSource> plan_sources_;
  char barrier_byte_ = 0;

  mutable std::mutex abort_mu_;
  std::atomic<bool> aborted_{false};
  std::string abort_reason_;

  OpQueue queue_;  // last: destroyed (joined) before the connections
};

}  // namespace weft
