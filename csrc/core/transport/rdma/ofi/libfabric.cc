#include "core/transport/rdma/ofi/libfabric.h"

#include "core/common/shared_library.h"

namespace weft {
namespace {

Libfabric load() {
  const SharedLibrary library("libfabric.so.1", "WEFT_TRANSPORT=ofi",
                              "install libfabric 1.10 or newer (Debian: apt-get install "
                              "libfabric1) or pick another WEFT_TRANSPORT");
  Libfabric lib{};
  library.resolve("fi_getinfo", lib.getinfo);
  library.resolve("fi_freeinfo", lib.freeinfo);
  library.resolve("fi_dupinfo", lib.dupinfo);
  library.resolve("fi_fabric", lib.fabric);
  library.resolve("fi_strerror", lib.strerror);
  return lib;  // the library stays loaded for the process's life
}

}  // namespace

const Libfabric& libfabric() { return loaded_once<Libfabric, load>(); }

}  // namespace weft
