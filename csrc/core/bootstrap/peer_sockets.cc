#include "core/bootstrap/peer_sockets.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <iterator>
#include <list>
#include <thread>

#include "core/bootstrap/handshake.h"
#include "core/common/error.h"
#include "core/common/log.h"

namespace weft {
namespace {

// Connections on the port still to complete their handshake; past this many
// the oldest silent one makes room (a rank's own connection is answered
// within a round trip, and is retried if it was dropped all the same).
constexpr size_t kMaxPending = 128;

// A rank that owes us a socket waits for it with its listener open
// (listener_watch.h), so each rank is watched once the mesh has taken this
// long: a quick bootstrap makes no extra connection.
constexpr double kWatchAfterS = 0.5;

// Errors after which the peer may still come up (or its backlog drain). Not
// ECONNREFUSED: the address comes from the Store, published once the rank
// listened, so a refusal means its listener is gone.
bool retryable(int err) {
  return err == ETIMEDOUT || err == ECONNRESET || err == ECONNABORTED || err == ENETUNREACH ||
         err == EHOSTUNREACH || err == EAGAIN;
}

void pause(int& pause_ms, const Deadline& deadline) {
  std::this_thread::sleep_for(
      std::chrono::milliseconds(std::min(pause_ms, deadline.remaining_ms())));
  pause_ms = std::min(pause_ms * 2, 100);
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
    if (err == ECONNREFUSED) {
      throw PeerError(what + ": connection refused: that rank has left (its process died, or " +
                      "its communicator creation failed) after it published this address");
    }
    if (!retryable(err)) throw_system_error(what, err);
    if (deadline.expired()) {
      throw TimeoutError(what + ": timed out (last error: " + std::strerror(err) + ")");
    }
    pause(pause_ms, deadline);
  }
}

std::string peer_name(const sockaddr_in& addr) {
  char text[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &addr.sin_addr, text, sizeof(text));
  return std::string(text) + ":" + std::to_string(ntohs(addr.sin_port));
}

// One accepted connection on its way through the handshake.
struct Pending {
  Socket socket;
  std::string from;         // ip:port, for the log
  bool challenged = false;  // hello taken and answered: reading the proof
  uint8_t in[kHelloBytes];  // the message being read (kProofBytes once challenged)
  size_t have = 0;
  Hello hello;
  Nonce nonce{};
};

class Acceptor {
 public:
  Acceptor(const MeshIdentity& me, std::vector<std::vector<Socket>>& sockets)
      : me_(me), sockets_(sockets) {}

  // Takes every connection waiting on the listener, reading at once what each
  // has already sent: a peer whose hello came with its connection is answered
  // before the next crowd of strangers can shed it.
  void accept_all(Socket& listener, int& expected) {
    for (;;) {
      sockaddr_in addr{};
      socklen_t len = sizeof(addr);
      int fd = ::accept4(listener.fd(), reinterpret_cast<sockaddr*>(&addr), &len,
                         SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) {
        int err = errno;
        if (err == EINTR || err == ECONNABORTED) continue;
        if (err == EAGAIN || err == EWOULDBLOCK) return;
        // Out of descriptors: shed a stranger and let poll() bring us back.
        if ((err == EMFILE || err == ENFILE) && !pending_.empty()) {
          drop(victim(), "too many connections waiting at once (out of file descriptors)");
          return;
        }
        throw_system_error(me() + ": accept", err);
      }
      if (pending_.size() >= kMaxPending) {
        drop(victim(), "too many connections waiting at once");
      }
      pending_.emplace_back();
      pending_.back().socket = Socket(fd);
      pending_.back().from = peer_name(addr);
      advance(std::prev(pending_.end()), expected);
      if (expected == 0) return;
    }
  }

  // Reads what `p` sent; returns true when `p` is done with (filed or dropped).
  bool advance(std::list<Pending>::iterator p, int& expected) {
    const size_t want = p->challenged ? kProofBytes : kHelloBytes;
    ssize_t n = ::recv(p->socket.fd(), p->in + p->have, want - p->have, MSG_DONTWAIT);
    if (n == 0) return drop(p, "closed before completing the handshake");
    if (n < 0) {
      int err = errno;
      if (err == EAGAIN || err == EWOULDBLOCK || err == EINTR) return false;
      return drop(p, std::string("failed: ") + std::strerror(err));
    }
    p->have += static_cast<size_t>(n);
    if (p->have < want) return false;
    p->have = 0;
    return p->challenged ? take_proof(p, expected) : take_hello(p);
  }

  std::list<Pending>& pending() { return pending_; }

 private:
  std::string me() const { return "bootstrap (rank " + std::to_string(me_.rank) + ")"; }

  bool take_hello(std::list<Pending>::iterator p) {
    std::optional<Hello> hello = decode_hello(p->in, kHelloBytes);
    if (!hello) return drop(p, "not a weft hello of this version");
    const Hello& h = *hello;
    if (h.to != me_.rank || h.from <= me_.rank || h.from >= me_.size || h.index < 0 ||
        h.index >= me_.sockets_per_peer) {
      return drop(p, "its hello (from " + std::to_string(h.from) + " to " + std::to_string(h.to) +
                         ", socket " + std::to_string(h.index) + ") names no socket of this mesh");
    }
    if (sockets_[h.from][h.index].valid()) return drop(p, "that socket is already connected");
    p->hello = h;
    p->nonce = fresh_nonce();
    Transcript t{me_.prefix, me_.size, p->hello, p->nonce};
    auto challenge = encode_challenge(Challenge{p->nonce, accept_mac(me_.secret, t)});
    // A fresh socket's send buffer takes these few bytes at once; one that
    // does not is not a peer worth waiting for.
    ssize_t n =
        ::send(p->socket.fd(), challenge.data(), challenge.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n != static_cast<ssize_t>(challenge.size())) return drop(p, "could not be answered");
    p->challenged = true;
    return false;
  }

  bool take_proof(std::list<Pending>::iterator p, int& expected) {
    Digest proof;
    std::memcpy(proof.data(), p->in, proof.size());
    Transcript t{me_.prefix, me_.size, p->hello, p->nonce};
    if (!equal_in_constant_time(proof, connect_mac(me_.secret, t))) {
      return drop(p, "wrong proof of the job secret (another job, or a different WEFT_JOB_SECRET)");
    }
    Socket& slot = sockets_[p->hello.from][p->hello.index];
    if (slot.valid()) return drop(p, "that socket is already connected");
    if (::send(p->socket.fd(), &kWelcome, 1, MSG_DONTWAIT | MSG_NOSIGNAL) != 1) {
      return drop(p, "closed before completing the handshake");
    }
    slot = std::move(p->socket);
    pending_.erase(p);
    --expected;
    return true;
  }

  // The connection to shed for room: the oldest that has sent nothing, else the
  // oldest that has not yet sent a whole hello, else the oldest.
  std::list<Pending>::iterator victim() {
    auto silent = std::find_if(pending_.begin(), pending_.end(),
                               [](const Pending& p) { return !p.challenged && p.have == 0; });
    if (silent != pending_.end()) return silent;
    auto unanswered = std::find_if(pending_.begin(), pending_.end(),
                                   [](const Pending& p) { return !p.challenged; });
    return unanswered != pending_.end() ? unanswered : pending_.begin();
  }

  bool drop(std::list<Pending>::iterator p, const std::string& why) {
    WEFT_LOG(Info, me_.rank, "bootstrap: dropped a connection from " << p->from << ": " << why);
    pending_.erase(p);
    return true;
  }

  const MeshIdentity& me_;
  std::vector<std::vector<Socket>>& sockets_;
  std::list<Pending> pending_;
};

}  // namespace

Socket connect_peer(const std::string& ip, uint16_t port, const MeshIdentity& me, int to, int index,
                    const Deadline& deadline, const std::string& what) {
  int pause_ms = 1;
  for (;;) {
    Socket s = connect_to(ip, port, deadline, what);
    Hello hello{me.rank, to, index, fresh_nonce()};
    try {
      auto out = encode_hello(hello);
      s.send_all(out.data(), out.size(), deadline, what);
      uint8_t in[kChallengeBytes];
      s.recv_all(in, sizeof(in), deadline, what);
      std::optional<Challenge> challenge = decode_challenge(in, sizeof(in));
      Transcript t{me.prefix, me.size, hello, challenge ? challenge->nonce : Nonce{}};
      if (!challenge || !equal_in_constant_time(challenge->mac, accept_mac(me.secret, t))) {
        throw InvalidArgument(what + ": the process listening there could not prove it knows the " +
                              "job secret (is WEFT_JOB_SECRET the same on every rank? does " +
                              "another job use the same store?)");
      }
      Digest proof = connect_mac(me.secret, t);
      s.send_all(proof.data(), proof.size(), deadline, what);
      uint8_t welcome = 0;
      s.recv_all(&welcome, 1, deadline, what);
      if (welcome == kWelcome) return s;
    } catch (const PeerError&) {
      // Dropped before it was filed (a crowd of strangers, or our proof was
      // refused): try again while there is time.
      if (deadline.expired()) throw;
    }
    if (deadline.expired()) throw TimeoutError(what + ": timed out");
    pause(pause_ms, deadline);
  }
}

void accept_peers(Socket& listener, const MeshIdentity& me,
                  std::vector<std::vector<Socket>>& sockets, const Deadline& deadline,
                  const std::function<std::string()>& missing, ListenerWatch& watch,
                  const std::function<std::string(int)>& left) {
  Acceptor acceptor(me, sockets);
  int expected = (me.size - 1 - me.rank) * me.sockets_per_peer;
  const Deadline watch_from(kWatchAfterS);
  std::vector<pollfd> fds;
  std::vector<std::list<Pending>::iterator> order;
  while (expected > 0) {
    if (watch_from.expired()) {
      for (int r = me.rank + 1; r < me.size; ++r) {
        bool owed = std::any_of(sockets[r].begin(), sockets[r].end(),
                                [](const Socket& s) { return !s.valid(); });
        if (!owed) {
          watch.forget(r);
        } else if (!watch.watch(r)) {
          throw PeerError(left(r));
        }
      }
    }
    fds.assign(1, pollfd{listener.fd(), POLLIN, 0});
    order.clear();
    for (auto p = acceptor.pending().begin(); p != acceptor.pending().end(); ++p) {
      fds.push_back(pollfd{p->socket.fd(), POLLIN, 0});
      order.push_back(p);
    }
    const size_t watched_at = fds.size();
    watch.add_pollfds(fds);
    int wait_ms = deadline.remaining_ms();
    if (!watch_from.expired()) wait_ms = std::min(wait_ms, watch_from.remaining_ms() + 1);
    int n = ::poll(fds.data(), fds.size(), wait_ms);
    if (n < 0 && errno != EINTR) throw_system_error("bootstrap: poll", errno);
    if (n == 0 && deadline.expired()) throw TimeoutError(missing());
    if (n <= 0) continue;
    for (size_t i = 0; i < watch.ranks().size(); ++i) {
      if (!watch.still_there(i, fds[watched_at + i].revents))
        throw PeerError(left(watch.ranks()[i]));
    }
    // Pending connections first: accepting may shed some of them.
    for (size_t i = 0; i < order.size() && expected > 0; ++i) {
      if (fds[i + 1].revents != 0) acceptor.advance(order[i], expected);
    }
    if (fds[0].revents != 0 && expected > 0) acceptor.accept_all(listener, expected);
  }
}

}  // namespace weft
