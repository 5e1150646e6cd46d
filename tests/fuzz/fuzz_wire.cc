// libFuzzer target: the bootstrap's parsers of bytes from the network (hello,
// challenge, a peer's abort notice on its control socket) and from the Store
// (a rank's address). Each must refuse what is not its message without
// reading past the input, and give back what it parsed byte for byte when
// encoded again.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/bootstrap/abort_notice.h"
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
  if (auto notice = decode_notice(reinterpret_cast<const char*>(data), size)) {
    const std::string again = encode_notice(notice->kind, notice->reason);
    if (std::memcmp(again.data(), data, again.size()) != 0) std::abort();
    left_words(notice->reason);  // what a kLeft notice says, whatever its reason holds
  }
  std::vector<uint8_t> bytes(data, data + size);
  if (auto address = decode_address(bytes)) {
    if (encode_address(*address) != bytes) std::abort();
  }
  return 0;
}
