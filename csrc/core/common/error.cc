#include "core/common/error.h"

#include <cstring>

namespace weft {

std::string lost_rank(int peer, const std::string& why) {
  return "lost rank " + std::to_string(peer) + ": " + why;
}

void throw_system_error(const std::string& what, int err) {
  throw PeerError(what + ": " + std::strerror(err));
}

}  // namespace weft
