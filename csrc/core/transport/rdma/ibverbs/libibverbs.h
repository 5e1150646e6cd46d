// libibverbs, loaded at run time (dlopen, as NCCL's ibvwrap does), so that
// weft builds and runs without it; WEFT_IBVERBS_LIB names another library
// with the same entry points (the tests' verbs emulator). Only exported
// functions are loaded: the data path (ibv_post_send, ibv_post_recv,
// ibv_poll_cq) is verbs.h's inline functions, which call through the
// context's ops.
#pragma once

#include <infiniband/verbs.h>

#include <string>

namespace weft {

struct Libibverbs {
  ibv_device** (*get_device_list)(int*);
  void (*free_device_list)(ibv_device**);
  const char* (*get_device_name)(ibv_device*);
  ibv_context* (*open_device)(ibv_device*);
  int (*close_device)(ibv_context*);
  int (*query_device)(ibv_context*, ibv_device_attr*);
  int (*query_port)(ibv_context*, uint8_t, ibv_port_attr*);
  int (*query_gid)(ibv_context*, uint8_t, int, ibv_gid*);
  ibv_pd* (*alloc_pd)(ibv_context*);
  int (*dealloc_pd)(ibv_pd*);
  ibv_mr* (*reg_mr)(ibv_pd*, void*, size_t, int);
  int (*dereg_mr)(ibv_mr*);
  ibv_cq* (*create_cq)(ibv_context*, int, void*, ibv_comp_channel*, int);
  int (*destroy_cq)(ibv_cq*);
  ibv_qp* (*create_qp)(ibv_pd*, ibv_qp_init_attr*);
  int (*modify_qp)(ibv_qp*, ibv_qp_attr*, int);
  int (*destroy_qp)(ibv_qp*);
  int (*get_async_event)(ibv_context*, ibv_async_event*);
  void (*ack_async_event)(ibv_async_event*);
  const char* (*wc_status_str)(ibv_wc_status);
  const char* (*event_type_str)(ibv_event_type);
  std::string path;  // what was loaded, for the log
};

// The loaded library; throws InvalidArgument saying what to install (or
// set) when it cannot be loaded or lacks an entry point.
const Libibverbs& libibverbs();

}  // namespace weft
