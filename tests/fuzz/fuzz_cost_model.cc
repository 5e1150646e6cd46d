// libFuzzer target: the cost-model file WEFT_TUNE names (tune/cost_model.h).
// Anything but a model or an InvalidArgument that says what is wrong (an
// uncaught exception, a crash, a sanitizer report) is a bug.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/common/error.h"
#include "core/tune/cost_model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const int fd = ::memfd_create("cost_model", 0);
  if (fd < 0 || ::ftruncate(fd, 0) != 0 || ::pwrite(fd, data, size, 0) != ssize_t(size)) {
    std::abort();
  }
  try {
    weft::CostModel model = weft::load_cost_model("/proc/self/fd/" + std::to_string(fd));
    if (!(model.shm.alpha_s > 0) || !(model.tcp.beta_s_per_b > 0) || !(model.gamma_s_per_b > 0)) {
      std::abort();  // accepted a model the loader promises to refuse
    }
    if (!(model.shm.beta_large_s_per_b >= 0) || !(model.tcp.beta_large_s_per_b >= 0) ||
        (model.large_bytes != 0 && model.large_bytes <= model.small_bytes)) {
      std::abort();  // large-buffer figures it promises to check
    }
  } catch (const weft::InvalidArgument&) {
  }
  return 0;
}
