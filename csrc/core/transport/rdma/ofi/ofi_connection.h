#pragma once

#include <memory>

#include "core/bootstrap/socket.h"
#include "core/transport/connection.h"
#include "core/transport/rdma/rdma_connection.h"

namespace weft {

// A Connection over a libfabric endpoint with FI_RMA, running the RDMA
// protocol (rdma_connection.h): FI_EP_MSG, where one side listens (`listen`)
// and sends its endpoint's name over `control` and the other connects to it,
// else FI_EP_RDM, where both swap names. The provider is libfabric's choice,
// or FI_PROVIDER's. Throws InvalidArgument when libfabric cannot be loaded or
// offers neither endpoint.
std::unique_ptr<Connection> make_ofi_connection(Socket& control, bool listen,
                                                const RdmaOptions& options, double timeout_s);

}  // namespace weft
