// The verbs of the control path: devices, contexts, PDs, MRs, CQs, QPs and their state
// machine, async events.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "emu.h"

using namespace emu;

namespace {

std::atomic<uint32_t> g_instances{0};
std::atomic<uint32_t> g_qpns{0};

// A number of this process and context, so that QP numbers and keys differ between processes
// (one confused with the peer's is then caught).
uint32_t salt(uint32_t pid, uint32_t instance) { return (pid * 2654435761u) ^ (instance * 40503u); }
constexpr int kMaxWr = 16384;
constexpr int kMaxSge = kMaxSgeIov;
constexpr int kMaxInline = 256;
constexpr int kMaxCqe = 1 << 20;
constexpr int kMaxRdAtomic = 16;

ibv_device* the_device() {
  static ibv_device dev = [] {
    ibv_device d{};
    d.node_type = IBV_NODE_CA;
    d.transport_type = IBV_TRANSPORT_IB;
    std::strcpy(d.name, "weft_emu0");
    std::strcpy(d.dev_name, "uverbs_weft_emu0");
    std::strcpy(d.dev_path, "/nonexistent/weft_emu0");
    std::strcpy(d.ibdev_path, "/nonexistent/weft_emu0");
    return d;
  }();
  return &dev;
}

template <typename T>
T* fail(int err) {
  errno = err;
  return nullptr;
}

int unsupported_cq_notify(ibv_cq*, int) { return EOPNOTSUPP; }
int unsupported_srq_recv(ibv_srq*, ibv_recv_wr*, ibv_recv_wr**) { return EOPNOTSUPP; }
ibv_mw* unsupported_alloc_mw(ibv_pd*, ibv_mw_type) { return fail<ibv_mw>(EOPNOTSUPP); }
int unsupported_bind_mw(ibv_qp*, ibv_mw*, ibv_mw_bind*) { return EOPNOTSUPP; }
int unsupported_dealloc_mw(ibv_mw*) { return EOPNOTSUPP; }

// verbs_context's query_device_ex: the basic attributes, and On-Demand Paging as configured.
int query_device_ex(ibv_context* context, const ibv_query_device_ex_input* input,
                    ibv_device_attr_ex* attr, size_t attr_size) {
  if ((input && input->comp_mask != 0) || attr_size < sizeof *attr) return EINVAL;
  std::memset(attr, 0, attr_size);
  const int err = ibv_query_device(context, &attr->orig_attr);
  if (err != 0) return err;
  if (config().odp) {
    attr->odp_caps.general_caps = IBV_ODP_SUPPORT;
    attr->odp_caps.per_transport_caps.rc_odp_caps = config().odp_rc_caps;
  }
  return 0;
}

// Removes the sockets of processes that died without closing their devices: no such process,
// and nobody listening.
void remove_stale_sockets(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) return;
  while (dirent* e = ::readdir(d)) {
    unsigned pid = 0, instance = 0;
    char rest = 0;
    if (std::sscanf(e->d_name, "%u.%u%c", &pid, &instance, &rest) != 2) continue;
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    const std::string path = dir + "/" + e->d_name;
    if (path.size() >= sizeof addr.sun_path) continue;
    std::strcpy(addr.sun_path, path.c_str());
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 &&
        errno == ECONNREFUSED)
      ::unlink(path.c_str());
    ::close(fd);
  }
  ::closedir(d);
}

bool listen_on(Context* ctx) {
  const Config& c = config();
  if (::mkdir(c.socket_dir.c_str(), 0777) == 0) ::chmod(c.socket_dir.c_str(), 01777);
  remove_stale_sockets(c.socket_dir);
  ctx->socket_path =
      c.socket_dir + "/" + std::to_string(ctx->self.pid) + "." + std::to_string(ctx->self.instance);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (ctx->socket_path.size() >= sizeof addr.sun_path) {
    complain("socket path %s is too long: set WEFT_VERBS_EMU_DIR to a shorter directory",
             ctx->socket_path.c_str());
    errno = ENAMETOOLONG;
    return false;
  }
  std::strcpy(addr.sun_path, ctx->socket_path.c_str());
  ::unlink(addr.sun_path);
  ctx->listen_fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (ctx->listen_fd < 0) return false;
  if (::bind(ctx->listen_fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::listen(ctx->listen_fd, 512) != 0) {
    complain("cannot listen on %s: %s", addr.sun_path, std::strerror(errno));
    return false;
  }
  return true;
}

bool access_ok(int access) {
  const int known = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                    IBV_ACCESS_REMOTE_ATOMIC;
  return (access & ~known) == 0;
}

struct Transition {
  int required, optional;
};

// The attribute masks of the RC transitions (IB spec, table 91; the kernel's qp_state_table).
bool transition(ibv_qp_state cur, ibv_qp_state next, Transition* t) {
  const int path = IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE;
  if (next == IBV_QPS_RESET || next == IBV_QPS_ERR) {
    *t = {IBV_QP_STATE, 0};
    return true;
  }
  if (cur == IBV_QPS_RESET && next == IBV_QPS_INIT) {
    *t = {IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, 0};
  } else if (cur == IBV_QPS_INIT && next == IBV_QPS_INIT) {
    *t = {0, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS};
  } else if (cur == IBV_QPS_INIT && next == IBV_QPS_RTR) {
    *t = {IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
              IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
          IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX};
  } else if (cur == IBV_QPS_RTR && next == IBV_QPS_RTS) {
    *t = {IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
              IBV_QP_MAX_QP_RD_ATOMIC,
          IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER | path};
  } else if (cur == IBV_QPS_RTS && next == IBV_QPS_RTS) {
    *t = {0, IBV_QP_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER | path};
  } else {
    return false;
  }
  return true;
}

const char* state_name(int s) {
  static const char* const kNames[] = {"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"};
  return s >= 0 && s <= IBV_QPS_ERR ? kNames[s] : "unknown";
}

// The values of the attributes in mask are ones the emulated port accepts.
int check_values(Qp* qp, const ibv_qp_attr* a, int mask) {
  const uint32_t qpn = qp->base.qp_num;
  if ((mask & IBV_QP_PKEY_INDEX) && a->pkey_index != 0) {
    complain("QP %u: pkey_index %u out of the P_Key table (1 entry)", qpn, a->pkey_index);
    return EINVAL;
  }
  if ((mask & IBV_QP_PORT) && a->port_num != 1) {
    complain("QP %u: port_num %u: the device has port 1 only", qpn, a->port_num);
    return EINVAL;
  }
  if ((mask & IBV_QP_ACCESS_FLAGS) && !access_ok(a->qp_access_flags)) {
    complain("QP %u: qp_access_flags 0x%x has unknown bits", qpn, a->qp_access_flags);
    return EINVAL;
  }
  if ((mask & IBV_QP_PATH_MTU) && (a->path_mtu < IBV_MTU_256 || a->path_mtu > IBV_MTU_4096)) {
    complain("QP %u: path_mtu %d is not an ibv_mtu of the port (256..4096)", qpn, a->path_mtu);
    return EINVAL;
  }
  if ((mask & IBV_QP_DEST_QPN) && a->dest_qp_num > kPsnMask) return EINVAL;
  if ((mask & IBV_QP_MAX_DEST_RD_ATOMIC) && a->max_dest_rd_atomic > kMaxRdAtomic) return EINVAL;
  if ((mask & IBV_QP_MAX_QP_RD_ATOMIC) && a->max_rd_atomic > kMaxRdAtomic) return EINVAL;
  if ((mask & IBV_QP_MIN_RNR_TIMER) && a->min_rnr_timer > 31) return EINVAL;
  if ((mask & IBV_QP_TIMEOUT) && a->timeout > 31) return EINVAL;
  if ((mask & IBV_QP_RETRY_CNT) && a->retry_cnt > 7) return EINVAL;
  if ((mask & IBV_QP_RNR_RETRY) && a->rnr_retry > 7) return EINVAL;
  if (mask & IBV_QP_AV) {
    const ibv_ah_attr& ah = a->ah_attr;
    if (ah.port_num != 1) {
      complain("QP %u: ah_attr.port_num %u: the device has port 1 only", qpn, ah.port_num);
      return EINVAL;
    }
    if (!ah.is_global) {
      complain(
          "QP %u: the port's link layer is Ethernet (RoCE): ah_attr.is_global must be 1 "
          "with grh.dgid set",
          qpn);
      return EINVAL;
    }
    if (ah.grh.sgid_index >= kGidTableLen) {
      complain("QP %u: sgid_index %u out of the GID table (%d entries)", qpn, ah.grh.sgid_index,
               kGidTableLen);
      return EINVAL;
    }
  }
  return 0;
}

}  // namespace

bool emu::mapped(const void* addr, size_t len) {
  if (len == 0) return true;
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t start = reinterpret_cast<uintptr_t>(addr) & ~(page - 1);
  const uintptr_t end = reinterpret_cast<uintptr_t>(addr) + len;
  std::vector<unsigned char> vec((end - start + page - 1) / page);
  return ::mincore(reinterpret_cast<void*>(start), end - start, vec.data()) == 0;
}

EMU_API struct ibv_device**(ibv_get_device_list)(int* num_devices) {
  const int n = config().no_device ? 0 : 1;
  auto** list = new ibv_device*[2]();
  if (n) list[0] = the_device();
  if (num_devices) *num_devices = n;
  return list;
}

EMU_API void ibv_free_device_list(struct ibv_device** list) { delete[] list; }

EMU_API const char* ibv_get_device_name(struct ibv_device* device) { return device->name; }

EMU_API struct ibv_context* ibv_open_device(struct ibv_device* device) {
  if (device != the_device()) return fail<ibv_context>(ENODEV);
  auto* ctx = new Context;
  std::memset(&ctx->ext, 0, sizeof ctx->ext);
  ctx->ext.sz = sizeof ctx->ext;
  ctx->ext.query_device_ex = query_device_ex;
  ibv_context& b = ctx->ext.context;
  b.abi_compat = __VERBS_ABI_IS_EXTENDED;
  b.device = device;
  b.ops.post_send = post_send;
  b.ops.post_recv = post_recv;
  b.ops.poll_cq = poll_cq;
  b.ops.req_notify_cq = unsupported_cq_notify;
  b.ops.post_srq_recv = unsupported_srq_recv;
  b.ops.alloc_mw = unsupported_alloc_mw;
  b.ops.bind_mw = unsupported_bind_mw;
  b.ops.dealloc_mw = unsupported_dealloc_mw;
  b.cmd_fd = -1;
  b.num_comp_vectors = 1;
  pthread_mutex_init(&b.mutex, nullptr);
  ctx->self.pid = static_cast<uint32_t>(getpid());
  ctx->self.instance = ++g_instances;
  b.async_fd = ::eventfd(0, EFD_SEMAPHORE | EFD_CLOEXEC);
  ctx->wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (b.async_fd < 0 || ctx->wake_fd < 0 || !listen_on(ctx)) {
    const int err = errno ? errno : EIO;
    if (b.async_fd >= 0) ::close(b.async_fd);
    if (ctx->wake_fd >= 0) ::close(ctx->wake_fd);
    if (ctx->listen_fd >= 0) ::close(ctx->listen_fd);
    delete ctx;
    return fail<ibv_context>(err);
  }
  if (config().fatal_ms >= 0)
    ctx->fatal_at = Clock::now() + std::chrono::milliseconds(config().fatal_ms);
  ctx->progress = std::thread(progress_main, ctx);
  return &ctx->ext.context;
}

EMU_API int ibv_close_device(struct ibv_context* context) {
  Context* ctx = ctx_of(context);
  {
    std::unique_lock<std::mutex> lk(ctx->async_mu);
    ctx->closing = true;
    ctx->async_cv.notify_all();
    ctx->async_cv.wait(lk, [&] { return ctx->async_waiters == 0; });
  }
  {
    std::lock_guard<std::mutex> lk(ctx->mu);
    ctx->stop = true;
  }
  wake(ctx);
  ctx->progress.join();
  {
    std::lock_guard<std::mutex> lk(ctx->mu);
    for (auto& [qpn, qp] : ctx->qps) {
      qp_reset(qp);
      delete qp;
    }
    ctx->qps.clear();
    while (!ctx->conns.empty()) {
      conn_kill(ctx, ctx->conns.back());
      ::close(ctx->conns.back()->fd);
      delete ctx->conns.back();
      ctx->conns.pop_back();
    }
    for (auto& [key, mr] : ctx->by_lkey) delete mr;
    for (Cq* cq : ctx->cqs) delete cq;
    for (Pd* pd : ctx->pds) delete pd;
  }
  ::close(ctx->listen_fd);
  ::unlink(ctx->socket_path.c_str());
  ::close(ctx->wake_fd);
  ::close(context->async_fd);
  pthread_mutex_destroy(&context->mutex);
  delete ctx;
  write_stats();
  return 0;
}

EMU_API int ibv_query_device(struct ibv_context* context, struct ibv_device_attr* a) {
  (void)context;
  std::memset(a, 0, sizeof *a);
  std::strcpy(a->fw_ver, "weft-verbs-emulator");
  a->node_guid = htobe64(0x0002c90300ee0000ull | getpid());
  a->sys_image_guid = a->node_guid;
  a->max_mr_size = 1ull << 40;
  a->page_size_cap = 0xfffff000;
  a->vendor_id = 0;
  a->vendor_part_id = 0xe1;
  a->hw_ver = 1;
  a->max_qp = 1 << 16;
  a->max_qp_wr = kMaxWr;
  a->device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_PORT_ACTIVE_EVENT;
  a->max_sge = kMaxSge;
  a->max_sge_rd = kMaxSge;
  a->max_cq = 1 << 16;
  a->max_cqe = kMaxCqe;
  a->max_mr = 1 << 20;
  a->max_pd = 1 << 16;
  a->max_qp_rd_atom = kMaxRdAtomic;
  a->max_qp_init_rd_atom = kMaxRdAtomic;
  a->max_res_rd_atom = kMaxRdAtomic << 16;
  a->atomic_cap = IBV_ATOMIC_NONE;
  a->max_pkeys = 1;
  a->local_ca_ack_delay = 16;
  a->phys_port_cnt = 1;
  return 0;
}

// Exported with the compat type of verbs.h's declaration; it fills the whole ibv_port_attr.
EMU_API int(ibv_query_port)(struct ibv_context* context, uint8_t port_num,
                            struct _compat_ibv_port_attr* compat) {
  (void)context;
  if (port_num != 1) return EINVAL;
  auto* a = reinterpret_cast<ibv_port_attr*>(compat);
  std::memset(a, 0, sizeof *a);
  a->state = IBV_PORT_ACTIVE;
  a->max_mtu = IBV_MTU_4096;
  a->active_mtu = IBV_MTU_4096;
  a->gid_tbl_len = kGidTableLen;
  a->port_cap_flags = 0;
  a->max_msg_sz = 1u << 31;
  a->pkey_tbl_len = 1;
  a->lid = 0;
  a->max_vl_num = 1;
  a->active_width = 2;   // 4x
  a->active_speed = 64;  // HDR
  a->phys_state = 5;     // LinkUp
  a->link_layer = IBV_LINK_LAYER_ETHERNET;
  return 0;
}

EMU_API int ibv_query_gid(struct ibv_context* context, uint8_t port_num, int index,
                          union ibv_gid* gid) {
  if (port_num != 1 || index < 0 || index >= kGidTableLen) {
    errno = EINVAL;
    return -1;
  }
  *gid = make_gid(ctx_of(context)->self, index);
  return 0;
}

EMU_API struct ibv_pd* ibv_alloc_pd(struct ibv_context* context) {
  Context* ctx = ctx_of(context);
  auto* pd = new Pd;
  pd->base.context = context;
  std::lock_guard<std::mutex> lk(ctx->mu);
  pd->base.handle = ctx->next_key++;
  ctx->pds.push_back(pd);
  return &pd->base;
}

EMU_API int ibv_dealloc_pd(struct ibv_pd* base) {
  Context* ctx = ctx_of(base->context);
  auto* pd = reinterpret_cast<Pd*>(base);
  std::lock_guard<std::mutex> lk(ctx->mu);
  if (pd->refs > 0) return EBUSY;
  for (size_t i = 0; i < ctx->pds.size(); ++i)
    if (ctx->pds[i] == pd) ctx->pds.erase(ctx->pds.begin() + static_cast<long>(i));
  delete pd;
  return 0;
}

EMU_API struct ibv_mr*(ibv_reg_mr)(struct ibv_pd * base, void* addr, size_t length, int access) {
  Context* ctx = ctx_of(base->context);
  const int optional = ~(IBV_ACCESS_OPTIONAL_FIRST - 1);  // ignored, as libibverbs does
  access &= ~optional;
  // On-Demand Paging: a device without it refuses the flag, as the kernel does for one (EINVAL;
  // newer kernels say EOPNOTSUPP); with it, the registration pins nothing, so it needs no
  // pages mapped now.
  const bool on_demand = (access & IBV_ACCESS_ON_DEMAND) != 0;
  if (on_demand && !config().odp) return fail<ibv_mr>(EINVAL);
  access &= ~IBV_ACCESS_ON_DEMAND;
  if (!access_ok(access)) {
    complain("ibv_reg_mr: access 0x%x has flags the emulator does not know", access);
    return fail<ibv_mr>(EINVAL);
  }
  if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
      !(access & IBV_ACCESS_LOCAL_WRITE)) {
    complain("ibv_reg_mr: remote write needs IBV_ACCESS_LOCAL_WRITE too");
    return fail<ibv_mr>(EINVAL);
  }
  if (!on_demand && !mapped(addr, length)) return fail<ibv_mr>(EFAULT);
  auto* mr = new Mr;
  mr->pd = reinterpret_cast<Pd*>(base);
  mr->access = access;
  mr->on_demand = on_demand;
  Stats& s = stats();
  s.reg_mrs++;
  if (on_demand) s.reg_mrs_on_demand++;
  const uint64_t live = ++s.mrs_live;
  for (uint64_t peak = s.mrs_peak; live > peak && !s.mrs_peak.compare_exchange_weak(peak, live);) {
  }
  std::lock_guard<std::mutex> lk(ctx->mu);
  const uint32_t id = ctx->next_key++;
  mr->base.context = base->context;
  mr->base.pd = base;
  mr->base.addr = addr;
  mr->base.length = length;
  mr->base.handle = id;
  // Distinct lkey and rkey: one given where the other is due is caught.
  const uint32_t mix = salt(ctx->self.pid, ctx->self.instance) & ~0xffu;
  mr->base.lkey = ((id << 8) | 0x1c) ^ mix;
  mr->base.rkey = ((id << 8) | 0xa7) ^ mix;
  ctx->by_lkey[mr->base.lkey] = mr;
  ctx->by_rkey[mr->base.rkey] = mr;
  ++mr->pd->refs;
  return &mr->base;
}

EMU_API int ibv_dereg_mr(struct ibv_mr* base) {
  Context* ctx = ctx_of(base->context);
  auto* mr = reinterpret_cast<Mr*>(base);
  std::unique_lock<std::mutex> lk(ctx->mu);
  ctx->by_lkey.erase(base->lkey);
  ctx->by_rkey.erase(base->rkey);
  ctx->mr_idle.wait(lk, [&] { return mr->busy == 0; });
  --mr->pd->refs;
  delete mr;
  stats().dereg_mrs++;
  stats().mrs_live--;
  return 0;
}

EMU_API struct ibv_cq* ibv_create_cq(struct ibv_context* context, int cqe, void* cq_context,
                                     struct ibv_comp_channel* channel, int comp_vector) {
  (void)comp_vector;
  if (channel) {
    complain("ibv_create_cq: completion channels are not emulated (poll the CQ)");
    return fail<ibv_cq>(EOPNOTSUPP);
  }
  if (cqe < 1 || cqe > kMaxCqe) return fail<ibv_cq>(EINVAL);
  Context* ctx = ctx_of(context);
  auto* cq = new Cq;
  std::memset(&cq->base, 0, sizeof cq->base);
  cq->base.context = context;
  cq->base.cq_context = cq_context;
  cq->base.cqe = cqe;
  pthread_mutex_init(&cq->base.mutex, nullptr);
  pthread_cond_init(&cq->base.cond, nullptr);
  cq->capacity = static_cast<size_t>(cqe);
  if (config().cq_clamp > 0 && cq->capacity > static_cast<size_t>(config().cq_clamp))
    cq->capacity = static_cast<size_t>(config().cq_clamp);
  std::lock_guard<std::mutex> lk(ctx->mu);
  cq->base.handle = ctx->next_key++;
  ctx->cqs.push_back(cq);
  return &cq->base;
}

EMU_API int ibv_destroy_cq(struct ibv_cq* base) {
  Context* ctx = ctx_of(base->context);
  Cq* cq = cq_of(base);
  std::lock_guard<std::mutex> lk(ctx->mu);
  if (cq->qp_refs > 0) return EBUSY;
  for (size_t i = 0; i < ctx->cqs.size(); ++i)
    if (ctx->cqs[i] == cq) ctx->cqs.erase(ctx->cqs.begin() + static_cast<long>(i));
  pthread_mutex_destroy(&base->mutex);
  pthread_cond_destroy(&base->cond);
  delete cq;
  return 0;
}

EMU_API struct ibv_qp* ibv_create_qp(struct ibv_pd* pd, struct ibv_qp_init_attr* init) {
  Context* ctx = ctx_of(pd->context);
  if (init->qp_type != IBV_QPT_RC) {
    complain("ibv_create_qp: only RC QPs are emulated (qp_type %d)", init->qp_type);
    return fail<ibv_qp>(EOPNOTSUPP);
  }
  if (init->srq) {
    complain("ibv_create_qp: SRQs are not emulated");
    return fail<ibv_qp>(EOPNOTSUPP);
  }
  if (!init->send_cq || !init->recv_cq || init->send_cq->context != pd->context ||
      init->recv_cq->context != pd->context)
    return fail<ibv_qp>(EINVAL);
  ibv_qp_cap& cap = init->cap;
  if (cap.max_send_wr < 1 || cap.max_send_wr > kMaxWr || cap.max_recv_wr > kMaxWr ||
      cap.max_send_sge > kMaxSge || cap.max_recv_sge > kMaxSge ||
      cap.max_inline_data > kMaxInline) {
    complain("ibv_create_qp: cap beyond the device (wr 1..%d, sge <= %d, inline <= %d)", kMaxWr,
             kMaxSge, kMaxInline);
    return fail<ibv_qp>(EINVAL);
  }
  auto* qp = new Qp;
  std::memset(&qp->base, 0, sizeof qp->base);
  ibv_qp& b = qp->base;
  b.context = pd->context;
  b.qp_context = init->qp_context;
  b.pd = pd;
  b.send_cq = init->send_cq;
  b.recv_cq = init->recv_cq;
  b.qp_num = ((salt(ctx->self.pid, 0) >> 8) + g_qpns++) & kPsnMask;
  if (b.qp_num < 0x100) b.qp_num += 0x100;  // clear of the special QPs 0 and 1
  b.state = IBV_QPS_RESET;
  b.qp_type = IBV_QPT_RC;
  pthread_mutex_init(&b.mutex, nullptr);
  pthread_cond_init(&b.cond, nullptr);
  qp->pd = reinterpret_cast<Pd*>(pd);
  qp->scq = cq_of(init->send_cq);
  qp->rcq = cq_of(init->recv_cq);
  qp->sig_all = init->sq_sig_all != 0;
  qp->cap = cap;
  qp->attr.qp_state = IBV_QPS_RESET;
  qp->attr.cap = cap;
  std::lock_guard<std::mutex> lk(ctx->mu);
  b.handle = ctx->next_key++;
  ctx->qps[b.qp_num] = qp;
  ++qp->pd->refs;
  ++qp->scq->qp_refs;
  ++qp->rcq->qp_refs;
  return &b;
}

EMU_API int ibv_modify_qp(struct ibv_qp* base, struct ibv_qp_attr* a, int mask) {
  Context* ctx = ctx_of(base->context);
  Qp* qp = qp_of(base);
  std::lock_guard<std::mutex> lk(ctx->mu);
  const ibv_qp_state cur = qp->attr.qp_state;
  const ibv_qp_state next = (mask & IBV_QP_STATE) ? a->qp_state : cur;
  if ((mask & IBV_QP_CUR_STATE) && a->cur_qp_state != cur) {
    complain("QP %u: cur_qp_state %s but the QP is in %s", base->qp_num,
             state_name(a->cur_qp_state), state_name(cur));
    return EINVAL;
  }
  mask &= ~IBV_QP_CUR_STATE;
  Transition t{};
  if (!transition(cur, next, &t)) {
    complain("QP %u: no transition %s -> %s", base->qp_num, state_name(cur), state_name(next));
    return EINVAL;
  }
  if ((mask & t.required) != t.required || (mask & ~(t.required | t.optional)) != 0) {
    complain("QP %u: %s -> %s with attribute mask 0x%x: required 0x%x, allowed besides 0x%x",
             base->qp_num, state_name(cur), state_name(next), mask, t.required, t.optional);
    return EINVAL;
  }
  if (const int err = check_values(qp, a, mask)) return err;
  ibv_qp_attr& s = qp->attr;
  if (mask & IBV_QP_PKEY_INDEX) s.pkey_index = a->pkey_index;
  if (mask & IBV_QP_PORT) s.port_num = a->port_num;
  if (mask & IBV_QP_ACCESS_FLAGS) s.qp_access_flags = a->qp_access_flags;
  if (mask & IBV_QP_PATH_MTU) s.path_mtu = a->path_mtu;
  if (mask & IBV_QP_DEST_QPN) s.dest_qp_num = a->dest_qp_num;
  if (mask & IBV_QP_RQ_PSN) s.rq_psn = a->rq_psn & kPsnMask;
  if (mask & IBV_QP_SQ_PSN) s.sq_psn = a->sq_psn & kPsnMask;
  if (mask & IBV_QP_MAX_DEST_RD_ATOMIC) s.max_dest_rd_atomic = a->max_dest_rd_atomic;
  if (mask & IBV_QP_MAX_QP_RD_ATOMIC) s.max_rd_atomic = a->max_rd_atomic;
  if (mask & IBV_QP_MIN_RNR_TIMER) s.min_rnr_timer = a->min_rnr_timer;
  if (mask & IBV_QP_TIMEOUT) s.timeout = a->timeout;
  if (mask & IBV_QP_RETRY_CNT) s.retry_cnt = a->retry_cnt;
  if (mask & IBV_QP_RNR_RETRY) s.rnr_retry = a->rnr_retry;
  if (mask & IBV_QP_AV) s.ah_attr = a->ah_attr;
  if (mask & IBV_QP_ALT_PATH) s.alt_ah_attr = a->alt_ah_attr;
  if (mask & IBV_QP_PATH_MIG_STATE) s.path_mig_state = a->path_mig_state;
  if (next == IBV_QPS_RESET) {
    qp_reset(qp);
  } else if (next == IBV_QPS_ERR) {
    qp_to_error(qp);
  } else {
    s.qp_state = next;
    base->state = next;
    if (cur == IBV_QPS_INIT && next == IBV_QPS_RTR) {
      qp->epsn = s.rq_psn;
      if (!parse_gid(s.ah_attr.grh.dgid, &qp->remote)) {
        complain(
            "QP %u: dgid is not a GID of this emulator: its sends will fail with "
            "retry exceeded",
            base->qp_num);
        qp->peer_dead = true;
      } else {
        connect_qp(ctx, qp);
      }
    }
    if (cur == IBV_QPS_RTR && next == IBV_QPS_RTS) {
      qp->next_psn = s.sq_psn;
      stats().rts_timeouts |= uint64_t{1} << s.timeout;
      stats().rts_retry_cnts |= uint64_t{1} << s.retry_cnt;
    }
  }
  wake(ctx);
  return 0;
}

EMU_API int ibv_query_qp(struct ibv_qp* base, struct ibv_qp_attr* a, int mask,
                         struct ibv_qp_init_attr* init) {
  (void)mask;  // everything is reported
  Context* ctx = ctx_of(base->context);
  Qp* qp = qp_of(base);
  std::lock_guard<std::mutex> lk(ctx->mu);
  *a = qp->attr;
  a->cur_qp_state = qp->attr.qp_state;
  a->cap = qp->cap;
  if (init) {
    std::memset(init, 0, sizeof *init);
    init->qp_context = base->qp_context;
    init->send_cq = base->send_cq;
    init->recv_cq = base->recv_cq;
    init->cap = qp->cap;
    init->qp_type = IBV_QPT_RC;
    init->sq_sig_all = qp->sig_all;
  }
  return 0;
}

EMU_API int ibv_destroy_qp(struct ibv_qp* base) {
  Context* ctx = ctx_of(base->context);
  Qp* qp = qp_of(base);
  {
    std::lock_guard<std::mutex> lk(ctx->mu);
    ctx->qps.erase(base->qp_num);
    qp_reset(qp);
    --qp->pd->refs;
    --qp->scq->qp_refs;
    --qp->rcq->qp_refs;
  }
  pthread_mutex_destroy(&base->mutex);
  pthread_cond_destroy(&base->cond);
  delete qp;
  wake(ctx);
  return 0;
}

// Blocks until an event is queued (EAGAIN at once if async_fd was made O_NONBLOCK); a caller
// blocked here when the context closes gets -1 (EIO). async_fd is readable exactly while
// events are queued, so poll() on it before calling is the way to stop such a thread.
EMU_API int ibv_get_async_event(struct ibv_context* context, struct ibv_async_event* event) {
  Context* ctx = ctx_of(context);
  const bool nonblocking = (::fcntl(context->async_fd, F_GETFL) & O_NONBLOCK) != 0;
  std::unique_lock<std::mutex> lk(ctx->async_mu);
  ++ctx->async_waiters;
  while (ctx->events.empty() && !ctx->closing) {
    if (nonblocking) {
      --ctx->async_waiters;
      errno = EAGAIN;
      return -1;
    }
    ctx->async_cv.wait(lk);
  }
  int rc = 0;
  if (ctx->events.empty()) {
    errno = EIO;
    rc = -1;
  } else {
    *event = ctx->events.front();
    ctx->events.pop_front();
    uint64_t one;
    if (::read(context->async_fd, &one, sizeof one) != sizeof one)
      complain("async_fd read: %s", std::strerror(errno));
  }
  --ctx->async_waiters;
  if (ctx->closing) ctx->async_cv.notify_all();
  return rc;
}

EMU_API void ibv_ack_async_event(struct ibv_async_event* event) { (void)event; }

namespace emu {

void push_async(Context* ctx, const ibv_async_event& ev) {
  std::lock_guard<std::mutex> lk(ctx->async_mu);
  ctx->events.push_back(ev);
  const uint64_t one = 1;
  if (::write(ctx->ext.context.async_fd, &one, sizeof one) != sizeof one)
    complain("async_fd write: %s", std::strerror(errno));
  ctx->async_cv.notify_all();
}

}  // namespace emu
