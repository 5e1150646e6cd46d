#pragma once

#include <memory>
#include <string>

#include "core/bootstrap/socket.h"
#include "core/transport/connection.h"
#include "core/transport/rdma/rdma_connection.h"

namespace weft {

// A Connection over RC queue pairs of libibverbs (ibverbs/ibverbs_endpoint.h)
// running the RDMA protocol (rdma_connection.h); `control` is the Mesh's
// control socket to the peer. Throws InvalidArgument when weft was built
// without libibverbs' headers, the library cannot be loaded or no port is
// usable.
std::unique_ptr<Connection> make_ibverbs_connection(Socket& control, int rank,
                                                    const RdmaOptions& options, double timeout_s);

// Empty when libibverbs loads and offers an active port (that WEFT_IB_HCA
// allows), else why not: what WEFT_TRANSPORT=auto asks before it takes
// ibverbs between hosts.
std::string ibverbs_unusable(int rank);

}  // namespace weft
