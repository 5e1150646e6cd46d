// Bootstrap: every rank listens on a TCP port, publishes where (and on which
// host) it is through the Store, reads everyone else's entry, checks that all
// ranks agree on the world size, then opens a fixed number of sockets to each
// peer. The higher rank of a pair connects, the lower one accepts. Every
// socket is kept only once both ends have proven they know the job's secret
// (handshake.h); anything else that reaches the port is dropped, logged at
// INFO, and the bootstrap goes on. The listener closes when the mesh is built.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/bootstrap/address.h"
#include "core/bootstrap/socket.h"
#include "core/bootstrap/store.h"
#include "core/common/machine.h"

namespace weft {

class Mesh {
 public:
  // Throws InvalidArgument on a world-size mismatch (naming both sizes and
  // ranks), TimeoutError/PeerError when a peer cannot be reached in time.
  // `spread` is published as this rank's PeerAddress::spread.
  Mesh(Store& store, const std::string& prefix, int rank, int size, int sockets_per_peer,
       double timeout_s, CpuSpread spread);

  int rank() const { return rank_; }
  int size() const { return size_; }
  const PeerAddress& peer(int rank) const { return peers_[rank]; }
  // The index-th socket to `peer` (blocking mode, TCP_NODELAY set).
  Socket& socket(int peer, int index) { return sockets_[peer][index]; }

 private:
  int rank_;
  int size_;
  std::vector<PeerAddress> peers_;
  std::vector<std::vector<Socket>> sockets_;
};

}  // namespace weft
