// weft::Store over the c10d::Store torch hands every backend (already
// prefixed with the group's name).
#pragma once

#include <cstdint>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "core/bootstrap/store.h"

namespace weft::backend {

class StoreAdapter : public Store {
 public:
  explicit StoreAdapter(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {}

  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    store_->set(key, value);
  }
  std::vector<uint8_t> get(const std::string& key) override { return store_->get(key); }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
};

}  // namespace weft::backend
