#include "core/bootstrap/mesh.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>

#include "core/bootstrap/handshake.h"
#include "core/bootstrap/peer_sockets.h"
#include "core/common/config.h"
#include "core/common/error.h"
#include "core/common/log.h"
#include "core/common/machine.h"

namespace weft {
namespace {

constexpr size_t kSecretBytes = 32;

// ---- local address ----

// The IPv4 address of WEFT_SOCKET_IFNAME, or (unset) of the first interface
// that is up and not loopback; "" when unset and there is none.
std::string interface_ip() {
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
  return found;
}

// Where this rank listens: the address WEFT_SOCKET_ADDR or WEFT_SOCKET_IFNAME
// names, bound to it alone; unset, every interface (and peers are told the
// first non-loopback address).
struct ListenAddress {
  std::string ip;
  bool any;
};

ListenAddress listen_address() {
  const Config& cfg = config();
  if (!cfg.socket_addr.empty() && !cfg.socket_ifname.empty()) {
    throw InvalidArgument("WEFT_SOCKET_ADDR and WEFT_SOCKET_IFNAME are both set; set one");
  }
  if (!cfg.socket_addr.empty()) {
    in_addr parsed{};
    if (::inet_pton(AF_INET, cfg.socket_addr.c_str(), &parsed) != 1) {
      throw InvalidArgument("WEFT_SOCKET_ADDR='" + cfg.socket_addr +
                            "' is not an IPv4 address (write it like 10.0.0.5)");
    }
    return {cfg.socket_addr, false};
  }
  std::string ip = interface_ip();
  if (!cfg.socket_ifname.empty()) return {ip, false};
  return {ip.empty() ? "127.0.0.1" : ip, true};
}

Socket listen_on(const ListenAddress& where, int backlog, uint16_t& port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) throw_system_error("bootstrap: socket", errno);
  Socket s(fd);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = 0;
  if (where.any) {
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
  } else {
    ::inet_pton(AF_INET, where.ip.c_str(), &addr.sin_addr);
  }
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) < 0) {
    int err = errno;
    if (err == EADDRNOTAVAIL) {
      throw InvalidArgument("bootstrap: cannot listen on " + where.ip +
                            ": no interface of this host has that address (check "
                            "WEFT_SOCKET_ADDR)");
    }
    throw_system_error("bootstrap: bind " + where.ip, err);
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

PeerAddress decode(const std::vector<uint8_t>& bytes, const std::string& key) {
  std::optional<PeerAddress> a = decode_address(bytes);
  if (!a) {
    throw PeerError(
        "bootstrap: store entry '" + key +
        "' is not a weft address of this version (does a peer run another weft build?)");
  }
  return *a;
}

std::string secret_key(const std::string& prefix) { return prefix + "/secret"; }

// Rank r's entry; the Store's wait for it ends with its own error (its
// timeout) when r never published one: r died before it reached the Store,
// never started, or is still on its way, which no rank can tell apart.
std::vector<uint8_t> read_address(Store& store, const std::string& key, const std::string& me,
                                  int r) {
  try {
    return store.get(key);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    // Only the store's timeout is that (an interrupt, say, passes through).
    const std::string text = e.what();
    if (text.find("imeout") == std::string::npos) throw;
    throw TimeoutError(me + ": rank " + std::to_string(r) +
                       " never joined: its address did not appear in the store (it died before " +
                       "reaching the store, never started, or is slow to start): " + e.what());
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
  const Config& cfg = config();

  // 1. Without WEFT_JOB_SECRET, rank 0 draws this communicator's secret and
  // shares it through the Store (which every rank already trusts) before it
  // publishes its address, so the others find it once they have read that.
  std::string secret = cfg.job_secret;
  if (secret.empty() && rank == 0) {
    std::vector<uint8_t> drawn(kSecretBytes);
    fill_random(drawn.data(), drawn.size());
    store.set(secret_key(prefix), drawn);
    secret.assign(drawn.begin(), drawn.end());
  }

  // 2. Listen and publish where.
  uint16_t port = 0;
  ListenAddress where = listen_address();
  Socket listener = listen_on(where, std::max(256, size * sockets_per_peer), port);
  PeerAddress self;
  self.host_id = cfg.host_id;
  self.cpus = cpu_identity(self.host_id);
  self.spread = spread;
  self.ip = where.ip;
  self.port = port;
  self.pid = static_cast<int32_t>(::getpid());
  self.size = size;
  self.listens_any = where.any;
  self.secret_from_env = !cfg.job_secret.empty();
  store.set(prefix + "/addr/" + std::to_string(rank), encode_address(self));
  WEFT_LOG(Info, rank,
           "bootstrap: listening on " << (where.any ? "0.0.0.0" : where.ip) << ":" << port);

  // 3. Read everyone's entry; a size or secret mismatch is reported as soon
  // as seen.
  peers_.resize(size);
  for (int r = 0; r < size; ++r) {
    if (r == rank) {
      peers_[r] = self;
      continue;
    }
    std::string key = prefix + "/addr/" + std::to_string(r);
    peers_[r] = decode(read_address(store, key, me, r), key);
    if (peers_[r].size != size) {
      throw InvalidArgument("world size mismatch: this rank (" + std::to_string(rank) +
                            ") was created with size " + std::to_string(size) + " but rank " +
                            std::to_string(r) + " with size " + std::to_string(peers_[r].size) +
                            "; every rank must pass the same size");
    }
    if (peers_[r].secret_from_env != self.secret_from_env) {
      throw InvalidArgument("WEFT_JOB_SECRET is set on rank " +
                            std::to_string(self.secret_from_env ? rank : r) + " but not on rank " +
                            std::to_string(self.secret_from_env ? r : rank) +
                            "; set it on every rank or on none");
    }
  }
  if (secret.empty()) {
    std::vector<uint8_t> shared = store.get(secret_key(prefix));
    secret.assign(shared.begin(), shared.end());
  }
  const MeshIdentity identity{prefix, rank, size, sockets_per_peer, secret};

  // 4. Connect to every lower rank. A lower rank answers once it reaches
  // step 5, which rank 0 does at once and every other rank after its own
  // lower ranks answered, so the waits form no cycle.
  sockets_.resize(size);
  for (auto& per_peer : sockets_) per_peer.resize(sockets_per_peer);
  // A peer on this host that listens everywhere is reached over loopback.
  std::vector<ListenerWatch::Target> reach(size);
  for (int r = 0; r < size; ++r) {
    const PeerAddress& p = peers_[r];
    reach[r] = {p.host_id == self.host_id && p.listens_any ? "127.0.0.1" : p.ip, p.port};
  }
  for (int r = 0; r < rank; ++r) {
    const ListenerWatch::Target& at = reach[r];
    for (int i = 0; i < sockets_per_peer; ++i) {
      std::string what = me + " connecting to rank " + std::to_string(r) + " at " + at.ip + ":" +
                         std::to_string(at.port);
      sockets_[r][i] = connect_peer(at.ip, at.port, identity, r, i, deadline, what);
    }
  }

  // 5. Accept the sockets of every higher rank; the listener closes after.
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
  auto left = [&](int r) {
    return me + ": rank " + std::to_string(r) +
           " left before its connections to this rank were made: its " + "listener at " +
           reach[r].ip + ":" + std::to_string(reach[r].port) +
           " is gone (its process died, or its communicator creation failed)";
  };
  ListenerWatch watch(reach);
  accept_peers(listener, identity, sockets_, deadline, missing, watch, left);

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
