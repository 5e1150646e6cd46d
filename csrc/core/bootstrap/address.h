// What each rank publishes through the Store about itself, and its bytes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/common/machine.h"

namespace weft {

struct PeerAddress {
  std::string host_id;  // same host_id => shared memory is possible
  std::string cpus;     // same cpus => the same CPUs to share (common/machine.h)
  CpuSpread spread;     // where on those CPUs the peer runs so far
  std::string ip;       // address the peer listens on
  uint16_t port = 0;
  int32_t pid = 0;
  int32_t size = 0;              // world size the peer was created with
  bool listens_any = true;       // bound to every interface (else to `ip` only)
  bool secret_from_env = false;  // WEFT_JOB_SECRET set (else rank 0's secret in the Store)
};

std::vector<uint8_t> encode_address(const PeerAddress& a);
// nullopt unless `bytes` is exactly an address of this weft version.
std::optional<PeerAddress> decode_address(const std::vector<uint8_t>& bytes);

}  // namespace weft
