#include "core/bootstrap/mesh.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <thread>

#include "core/common/config.h"
#include "core/common/error.h"
#include "core/common/log.h"
#include "core/common/machine.h"

namespace weft {
namespace {

constexpr uint32_t kAddressMagic = 0x57464142;  // "WFAB"
constexpr uint32_t kHelloMagic = 0x5746484c;    // "WFHL"

// Sent by the connecting (higher) rank on every new socket.
struct Hello {
  uint32_t magic;
  int32_t from;
  int32_t to;
  int32_t index;
};

// ---- PeerAddress <-> bytes (the ranks of one job share an architecture) ----

template <typename T>
void put(std::vector<uint8_t>& out, const T& value) {
  const uint8_t* p = reinterpret_cast<const uint8_t*>(&value);
  out.insert(out.end(), p, p + sizeof(T));
}

void put_string(std::vector<uint8_t>& out, const std::string& s) {
  put(out, static_cast<uint32_t>(s.size()));
  out.insert(out.end(), s.begin(), s.end());
}

class Reader {
 public:
  explicit Reader(const std::vector<uint8_t>& in) : in_(in) {}
  template <typename T>
  bool get(T& value) {
    if (in_.size() - pos_ < sizeof(T)) return false;
    std::memcpy(&value, in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool get_string(std::string& s) {
    uint32_t n = 0;
    if (!get(n) || in_.size() - pos_ < n) return false;
    s.assign(reinterpret_cast<const char*>(in_.data() + pos_), n);
    pos_ += n;
    return true;
  }
  bool done() const { return pos_ == in_.size(); }

 private:
  const std::vector<uint8_t>& in_;
  size_t pos_ = 0;
};

std::vector<uint8_t> encode(const PeerAddress& a) {
  std::vector<uint8_t> out;
  put(out, kAddressMagic);
  put(out, a.size);
  put(out, a.pid);
  put(out, a.port);
  put_string(out, a.host_id);
  put_string(out, a.cpus);
  put(out, a.spread.ranks);
  put(out, a.spread.index);
  put_string(out, a.ip);
  return out;
}

PeerAddress decode(const std::vector<uint8_t>& bytes, const std::string& key) {
  PeerAddress a;
  Reader r(bytes);
  uint32_t magic = 0;
  if (!r.get(magic) || magic != kAddressMagic || !r.get(a.size) || !r.get(a.pid) ||
      !r.get(a.port) || !r.get_string(a.host_id) || !r.get_string(a.cpus) ||
      !r.get(a.spread.ranks) || !r.get(a.spread.index) || !r.get_string(a.ip) || !r.done()) {
    throw PeerError(
        "bootstrap: store entry '" + key +
        "' is not a weft address of this version (does a peer run another weft build?)");
  }
  return a;
}

// ---- local address ----

std::string advertised_ip() {
  const std::string& wanted = config().socket_ifname;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) < 0) throw_system_error("getifaddrs", errno);
  std::string found;
  bool name_seen = false;
  for (ifaddrs* i = list; i != nullptr && found.empty(); i = i->ifa_next) {
    if (!wanted.empty() && wanted == i->ifa_name) name_seen = true;
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    bool match = wanted.empty() ? ((i->ifa_flags & IFF_UP) && !(i->ifa_flags & IFF_LOOPBACK))
                                : wanted == i->ifa_name;
    if (!match) continue;
    char text[INET_ADDRSTRLEN] = {};
    const auto* sin = reinterpret_cast<const sockaddr_in*>(i->ifa_addr);
    if (::inet_ntop(AF_INET, &sin->sin_addr, text, sizeof(text)) != nullptr) found = text;
  }
  ::freeifaddrs(list);
  if (!wanted.empty() && found.empty()) {
    throw InvalidArgument("WEFT_SOCKET_IFNAME='" + wanted + "': " +
                          (name_seen ? "interface has no IPv4 address" : "no such interface"));
  }
  return found.empty() ? "127.0.0.1" : found;
}

Socket listen_any(int backlog, uint16_t& port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) throw_system_error("bootstrap: socket", errno);
  Socket s(fd);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) < 0) {
    throw_system_error("bootstrap: bind", errno);
  }
  if (::listen(fd, backlog) < 0) throw_system_error("bootstrap: listen", errno);
  socklen_t len = sizeof(addr);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) < 0) {
    throw_system_error("bootstrap: getsockname", errno);
  }
  port = ntohs(addr.sin_port);
  return s;
}

void set_blocking(Socket& s) {
  int flags = ::fcntl(s.fd(), F_GETFL, 0);
  if (flags < 0 || ::fcntl(s.fd(), F_SETFL, flags & ~O_NONBLOCK) < 0) {
    throw_system_error("fcntl(blocking)", errno);
  }
}

// Errors after which the peer may still come up (or its backlog drain).
bool retryable(int err) {
  return err == ECONNREFUSED || err == ETIMEDOUT || err == ECONNRESET || err == ECONNABORTED ||
         err == ENETUNREACH || err == EHOSTUNREACH || err == EAGAIN;
}

// Non-blocking connect so that neither an unreachable host nor a full backlog
// can hold us past the deadline.
Socket connect_to(const std::string& ip, uint16_t port, const Deadline& deadline,
                  const std::string& what) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  if (::inet_pton(AF_INET, ip.c_str(), &addr.sin_addr) != 1) {
    throw PeerError(what + ": '" + ip + "' is not an IPv4 address");
  }
  int pause_ms = 1;
  for (;;) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) throw_system_error(what + ": socket", errno);
    Socket s(fd);
    int err = 0;
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) < 0) err = errno;
    if (err == EINPROGRESS || err == EINTR) {
      pollfd p{fd, POLLOUT, 0};
      int n;
      while ((n = ::poll(&p, 1, deadline.remaining_ms())) < 0 && errno == EINTR) {
      }
      if (n < 0) throw_system_error(what + ": poll", errno);
      if (n == 0) throw TimeoutError(what + ": timed out");
      socklen_t len = sizeof(err);
      if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0) err = errno;
    }
    if (err == 0) return s;
    if (!retryable(err)) throw_system_error(what, err);
    if (deadline.expired()) {
      throw TimeoutError(what + ": timed out (last error: " + std::strerror(err) + ")");
    }
    std::this_thread::sleep_for(
        std::chrono::milliseconds(std::min(pause_ms, deadline.remaining_ms())));
    pause_ms = std::min(pause_ms * 2, 100);
  }
}

}  // namespace

Mesh::Mesh(Store& store, const std::string& prefix, int rank, int size, int sockets_per_peer,
           double timeout_s, CpuSpread spread)
    : rank_(rank), size_(size) {
  if (size < 1 || rank < 0 || rank >= size) {
    throw InvalidArgument("rank " + std::to_string(rank) + " is not in a world of size " +
                          std::to_string(size));
  }
  if (sockets_per_peer < 1) {
    throw InvalidArgument("sockets_per_peer must be at least 1, got " +
                          std::to_string(sockets_per_peer));
  }
  Deadline deadline(timeout_s);
  const std::string me = "bootstrap (rank " + std::to_string(rank) + ")";

  // 1. Listen and publish where.
  uint16_t port = 0;
  Socket listener = listen_any(std::max(256, size * sockets_per_peer), port);
  PeerAddress self;
  self.host_id = config().host_id;
  self.cpus = cpu_identity(self.host_id);
  self.spread = spread;
  self.ip = advertised_ip();
  self.port = port;
  self.pid = static_cast<int32_t>(::getpid());
  self.size = size;
  store.set(prefix + "/addr/" + std::to_string(rank), encode(self));
  WEFT_LOG(Info, rank, "bootstrap: listening on " << self.ip << ":" << port);

  // 2. Read everyone's entry; a size mismatch is reported as soon as seen.
  peers_.resize(size);
  for (int r = 0; r < size; ++r) {
    if (r == rank) {
      peers_[r] = self;
      continue;
    }
    std::string key = prefix + "/addr/" + std::to_string(r);
    peers_[r] = decode(store.get(key), key);
    if (peers_[r].size != size) {
      throw InvalidArgument("world size mismatch: this rank (" + std::to_string(rank) +
                            ") was created with size " + std::to_string(size) + " but rank " +
                            std::to_string(r) + " with size " + std::to_string(peers_[r].size) +
                            "; every rank must pass the same size");
    }
  }

  // 3. Connect to every lower rank. This never waits for the peer to accept
  // (the kernel queues the connection), so it cannot deadlock with step 4.
  sockets_.resize(size);
  for (auto& per_peer : sockets_) per_peer.resize(sockets_per_peer);
  for (int r = 0; r < rank; ++r) {
    const PeerAddress& p = peers_[r];
    std::string ip = p.host_id == self.host_id ? "127.0.0.1" : p.ip;
    for (int i = 0; i < sockets_per_peer; ++i) {
      std::string what = me + " connecting to rank " + std::to_string(r) + " at " + ip + ":" +
                         std::to_string(p.port);
      Socket s = connect_to(ip, p.port, deadline, what);
      Hello hello{kHelloMagic, rank, r, i};
      s.send_all(&hello, sizeof(hello), deadline, what);
      sockets_[r][i] = std::move(s);
    }
  }

  // 4. Accept the sockets of every higher rank and file them by their hello.
  int expected = (size - 1 - rank) * sockets_per_peer;
  auto missing = [&] {
    std::string list;
    for (int r = rank + 1; r < size; ++r) {
      bool complete = std::all_of(sockets_[r].begin(), sockets_[r].end(),
                                  [](const Socket& s) { return s.valid(); });
      if (!complete) list += (list.empty() ? "" : ", ") + std::to_string(r);
    }
    char seconds[32];
    std::snprintf(seconds, sizeof(seconds), "%g", timeout_s);
    return me + ": timed out after " + seconds + " s waiting for rank(s) " + list + " to connect";
  };
  while (expected > 0) {
    pollfd pfd{listener.fd(), POLLIN, 0};
    int n = ::poll(&pfd, 1, deadline.remaining_ms());
    if (n < 0 && errno != EINTR) throw_system_error(me + ": poll", errno);
    if (n == 0 && deadline.expired()) throw TimeoutError(missing());
    if (n <= 0) continue;
    int fd = ::accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      int err = errno;
      if (err == EAGAIN || err == EWOULDBLOCK || err == EINTR || err == ECONNABORTED) continue;
      throw_system_error(me + ": accept", err);
    }
    Socket s(fd);
    Hello hello{};
    try {
      s.recv_all(&hello, sizeof(hello), deadline, me + ": reading a connecting peer's hello");
    } catch (const TimeoutError&) {
      throw TimeoutError(missing());
    }
    bool valid = hello.magic == kHelloMagic && hello.to == rank && hello.from > rank &&
                 hello.from < size && hello.index >= 0 && hello.index < sockets_per_peer &&
                 !sockets_[hello.from][hello.index].valid();
    if (!valid) {
      throw PeerError(me + ": an unexpected connection reached this rank's port (bad hello; is " +
                      "another job using the same store prefix?)");
    }
    sockets_[hello.from][hello.index] = std::move(s);
    --expected;
  }

  for (int r = 0; r < size; ++r) {
    for (Socket& s : sockets_[r]) {
      if (!s.valid()) continue;
      set_blocking(s);
      s.set_nodelay();
    }
  }
  WEFT_LOG(Info, rank,
           "bootstrap: connected to " << size - 1 << " peer(s), " << sockets_per_peer
                                      << " socket(s) each");
}

}  // namespace weft
