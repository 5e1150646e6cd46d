// A move-only TCP socket with blocking helpers bounded by a Deadline.
#pragma once

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
  // True when the peer has closed or reset the connection (checks without
  // consuming data; only meaningful on a socket that carries no payload).
  bool peer_closed() const;
  // Wakes the peer with EOF; the descriptor stays open until destruction.
  void shutdown();

 private:
  int fd_ = -1;
};

}  // namespace weft
