// Setting up the two FIFOs of a shared-memory connection over the control
// socket. Each side creates the segment it will receive through and sends its
// name; each then maps the peer's, acks, waits for the peer's ack and removes
// its own name. Both sides send before they receive, so the exchange cannot
// deadlock, and a side that fails still acks so the peer fails fast too.
#pragma once

#include "core/bootstrap/socket.h"
#include "core/transport/shm/fifo_layout.h"
#include "core/transport/shm/segment.h"
#include "core/transport/shm/shm_connection.h"

namespace weft::shm {

struct Endpoints {
  FifoLayout layout;
  Segment incoming;            // created by us, written by the peer
  Segment outgoing;            // created by the peer, written by us
  bool peer_reads_us = false;  // the peer can process_vm_readv our memory
  bool we_read_peer = false;   // and we the peer's: it asked to send by reference
};

// Throws InvalidArgument when the ranks' slot settings differ, PeerError or
// TimeoutError when the peer fails or does not answer in time, Error when a
// segment cannot be created or mapped. Leaves no name behind in /dev/shm.
Endpoints handshake(Socket& control, int rank, int peer, int peer_pid, int channel,
                    const ShmOptions& options, double timeout_s);

}  // namespace weft::shm
