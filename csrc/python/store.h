// weft::Store over a Python object with set(key, bytes) and get(key) ->
// bytes: torch.distributed's TCPStore, FileStore, PrefixStore...
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>

#include "core/bootstrap/store.h"

namespace weft::python {

class PyStore : public Store {
 public:
  explicit PyStore(pybind11::object store) : store_(std::move(store)) {}
  ~PyStore() override {
    pybind11::gil_scoped_acquire gil;
    store_ = pybind11::object();
  }

  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    pybind11::gil_scoped_acquire gil;
    store_.attr("set")(key,
                       pybind11::bytes(reinterpret_cast<const char*>(value.data()), value.size()));
  }

  std::vector<uint8_t> get(const std::string& key) override {
    pybind11::gil_scoped_acquire gil;
    std::string value = store_.attr("get")(key).cast<std::string>();
    return std::vector<uint8_t>(value.begin(), value.end());
  }

 private:
  pybind11::object store_;
};

}  // namespace weft::python
