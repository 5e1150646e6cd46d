#include "core/transport/op_signature.h"

#include <cstdint>

namespace weft {
namespace {

// FNV-1a, 32 bits.
uint32_t mix(uint32_t h, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 16777619u;
  return h;
}

uint32_t mix(uint32_t h, const std::string& s) { return mix(h, s.data(), s.size() + 1); }

constexpr const char* kRule =
    " (every rank must issue the same collectives, with the same sizes, in the same order)";

}  // namespace

uint64_t op_signature(uint64_t seq, const char* collective, const std::string& algorithm,
                      DataType dtype, ReduceOp op, size_t agreed_bytes) {
  uint32_t h = mix(2166136261u, collective);
  h = mix(h, algorithm);
  const uint64_t fields[] = {static_cast<uint64_t>(dtype), static_cast<uint64_t>(op), agreed_bytes};
  h = mix(h, fields, sizeof(fields));
  return (seq + 1) << 32 | h;  // never 0, the tag of traffic outside operations
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
