#pragma once

#include <memory>

#include "core/bootstrap/socket.h"
#include "core/transport/rdma/endpoint.h"

namespace weft {

// WEFT_IB_QPS_PER_PEER connected RC queue pairs to the peer at the other end
// of `control` (ibverbs_endpoint.cc), on the process's device (ib_device.h,
// opened as rank `rank` by the first connection).
std::unique_ptr<RdmaEndpoint> connect_ibverbs_endpoint(Socket& control, int rank, double timeout_s);

}  // namespace weft
