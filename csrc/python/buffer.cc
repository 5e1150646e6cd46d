#include "buffer.h"

#include <cstring>

#include "core/common/error.h"

namespace py = pybind11;

namespace weft::python {
namespace {

// struct-module format codes (numpy's buffer formats) to DataType.
bool format_to_dtype(const char* format, size_t itemsize, DataType* out) {
  while (*format == '@' || *format == '=' || *format == '<' || *format == '!') ++format;
  if (std::strlen(format) != 1) return false;
  switch (format[0]) {
    case 'f': *out = DataType::Float32; return itemsize == 4;
    case 'd': *out = DataType::Float64; return itemsize == 8;
    case 'e': *out = DataType::Float16; return itemsize == 2;
    case 'b': *out = DataType::Int8; return true;
    case 'B': *out = DataType::UInt8; return true;
    case 'i':
    case 'l':
    case 'q':
      if (itemsize == 4)
        *out = DataType::Int32;
      else if (itemsize == 8)
        *out = DataType::Int64;
      else
        return false;
      return true;
    default: return false;
  }
}

bool torch_dtype_to_dtype(const std::string& name, DataType* out) {
  static const std::pair<const char*, DataType> table[] = {
      {"torch.float32", DataType::Float32}, {"torch.float64", DataType::Float64},
      {"torch.float16", DataType::Float16}, {"torch.bfloat16", DataType::BFloat16},
      {"torch.int8", DataType::Int8},       {"torch.uint8", DataType::UInt8},
      {"torch.int32", DataType::Int32},     {"torch.int64", DataType::Int64},
  };
  for (const auto& [torch_name, dtype] : table) {
    if (name == torch_name) {
      *out = dtype;
      return true;
    }
  }
  return false;
}

const char* kSupported =
    "float32, float64, float16, bfloat16 (torch tensors), int8, uint8, int32 or int64";

}  // namespace

BufferView::BufferView(const py::handle& obj, const char* what, bool writable)
    : object_(py::reinterpret_borrow<py::object>(obj)) {
  if (PyObject_CheckBuffer(obj.ptr())) {
    from_buffer_protocol(what, writable);
  } else if (py::hasattr(obj, "data_ptr")) {
    from_tensor(what);
  } else {
    throw InvalidArgument(std::string(what) +
                          " must be a numpy array, a CPU torch tensor or "
                          "another object with the buffer protocol, not " +
                          std::string(py::str(py::type::of(obj).attr("__name__"))));
  }
}

void BufferView::from_buffer_protocol(const char* what, bool writable) {
  if (PyObject_GetBuffer(object_.ptr(), &view_, PyBUF_STRIDES | PyBUF_FORMAT) != 0) {
    PyErr_Clear();
    throw InvalidArgument(std::string(what) +
                          " is not C-contiguous; pass a contiguous copy "
                          "(numpy.ascontiguousarray)");
  }
  has_view_ = true;
  if (!PyBuffer_IsContiguous(&view_, 'C')) {
    throw InvalidArgument(std::string(what) +
                          " is not C-contiguous; pass a contiguous copy (numpy.ascontiguousarray)");
  }
  if (writable && view_.readonly) {
    throw InvalidArgument(std::string(what) +
                          " is read-only; the result is written into it, so pass a writable "
                          "array (or out=)");
  }
  if (!format_to_dtype(view_.format ? view_.format : "B", view_.itemsize, &dtype_)) {
    throw InvalidArgument(std::string(what) + " has an unsupported element type (format '" +
                          std::string(view_.format ? view_.format : "B") + "', " +
                          std::to_string(view_.itemsize) + " bytes); use " + kSupported);
  }
  data_ = view_.buf;
  count_ = static_cast<size_t>(view_.len) / view_.itemsize;
}

void BufferView::from_tensor(const char* what) {
  py::object tensor = object_;
  std::string device = py::str(tensor.attr("device").attr("type"));
  if (device != "cpu") {
    throw InvalidArgument(std::string(what) + " is a " + device +
                          " tensor; weft.Communicator works on host memory (CPU tensors)");
  }
  if (!tensor.attr("is_contiguous")().cast<bool>()) {
    throw InvalidArgument(std::string(what) +
                          " is not contiguous; pass tensor.contiguous() (and copy back)");
  }
  std::string dtype_name = py::str(tensor.attr("dtype"));
  if (!torch_dtype_to_dtype(dtype_name, &dtype_)) {
    throw InvalidArgument(std::string(what) + " has unsupported dtype " + dtype_name + "; use " +
                          kSupported);
  }
  data_ = reinterpret_cast<void*>(tensor.attr("data_ptr")().cast<uintptr_t>());
  count_ = tensor.attr("numel")().cast<size_t>();
}

BufferView::~BufferView() {
  if (has_view_) PyBuffer_Release(&view_);
}

BufferView::BufferView(BufferView&& other) noexcept
    : object_(std::move(other.object_)),
      view_(other.view_),
      has_view_(other.has_view_),
      data_(other.data_),
      count_(other.count_),
      dtype_(other.dtype_) {
  other.has_view_ = false;
}

}  // namespace weft::python
