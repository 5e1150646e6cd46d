#include "core/transport/op_signature.h"

#include <cstdint>
#include <cstring>

namespace weft {
namespace {

// A word at a time, not a byte: this runs on every call. The multiplier is
// FNV's 64-bit prime; the shift carries high bits down into the low ones.
uint64_t mix(uint64_t h, uint64_t word) {
  h = (h ^ word) * 0x100000001b3ull;
  return h ^ (h >> 29);
}

// The text; its last, partial word carries the number of bytes in it (so
// that "ab" + "c" differs from "a" + "bc").
uint64_t mix(uint64_t h, const char* text, size_t n) {
  for (; n >= 8; text += 8, n -= 8) {
    uint64_t word;
    std::memcpy(&word, text, 8);
    h = mix(h, word);
  }
  uint64_t tail = 0;
  std::memcpy(&tail, text, n);
  return mix(h, tail ^ (static_cast<uint64_t>(n) << 56));
}

constexpr const char* kRule =
    " (every rank must issue the same collectives, with the same sizes, in the same order)";

}  // namespace

uint64_t op_signature(uint64_t seq, const char* collective, const std::string& algorithm,
                      DataType dtype, ReduceOp op, size_t agreed_bytes, int root) {
  uint64_t h = mix(0xcbf29ce484222325ull, collective, std::strlen(collective));
  h = mix(h, algorithm.data(), algorithm.size());
  h = mix(h, static_cast<uint64_t>(dtype) << 8 | static_cast<uint64_t>(op));
  h = mix(h, agreed_bytes);
  h = mix(h, static_cast<uint64_t>(root));
  const uint32_t low = static_cast<uint32_t>(h ^ h >> 32);
  return (seq + 1) << 32 | low;  // never 0, the tag of traffic outside operations
}

std::string op_mismatch(uint64_t ours, uint64_t theirs) {
  const uint64_t our_seq = (ours >> 32) - 1, their_seq = (theirs >> 32) - 1;
  std::string why = "ranks out of step: the peer's message ";
  if (ours == 0 || theirs == 0) {
    why += "does not belong to the same kind of traffic";
  } else if (our_seq != their_seq) {
    why += "belongs to its operation #" + std::to_string(their_seq) + ", this rank runs #" +
           std::to_string(our_seq);
  } else {
    why += "belongs to an operation #" + std::to_string(their_seq) +
           " with another collective, algorithm, size, dtype or reduce op";
  }
  return why + kRule;
}

std::string length_mismatch(size_t expected, size_t sent) {
  return "ranks out of step: expected a message of " + std::to_string(expected) +
         " bytes from the peer, it sent " + std::to_string(sent) + kRule;
}

}  // namespace weft
