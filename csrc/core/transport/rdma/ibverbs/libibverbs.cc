#include "core/transport/rdma/ibverbs/libibverbs.h"

#include <string>

#include "core/common/config.h"
#include "core/common/shared_library.h"

namespace weft {
namespace {

Libibverbs load() {
  const std::string& chosen = config().ibverbs_lib;
  const SharedLibrary library(chosen.empty() ? "libibverbs.so.1" : chosen, "WEFT_TRANSPORT=ibverbs",
                              "install rdma-core / libibverbs1, or set WEFT_IBVERBS_LIB");
  Libibverbs lib{};
  lib.path = library.path();
  library.resolve("ibv_get_device_list", lib.get_device_list);
  library.resolve("ibv_free_device_list", lib.free_device_list);
  library.resolve("ibv_get_device_name", lib.get_device_name);
  library.resolve("ibv_open_device", lib.open_device);
  library.resolve("ibv_close_device", lib.close_device);
  library.resolve("ibv_query_device", lib.query_device);
  library.resolve("ibv_query_port", lib.query_port);
  library.resolve("ibv_query_gid", lib.query_gid);
  library.resolve("ibv_alloc_pd", lib.alloc_pd);
  library.resolve("ibv_dealloc_pd", lib.dealloc_pd);
  library.resolve("ibv_reg_mr", lib.reg_mr);
  library.resolve("ibv_dereg_mr", lib.dereg_mr);
  library.resolve("ibv_create_cq", lib.create_cq);
  library.resolve("ibv_destroy_cq", lib.destroy_cq);
  library.resolve("ibv_create_qp", lib.create_qp);
  library.resolve("ibv_modify_qp", lib.modify_qp);
  library.resolve("ibv_destroy_qp", lib.destroy_qp);
  library.resolve("ibv_get_async_event", lib.get_async_event);
  library.resolve("ibv_ack_async_event", lib.ack_async_event);
  library.resolve("ibv_wc_status_str", lib.wc_status_str);
  library.resolve("ibv_event_type_str", lib.event_type_str);
  return lib;  // the library stays loaded for the process's life
}

}  // namespace

const Libibverbs& libibverbs() { return loaded_once<Libibverbs, load>(); }

}  // namespace weft
