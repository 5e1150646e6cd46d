#include "core/bootstrap/abort_notice.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace weft {

std::string encode_notice(char kind, const std::string& reason) {
  std::string notice = kind + reason.substr(0, kMostNoticeBytes - 2) + "\n";
  for (size_t i = 0; i + 1 < notice.size(); ++i) {
    if (notice[i] == '\n') notice[i] = ' ';
  }
  return notice;
}

std::optional<AbortNotice> decode_notice(const char* bytes, size_t n) {
  n = std::min(n, kMostNoticeBytes);
  if (n < 2) return std::nullopt;
  const char kind = bytes[0];
  if (kind != kTimedOut && kind != kPeerFailed && kind != kUserAbort && kind != kLeft) {
    return std::nullopt;  // not a notice weft sends
  }
  const char* end = static_cast<const char*>(std::memchr(bytes + 1, '\n', n - 1));
  if (end == nullptr) return std::nullopt;
  return AbortNotice{kind, std::string(bytes + 1, end)};
}

uint64_t operations_taken(const std::string& left_reason) {
  return std::strtoull(left_reason.c_str(), nullptr, 10);
}

std::string left_words(const std::string& left_reason) {
  const uint64_t took = operations_taken(left_reason);
  const size_t space = left_reason.find(' ');
  const std::string why =
      space == std::string::npos ? "" : " (" + left_reason.substr(space + 1) + ")";
  return "it left the group " +
         (took == 0 ? std::string("before its first operation")
                    : "after its operation #" + std::to_string(took - 1)) +
         why;
}

}  // namespace weft
