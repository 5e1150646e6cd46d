// Reading a torch tensor without Python's attribute machinery. weft._C does
// not link torch, so it asks for a tensor's pointer, size and type through
// five Python calls: about 1 us, as long as a small collective takes.
// weft._C_torch, which links torch, reads the same in C++ and hands its
// reader to weft._C in a capsule (kHostTensorReaderCapsule). The reader takes
// only the common case (a contiguous CPU tensor of a type weft.Communicator
// supports); for anything else weft._C's Python path gives the error.
#pragma once

#include <Python.h>

#include <cstddef>

#include "core/common/types.h"

namespace weft::python {

struct HostTensor {
  void* data;
  size_t count;
  DataType dtype;
};

struct HostTensorReader {
  // True, with `out` filled, when `obj` is a contiguous CPU torch tensor of a
  // supported type; false for everything else.
  bool (*read)(PyObject* obj, HostTensor* out);
};

inline constexpr const char* kHostTensorReaderCapsule = "weft._C_torch.host_tensor_reader";

}  // namespace weft::python
