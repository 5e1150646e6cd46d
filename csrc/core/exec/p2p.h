// Tagged point-to-point messages on their own channel, so they never mix with
// collective traffic. A message is a 16-byte header {tag, length} followed by
// its payload in slot-sized pieces. A receive takes the next message from the
// named peer (or from any peer) whose tag matches; messages with other tags
// that arrive first are set aside for later receives.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "core/exec/executor.h"
#include "core/transport/connection.h"

namespace weft {

class P2p {
 public:
  // connections[p] is the p2p-channel connection to rank p (null for self).
  P2p(int rank, std::vector<Connection*> connections);

  void send(const void* data, size_t bytes, int peer, uint32_t tag, const OpContext& op);
  // peer < 0: any source. Returns the source rank. Throws InvalidArgument
  // when the matched message's length differs from `bytes`.
  int recv(void* data, size_t bytes, int peer, uint32_t tag, const OpContext& op);

 private:
  struct Header {
    uint32_t magic;
    uint32_t tag;
    uint64_t bytes;
  };
  struct Stashed {
    uint32_t tag;
    std::vector<char> payload;
  };

  bool take_stashed(void* data, size_t bytes, int peer, uint32_t tag, const OpContext& op,
                    int* source);
  // Receives `bytes` of payload from `peer` into `data`, slot by slot.
  void recv_payload(void* data, size_t bytes, int peer, const OpContext& op);

  int rank_;
  std::vector<Connection*> conns_;
  std::vector<std::deque<Stashed>> stash_;  // per peer, arrival order
};

}  // namespace weft
