// What differs between the torch releases the backend builds against (2.4
// and later), behind one name each.
#pragma once

#include <c10/core/Stream.h>
#include <torch/version.h>

#include <stdexcept>

#define WEFT_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||       \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

#if !WEFT_TORCH_AT_LEAST(2, 11) && defined(WEFT_HAVE_CUDA)
#include <c10/cuda/CUDAStream.h>
#endif

namespace weft::torch_compat {

// The stream's native handle (a cudaStream_t on CUDA devices).
// c10::Stream::native_handle() arrived in torch 2.11.
inline void* native_handle(const c10::Stream& stream) {
#if WEFT_TORCH_AT_LEAST(2, 11)
  return stream.native_handle();
#elif defined(WEFT_HAVE_CUDA)
  return c10::cuda::CUDAStream(stream).stream();
#else
  (void)stream;
  throw std::logic_error("weft was built without CUDA: it has no device streams");
#endif
}

}  // namespace weft::torch_compat
