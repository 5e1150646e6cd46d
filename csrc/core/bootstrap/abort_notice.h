// What a rank tells its peers on the control sockets (which carry nothing
// else after setup) before it shuts its connections down: a kind letter, a
// reason and a newline, at most kMostNoticeBytes. Peers read it without
// consuming it, so that a closed control socket with a notice in it is told
// from a rank whose process died. Bytes from a peer: decoding checks them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace weft {

constexpr char kTimedOut = 'T', kPeerFailed = 'P', kUserAbort = 'A';
// A rank that left an idle group (destroy_process_group between operations)
// sends kLeft with how many operations it took part in, a space and why: its
// peers finish those and fail the next one at once.
constexpr char kLeft = 'L';
constexpr size_t kMostNoticeBytes = 1024;

struct AbortNotice {
  char kind;
  std::string reason;
};

// The notice's bytes: the reason cut to fit, its newlines made spaces.
std::string encode_notice(char kind, const std::string& reason);
// The notice at the start of `bytes`, or nullopt where none is (yet): fewer
// than two bytes, a kind weft does not send, no newline within
// kMostNoticeBytes.
std::optional<AbortNotice> decode_notice(const char* bytes, size_t n);

// How many operations a kLeft notice's rank took part in (0 if it says none).
uint64_t operations_taken(const std::string& left_reason);
// What a kLeft notice's reason says, in words for an error.
std::string left_words(const std::string& left_reason);

}  // namespace weft
