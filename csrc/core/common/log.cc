#include "core/common/log.h"

#include <unistd.h>

#include <mutex>
#include <set>
#include <string>
#include <utility>

namespace weft {

void log_line(int rank, const std::string& message) {
  std::string line = "weft[rank " + std::to_string(rank) + "] " + message + "\n";
  // One write() so lines of concurrent ranks do not interleave.
  ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
  (void)ignored;
}

void log_call_line(int rank, const void* owner, const std::string& message) {
  if (!log_enabled(LogLevel::Trace)) {
    static std::mutex mu;
    static std::set<std::pair<const void*, std::string>> logged;
    std::lock_guard<std::mutex> lock(mu);
    if (!logged.emplace(owner, message).second) return;
  }
  log_line(rank, message);
}

}  // namespace weft
