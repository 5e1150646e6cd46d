// A move-only TCP socket with blocking helpers bounded by a Deadline.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <string>

#include "core/common/deadline.h"

namespace weft {

class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket();
  Socket(Socket&& other) noexcept;
  Socket& operator=(Socket&& other) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }

  // Blocking transfers that poll() until done; throw PeerError when the peer
  // closed or failed, TimeoutError when the deadline passes. `what` names the
  // transfer in the message.
  void send_all(const void* data, size_t bytes, const Deadline& deadline, const std::string& what);
  void recv_all(void* data, size_t bytes, const Deadline& deadline, const std::string& what);

  void set_nonblocking();
  void set_nodelay();
  // Turns TCP keepalive on, for a socket that carries (almost) nothing: the
  // kernel probes the idle connection and gives it up (ETIMEDOUT) once
  // nothing was acknowledged for `seconds`, as when the peer's host is down
  // or the network to it is cut; a stopped process's kernel still answers.
  // Not for data sockets: TCP_USER_TIMEOUT also ends a connection whose
  // receiver keeps its window closed that long.
  void keep_alive(double seconds);
  // True when the peer has closed or reset the connection, or the kernel
  // gave it up (checks without consuming data; only meaningful on a socket
  // that carries no payload).
  bool peer_closed() const;
  // True when the kernel gave the connection up for want of
  // acknowledgements (see keep_alive).
  bool gave_up() const;
  // recv(MSG_PEEK) and send() that never block, keeping the socket's error
  // for loss() (a call that fails returns it once and clears it).
  ssize_t peek(void* data, size_t bytes) const;
  ssize_t send_nowait(const void* data, size_t bytes);
  // Why the connection was lost, for an error: that the peer's host stopped
  // answering when the kernel gave the connection up for want of
  // acknowledgements (`err`, else the socket's own error), else that the
  // peer's process is gone.
  std::string loss(int err = 0) const;
  // True for the errors of a connection the peer closed or reset.
  static bool closed_by_peer(int err);
  // True for the errors of a connection the kernel gave up for want of
  // acknowledgements (a keepalive or send timeout, no route to the host).
  static bool unanswered(int err);
  // Wakes the peer with EOF; the descriptor stays open until destruction.
  void shutdown();

 private:
  // The connection's error, read from the kernel once (reading it clears
  // it there) and kept; 0 while there is none.
  int connection_error() const;
  // A failed call's errno, kept as the connection's error.
  int kept(int err) const;

  int fd_ = -1;
  // Atomic: the connections of several threads watch one control socket.
  mutable std::atomic<int> error_{0};
  double keep_alive_s_ = 0;
};

}  // namespace weft
