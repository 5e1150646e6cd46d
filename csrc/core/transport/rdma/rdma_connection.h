#pragma once

#include <memory>

#include "core/bootstrap/socket.h"
#include "core/transport/connection.h"
#include "core/transport/rdma/endpoint.h"

namespace weft {

struct RdmaOptions {
  size_t slot_bytes;
  int slots;
  // For tests: name a wrong key in every clear-to-send, so that the peer's
  // payload writes are refused (WEFT_RDMA_FAULT=bad_key).
  bool bad_key = false;
};

// The writes every RDMA connection of this process has posted so far, by
// what they carried: a benchmark's count of messages per transfer.
struct RdmaWrites {
  uint64_t eager = 0;          // header and payload together
  uint64_t ready_to_send = 0;  // a rendezvous message's header alone
  uint64_t clear_to_send = 0;
  uint64_t early_clear_to_send = 0;   // of those, written before the header arrived
  uint64_t unused_clear_to_send = 0;  // early ones whose message came eagerly
  uint64_t payload = 0;               // a rendezvous message's payload
  uint64_t credit = 0;
};
RdmaWrites rdma_writes();

// A Connection over a connected RdmaEndpoint, with NCCL net_ib's protocol
// (rdma_connection.cc). The two sides exchange their inboxes' addresses and
// keys over `control` (a connected socket of the Mesh, which must outlive the
// connection: it is watched for the peer's death while the connection waits).
std::unique_ptr<Connection> make_rdma_connection(std::unique_ptr<RdmaEndpoint> endpoint,
                                                 Socket& control, const RdmaOptions& options,
                                                 double timeout_s, const char* transport_name);

}  // namespace weft
