// Both ends of a mesh socket's handshake (handshake.h): the connecting rank's,
// which proves itself to the rank the Store says listens there and checks that
// rank's proof, and the accepting rank's, which serves every connection on its
// port at once, so that no stranger (silent, slow, or one of a thousand) can
// hold up the ranks that belong.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/bootstrap/listener_watch.h"
#include "core/bootstrap/socket.h"
#include "core/common/deadline.h"

namespace weft {

// Who this end is, and the secret both ends must know.
struct MeshIdentity {
  const std::string& prefix;
  int rank;
  int size;
  int sockets_per_peer;
  const std::string& secret;
};

// The index-th socket to lower rank `to` at ip:port, handshake done. Retries
// (until the deadline) when the peer drops the connection before it is filed,
// as it may when strangers crowd its port; throws PeerError when the process
// there cannot prove it knows the secret or the port refuses connections (the
// rank has left). `what` names the connection.
Socket connect_peer(const std::string& ip, uint16_t port, const MeshIdentity& me, int to, int index,
                    const Deadline& deadline, const std::string& what);

// Fills sockets[r][i] for every higher rank r and index i from connections on
// the (non-blocking) listener; drops and logs at INFO every connection that
// does not complete the handshake. Throws PeerError(left(r)) when `watch`
// sees that a rank r that owes a socket has left, TimeoutError(missing()) at
// the deadline.
void accept_peers(Socket& listener, const MeshIdentity& me,
                  std::vector<std::vector<Socket>>& sockets, const Deadline& deadline,
                  const std::function<std::string()>& missing, ListenerWatch& watch,
                  const std::function<std::string(int)>& left);

}  // namespace weft
