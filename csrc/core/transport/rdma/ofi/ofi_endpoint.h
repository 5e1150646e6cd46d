#pragma once

#include <memory>

#include "core/bootstrap/socket.h"
#include "core/transport/rdma/endpoint.h"

namespace weft {

// A connected libfabric FI_EP_MSG endpoint (ofi_connection.h says how the
// two sides meet).
std::unique_ptr<RdmaEndpoint> connect_ofi_endpoint(Socket& control, bool listen, double timeout_s);

}  // namespace weft
