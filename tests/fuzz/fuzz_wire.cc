// libFuzzer target: the bootstrap's parsers of bytes from the network (hello,
// challenge) and from the Store (a rank's address). Each must refuse what is
// not its message without reading past the input, and give back what it
// parsed byte for byte when encoded again.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/bootstrap/address.h"
#include "core/bootstrap/handshake.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace weft;
  if (auto hello = decode_hello(data, size)) {
    if (std::memcmp(encode_hello(*hello).data(), data, size) != 0) std::abort();
  }
  if (auto challenge = decode_challenge(data, size)) {
    if (std::memcmp(encode_challenge(*challenge).data(), data, size) != 0) std::abort();
  }
  std::vector<uint8_t> bytes(data, data + size);
  if (auto address = decode_address(bytes)) {
    if (encode_address(*address) != bytes) std::abort();
  }
  return 0;
}
