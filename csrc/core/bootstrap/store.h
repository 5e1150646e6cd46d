// The key-value store every rank can reach before any connection exists.
// weft never runs its own rendezvous: the Python layer adapts torch's c10d
// Store (TCPStore, FileStore, torchrun's store), the torch backend adapts the
// c10d::Store it is given.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace weft {

class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::vector<uint8_t>& value) = 0;
  // Blocks until `key` exists (bounded by the store's own timeout, which
  // throws) and returns its value.
  virtual std::vector<uint8_t> get(const std::string& key) = 0;
};

}  // namespace weft
