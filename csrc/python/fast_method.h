// Methods bound through CPython's vectorcall protocol (METH_FASTCALL |
// METH_KEYWORDS) instead of pybind11's dispatcher, for the calls whose own
// cost is part of what a small collective costs. pybind11 (3.0) creates and
// interns a string for every parameter a call leaves out whenever the call
// passes any keyword, and fills two vectors per call: `comm.allreduce(x,
// out=y)` spent about 0.4 us there, a fifth of an 8-byte allreduce between
// two ranks.
#pragma once

#include <Python.h>
#include <pybind11/pybind11.h>

#include <array>
#include <cstddef>
#include <string>

namespace weft::python {

constexpr size_t kMostParams = 6;

// A parameter: its name and, unless it is required, its default as a Python
// literal ("None", "'sum'", "0").
struct Param {
  const char* name = nullptr;
  const char* default_literal = nullptr;
};

class CallArgs;

struct FastMethod {
  const char* name;
  std::array<Param, kMostParams> params;  // in order; unused entries have no name
  pybind11::object (*body)(pybind11::handle self, const CallArgs& args);
  const char* doc;
};

// A method's parameter names (interned) and defaults as Python objects, made
// once with the GIL held and kept for the life of the process.
class Params {
 public:
  explicit Params(const FastMethod& method);
  const FastMethod& method() const { return method_; }
  size_t size() const { return size_; }
  const char* name(size_t i) const { return method_.params[i].name; }
  // The parameter called `name`, or -1.
  int index_of(PyObject* name) const;
  PyObject* default_value(size_t i) const { return defaults_[i]; }  // nullptr: required

 private:
  const FastMethod& method_;
  size_t size_ = 0;
  std::array<PyObject*, kMostParams> names_{};
  std::array<PyObject*, kMostParams> defaults_{};
};

// One call's arguments matched to the parameters as Python matches them
// (positional first, then keywords, then defaults), with Python's TypeErrors.
class CallArgs {
 public:
  CallArgs(const Params& params, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames);

  pybind11::object operator[](size_t i) const {
    return pybind11::reinterpret_borrow<pybind11::object>(values_[i]);
  }

  // The argument converted as pybind11 converts it; a TypeError naming the
  // parameter and the value where it cannot be (a wrong type, or a number out
  // of the C++ type's range). Types whose conversion keeps temporaries alive
  // (pybind11's loader_life_support) are not supported: none of the
  // operations take one.
  template <typename T>
  T get(size_t i) const {
    try {
      return pybind11::handle(values_[i]).cast<T>();
    } catch (const pybind11::cast_error&) {
      throw wrong_type(i);
    }
  }

 private:
  pybind11::type_error wrong_type(size_t i) const;

  const Params& params_;
  std::array<PyObject*, kMostParams> values_{};
};

// Runs the method `params` belongs to on a call; returns a new reference, or
// nullptr with the Python error set: weft's errors as weft._C's types
// (errors.h), pybind11's and Python's as they are, std::bad_alloc as
// MemoryError, any other std::exception as RuntimeError, anything else as
// SystemError.
PyObject* call_fast_method(const Params& params, PyObject* self, PyObject* const* args,
                           Py_ssize_t nargs, PyObject* kwnames);

// Adds `def` to the class `cls` as a method.
void add_method(pybind11::handle cls, PyMethodDef* def);

// `name($self, params...)\n--\n\n` and the doc: what inspect.signature and
// help() read.
std::string doc_with_signature(const FastMethod& method);

template <const FastMethod& M>
const Params& params_of() {
  static const Params params(M);
  return params;
}

template <const FastMethod& M>
PyObject* vectorcall(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  return call_fast_method(params_of<M>(), self, args, nargs, kwnames);
}

// Binds M on `cls` (replacing any method of that name).
template <const FastMethod& M>
void def_fast(pybind11::handle cls) {
  params_of<M>();  // parse the defaults now, where a mistake fails the import
  static const std::string doc = doc_with_signature(M);
  static PyMethodDef def{
      M.name, reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&vectorcall<M>)),
      METH_FASTCALL | METH_KEYWORDS, doc.c_str()};
  add_method(cls, &def);
}

}  // namespace weft::python
