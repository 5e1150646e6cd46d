// SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104): what the bootstrap
// handshake needs to prove that a connecting process knows the job's secret,
// small enough to read in one sitting rather than a crypto library to link.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace weft {

using Digest = std::array<uint8_t, 32>;

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t bytes);
  Digest finish();

 private:
  void block(const uint8_t* p);
  uint32_t h_[8];
  uint8_t buffer_[64];
  size_t buffered_ = 0;
  uint64_t total_ = 0;
};

Digest sha256(const void* data, size_t bytes);

// HMAC-SHA256 over a message given in pieces (update), keyed once.
class HmacSha256 {
 public:
  HmacSha256(const void* key, size_t key_bytes);
  void update(const void* data, size_t bytes) { inner_.update(data, bytes); }
  Digest finish();

 private:
  Sha256 inner_;
  uint8_t outer_pad_[64];
};

Digest hmac_sha256(const void* key, size_t key_bytes, const void* data, size_t bytes);

// Compares without an early exit, so the time taken says nothing about where
// two MACs first differ.
bool equal_in_constant_time(const Digest& a, const Digest& b);

}  // namespace weft
