// libfabric, loaded at run time (dlopen), so that weft builds and runs
// without it. Only the library's exported entry points need loading: every
// other fi_* call is an inline function of its headers that calls through
// the objects these return.
#pragma once

#include <rdma/fabric.h>

namespace weft {

struct Libfabric {
  int (*getinfo)(uint32_t, const char*, const char*, uint64_t, const fi_info*, fi_info**);
  void (*freeinfo)(fi_info*);
  fi_info* (*dupinfo)(const fi_info*);
  int (*fabric)(fi_fabric_attr*, fid_fabric**, void*);
  const char* (*strerror)(int);
};

// The loaded library; throws InvalidArgument saying what to install when
// libfabric cannot be loaded.
const Libfabric& libfabric();

}  // namespace weft
