// Turns the Python objects users pass (numpy arrays, anything with the buffer
// protocol, CPU torch tensors) into (pointer, count, dtype), with the checks
// that must happen before any byte moves.
#pragma once

#include <Python.h>
#include <pybind11/pybind11.h>

#include <cstddef>
#include <string>

#include "core/common/types.h"

namespace weft::python {

// A view of a caller's buffer; keeps the object (and its exported buffer)
// alive while it exists.
class BufferView {
 public:
  // `what` names the argument in errors ("buf", "out"). Throws
  // InvalidArgument for non-contiguous, read-only (when writable), CUDA or
  // unsupported-dtype objects.
  BufferView(const pybind11::handle& obj, const char* what, bool writable);
  ~BufferView();
  BufferView(BufferView&& other) noexcept;
  BufferView(const BufferView&) = delete;
  BufferView& operator=(const BufferView&) = delete;
  BufferView& operator=(BufferView&&) = delete;

  void* data() const { return data_; }
  size_t count() const { return count_; }
  DataType dtype() const { return dtype_; }
  size_t bytes() const { return count_ * element_size(dtype_); }
  const pybind11::object& object() const { return object_; }

 private:
  void from_buffer_protocol(const char* what, bool writable);
  // The common case of a torch tensor, read by weft._C_torch; false otherwise.
  bool read_tensor_in_cpp(const pybind11::handle& obj);
  void from_tensor(const char* what);

  pybind11::object object_;
  Py_buffer view_{};
  bool has_view_ = false;
  void* data_ = nullptr;
  size_t count_ = 0;
  DataType dtype_ = DataType::Float32;
};

}  // namespace weft::python
