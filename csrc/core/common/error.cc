#include "core/common/error.h"

#include <cstring>

namespace weft {

void throw_system_error(const std::string& what, int err) {
  throw PeerError(what + ": " + std::strerror(err));
}

}  // namespace weft
