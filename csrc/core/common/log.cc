#include "core/common/log.h"

#include <unistd.h>

#include <string>

namespace weft {

void log_line(int rank, const std::string& message) {
  std::string line = "weft[rank " + std::to_string(rank) + "] " + message + "\n";
  // One write() so lines of concurrent ranks do not interleave.
  ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
  (void)ignored;
}

}  // namespace weft
