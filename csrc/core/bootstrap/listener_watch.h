// Tells, while the mesh forms, that a rank whose socket we still wait for has
// left: its process died (or its communicator creation failed) after it
// published its address. Such a rank's listener is open for as long as it
// owes us a socket (it closes only once that rank's mesh is built, which needs
// ours), so one connection parked in its listen queue is reset by its kernel
// when the listener goes, and a new one is refused. A rank on a host that
// went down entirely sends nothing: that is the timeout's case.
#pragma once

#include <poll.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/bootstrap/socket.h"

namespace weft {

class ListenerWatch {
 public:
  struct Target {
    std::string ip;
    uint16_t port = 0;
  };

  // `targets[r]` is where rank r listens (unused for ranks never watched).
  explicit ListenerWatch(std::vector<Target> targets) : targets_(std::move(targets)) {}

  // Parks a connection at rank r's listener unless one is there already.
  // Returns false when r's listener refuses it (r has left).
  bool watch(int rank);
  // Stops watching r (it owes no socket any more): closes the parked
  // connection, which r drops once it accepts (logged there at INFO).
  void forget(int rank);

  // One pollfd per watched rank, appended to `fds`, in the order of ranks().
  void add_pollfds(std::vector<pollfd>& fds) const;
  const std::vector<int>& ranks() const { return ranks_; }
  // After poll() gave `revents` for ranks()[i]: false when that rank has left.
  bool still_there(size_t i, short revents);

 private:
  std::vector<Target> targets_;
  std::vector<int> ranks_;        // watched ranks
  std::vector<Socket> sockets_;   // their parked connections
  std::vector<bool> connecting_;  // connect() still in progress
};

}  // namespace weft
