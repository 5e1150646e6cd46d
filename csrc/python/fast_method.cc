#include "fast_method.h"

#include <exception>
#include <new>

#include "errors.h"

namespace py = pybind11;

namespace weft::python {

Params::Params(const FastMethod& method) : method_(method) {
  py::object literal_eval = py::module_::import("ast").attr("literal_eval");
  for (const Param& p : method.params) {
    if (p.name == nullptr) break;
    names_[size_] = PyUnicode_InternFromString(p.name);
    if (names_[size_] == nullptr) throw py::error_already_set();
    if (p.default_literal != nullptr) {
      defaults_[size_] = literal_eval(p.default_literal).release().ptr();
    }
    ++size_;
  }
}

int Params::index_of(PyObject* name) const {
  // Keywords from Python source are interned, so identity finds them.
  for (size_t i = 0; i < size_; ++i) {
    if (names_[i] == name) return static_cast<int>(i);
  }
  for (size_t i = 0; i < size_; ++i) {
    const int order = PyUnicode_Compare(names_[i], name);
    if (order == 0) return static_cast<int>(i);
    if (order == -1 && PyErr_Occurred()) throw py::error_already_set();
  }
  return -1;
}

CallArgs::CallArgs(const Params& params, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames)
    : params_(params) {
  auto where = [&] { return std::string(params.method().name) + "()"; };
  if (static_cast<size_t>(nargs) > params.size()) {
    throw py::type_error(where() + " takes at most " + std::to_string(params.size()) +
                         " arguments besides self (" + std::to_string(nargs) + " given)");
  }
  for (Py_ssize_t i = 0; i < nargs; ++i) values_[i] = args[i];
  const Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
  for (Py_ssize_t k = 0; k < nkw; ++k) {
    PyObject* name = PyTuple_GET_ITEM(kwnames, k);
    const int i = params.index_of(name);
    if (i < 0) {
      throw py::type_error(where() + " got an unexpected keyword argument '" +
                           py::str(name).cast<std::string>() + "'");
    }
    if (values_[i] != nullptr) {
      throw py::type_error(where() + " got multiple values for argument '" + params.name(i) + "'");
    }
    values_[i] = args[nargs + k];
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (values_[i] != nullptr) continue;
    values_[i] = params.default_value(i);
    if (values_[i] == nullptr) {
      throw py::type_error(where() + " missing required argument '" + params.name(i) + "'");
    }
  }
}

py::type_error CallArgs::wrong_type(size_t i) const {
  const py::handle value(values_[i]);
  return py::type_error(std::string(params_.method().name) + "(): " + params_.name(i) +
                        " cannot be " + py::repr(value).cast<std::string>() + " (" +
                        py::str(py::type::handle_of(value).attr("__name__")).cast<std::string>() +
                        ")");
}

PyObject* call_fast_method(const Params& params, PyObject* self, PyObject* const* args,
                           Py_ssize_t nargs, PyObject* kwnames) {
  try {
    const CallArgs call(params, args, nargs, kwnames);
    return params.method().body(self, call).release().ptr();
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (const py::builtin_exception& e) {
    e.set_error();
  } catch (const std::bad_alloc&) {
    PyErr_NoMemory();
  } catch (const std::exception& e) {
    if (!set_weft_error(std::current_exception())) PyErr_SetString(PyExc_RuntimeError, e.what());
  } catch (...) {
    PyErr_SetString(PyExc_SystemError, "an unknown C++ exception escaped a weft call");
  }
  return nullptr;
}

void add_method(py::handle cls, PyMethodDef* def) {
  PyObject* descr = PyDescr_NewMethod(reinterpret_cast<PyTypeObject*>(cls.ptr()), def);
  if (descr == nullptr) throw py::error_already_set();
  py::setattr(cls, def->ml_name, py::reinterpret_steal<py::object>(descr));
}

std::string doc_with_signature(const FastMethod& method) {
  std::string text = std::string(method.name) + "($self";
  for (const Param& p : method.params) {
    if (p.name == nullptr) break;
    text += std::string(", ") + p.name;
    if (p.default_literal != nullptr) text += std::string("=") + p.default_literal;
  }
  return text + ")\n--\n\n" + method.doc;
}

}  // namespace weft::python
