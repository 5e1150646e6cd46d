#pragma once

#include <memory>

#include "core/bootstrap/socket.h"
#include "core/transport/connection.h"

namespace weft {

struct ShmOptions {
  size_t slot_bytes;
  int slots;
  bool cma;              // allow process_vm_readv sends by reference
  size_t cma_min_bytes;  // smallest message sent by reference (above the
                         // 32 bytes that travel in a slot header)
};

// A Connection through shared-memory FIFOs, one per direction. The two ranks
// exchange segment names over `control` (a connected blocking socket of the
// Mesh, which the connection keeps watching to notice a dead peer; it does
// not own it). `channel` distinguishes several connections to one peer.
std::unique_ptr<Connection> make_shm_connection(Socket& control, int rank, int peer, int peer_pid,
                                                int channel, const ShmOptions& options,
                                                double timeout_s);

}  // namespace weft
