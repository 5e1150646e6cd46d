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
std::unique_ptr<Connection> make_tcp_connection(Socket socket, const TcpOptions& options);

}  // namespace weft
