#include "errors.h"

#include <c10/util/Exception.h>

#include "core/common/error.h"

namespace weft::backend {

std::exception_ptr to_torch_error(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const InvalidArgument& e) {
    return std::make_exception_ptr(c10::ValueError(e.what()));
  } catch (const Error& e) {
    return std::make_exception_ptr(c10::DistBackendError(e.what()));
  } catch (...) {
    return error;
  }
}

void rethrow_as_torch_error(std::exception_ptr error) {
  std::rethrow_exception(to_torch_error(error));
}

}  // namespace weft::backend
