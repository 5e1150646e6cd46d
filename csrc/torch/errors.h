// Core errors as the exceptions torch users expect: a caller's mistake
// (weft::InvalidArgument) becomes a ValueError, everything else a weft error
// raises (timeout, lost peer, aborted communicator) a DistBackendError, with
// the core's message either way.
#pragma once

#include <exception>

namespace weft::backend {

// Other exceptions pass through unchanged.
std::exception_ptr to_torch_error(std::exception_ptr error);

[[noreturn]] void rethrow_as_torch_error(std::exception_ptr error);

}  // namespace weft::backend
