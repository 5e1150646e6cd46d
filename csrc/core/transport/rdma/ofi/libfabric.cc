#include "core/transport/rdma/ofi/libfabric.h"

#include <dlfcn.h>

#include <mutex>
#include <string>

#include "core/common/error.h"

namespace weft {
namespace {

constexpr const char* kLibrary = "libfabric.so.1";

template <typename F>
void resolve(void* handle, const char* symbol, F& out) {
  out = reinterpret_cast<F>(::dlsym(handle, symbol));
  if (!out) {
    throw InvalidArgument(std::string("WEFT_TRANSPORT=ofi: ") + kLibrary + " has no " + symbol +
                          "; install libfabric 1.10 or newer");
  }
}

Libfabric load() {
  void* handle = ::dlopen(kLibrary, RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* why = ::dlerror();
    throw InvalidArgument(
        std::string("WEFT_TRANSPORT=ofi needs libfabric, which cannot be loaded (") +
        (why ? why : kLibrary) +
        "); install it (Debian: apt-get install libfabric1) or pick another "
        "WEFT_TRANSPORT");
  }
  Libfabric lib{};
  resolve(handle, "fi_getinfo", lib.getinfo);
  resolve(handle, "fi_freeinfo", lib.freeinfo);
  resolve(handle, "fi_dupinfo", lib.dupinfo);
  resolve(handle, "fi_fabric", lib.fabric);
  resolve(handle, "fi_strerror", lib.strerror);
  return lib;  // the library stays loaded for the process's life
}

}  // namespace

const Libfabric& libfabric() {
  static std::once_flag once;
  static Libfabric lib;
  static std::string failure;
  std::call_once(once, [] {
    try {
      lib = load();
    } catch (const InvalidArgument& e) {
      failure = e.what();
    }
  });
  if (!failure.empty()) throw InvalidArgument(failure);
  return lib;
}

}  // namespace weft
