#include "core/bootstrap/handshake.h"

#include <sys/random.h>

#include <cerrno>
#include <cstring>

#include "core/common/error.h"

namespace weft {
namespace {

constexpr uint32_t kHelloMagic = 0x57464833;      // "WFH3"
constexpr uint32_t kChallengeMagic = 0x57464348;  // "WFCH"

// Integers travel little-endian whatever the host.
void put32(uint8_t*& p, uint32_t v) {
  for (int i = 0; i < 4; ++i) *p++ = uint8_t(v >> (8 * i));
}

uint32_t get32(const uint8_t*& p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t(*p++) << (8 * i);
  return v;
}

Digest mac(const char* label, const std::string& secret, const Transcript& t) {
  HmacSha256 h(secret.data(), secret.size());
  h.update(label, std::strlen(label) + 1);
  uint8_t numbers[5 * 4];
  uint8_t* p = numbers;
  put32(p, static_cast<uint32_t>(t.prefix.size()));
  put32(p, static_cast<uint32_t>(t.size));
  put32(p, static_cast<uint32_t>(t.hello.from));
  put32(p, static_cast<uint32_t>(t.hello.to));
  put32(p, static_cast<uint32_t>(t.hello.index));
  h.update(numbers, sizeof(numbers));
  h.update(t.prefix.data(), t.prefix.size());
  h.update(t.hello.nonce.data(), t.hello.nonce.size());
  h.update(t.accept_nonce.data(), t.accept_nonce.size());
  return h.finish();
}

}  // namespace

std::array<uint8_t, kHelloBytes> encode_hello(const Hello& hello) {
  std::array<uint8_t, kHelloBytes> out{};
  uint8_t* p = out.data();
  put32(p, kHelloMagic);
  put32(p, static_cast<uint32_t>(hello.from));
  put32(p, static_cast<uint32_t>(hello.to));
  put32(p, static_cast<uint32_t>(hello.index));
  std::memcpy(p, hello.nonce.data(), hello.nonce.size());
  return out;
}

std::optional<Hello> decode_hello(const uint8_t* bytes, size_t n) {
  if (n != kHelloBytes) return std::nullopt;
  const uint8_t* p = bytes;
  if (get32(p) != kHelloMagic) return std::nullopt;
  Hello hello;
  hello.from = static_cast<int32_t>(get32(p));
  hello.to = static_cast<int32_t>(get32(p));
  hello.index = static_cast<int32_t>(get32(p));
  std::memcpy(hello.nonce.data(), p, hello.nonce.size());
  return hello;
}

std::array<uint8_t, kChallengeBytes> encode_challenge(const Challenge& challenge) {
  std::array<uint8_t, kChallengeBytes> out{};
  uint8_t* p = out.data();
  put32(p, kChallengeMagic);
  std::memcpy(p, challenge.nonce.data(), challenge.nonce.size());
  std::memcpy(p + challenge.nonce.size(), challenge.mac.data(), challenge.mac.size());
  return out;
}

std::optional<Challenge> decode_challenge(const uint8_t* bytes, size_t n) {
  if (n != kChallengeBytes) return std::nullopt;
  const uint8_t* p = bytes;
  if (get32(p) != kChallengeMagic) return std::nullopt;
  Challenge challenge;
  std::memcpy(challenge.nonce.data(), p, challenge.nonce.size());
  std::memcpy(challenge.mac.data(), p + challenge.nonce.size(), challenge.mac.size());
  return challenge;
}

Digest accept_mac(const std::string& secret, const Transcript& t) {
  return mac("weft accept", secret, t);
}

Digest connect_mac(const std::string& secret, const Transcript& t) {
  return mac("weft connect", secret, t);
}

void fill_random(void* out, size_t bytes) {
  uint8_t* p = static_cast<uint8_t*>(out);
  while (bytes > 0) {
    ssize_t n = ::getrandom(p, bytes, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_system_error("getrandom", errno);
    }
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

Nonce fresh_nonce() {
  Nonce n;
  fill_random(n.data(), n.size());
  return n;
}

}  // namespace weft
