#include "core/bootstrap/listener_watch.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>

#include "core/common/error.h"

namespace weft {

bool ListenerWatch::watch(int rank) {
  if (std::find(ranks_.begin(), ranks_.end(), rank) != ranks_.end()) return true;
  const Target& t = targets_[rank];
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(t.port);
  if (::inet_pton(AF_INET, t.ip.c_str(), &addr.sin_addr) != 1) return true;  // cannot watch
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) throw_system_error("bootstrap: socket", errno);
  Socket s(fd);
  int err = 0;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) < 0) err = errno;
  if (err == ECONNREFUSED) return false;
  // Any other failure (no route, no descriptors) leaves this rank to the timeout.
  if (err != 0 && err != EINPROGRESS) return true;
  ranks_.push_back(rank);
  sockets_.push_back(std::move(s));
  connecting_.push_back(err == EINPROGRESS);
  return true;
}

void ListenerWatch::forget(int rank) {
  auto it = std::find(ranks_.begin(), ranks_.end(), rank);
  if (it == ranks_.end()) return;
  size_t i = static_cast<size_t>(it - ranks_.begin());
  ranks_.erase(it);
  sockets_.erase(sockets_.begin() + static_cast<std::ptrdiff_t>(i));
  connecting_.erase(connecting_.begin() + static_cast<std::ptrdiff_t>(i));
}

void ListenerWatch::add_pollfds(std::vector<pollfd>& fds) const {
  for (size_t i = 0; i < sockets_.size(); ++i) {
    fds.push_back(
        pollfd{sockets_[i].fd(), static_cast<short>(connecting_[i] ? POLLOUT : POLLIN), 0});
  }
}

bool ListenerWatch::still_there(size_t i, short revents) {
  if (revents == 0) return true;
  int fd = sockets_[i].fd();
  int err = 0;
  socklen_t len = sizeof(err);
  if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0) err = errno;
  if (connecting_[i]) {
    if (err == ECONNREFUSED) return false;
    if (err != 0) {  // unreachable and the like: nothing to tell, stop watching
      forget(ranks_[i]);
      return true;
    }
    connecting_[i] = false;
    return true;
  }
  // Parked in a listen queue, the connection carries nothing: any event is
  // its reset (or close) by the listener's end.
  char byte;
  ssize_t n = ::recv(fd, &byte, 1, MSG_DONTWAIT | MSG_PEEK);
  if (n > 0) return true;
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return true;
  return false;
}

}  // namespace weft
