#include "buffer.h"

#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "core/common/error.h"
#include "host_tensor.h"

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

// torch's dtype objects are singletons, so a tensor's dtype is found by
// identity; the table is built on the first tensor (torch is imported by then)
// and kept for the life of the process, as torch keeps the dtypes.
bool torch_dtype_to_dtype(PyObject* torch_dtype, DataType* out) {
  static const std::vector<std::pair<PyObject*, DataType>>* table = [] {
    static const std::pair<const char*, DataType> names[] = {
        {"float32", DataType::Float32}, {"float64", DataType::Float64},
        {"float16", DataType::Float16}, {"bfloat16", DataType::BFloat16},
        {"int8", DataType::Int8},       {"uint8", DataType::UInt8},
        {"int32", DataType::Int32},     {"int64", DataType::Int64},
    };
    auto* t = new std::vector<std::pair<PyObject*, DataType>>();
    py::module_ torch = py::module_::import("torch");
    for (const auto& [name, dtype] : names)
      t->emplace_back(py::object(torch.attr(name)).release().ptr(), dtype);
    return t;
  }();
  for (const auto& [object, dtype] : *table) {
    if (object == torch_dtype) {
      *out = dtype;
      return true;
    }
  }
  return false;
}

// The tensor attributes read on every call, as names interned once: a lookup
// through a fresh string per call costs more than a small collective.
struct TensorNames {
  PyObject* data_ptr;
  PyObject* is_cpu;
  PyObject* is_contiguous;
  PyObject* dtype;
  PyObject* numel;
};

const TensorNames& tensor_names() {
  static const TensorNames names = [] {
    auto intern = [](const char* name) {
      PyObject* s = PyUnicode_InternFromString(name);
      if (s == nullptr) throw py::error_already_set();
      return s;
    };
    return TensorNames{intern("data_ptr"), intern("is_cpu"), intern("is_contiguous"),
                       intern("dtype"), intern("numel")};
  }();
  return names;
}

py::object get(const py::object& tensor, PyObject* name) {
  PyObject* result = PyObject_GetAttr(tensor.ptr(), name);
  if (result == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(result);
}

py::object call(const py::object& tensor, PyObject* method) {
  PyObject* result = PyObject_CallMethodNoArgs(tensor.ptr(), method);
  if (result == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(result);
}

// weft._C_torch's reader (host_tensor.h), looked up on the first tensor;
// nullptr where that module is not built. Called with the GIL held: the flag
// is set before the import, so a thread that runs while the import has let the
// GIL go takes the Python path instead of waiting.
const HostTensorReader* host_tensor_reader() {
  static bool looked = false;
  static const HostTensorReader* reader = nullptr;
  if (looked) return reader;
  looked = true;
  PyObject* module = PyImport_ImportModule("weft._C_torch");
  PyObject* capsule = module ? PyObject_GetAttrString(module, "host_tensor_reader") : nullptr;
  if (capsule) {
    reader = static_cast<const HostTensorReader*>(
        PyCapsule_GetPointer(capsule, kHostTensorReaderCapsule));
  }
  if (!reader) PyErr_Clear();
  Py_XDECREF(capsule);
  Py_XDECREF(module);
  return reader;
}

const char* kSupported =
    "float32, float64, float16, bfloat16 (torch tensors), int8, uint8, int32 or int64";

}  // namespace

BufferView::BufferView(const py::handle& obj, const char* what, bool writable)
    : object_(py::reinterpret_borrow<py::object>(obj)) {
  if (PyObject_CheckBuffer(obj.ptr())) {
    from_buffer_protocol(what, writable);
  } else if (read_tensor_in_cpp(obj)) {
    return;
  } else if (PyObject_HasAttr(obj.ptr(), tensor_names().data_ptr)) {
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

bool BufferView::read_tensor_in_cpp(const py::handle& obj) {
  const HostTensorReader* reader = host_tensor_reader();
  HostTensor tensor;
  if (reader == nullptr || !reader->read(obj.ptr(), &tensor)) return false;
  data_ = tensor.data;
  count_ = tensor.count;
  dtype_ = tensor.dtype;
  return true;
}

void BufferView::from_tensor(const char* what) {
  const py::object& tensor = object_;
  const TensorNames& names = tensor_names();
  if (!get(tensor, names.is_cpu).cast<bool>()) {
    std::string device = py::str(tensor.attr("device").attr("type"));
    throw InvalidArgument(std::string(what) + " is a " + device +
                          " tensor; weft.Communicator works on host memory (CPU tensors)");
  }
  if (!call(tensor, names.is_contiguous).cast<bool>()) {
    throw InvalidArgument(std::string(what) +
                          " is not contiguous; pass tensor.contiguous() (and copy back)");
  }
  py::object dtype = get(tensor, names.dtype);
  if (!torch_dtype_to_dtype(dtype.ptr(), &dtype_)) {
    throw InvalidArgument(std::string(what) + " has unsupported dtype " +
                          std::string(py::str(dtype)) + "; use " + kSupported);
  }
  data_ = reinterpret_cast<void*>(call(tensor, names.data_ptr).cast<uintptr_t>());
  count_ = call(tensor, names.numel).cast<size_t>();
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
