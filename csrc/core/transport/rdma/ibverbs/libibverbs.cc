#include "core/transport/rdma/ibverbs/libibverbs.h"

#include <dlfcn.h>

#include <mutex>
#include <string>

#include "core/common/config.h"
#include "core/common/error.h"

namespace weft {
namespace {

constexpr const char* kLibrary = "libibverbs.so.1";

template <typename F>
void resolve(void* handle, const std::string& path, const char* symbol, F& out) {
  out = reinterpret_cast<F>(::dlsym(handle, symbol));
  if (!out) {
    throw InvalidArgument("WEFT_TRANSPORT=ibverbs: " + path + " has no " + symbol +
                          "; install rdma-core / libibverbs1, or set WEFT_IBVERBS_LIB");
  }
}

Libibverbs load() {
  const std::string& chosen = config().ibverbs_lib;
  const std::string path = chosen.empty() ? kLibrary : chosen;
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* why = ::dlerror();
    throw InvalidArgument("WEFT_TRANSPORT=ibverbs: libibverbs could not be loaded (" +
                          std::string(why ? why : path.c_str()) +
                          "); install rdma-core / libibverbs1, or set WEFT_IBVERBS_LIB");
  }
  Libibverbs lib{};
  lib.path = path;
  resolve(handle, path, "ibv_get_device_list", lib.get_device_list);
  resolve(handle, path, "ibv_free_device_list", lib.free_device_list);
  resolve(handle, path, "ibv_get_device_name", lib.get_device_name);
  resolve(handle, path, "ibv_open_device", lib.open_device);
  resolve(handle, path, "ibv_close_device", lib.close_device);
  resolve(handle, path, "ibv_query_device", lib.query_device);
  resolve(handle, path, "ibv_query_port", lib.query_port);
  resolve(handle, path, "ibv_query_gid", lib.query_gid);
  resolve(handle, path, "ibv_alloc_pd", lib.alloc_pd);
  resolve(handle, path, "ibv_dealloc_pd", lib.dealloc_pd);
  resolve(handle, path, "ibv_reg_mr", lib.reg_mr);
  resolve(handle, path, "ibv_dereg_mr", lib.dereg_mr);
  resolve(handle, path, "ibv_create_cq", lib.create_cq);
  resolve(handle, path, "ibv_destroy_cq", lib.destroy_cq);
  resolve(handle, path, "ibv_create_qp", lib.create_qp);
  resolve(handle, path, "ibv_modify_qp", lib.modify_qp);
  resolve(handle, path, "ibv_destroy_qp", lib.destroy_qp);
  resolve(handle, path, "ibv_get_async_event", lib.get_async_event);
  resolve(handle, path, "ibv_ack_async_event", lib.ack_async_event);
  resolve(handle, path, "ibv_wc_status_str", lib.wc_status_str);
  resolve(handle, path, "ibv_event_type_str", lib.event_type_str);
  return lib;  // the library stays loaded for the process's life
}

}  // namespace

const Libibverbs& libibverbs() {
  static std::once_flag once;
  static Libibverbs lib;
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
