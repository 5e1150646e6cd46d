#include "core/bootstrap/socket.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include "core/common/error.h"

namespace weft {
namespace {

bool is_peer_gone(int err) { return err == EPIPE || err == ECONNRESET || err == ENOTCONN; }

// Waits until `fd` is ready for `events` or the deadline passes.
void wait_ready(int fd, short events, const Deadline& deadline, const std::string& what) {
  for (;;) {
    pollfd p{fd, events, 0};
    int ms = deadline.remaining_ms();
    int n = ::poll(&p, 1, ms);
    if (n > 0) return;  // ready, or an error the next send/recv reports
    if (n < 0 && errno != EINTR) throw_system_error(what + ": poll", errno);
    if (n == 0 && deadline.expired()) throw TimeoutError(what + ": timed out");
  }
}

}  // namespace

Socket::~Socket() {
  if (fd_ >= 0) ::close(fd_);
}

Socket::Socket(Socket&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

// MSG_DONTWAIT makes each call non-blocking whatever the descriptor's mode, so
// the deadline is honoured on blocking sockets too.
void Socket::send_all(const void* data, size_t bytes, const Deadline& deadline,
                      const std::string& what) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = ::send(fd_, p, bytes, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0) {
      p += n;
      bytes -= static_cast<size_t>(n);
      continue;
    }
    int err = errno;
    if (err == EINTR) continue;
    if (err == EAGAIN || err == EWOULDBLOCK) {
      wait_ready(fd_, POLLOUT, deadline, what);
      continue;
    }
    if (is_peer_gone(err)) throw PeerError(what + ": peer closed the connection");
    throw_system_error(what, err);
  }
}

void Socket::recv_all(void* data, size_t bytes, const Deadline& deadline, const std::string& what) {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    ssize_t n = ::recv(fd_, p, bytes, MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      bytes -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0) throw PeerError(what + ": peer closed the connection");
    int err = errno;
    if (err == EINTR) continue;
    if (err == EAGAIN || err == EWOULDBLOCK) {
      wait_ready(fd_, POLLIN, deadline, what);
      continue;
    }
    if (is_peer_gone(err)) throw PeerError(what + ": peer closed the connection");
    throw_system_error(what, err);
  }
}

void Socket::set_nonblocking() {
  int flags = ::fcntl(fd_, F_GETFL, 0);
  if (flags < 0 || ::fcntl(fd_, F_SETFL, flags | O_NONBLOCK) < 0) {
    throw_system_error("fcntl(O_NONBLOCK)", errno);
  }
}

void Socket::set_nodelay() {
  int one = 1;
  if (::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) < 0) {
    throw_system_error("setsockopt(TCP_NODELAY)", errno);
  }
}

bool Socket::peer_closed() const {
  if (fd_ < 0) return true;
  pollfd p{fd_, static_cast<short>(POLLIN | POLLRDHUP), 0};
  int n = ::poll(&p, 1, 0);
  if (n <= 0) return false;  // nothing to report (or EINTR: ask again later)
  if (p.revents & (POLLHUP | POLLERR | POLLRDHUP | POLLNVAL)) return true;
  if (p.revents & POLLIN) {
    char byte;
    ssize_t r = ::recv(fd_, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    return r == 0 || (r < 0 && is_peer_gone(errno));
  }
  return false;
}

void Socket::shutdown() {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

}  // namespace weft
