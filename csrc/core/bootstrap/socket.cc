#include "core/bootstrap/socket.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <sstream>

#include "core/common/error.h"

namespace weft {
namespace {

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

Socket::Socket(Socket&& other) noexcept
    : fd_(other.fd_), error_(other.error_.exchange(0)), keep_alive_s_(other.keep_alive_s_) {
  other.fd_ = -1;
  other.keep_alive_s_ = 0;
}

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    error_ = other.error_.exchange(0);
    keep_alive_s_ = other.keep_alive_s_;
    other.fd_ = -1;
    other.keep_alive_s_ = 0;
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
    if (closed_by_peer(err)) throw PeerError(what + ": peer closed the connection");
    if (unanswered(kept(err))) throw PeerError(what + ": " + loss(err));
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
    if (closed_by_peer(err)) throw PeerError(what + ": peer closed the connection");
    if (unanswered(kept(err))) throw PeerError(what + ": " + loss(err));
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

void Socket::keep_alive(double seconds) {
  // Probes start after half the time without traffic and repeat every tenth
  // of it (at least a second). With TCP_USER_TIMEOUT set the kernel ignores
  // the probe count: at the first probe `seconds` after the last
  // acknowledgement it gives up, so by `seconds` plus one interval.
  const int whole = std::max(1, static_cast<int>(seconds));
  const int idle = std::max(1, whole / 2), interval = std::max(1, whole / 10), on = 1;
  const unsigned user_timeout_ms = static_cast<unsigned>(seconds * 1000);
  if (::setsockopt(fd_, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on)) < 0 ||
      ::setsockopt(fd_, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle)) < 0 ||
      ::setsockopt(fd_, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval)) < 0 ||
      ::setsockopt(fd_, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout_ms, sizeof(user_timeout_ms)) <
          0) {
    throw_system_error("setsockopt(SO_KEEPALIVE, TCP_USER_TIMEOUT)", errno);
  }
  keep_alive_s_ = seconds;
}

int Socket::connection_error() const {
  if (error_.load() == 0 && fd_ >= 0) {
    int err = 0;
    socklen_t len = sizeof(err);
    if (::getsockopt(fd_, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err != 0) kept(err);
  }
  return error_.load();
}

bool Socket::peer_closed() const {
  if (fd_ < 0) return true;
  pollfd p{fd_, static_cast<short>(POLLIN | POLLRDHUP), 0};
  int n = ::poll(&p, 1, 0);
  if (n <= 0) return false;  // nothing to report (or EINTR: ask again later)
  if (p.revents & POLLERR) connection_error();
  if (p.revents & (POLLHUP | POLLERR | POLLRDHUP | POLLNVAL)) return true;
  if (p.revents & POLLIN) {
    char byte;
    ssize_t r = peek(&byte, 1);
    return r == 0 || (r < 0 && closed_by_peer(errno));
  }
  return false;
}

bool Socket::gave_up() const { return peer_closed() && unanswered(connection_error()); }

int Socket::kept(int err) const {
  int none = 0;
  if (err != EAGAIN && err != EWOULDBLOCK && err != EINTR) {
    error_.compare_exchange_strong(none, err);
  }
  return err;
}

ssize_t Socket::peek(void* data, size_t bytes) const {
  // A recv() returns the kernel's error once and clears it: read it first.
  connection_error();
  const ssize_t n = ::recv(fd_, data, bytes, MSG_PEEK | MSG_DONTWAIT);
  if (n < 0) kept(errno);
  return n;
}

ssize_t Socket::send_nowait(const void* data, size_t bytes) {
  connection_error();
  const ssize_t n = ::send(fd_, data, bytes, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (n < 0) kept(errno);
  return n;
}

bool Socket::closed_by_peer(int err) {
  return err == EPIPE || err == ECONNRESET || err == ENOTCONN || err == ESHUTDOWN;
}

bool Socket::unanswered(int err) {
  return err == ETIMEDOUT || err == EHOSTUNREACH || err == ENETUNREACH;
}

std::string Socket::loss(int err) const {
  const int why = err != 0 ? err : connection_error();
  if (!unanswered(why)) return "peer process is gone";
  std::ostringstream words;
  words << "its host stopped answering";
  if (why == ETIMEDOUT && keep_alive_s_ > 0) {
    words << ": nothing was acknowledged for " << keep_alive_s_ << " s (WEFT_HOST_TIMEOUT_S)";
  } else {
    words << " (" << std::strerror(why) << ")";
  }
  words << "; the host is down or the network to it is cut";
  return words.str();
}

void Socket::shutdown() {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

}  // namespace weft
