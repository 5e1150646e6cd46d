#pragma once

#include <memory>

#include "core/bootstrap/socket.h"
#include "core/transport/connection.h"

namespace weft {

struct TcpOptions {
  size_t slot_bytes;
  int slots;
};

// A Connection over one connected TCP socket (switched to non-blocking).
// `control` is the pair's control socket (the Mesh's, which outlives the
// connection), watched for a host that stopped answering.
std::unique_ptr<Connection> make_tcp_connection(const Socket& control, Socket socket,
                                                const TcpOptions& options);

}  // namespace weft
