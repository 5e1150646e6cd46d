// Choosing the port: devices in libibverbs' order, ports in number order,
// the first ACTIVE one WEFT_IB_HCA allows. Choosing the GID where
// WEFT_IB_GID_INDEX is unset: index 0 on InfiniBand; on Ethernet (RoCE) the
// first IPv4-mapped GID whose sysfs type is RoCE v2 (routable, what NCCL
// picks by default), else the first IPv4-mapped one, else 0.
//
// On-Demand Paging (WEFT_IB_ODP=auto, the default): used where the device
// says (ibv_query_device_ex) that its ODP covers RC queue pairs' sends and
// RDMA writes (a requester gathers from ODP memory, a responder places into
// it), and its protection domain then takes a one-page registration with
// IBV_ACCESS_ON_DEMAND. Its registrations pin nothing and stay right whatever
// becomes of the memory under them, so the registration cache keeps them
// between messages.
#include "core/transport/rdma/ibverbs/ib_device.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "core/common/config.h"
#include "core/common/error.h"
#include "core/common/log.h"
#include "core/transport/rdma/ibverbs/hca_filter.h"
#include "core/transport/rdma/ibverbs/libibverbs.h"

namespace weft {
namespace {

const char* port_state(ibv_port_state state) {
  switch (state) {
    case IBV_PORT_DOWN: return "down";
    case IBV_PORT_INIT: return "init";
    case IBV_PORT_ARMED: return "armed";
    case IBV_PORT_ACTIVE: return "active";
    default: return "not active";
  }
}

bool ipv4_mapped(const ibv_gid& gid) {
  for (int i = 0; i < 10; ++i) {
    if (gid.raw[i] != 0) return false;
  }
  return gid.raw[10] == 0xff && gid.raw[11] == 0xff;
}

bool roce_v2(const std::string& device, int port, int index) {
  std::ifstream type("/sys/class/infiniband/" + device + "/ports/" + std::to_string(port) +
                     "/gid_attrs/types/" + std::to_string(index));
  std::string line;
  std::getline(type, line);
  return line.find("v2") != std::string::npos;
}

std::string gid_text(const ibv_gid& gid) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (int i = 0; i < 16; ++i) {
    if (i > 0 && i % 2 == 0) s += ':';
    s += digits[gid.raw[i] >> 4];
    s += digits[gid.raw[i] & 15];
  }
  return s;
}

std::string hex(uint32_t v) {
  std::ostringstream s;
  s << std::hex << v;
  return s.str();
}

constexpr int kAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;

// Empty when the device says its On-Demand Paging covers what weft does on RC
// queue pairs, else why not. verbs.h's ibv_query_device_ex is inline and
// falls back to the exported ibv_query_device, which is not linked (it is
// loaded), so the context's op is called directly.
std::string odp_caps_lacking(ibv_context* context) {
  verbs_context* ext = verbs_get_ctx_op(context, query_device_ex);
  if (!ext) return "the device does not answer ibv_query_device_ex";
  ibv_device_attr_ex attr{};
  const int err = ext->query_device_ex(context, nullptr, &attr, sizeof attr);
  if (err != 0) return std::string("ibv_query_device_ex failed: ") + std::strerror(err);
  if (!(attr.odp_caps.general_caps & IBV_ODP_SUPPORT)) return "the device reports no ODP";
  constexpr uint32_t kNeeded = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_WRITE;
  const uint32_t rc = attr.odp_caps.per_transport_caps.rc_odp_caps;
  if ((rc & kNeeded) == kNeeded) return "";
  std::string missing;
  if (!(rc & IBV_ODP_SUPPORT_SEND)) missing = "sends";
  if (!(rc & IBV_ODP_SUPPORT_WRITE))
    missing += missing.empty() ? "RDMA writes" : " and RDMA writes";
  return "the device's ODP does not cover " + missing + " on RC queue pairs (rc_odp_caps 0x" +
         hex(rc) + ")";
}

// Empty when the device's ODP covers weft's use and `pd` takes an ODP
// registration, else why not.
std::string odp_refused(ibv_context* context, ibv_pd* pd) {
  const std::string lacking = odp_caps_lacking(context);
  if (!lacking.empty()) return lacking;
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  void* probe = ::mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (probe == MAP_FAILED) return std::string("mmap of a page failed: ") + std::strerror(errno);
  const Libibverbs& lib = libibverbs();
  ibv_mr* mr = lib.reg_mr(pd, probe, page, kAccess | IBV_ACCESS_ON_DEMAND);
  const int err = errno;
  if (mr) lib.dereg_mr(mr);
  ::munmap(probe, page);
  return mr ? std::string()
            : std::string("ibv_reg_mr with IBV_ACCESS_ON_DEMAND failed: ") + std::strerror(err);
}

}  // namespace

std::shared_ptr<IbDevice> IbDevice::shared(int rank) {
  static std::mutex mutex;
  static std::weak_ptr<IbDevice> current;
  std::lock_guard<std::mutex> lock(mutex);
  std::shared_ptr<IbDevice> device = current.lock();
  if (!device) {
    device.reset(new IbDevice(rank));
    current = device;
  }
  return device;
}

IbDevice::IbDevice(int rank) {
  const Libibverbs& lib = libibverbs();
  const Config& cfg = config();
  const HcaFilter filter(cfg.ib_hca);
  int count = 0;
  ibv_device** devices = lib.get_device_list(&count);
  std::string seen;  // what was found, for the error
  for (int d = 0; devices && d < count && !context_; ++d) {
    const std::string device = lib.get_device_name(devices[d]);
    ibv_context* context = lib.open_device(devices[d]);
    if (!context) {
      seen += (seen.empty() ? "" : ", ") + device + " (cannot be opened)";
      continue;
    }
    ibv_device_attr attr{};
    if (lib.query_device(context, &attr) != 0) attr.phys_port_cnt = 0;
    for (int port = 1; port <= attr.phys_port_cnt && !context_; ++port) {
      ibv_port_attr port_attr{};
      if (lib.query_port(context, static_cast<uint8_t>(port), &port_attr) != 0) continue;
      seen += (seen.empty() ? "" : ", ") + device + ":" + std::to_string(port) + " " +
              port_state(port_attr.state);
      if (!filter.allows(device, port)) {
        seen += " (not in WEFT_IB_HCA)";
      } else if (port_attr.state == IBV_PORT_ACTIVE) {
        context_ = context;
        port_ = static_cast<uint8_t>(port);
        port_attr_ = port_attr;
        device_attr_ = attr;
        name_ = device + ":" + std::to_string(port);
      }
    }
    if (!context_) lib.close_device(context);
  }
  if (devices) lib.free_device_list(devices);
  if (!context_) {
    throw InvalidArgument(
        "WEFT_TRANSPORT=ibverbs: no active RDMA port" +
        (filter.spec().empty() ? std::string()
                               : " that WEFT_IB_HCA='" + filter.spec() + "' allows") +
        " (" + lib.path + " lists " + (seen.empty() ? std::string("no device") : seen) +
        "); check `ibv_devinfo`, set WEFT_IB_HCA, or pick another WEFT_TRANSPORT");
  }
  auto fail = [&](const std::string& why) {
    if (pd_) lib.dealloc_pd(pd_);
    lib.close_device(context_);
    throw InvalidArgument("WEFT_TRANSPORT=ibverbs: " + name_ + ": " + why);
  };
  const std::string device = name_.substr(0, name_.rfind(':'));
  const char* chosen_by = "WEFT_IB_GID_INDEX";
  if (cfg.ib_gid_index >= 0) {
    gid_index_ = cfg.ib_gid_index;
    if (gid_index_ >= port_attr_.gid_tbl_len) {
      fail("WEFT_IB_GID_INDEX=" + std::to_string(gid_index_) + " is beyond the port's " +
           std::to_string(port_attr_.gid_tbl_len) + " GIDs");
    }
  } else if (ethernet()) {
    chosen_by = "no IPv4-mapped GID: index 0";
    int mapped = -1;
    for (int i = 0; i < port_attr_.gid_tbl_len; ++i) {
      ibv_gid gid{};
      if (lib.query_gid(context_, port_, i, &gid) != 0 || !ipv4_mapped(gid)) continue;
      if (roce_v2(device, port_, i)) {
        mapped = i;
        chosen_by = "the first IPv4-mapped RoCE v2 GID";
        break;
      }
      if (mapped < 0) {
        mapped = i;
        chosen_by = "the first IPv4-mapped GID";
      }
    }
    gid_index_ = mapped < 0 ? 0 : mapped;
  } else {
    chosen_by = "InfiniBand: index 0";
  }
  if (lib.query_gid(context_, port_, gid_index_, &gid_) != 0) {
    fail("ibv_query_gid of index " + std::to_string(gid_index_) + " failed");
  }
  pd_ = lib.alloc_pd(context_);
  if (!pd_) fail("ibv_alloc_pd failed");
  const std::string refused = cfg.ib_odp == IbOdp::Off ? "" : odp_refused(context_, pd_);
  if (cfg.ib_odp == IbOdp::Required && !refused.empty()) {
    fail("WEFT_IB_ODP=1, but On-Demand Paging cannot be used: " + refused +
         "; unset WEFT_IB_ODP or set it to auto or 0");
  }
  odp_ = cfg.ib_odp != IbOdp::Off && refused.empty();
  WEFT_LOG(Info, rank,
           "ibverbs: device " << name_ << " (" << lib.path << "), link layer "
                              << (ethernet() ? "Ethernet (RoCE)" : "InfiniBand") << ", lid "
                              << port_attr_.lid << ", GID index " << gid_index_ << " (" << chosen_by
                              << ") " << gid_text(gid_));
  WEFT_LOG(Info, rank,
           "ibverbs: On-Demand Paging "
               << (odp_ ? "on" : "off") << " (WEFT_IB_ODP="
               << (cfg.ib_odp == IbOdp::Auto  ? "auto"
                   : cfg.ib_odp == IbOdp::Off ? "0"
                                              : "1")
               << (refused.empty() ? "" : ": " + refused) << "): "
               << (odp_ ? "registrations of callers' buffers are kept between messages"
                        : "callers' buffers are registered for each message"));
  events_ = std::make_unique<IbAsyncEvents>(context_, name_, faults_);
}

int IbDevice::mr_access() const { return kAccess | (odp_ ? IBV_ACCESS_ON_DEMAND : 0); }

IbDevice::~IbDevice() {
  events_.reset();
  libibverbs().dealloc_pd(pd_);
  libibverbs().close_device(context_);
}

}  // namespace weft
