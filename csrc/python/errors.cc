#include "errors.h"

#include <string>

#include "core/common/error.h"

namespace py = pybind11;

namespace weft::python {
namespace {

struct ErrorTypes {
  PyObject* error = nullptr;
  PyObject* invalid = nullptr;
  PyObject* peer = nullptr;
  PyObject* timeout = nullptr;
  PyObject* aborted = nullptr;
};

ErrorTypes& types() {
  static ErrorTypes t;
  return t;
}

PyObject* new_exception(py::module_& m, const char* name, PyObject* bases, const char* doc) {
  std::string qualified = std::string("weft._C.") + name;
  PyObject* type = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases, nullptr);
  m.add_object(name, py::handle(type));
  return type;
}

}  // namespace

bool set_weft_error(std::exception_ptr error) {
  const ErrorTypes& t = types();
  try {
    std::rethrow_exception(error);
  } catch (const InvalidArgument& e) {
    PyErr_SetString(t.invalid, e.what());
  } catch (const PeerError& e) {
    PyErr_SetString(t.peer, e.what());
  } catch (const TimeoutError& e) {
    PyErr_SetString(t.timeout, e.what());
  } catch (const AbortedError& e) {
    PyErr_SetString(t.aborted, e.what());
  } catch (const Error& e) {
    PyErr_SetString(t.error, e.what());
  } catch (...) {
    return false;
  }
  return true;
}

void bind_errors(py::module_& m) {
  ErrorTypes& t = types();
  t.error = new_exception(m, "Error", PyExc_RuntimeError, "Any weft error.");
  t.invalid = new_exception(
      m, "InvalidArgument",
      py::make_tuple(py::handle(t.error), py::handle(PyExc_ValueError)).release().ptr(),
      "A call was given something wrong; nothing was sent.");
  t.peer = new_exception(m, "PeerError", t.error, "A peer died, closed or misbehaved.");
  t.timeout = new_exception(
      m, "TimeoutError",
      py::make_tuple(py::handle(t.error), py::handle(PyExc_TimeoutError)).release().ptr(),
      "Nothing progressed within the communicator's timeout.");
  t.aborted = new_exception(m, "AbortedError", t.error,
                            "The communicator was aborted by an earlier error.");
  py::register_exception_translator([](std::exception_ptr p) {
    if (p && !set_weft_error(p)) std::rethrow_exception(p);
  });
}

}  // namespace weft::python
