// The Communicator: the one entry point of the core. It bootstraps through a
// Store, connects to every peer over the transport chosen for the pair, and
// runs collectives as Plans on its executor, in issue order.
//
// Buffers are raw host pointers with element counts; validation of what the
// caller passes (sizes, dtypes, writability) happens in the layers above,
// which know the caller's objects.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "core/algo/plan.h"
#include "core/bootstrap/mesh.h"
#include "core/bootstrap/store.h"
#include "core/common/types.h"
#include "core/exec/executor.h"
#include "core/exec/op_queue.h"
#include "core/exec/p2p.h"
#include "core/exec/work.h"
#include "core/transport/connection.h"

namespace weft {

// The algorithms that can run `collective` ("allreduce", "reduce_scatter",
// "allgather", "broadcast", "reduce", "alltoall", "gather", "scatter"), by the
// names WEFT_ALGO takes and WEFT_DEBUG logs; empty for an unknown collective.
std::vector<std::string> algorithms_for(const std::string& collective);

class Communicator {
 public:
  // `name` keeps several communicators on one store apart. timeout_s <= 0
  // takes WEFT_TIMEOUT_S.
  Communicator(Store& store, int rank, int size, const std::string& name, double timeout_s);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  double timeout_s() const { return timeout_s_; }
  // "shm" or "tcp" for each peer, "self" for this rank.
  std::string transport_to(int peer) const;

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
  std::shared_ptr<Work> send(const void* buf, size_t bytes, int peer, uint32_t tag, bool async);
  // Point-to-point calls do not wait for earlier collectives: they progress
  // on their own channel. peer < 0 receives from any rank; Work::source()
  // tells which.
  std::shared_ptr<Work> recv(void* buf, size_t bytes, int peer, uint32_t tag, bool async);

  // Fails this and every later operation and wakes the peers with an error.
  void abort(const std::string& reason);

 private:
  enum class Coll : uint8_t { Allreduce, ReduceScatter, Allgather, Broadcast, Reduce, Barrier };
  // What a cached Plan depends on.
  using PlanKey = std::tuple<Coll, size_t, size_t, int, bool, bool>;

  void connect(Store& store, const std::string& name);
  void agree_on_sizes();
  PlanContext plan_context(DataType dtype) const;
  const Plan& cached_plan(const PlanKey& key, DataType dtype);
  Plan make_plan(const PlanKey& key, DataType dtype) const;
  void check_root(int root, const char* what) const;
  void check_peer(int peer, const char* what, bool allow_any) const;
  // Throws InvalidArgument when WEFT_ALGO forces an algorithm `collective`
  // does not have.
  void check_algorithm(const char* collective) const;

  // Queues a collective; `make` builds its Plan when it runs.
  template <typename MakePlan>
  std::shared_ptr<Work> submit(const char* name, const void* in, void* out, DataType dtype,
                               ReduceOp op, size_t out_bytes, bool async, MakePlan make);
  void execute(const char* name, uint64_t seq, const Plan& plan, const void* in, void* out,
               DataType dtype, ReduceOp op, size_t out_bytes);
  OpContext op_context(const char* name, uint64_t seq, DataType dtype, ReduceOp op,
                       size_t out_bytes) const;
  void check_usable() const;
  void fail(const std::string& reason);

  const int rank_;
  const int size_;
  const double timeout_s_;
  // Message and step sizes every rank derives alike from the transports in
  // use anywhere in the world, so that all ranks build matching Plans.
  size_t slice_bytes_ = 0;
  size_t step_limit_bytes_ = 0;
  std::unique_ptr<Mesh> mesh_;
  std::vector<std::unique_ptr<Connection>> collective_conns_;
  std::vector<std::unique_ptr<Connection>> p2p_conns_;
  std::unique_ptr<Executor> executor_;
  std::unique_ptr<P2pEngine> p2p_;
  std::map<PlanKey, Plan> plans_;  // touched only by the running op
  std::vector<char> scratch_;
  char barrier_byte_ = 0;

  mutable std::mutex abort_mu_;
  std::atomic<bool> aborted_{false};
  std::string abort_reason_;

  OpQueue queue_;  // last: destroyed (joined) before the connections
};

}  // namespace weft
