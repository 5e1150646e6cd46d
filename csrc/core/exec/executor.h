// Runs a Plan for this rank: its channels progressed together on the calling
// thread, each channel's steps in order, each step streamed in slot-sized
// slices; waits with Backoff and names the operation, its sequence number,
// the step and the peer in every error.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/algo/plan.h"
#include "core/common/types.h"
#include "core/transport/connection.h"

namespace weft {

struct OpBuffers {
  const void* input = nullptr;
  void* output = nullptr;
  void* scratch = nullptr;
};

// Who is running and how: used for errors, logs and the Avg divisor.
struct OpContext {
  const char* name;  // "allreduce", ...
  uint64_t seq;      // per-communicator sequence number
  int rank;
  int size;
  double timeout_s;
  DataType dtype;
  ReduceOp op;
  bool streaming;  // write user outputs with non-temporal stores
  // Largest message: the same on every rank, at most any connection's slot.
  size_t slice_bytes;
  // A Plan whose steps are all at most this size, run on the caller's
  // thread, waits on sockets by yielding before it sleeps
  // (Backoff::SocketWait::Yield); larger ones sleep soon.
  size_t yielding_step_bytes;
  uint64_t signature;  // tags this operation's messages (op_signature.h)
};

// What the communicator knows of its peers beyond the connections: asked
// while a Plan waits or fails.
struct PeerStatus {
  // A rank whose process is gone or whose host stopped answering, and which
  // of the two in words; rank -1 when there is none. Used to blame the right
  // rank when a peer closes because another one was lost.
  struct Departure {
    int rank = -1;
    std::string why;
  };
  std::function<Departure()> departed_peer;
  // Why the communicator was aborted (empty while it is not): a wait checks
  // it, so that an abort from another thread ends it.
  std::function<std::string()> abort_reason;
  // Why `peer` will take no part in operation `seq` (it left the group
  // before it), or empty: a wait on it ends at once instead of at the timeout.
  std::function<std::string(int peer, uint64_t seq)> left_before;
};

class Executor {
 public:
  // connections[t][p] is the connection of channel tag t to rank p (null
  // for this rank); a Plan's channel tags must be below connections.size().
  Executor(std::vector<std::vector<Connection*>> connections, PeerStatus peers);

  // Throws PeerError/TimeoutError with the operation's context.
  void run(const Plan& plan, const OpBuffers& buffers, const OpContext& op);

  // How many channel tags a Plan may use here.
  size_t channel_tags() const { return connections_.size(); }

 private:
  std::vector<std::vector<Connection*>> connections_;
  PeerStatus peers_;
};

}  // namespace weft
