// The messages of the bootstrap handshake, by which the two ends of every
// mesh socket prove to each other that they know the job's secret without
// sending it (challenge and response, HMAC-SHA256 over fresh nonces from both
// sides):
//   connecting rank -> accepting rank   Hello     from, to, index, its nonce
//   accepting rank  -> connecting rank  Challenge its nonce, accept_mac
//   connecting rank -> accepting rank   Proof     connect_mac
//   accepting rank  -> connecting rank  one byte: the socket is filed
// Both MACs cover the mesh's store prefix, its size, the hello and both
// nonces, under different labels, so neither can be replayed or reflected.
// Every message has a fixed size: nothing a stranger sends is a length.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "core/common/sha256.h"

namespace weft {

using Nonce = std::array<uint8_t, 32>;

struct Hello {
  int32_t from = 0;
  int32_t to = 0;
  int32_t index = 0;
  Nonce nonce{};
};

struct Challenge {
  Nonce nonce{};
  Digest mac{};
};

constexpr size_t kHelloBytes = 4 + 3 * 4 + sizeof(Nonce);
constexpr size_t kChallengeBytes = 4 + sizeof(Nonce) + sizeof(Digest);
constexpr size_t kProofBytes = sizeof(Digest);
constexpr uint8_t kWelcome = 'W';

std::array<uint8_t, kHelloBytes> encode_hello(const Hello& hello);
// nullopt unless `bytes` is a hello of this weft version.
std::optional<Hello> decode_hello(const uint8_t* bytes, size_t n);

std::array<uint8_t, kChallengeBytes> encode_challenge(const Challenge& challenge);
std::optional<Challenge> decode_challenge(const uint8_t* bytes, size_t n);

// What both MACs of one socket's handshake are computed over.
struct Transcript {
  const std::string& prefix;  // the mesh's store prefix: one communicator
  int32_t size;
  const Hello& hello;
  const Nonce& accept_nonce;
};

Digest accept_mac(const std::string& secret, const Transcript& t);
Digest connect_mac(const std::string& secret, const Transcript& t);

// Bytes from the kernel's random source (getrandom), for nonces and secrets.
void fill_random(void* out, size_t bytes);
Nonce fresh_nonce();

}  // namespace weft
