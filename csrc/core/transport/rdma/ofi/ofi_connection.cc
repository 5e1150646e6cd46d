#include "core/transport/rdma/ofi/ofi_connection.h"

#include "core/common/error.h"
#ifdef WEFT_HAVE_LIBFABRIC
#include "core/transport/rdma/ofi/ofi_endpoint.h"
#endif

namespace weft {

std::unique_ptr<Connection> make_ofi_connection(Socket& control, bool listen,
                                                const RdmaOptions& options, double timeout_s) {
#ifdef WEFT_HAVE_LIBFABRIC
  return make_rdma_connection(connect_ofi_endpoint(control, listen, timeout_s), control, options,
                              timeout_s, "ofi");
#else
  (void)control, (void)listen, (void)options, (void)timeout_s;
  throw InvalidArgument(
      "WEFT_TRANSPORT=ofi, but weft was built without libfabric's headers; install them "
      "(Debian: libfabric-dev) and rebuild weft, or pick another WEFT_TRANSPORT");
#endif
}

}  // namespace weft
