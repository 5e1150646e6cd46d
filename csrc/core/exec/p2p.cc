#include "core/exec/p2p.h"

#include <algorithm>
#include <cstring>
#include <sstream>

#include "core/common/error.h"
#include "core/exec/backoff.h"

namespace weft {
namespace {

constexpr uint32_t kMagic = 0x77667470;  // "wftp"

std::string describe(const OpContext& op, const std::string& what, int peer) {
  std::ostringstream msg;
  msg << op.name << " #" << op.seq << " on rank " << op.rank << " " << what;
  if (peer >= 0) {
    msg << " rank " << peer;
  } else {
    msg << " any rank";
  }
  return msg.str();
}

void progress(Connection* conn, const OpContext& op, int peer) {
  try {
    conn->progress();
  } catch (const PeerError& e) {
    throw PeerError(describe(op, "lost", peer) + ": " + e.what());
  }
}

// Retries `attempt` until it succeeds, progressing `conn` in between.
template <typename Attempt>
void wait_on(Connection* conn, int peer, const OpContext& op, Backoff& backoff,
             const char* what, Attempt attempt) {
  while (!attempt()) {
    progress(conn, op, peer);
    if (attempt()) break;
    backoff.idle([&] { return describe(op, what, peer); });
  }
  backoff.reset();
}

// A matched message must fill the receive buffer exactly.
void check_length(const OpContext& op, int source, uint32_t tag, size_t sent, size_t expected) {
  if (sent == expected) return;
  std::ostringstream msg;
  msg << describe(op, "matched a message from", source) << " with tag " << tag << " of " << sent
      << " bytes, but the receive buffer has " << expected
      << " bytes; post a receive of the size that was sent";
  throw InvalidArgument(msg.str());
}

}  // namespace

P2p::P2p(int rank, std::vector<Connection*> connections)
    : rank_(rank), conns_(std::move(connections)), stash_(conns_.size()) {}

void P2p::send(const void* data, size_t bytes, int peer, uint32_t tag, const OpContext& op) {
  Connection* conn = conns_[peer];
  Backoff backoff(op.timeout_s);
  Header header{kMagic, tag, bytes};
  void* slot = nullptr;
  wait_on(conn, peer, op, backoff, "waiting to send to",
          [&] { return (slot = conn->send_slot()) != nullptr; });
  std::memcpy(slot, &header, sizeof(header));
  conn->post_send(sizeof(header));
  const char* p = static_cast<const char*>(data);
  for (size_t off = 0; off < bytes; off += conn->slot_bytes()) {
    size_t n = std::min(conn->slot_bytes(), bytes - off);
    wait_on(conn, peer, op, backoff, "waiting to send to",
            [&] { return conn->send_from(p + off, n); });
  }
  wait_on(conn, peer, op, backoff, "waiting to finish sending to",
          [&] { return conn->sends_complete(); });
}

void P2p::recv_payload(void* data, size_t bytes, int peer, const OpContext& op) {
  Connection* conn = conns_[peer];
  Backoff backoff(op.timeout_s);
  char* p = static_cast<char*>(data);
  for (size_t off = 0; off < bytes; off += conn->slot_bytes()) {
    size_t n = std::min(conn->slot_bytes(), bytes - off);
    wait_on(conn, peer, op, backoff, "receiving from",
            [&] { return conn->recv_into(p + off, n); });
  }
}

bool P2p::take_stashed(void* data, size_t bytes, int peer, uint32_t tag, const OpContext& op,
                       int* source) {
  for (size_t p = 0; p < stash_.size(); ++p) {
    if (peer >= 0 && static_cast<int>(p) != peer) continue;
    auto& queue = stash_[p];
    auto it = std::find_if(queue.begin(), queue.end(), [&](const Stashed& s) { return s.tag == tag; });
    if (it == queue.end()) continue;
    check_length(op, static_cast<int>(p), tag, it->payload.size(), bytes);
    std::memcpy(data, it->payload.data(), bytes);
    queue.erase(it);
    *source = static_cast<int>(p);
    return true;
  }
  return false;
}

int P2p::recv(void* data, size_t bytes, int peer, uint32_t tag, const OpContext& op) {
  int source = -1;
  if (take_stashed(data, bytes, peer, tag, op, &source)) return source;
  Backoff backoff(op.timeout_s);
  while (true) {
    bool idle = true;
    for (size_t p = 0; p < conns_.size(); ++p) {
      if (conns_[p] == nullptr || (peer >= 0 && static_cast<int>(p) != peer)) continue;
      Connection* conn = conns_[p];
      progress(conn, op, static_cast<int>(p));
      const void* slot = conn->recv_slot(sizeof(Header));
      if (slot == nullptr) continue;
      Header header;
      std::memcpy(&header, slot, sizeof(header));
      conn->release_recv();
      if (header.magic != kMagic) {
        throw PeerError(describe(op, "got a corrupt message header from", static_cast<int>(p)));
      }
      idle = false;
      if (header.tag == tag) {
        check_length(op, static_cast<int>(p), tag, header.bytes, bytes);
        recv_payload(data, bytes, static_cast<int>(p), op);
        return static_cast<int>(p);
      }
      Stashed stashed{header.tag, std::vector<char>(header.bytes)};
      recv_payload(stashed.payload.data(), header.bytes, static_cast<int>(p), op);
      stash_[p].push_back(std::move(stashed));
    }
    if (idle) {
      backoff.idle([&] { return describe(op, "waiting for a message with tag " +
                                                     std::to_string(tag) + " from",
                                                 peer); });
    } else {
      backoff.reset();
    }
  }
}

}  // namespace weft
