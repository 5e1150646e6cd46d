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

// A Connection over a connected RdmaEndpoint, with NCCL net_ib's protocol
// (rdma_connection.cc). The two sides exchange their inboxes' addresses and
// keys over `control` (a connected socket of the Mesh, not kept).
std::unique_ptr<Connection> make_rdma_connection(std::unique_ptr<RdmaEndpoint> endpoint,
                                                 Socket& control, const RdmaOptions& options,
                                                 double timeout_s, const char* transport_name);

}  // namespace weft
