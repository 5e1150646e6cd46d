// The ofi back end: one FI_EP_MSG endpoint per connection, with its own
// fabric, domain, event queue (connection management, FI_SHUTDOWN for a
// peer that went away) and completion queue (FI_CQ_FORMAT_DATA: our writes'
// completions and the peer's 4 bytes of remote CQ data). Where the provider
// has no FI_EP_MSG endpoints (shm, efa), an FI_EP_RDM one with an address
// vector holding the peer alone: no connection, so no FI_SHUTDOWN (a dead
// peer shows in failed writes and in the bootstrap's control socket).
//
// Memory-registration modes weft supports: FI_MR_LOCAL (local buffers are
// registered and named by descriptor), FI_MR_VIRT_ADDR (writes name virtual
// addresses; without it, offsets into the region), FI_MR_ALLOCATED and
// FI_MR_PROV_KEY. Providers that need a posted receive per remote CQ datum
// (FI_RX_CQ_DATA) get kPostedReceives zero-byte receives, reposted as they go.
//
// Strangers: an FI_EP_MSG listener's port can be found and connected to by
// anyone while it waits for the peer, so the listener sends a fresh token
// over the authenticated control socket and accepts only the connection
// request that carries it (others are rejected and logged; the wait goes
// on). Keys weft chooses for its memory regions are random, not counted up,
// so that no one can guess them.
#include "core/transport/rdma/ofi/ofi_endpoint.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/common/config.h"
#include "core/common/deadline.h"
#include "core/common/error.h"
#include "core/common/log.h"
#include "core/common/random_word.h"
#include "core/transport/rdma/ofi/libfabric.h"

namespace weft {
namespace {

constexpr const char* kShutDown = "ofi: the peer closed the connection (FI_SHUTDOWN)";

constexpr uint32_t kApiVersion = FI_VERSION(1, 10);
constexpr int kPostedReceives = 64;
constexpr uint64_t kMrModes = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
// The context of our posted receives, told apart from writes' ids (which
// are never this).
void* const kReceiveContext = reinterpret_cast<void*>(~uintptr_t{0});
constexpr std::chrono::milliseconds kSlowConnect{1500};
// What a connection request must carry: 16 unpredictable bytes.
using ConnectToken = std::array<uint64_t, 2>;
// A connection-management event with room for a request's data.
struct CmEvent {
  alignas(fi_eq_cm_entry) unsigned char bytes[sizeof(fi_eq_cm_entry) + 256];
  size_t data_bytes = 0;  // the request's data that arrived
  fi_eq_cm_entry& entry() { return *reinterpret_cast<fi_eq_cm_entry*>(bytes); }
  const unsigned char* data() const { return bytes + sizeof(fi_eq_cm_entry); }
};

std::string fi_error(const char* what, int ret) {
  return std::string("ofi: ") + what + " failed: " + libfabric().strerror(-ret) + " (" +
         std::to_string(ret) + ")";
}

void check(const char* what, int ret) {
  if (ret != 0) throw PeerError(fi_error(what, ret));
}

void close_fid(fid* f) {
  if (f) fi_close(f);
}

struct InfoDeleter {
  void operator()(fi_info* info) const {
    if (info) libfabric().freeinfo(info);
  }
};
using InfoPtr = std::unique_ptr<fi_info, InfoDeleter>;

// What we ask every provider for.
InfoPtr hints(fi_ep_type type) {
  InfoPtr h(libfabric().dupinfo(nullptr));
  h->caps = FI_MSG | FI_RMA;
  h->mode = FI_RX_CQ_DATA;
  h->ep_attr->type = type;
  h->domain_attr->mr_mode = kMrModes;
  h->domain_attr->threading = FI_THREAD_DOMAIN;
  return h;
}

// The IP address this side of `control` uses: the peer reached us there.
std::string local_address(const Socket& control, int& family) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (::getsockname(control.fd(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    throw_system_error("ofi: getsockname of the control socket", errno);
  }
  char text[INET6_ADDRSTRLEN] = {};
  family = addr.ss_family;
  const void* ip =
      family == AF_INET6
          ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&addr)->sin6_addr)
          : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&addr)->sin_addr);
  ::inet_ntop(family, ip, text, sizeof(text));
  return text;
}

class OfiRegion : public MemoryRegion {
 public:
  OfiRegion(void* base, size_t bytes, fid_mr* mr, bool virtual_addresses)
      : MemoryRegion(base, bytes), mr_(mr), virtual_(virtual_addresses) {}
  ~OfiRegion() override { close_fid(&mr_->fid); }
  uint64_t remote_address(const void* p) const override {
    const auto at = reinterpret_cast<uintptr_t>(p);
    return virtual_ ? at : at - reinterpret_cast<uintptr_t>(base());
  }
  uint64_t remote_key() const override { return fi_mr_key(mr_); }
  void* local_descriptor() const override { return fi_mr_desc(mr_); }

 private:
  fid_mr* mr_;
  bool virtual_;
};

class OfiEndpoint : public RdmaEndpoint {
 public:
  ~OfiEndpoint() override {
    close_fid(ep_ ? &ep_->fid : nullptr);
    close_fid(pep_ ? &pep_->fid : nullptr);
    close_fid(cq_ ? &cq_->fid : nullptr);
    close_fid(av_ ? &av_->fid : nullptr);
    close_fid(eq_ ? &eq_->fid : nullptr);
    close_fid(domain_ ? &domain_->fid : nullptr);
    close_fid(fabric_ ? &fabric_->fid : nullptr);
  }

  void connect(Socket& control, bool listen, double timeout_s) {
    const Deadline deadline(timeout_s);
    int family = AF_INET;
    const std::string ip = local_address(control, family);
    if (listen) {
      fi_info* found = nullptr;
      InfoPtr h = hints(FI_EP_MSG);
      int ret = libfabric().getinfo(kApiVersion, ip.c_str(), "0", FI_SOURCE, h.get(), &found);
      uint8_t reliable_datagrams = ret != 0;
      control.send_all(&reliable_datagrams, 1, deadline, "ofi endpoint type");
      if (reliable_datagrams) return connect_rdm(control, true, ip, deadline);
      InfoPtr info(found);
      open_fabric(info.get());
      check("fi_passive_ep", fi_passive_ep(fabric_, info.get(), &pep_, nullptr));
      check("fi_pep_bind", fi_pep_bind(pep_, &eq_->fid, 0));
      check("fi_listen", fi_listen(pep_));
      std::vector<char> name(256);
      size_t len = name.size();
      check("fi_getname", fi_getname(&pep_->fid, name.data(), &len));
      const uint64_t len64 = len;
      control.send_all(&len64, sizeof(len64), deadline, "ofi endpoint name");
      control.send_all(name.data(), len, deadline, "ofi endpoint name");
      const ConnectToken token{random_word(), random_word()};
      control.send_all(token.data(), sizeof(token), deadline, "ofi connection token");
      InfoPtr request = request_with(token, deadline);
      open_endpoint(request.get());
      check("fi_accept", fi_accept(ep_, nullptr, 0));
      CmEvent connected;
      wait_event(FI_CONNECTED, connected, deadline);
      close_fid(&pep_->fid);
      pep_ = nullptr;
    } else {
      uint8_t reliable_datagrams = 0;
      control.recv_all(&reliable_datagrams, 1, deadline, "ofi endpoint type of the peer");
      if (reliable_datagrams) return connect_rdm(control, false, ip, deadline);
      uint64_t len = 0;
      control.recv_all(&len, sizeof(len), deadline, "ofi endpoint name of the peer");
      if (len == 0 || len > 4096)
        throw PeerError("ofi: the peer sent an endpoint name of " + std::to_string(len) + " bytes");
      std::vector<char> name(len);
      control.recv_all(name.data(), len, deadline, "ofi endpoint name of the peer");
      ConnectToken token{};
      control.recv_all(token.data(), sizeof(token), deadline, "ofi connection token");
      InfoPtr h = hints(FI_EP_MSG);
      h->dest_addr = std::malloc(len);  // freed with the hints
      std::memcpy(h->dest_addr, name.data(), len);
      h->dest_addrlen = len;
      h->addr_format = family == AF_INET6 ? FI_SOCKADDR_IN6 : FI_SOCKADDR_IN;
      fi_info* found = nullptr;
      int ret = libfabric().getinfo(kApiVersion, nullptr, nullptr, 0, h.get(), &found);
      if (ret != 0) no_provider(ret, ip);
      InfoPtr info(found);
      open_fabric(info.get());
      open_endpoint(info.get());
      // WEFT_RDMA_FAULT=slow_connect: a test's stranger gets to the listener first.
      if (config().rdma_slow_connect) std::this_thread::sleep_for(kSlowConnect);
      check("fi_connect", fi_connect(ep_, name.data(), token.data(), sizeof(token)));
      CmEvent connected;
      wait_event(FI_CONNECTED, connected, deadline);
    }
  }

  std::unique_ptr<MemoryRegion> register_memory(void* base, size_t bytes) override {
    fid_mr* mr = nullptr;
    const uint64_t access =
        FI_SEND | FI_RECV | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
    // Where the provider takes our key, one no one can guess, within its key size.
    const size_t key_bytes = std::clamp<size_t>(key_bytes_, 1, sizeof(uint64_t));
    int ret = -FI_ENOKEY;
    for (int tries = 0; ret == -FI_ENOKEY && tries < 8; ++tries) {  // a key already in use
      const uint64_t key = random_word() >> (64 - 8 * key_bytes);
      ret = fi_mr_reg(domain_, base, bytes, access, 0, key, 0, &mr, nullptr);
    }
    check("fi_mr_reg", ret);
    return std::make_unique<OfiRegion>(base, bytes, mr, virtual_addresses_);
  }

  bool needs_local_registration() const override { return local_mr_; }

  bool write_with_imm(const void* src, size_t bytes, const MemoryRegion* local,
                      uint64_t remote_address, uint64_t remote_key, uint32_t imm, uint64_t id,
                      bool local_completion) override {
    void* desc = local ? local->local_descriptor() : nullptr;
    iovec iov{const_cast<void*>(src), bytes};
    fi_rma_iov target{remote_address, bytes, remote_key};
    fi_msg_rma msg{};
    msg.msg_iov = &iov;
    msg.desc = &desc;
    msg.iov_count = 1;
    msg.addr = peer_;
    msg.rma_iov = &target;
    msg.rma_iov_count = 1;
    msg.context = reinterpret_cast<void*>(id);
    msg.data = imm;
    // Each completion the tcp provider reports costs a write and a read of
    // its queue's pipe: writes nobody waits on go without one.
    const uint64_t flags =
        FI_REMOTE_CQ_DATA | (local_completion || !selective_ ? FI_COMPLETION : 0);
    const ssize_t ret = fi_writemsg(ep_, &msg, flags);
    if (ret == -FI_EAGAIN) return false;
    if (ret != 0) throw PeerError(fi_error("fi_writemsg", static_cast<int>(ret)));
    return true;
  }

  int poll(Completion* out, int max) override {
    fi_cq_data_entry entries[16];
    ssize_t n = fi_cq_read(cq_, entries, std::min(max, 16));
    if (n == -FI_EAGAIN) return 0;
    if (n == -FI_EAVAIL) completion_error();
    if (n < 0) throw PeerError(fi_error("fi_cq_read", static_cast<int>(n)));
    int got = 0;
    for (ssize_t i = 0; i < n; ++i) {
      const fi_cq_data_entry& e = entries[i];
      if (e.flags & FI_REMOTE_CQ_DATA) {
        out[got++] = Completion{Completion::Kind::Remote, 0, static_cast<uint32_t>(e.data)};
        if (rx_cq_data_) post_receive();
      } else if (e.op_context != kReceiveContext) {
        out[got++] =
            Completion{Completion::Kind::Local, reinterpret_cast<uint64_t>(e.op_context), 0};
      }
    }
    return got;
  }

  int sleep_fd() const override { return wait_fd_; }
  // fi_trywait says whether the descriptor may be slept on: it fails while
  // completions wait to be read. It costs the provider a pass of its
  // progress, so it is asked only by a waiter about to sleep.
  bool arm_sleep_fd() override {
    if (wait_fd_ < 0) return false;
    fid* queue = &cq_->fid;
    return fi_trywait(fabric_, &queue, 1) == FI_SUCCESS;
  }

  std::string closed_by_peer() override {
    if (shut_down_) return kShutDown;
    if (av_) return "";  // no connection to watch
    uint32_t event = 0;
    fi_eq_cm_entry entry{};
    ssize_t n = fi_eq_read(eq_, &event, &entry, sizeof(entry), 0);
    if (n == -FI_EAGAIN) return "";
    if (n == -FI_EAVAIL) event_error();
    if (n < 0) throw PeerError(fi_error("fi_eq_read", static_cast<int>(n)));
    shut_down_ = event == FI_SHUTDOWN;
    return shut_down_ ? kShutDown : "";
  }

  void close() override {
    if (ep_ && !av_ && !closed_) fi_shutdown(ep_, 0);
    closed_ = true;
  }

  size_t max_write_bytes() const override { return max_write_; }
  std::string name() const override { return "ofi/" + provider_; }

 private:
  [[noreturn]] void no_provider(int ret, const std::string& ip) {
    throw InvalidArgument(
        "WEFT_TRANSPORT=ofi: libfabric offers no FI_EP_MSG or FI_EP_RDM endpoint with FI_RMA "
        "at " +
        ip + " (" + libfabric().strerror(-ret) +
        "); check `fi_info -c FI_RMA`, or set FI_PROVIDER (tcp, verbs, shm)");
  }

  // Both sides open an FI_EP_RDM endpoint, swap names over `control` and put
  // the peer's in the address vector.
  void connect_rdm(Socket& control, bool listen, const std::string& ip, const Deadline& deadline) {
    fi_info* found = nullptr;
    InfoPtr h = hints(FI_EP_RDM);
    int ret = libfabric().getinfo(kApiVersion, nullptr, nullptr, 0, h.get(), &found);
    uint8_t ok = ret == 0, peer_ok = 0;
    // Both learn whether both have one, so that neither waits for a name.
    if (listen) {
      control.send_all(&ok, 1, deadline, "ofi endpoint type");
      control.recv_all(&peer_ok, 1, deadline, "ofi endpoint type of the peer");
    } else {
      control.recv_all(&peer_ok, 1, deadline, "ofi endpoint type of the peer");
      control.send_all(&ok, 1, deadline, "ofi endpoint type");
    }
    InfoPtr info(found);
    if (!ok) no_provider(ret, ip);
    if (!peer_ok) throw InvalidArgument("WEFT_TRANSPORT=ofi: the peer found no FI_EP_RDM endpoint");
    open_fabric(info.get());
    fi_av_attr av_attr{};
    av_attr.type = FI_AV_TABLE;
    check("fi_domain", fi_domain(fabric_, info.get(), &domain_, nullptr));
    check("fi_av_open", fi_av_open(domain_, &av_attr, &av_, nullptr));
    open_endpoint(info.get(), true);
    std::vector<char> name(256);
    size_t len = name.size();
    check("fi_getname", fi_getname(&ep_->fid, name.data(), &len));
    const uint64_t len64 = len;
    uint64_t peer_len = 0;
    std::vector<char> peer_name(4096);
    auto send_name = [&] {
      control.send_all(&len64, sizeof(len64), deadline, "ofi endpoint name");
      control.send_all(name.data(), len, deadline, "ofi endpoint name");
    };
    auto recv_name = [&] {
      control.recv_all(&peer_len, sizeof(peer_len), deadline, "ofi endpoint name of the peer");
      if (peer_len == 0 || peer_len > peer_name.size()) {
        throw PeerError("ofi: the peer sent an endpoint name of " + std::to_string(peer_len) +
                        " bytes");
      }
      control.recv_all(peer_name.data(), peer_len, deadline, "ofi endpoint name of the peer");
    };
    if (listen) {
      send_name();
      recv_name();
    } else {
      recv_name();
      send_name();
    }
    if (fi_av_insert(av_, peer_name.data(), 1, &peer_, 0, nullptr) != 1) {
      throw PeerError("ofi: fi_av_insert refused the peer's address");
    }
  }

  void open_fabric(fi_info* info) {
    provider_ = info->fabric_attr->prov_name ? info->fabric_attr->prov_name : "?";
    check("fi_fabric", libfabric().fabric(info->fabric_attr, &fabric_, nullptr));
    fi_eq_attr eq_attr{};
    eq_attr.wait_obj = FI_WAIT_UNSPEC;
    check("fi_eq_open", fi_eq_open(fabric_, &eq_attr, &eq_, nullptr));
  }

  void open_endpoint(fi_info* info, bool reliable_datagrams = false) {
    if (!reliable_datagrams) check("fi_domain", fi_domain(fabric_, info, &domain_, nullptr));
    open_completion_queue();
    check("fi_endpoint", fi_endpoint(domain_, info, &ep_, nullptr));
    if (reliable_datagrams) {
      check("fi_ep_bind av", fi_ep_bind(ep_, &av_->fid, 0));
    } else {
      check("fi_ep_bind eq", fi_ep_bind(ep_, &eq_->fid, 0));
    }
    // Our writes complete locally only where they ask to (write_with_imm).
    selective_ = fi_ep_bind(ep_, &cq_->fid, FI_TRANSMIT | FI_SELECTIVE_COMPLETION) == 0;
    if (!selective_) check("fi_ep_bind cq", fi_ep_bind(ep_, &cq_->fid, FI_TRANSMIT));
    check("fi_ep_bind cq", fi_ep_bind(ep_, &cq_->fid, FI_RECV));
    check("fi_enable", fi_enable(ep_));
    const uint64_t mr_mode = info->domain_attr->mr_mode;
    local_mr_ = (mr_mode & FI_MR_LOCAL) != 0;
    virtual_addresses_ = (mr_mode & FI_MR_VIRT_ADDR) != 0;
    key_bytes_ = info->domain_attr->mr_key_size;
    rx_cq_data_ = (info->mode & FI_RX_CQ_DATA) != 0;
    max_write_ = info->ep_attr->max_msg_size;
    if (rx_cq_data_) {
      for (int i = 0; i < kPostedReceives; ++i) post_receive();
    }
  }

  // The tcp provider's completion queue can have a descriptor that its
  // sockets make readable, so that waiters sleep in the kernel instead of
  // polling (each poll is a syscall there, and with more ranks than cores
  // the pollers take the CPU from the ranks with work). Other providers are
  // polled: shm delivers through memory that no descriptor watches, and a
  // NIC's completion channel would cost an interrupt a wake-up, which is what
  // polling spares (NCCL's net plugins poll too). Only the provider named
  // exactly "tcp" sleeps; "tcp;ofi_rxm" and "sockets" are polled.
  void open_completion_queue() {
    fi_cq_attr cq_attr{};
    cq_attr.format = FI_CQ_FORMAT_DATA;
    cq_attr.wait_obj = provider_ == "tcp" ? FI_WAIT_FD : FI_WAIT_NONE;
    if (cq_attr.wait_obj == FI_WAIT_FD && fi_cq_open(domain_, &cq_attr, &cq_, nullptr) == 0) {
      if (fi_control(&cq_->fid, FI_GETWAIT, &wait_fd_) == 0 && wait_fd_ >= 0) {
        log_completion_mode("waited on by its descriptor");
        return;
      }
      close_fid(&cq_->fid);
      cq_ = nullptr;
      wait_fd_ = -1;
    }
    cq_attr.wait_obj = FI_WAIT_NONE;
    check("fi_cq_open", fi_cq_open(domain_, &cq_attr, &cq_, nullptr));
    log_completion_mode("polled");
  }

  // Once per process, at INFO: how waiters wait on this provider.
  void log_completion_mode(const char* mode) const {
    static std::once_flag logged;
    std::call_once(logged, [&] {
      WEFT_LOG(Info, -1, "ofi: provider '" << provider_ << "': completion queue " << mode);
    });
  }

  void post_receive() {
    ssize_t ret;
    while ((ret = fi_recv(ep_, nullptr, 0, nullptr, FI_ADDR_UNSPEC, kReceiveContext)) ==
           -FI_EAGAIN) {
      fi_cq_data_entry none;
      fi_cq_read(cq_, &none, 0);
    }
    if (ret != 0) throw PeerError(fi_error("fi_recv", static_cast<int>(ret)));
  }

  // The connection request that carries `token`; others are strangers'.
  InfoPtr request_with(const ConnectToken& token, const Deadline& deadline) {
    for (;;) {
      CmEvent event;
      wait_event(FI_CONNREQ, event, deadline);
      InfoPtr request(event.entry().info);
      if (event.data_bytes >= sizeof(token) &&
          std::memcmp(event.data(), token.data(), sizeof(token)) == 0) {
        return request;
      }
      fi_reject(pep_, request->handle, nullptr, 0);
      WEFT_LOG(Info, -1, "ofi: refused a connection request without this connection's token");
    }
  }

  void wait_event(uint32_t wanted, CmEvent& out, const Deadline& deadline) {
    for (;;) {
      uint32_t event = 0;
      const int ms = std::min(deadline.remaining_ms(), 100) + 1;
      ssize_t n = fi_eq_sread(eq_, &event, out.bytes, sizeof(out.bytes), ms, 0);
      if (n == -FI_EAGAIN || n == -FI_ETIMEDOUT) {
        if (deadline.expired()) {
          throw TimeoutError(std::string("ofi: no ") + fi_tostr_event(wanted) +
                             " from the peer within the timeout");
        }
        continue;
      }
      if (n == -FI_EAVAIL) event_error();
      if (n < 0) throw PeerError(fi_error("fi_eq_sread", static_cast<int>(n)));
      out.data_bytes = static_cast<size_t>(n) > sizeof(fi_eq_cm_entry)
                           ? static_cast<size_t>(n) - sizeof(fi_eq_cm_entry)
                           : 0;
      if (event == wanted) return;
      throw PeerError(std::string("ofi: ") + fi_tostr_event(event) + " while waiting for " +
                      fi_tostr_event(wanted));
    }
  }

  static const char* fi_tostr_event(uint32_t event) {
    switch (event) {
      case FI_CONNREQ: return "FI_CONNREQ";
      case FI_CONNECTED: return "FI_CONNECTED";
      case FI_SHUTDOWN: return "FI_SHUTDOWN";
      default: return "an unexpected event";
    }
  }

  [[noreturn]] void completion_error() {
    fi_cq_err_entry err{};
    fi_cq_readerr(cq_, &err, 0);
    char detail[256] = {};
    const char* provider =
        fi_cq_strerror(cq_, err.prov_errno, err.err_data, detail, sizeof(detail));
    throw PeerError(std::string("ofi: a write failed: ") + libfabric().strerror(err.err) +
                    (provider && *provider ? std::string(" (") + provider + ")" : std::string()));
  }

  [[noreturn]] void event_error() {
    fi_eq_err_entry err{};
    fi_eq_readerr(eq_, &err, 0);
    throw PeerError(std::string("ofi: connection failed: ") + libfabric().strerror(err.err));
  }

  int wait_fd_ = -1;  // cq_'s descriptor, or -1 where it has none
  fid_fabric* fabric_ = nullptr;
  fid_domain* domain_ = nullptr;
  fid_eq* eq_ = nullptr;
  fid_cq* cq_ = nullptr;
  fid_pep* pep_ = nullptr;
  fid_ep* ep_ = nullptr;
  fid_av* av_ = nullptr;  // FI_EP_RDM only
  fi_addr_t peer_ = 0;    // FI_EP_RDM: the peer in av_; FI_EP_MSG ignores it
  std::string provider_;
  bool local_mr_ = false, virtual_addresses_ = false, rx_cq_data_ = false, closed_ = false;
  bool shut_down_ = false;  // the peer's FI_SHUTDOWN came
  bool selective_ = false;  // writes complete locally only when asked to
  size_t max_write_ = 0;
  size_t key_bytes_ = sizeof(uint64_t);  // the provider's memory-key size
};

}  // namespace

std::unique_ptr<RdmaEndpoint> connect_ofi_endpoint(Socket& control, bool listen, double timeout_s) {
  libfabric();  // the clear error first, when it is missing
  auto endpoint = std::make_unique<OfiEndpoint>();
  endpoint->connect(control, listen, timeout_s);
  return endpoint;
}

}  // namespace weft
