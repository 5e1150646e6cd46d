#include "core/transport/rdma/ibverbs/ibverbs_connection.h"

#include "core/common/error.h"
#ifdef WEFT_HAVE_IBVERBS
#include "core/transport/rdma/ibverbs/ib_device.h"
#include "core/transport/rdma/ibverbs/ibverbs_endpoint.h"
#endif

namespace weft {

#ifdef WEFT_HAVE_IBVERBS

std::unique_ptr<Connection> make_ibverbs_connection(Socket& control, int rank,
                                                    const RdmaOptions& options, double timeout_s) {
  return make_rdma_connection(connect_ibverbs_endpoint(control, rank, timeout_s), control, options,
                              timeout_s, "ibverbs");
}

std::string ibverbs_unusable(int rank) {
  try {
    IbDevice::shared(rank);
    return {};
  } catch (const Error& e) {
    return e.what();
  }
}

#else

namespace {
constexpr const char* kNotBuilt =
    "WEFT_TRANSPORT=ibverbs, but weft was built without libibverbs' headers; install them "
    "(Debian: libibverbs-dev) and rebuild weft, or pick another WEFT_TRANSPORT";
}  // namespace

std::unique_ptr<Connection> make_ibverbs_connection(Socket&, int, const RdmaOptions&, double) {
  throw InvalidArgument(kNotBuilt);
}

std::string ibverbs_unusable(int) { return kNotBuilt; }

#endif

}  // namespace weft
