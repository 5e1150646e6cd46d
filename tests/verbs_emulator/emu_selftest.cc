// A small verbs client that exercises the emulator from two real processes, loading it the way
// weft's back end does (dlopen + dlsym; the data path through the context's ops table).
//
//   emu_selftest LIB SCENARIO ROLE [key=value ...]     ROLE: send | recv
//
// It prints "INFO qpn psn gid rkey addr" once its QP is in INIT, reads the peer's
// "PEER qpn psn gid rkey addr" line, goes to RTS, prints "READY", waits for "GO", runs the
// scenario and prints "OK <what>" or "FAIL <what>" lines (exit status 1 on any FAIL).
// Options: rnr_retry, min_rnr_timer, timeout, retry_cnt, cqe, n.
#include <arpa/inet.h>
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <sys/mman.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <string>
#include <thread>
#include <vector>

namespace {

struct Lib {
  ibv_device** (*get_device_list)(int*);
  void (*free_device_list)(ibv_device**);
  const char* (*get_device_name)(ibv_device*);
  ibv_context* (*open_device)(ibv_device*);
  int (*close_device)(ibv_context*);
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
  int (*query_qp)(ibv_qp*, ibv_qp_attr*, int, ibv_qp_init_attr*);
  int (*destroy_qp)(ibv_qp*);
  int (*get_async_event)(ibv_context*, ibv_async_event*);
  void (*ack_async_event)(ibv_async_event*);
  const char* (*wc_status_str)(ibv_wc_status);
};
Lib L;
int g_failures = 0;

template <typename F>
void resolve(void* h, const char* name, F& f) {
  f = reinterpret_cast<F>(dlsym(h, name));
  if (!f) {
    std::printf("FAIL missing symbol %s\n", name);
    std::exit(2);
  }
}

void check(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "OK" : "FAIL", what.c_str());
  std::fflush(stdout);
  if (!ok) ++g_failures;
}

std::string read_line() {
  std::string line;
  if (!std::getline(std::cin, line)) std::exit(3);
  return line;
}

std::map<std::string, long> g_opt;
long opt(const char* k, long dflt) {
  auto it = g_opt.find(k);
  return it == g_opt.end() ? dflt : it->second;
}

size_t kBuf = 1 << 20;  // option buf

struct Peer {
  uint32_t qpn, psn, rkey;
  ibv_gid gid;
  uint64_t addr;
};

struct Side {
  ibv_context* ctx;
  ibv_pd* pd;
  ibv_cq* cq;
  ibv_qp* qp;                // qps[0]
  std::vector<ibv_qp*> qps;  // option qps
  std::vector<uint32_t> peer_qpns;
  ibv_mr* mr;
  ibv_mr* mr2;
  char* buf;
  char* buf2;
  Peer peer;
};

uint8_t pattern(size_t i) { return static_cast<uint8_t>(i * 7 + 3); }

int post_write(Side& s, bool imm, uint32_t imm_value, std::vector<ibv_sge> sges, uint64_t raddr,
               uint32_t rkey, bool signaled, uint64_t wr_id, size_t q = 0) {
  ibv_send_wr wr{}, *bad = nullptr;
  wr.wr_id = wr_id;
  wr.opcode = imm ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
  wr.send_flags = signaled ? IBV_SEND_SIGNALED : 0;
  wr.imm_data = htonl(imm_value);
  wr.sg_list = sges.data();
  wr.num_sge = static_cast<int>(sges.size());
  wr.wr.rdma.remote_addr = raddr;
  wr.wr.rdma.rkey = rkey;
  return s.ctx->ops.post_send(s.qps[q], &wr, &bad);
}

int post_recv(Side& s, uint64_t wr_id, size_t q = 0) {
  ibv_recv_wr wr{}, *bad = nullptr;
  wr.wr_id = wr_id;
  return s.ctx->ops.post_recv(s.qps[q], &wr, &bad);
}

// Polls until n completions came or ms passed.
std::vector<ibv_wc> poll_n(Side& s, size_t n, int ms = 5000) {
  std::vector<ibv_wc> out;
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (out.size() < n && std::chrono::steady_clock::now() < end) {
    ibv_wc wc[16];
    const int k = s.ctx->ops.poll_cq(s.cq, 16, wc);
    for (int i = 0; i < k; ++i) out.push_back(wc[i]);
    if (k == 0) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  return out;
}

ibv_qp_state state_of(Side& s) {
  ibv_qp_attr a{};
  ibv_qp_init_attr init{};
  L.query_qp(s.qp, &a, IBV_QP_STATE, &init);
  return a.qp_state;
}

std::string status(const ibv_wc& wc) { return L.wc_status_str(wc.status); }

void to_init(Side& s, ibv_qp* qp) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = 1;
  a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE;
  (void)s;
  if (L.modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
    check(false, "modify to INIT");
}

int rtr_mask() {
  return IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
         IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
}

ibv_qp_attr rtr_attr(Side& s, size_t q = 0) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_4096;
  a.dest_qp_num = s.peer_qpns[q];
  a.rq_psn = s.peer.psn;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = static_cast<uint8_t>(opt("min_rnr_timer", 1));
  a.ah_attr.is_global = 1;
  a.ah_attr.grh.dgid = s.peer.gid;
  a.ah_attr.grh.sgid_index = static_cast<uint8_t>(opt("gid_index", 0));
  a.ah_attr.grh.hop_limit = 255;
  a.ah_attr.port_num = 1;
  return a;
}

int rts_mask() {
  return IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
         IBV_QP_MAX_QP_RD_ATOMIC;
}

ibv_qp_attr rts_attr(uint32_t psn) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTS;
  a.timeout = static_cast<uint8_t>(opt("timeout", 14));
  a.retry_cnt = static_cast<uint8_t>(opt("retry_cnt", 7));
  a.rnr_retry = static_cast<uint8_t>(opt("rnr_retry", 7));
  a.sq_psn = psn;
  a.max_rd_atomic = 1;
  return a;
}

std::string hex(const ibv_gid& g) {
  char out[33];
  for (int i = 0; i < 16; ++i) std::snprintf(out + 2 * i, 3, "%02x", g.raw[i]);
  return out;
}

ibv_gid unhex(const std::string& s) {
  ibv_gid g{};
  for (int i = 0; i < 16; ++i)
    g.raw[i] = static_cast<uint8_t>(std::stoul(s.substr(2 * i, 2), nullptr, 16));
  return g;
}

// The state-machine checks of scenario "states", run while the QP comes up.
void check_refusals(Side& s, const char* when) {
  std::vector<ibv_sge> sge{{reinterpret_cast<uintptr_t>(s.buf), 8, s.mr->lkey}};
  check(post_write(s, false, 0, sge, s.peer.addr, s.peer.rkey, true, 1) == EINVAL,
        std::string("post_send refused in ") + when);
}

// What the emulator refuses rather than pretends.
void check_misuse(Side& s) {
  ibv_send_wr wr{}, *bad = nullptr;
  wr.opcode = IBV_WR_SEND;
  check(s.ctx->ops.post_send(s.qp, &wr, &bad) == EINVAL && bad == &wr, "IBV_WR_SEND refused");
  ibv_qp_init_attr ud{};
  ud.send_cq = ud.recv_cq = s.cq;
  ud.qp_type = IBV_QPT_UD;
  ud.cap.max_send_wr = ud.cap.max_recv_wr = 1;
  errno = 0;
  check(L.create_qp(s.pd, &ud) == nullptr && errno == EOPNOTSUPP, "UD QP refused");
  void* page = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  munmap(page, 4096);
  errno = 0;
  check(L.reg_mr(s.pd, page, 4096, IBV_ACCESS_LOCAL_WRITE) == nullptr && errno == EFAULT,
        "unmapped memory not registered");
  errno = 0;
  check(L.reg_mr(s.pd, s.buf, 64, IBV_ACCESS_REMOTE_WRITE) == nullptr && errno == EINVAL,
        "remote write without local write refused");
  check(L.dealloc_pd(s.pd) == EBUSY, "a PD in use is not freed");
  const int flags = fcntl(s.ctx->async_fd, F_GETFL);
  fcntl(s.ctx->async_fd, F_SETFL, flags | O_NONBLOCK);
  ibv_async_event ev{};
  errno = 0;
  check(L.get_async_event(s.ctx, &ev) == -1 && errno == EAGAIN,
        "no event on a non-blocking async_fd: EAGAIN");
  fcntl(s.ctx->async_fd, F_SETFL, flags);
}

void bring_up(Side& s, const std::string& scenario, const std::string& role) {
  const uint32_t psn = role == "send" ? 0x1234 : 0xabcde;
  if (scenario == "states") {
    ibv_qp_attr a = rts_attr(psn);
    check(L.modify_qp(s.qp, &a, rts_mask()) == EINVAL, "RESET -> RTS refused");
    ibv_qp_attr i{};
    i.qp_state = IBV_QPS_INIT;
    i.port_num = 1;
    check(L.modify_qp(s.qp, &i, IBV_QP_STATE | IBV_QP_PORT) == EINVAL,
          "RESET -> INIT without PKEY_INDEX/ACCESS_FLAGS refused");
    check(state_of(s) == IBV_QPS_RESET, "still RESET");
  }
  for (ibv_qp* qp : s.qps) to_init(s, qp);
  ibv_gid gid{};
  L.query_gid(s.ctx, 1, static_cast<int>(opt("gid_index", 0)), &gid);
  std::string qpns;
  for (ibv_qp* qp : s.qps) qpns += (qpns.empty() ? "" : ",") + std::to_string(qp->qp_num);
  std::printf("INFO %s %u %s %u %lu\n", qpns.c_str(), psn, hex(gid).c_str(), s.mr->rkey,
              static_cast<unsigned long>(reinterpret_cast<uintptr_t>(s.mr->addr)));
  std::fflush(stdout);
  char gidhex[64], peer_qpns[256];
  unsigned long addr;
  if (std::sscanf(read_line().c_str(), "PEER %255s %u %63s %u %lu", peer_qpns, &s.peer.psn, gidhex,
                  &s.peer.rkey, &addr) != 5)
    std::exit(4);
  for (char* t = std::strtok(peer_qpns, ","); t; t = std::strtok(nullptr, ","))
    s.peer_qpns.push_back(static_cast<uint32_t>(std::atol(t)));
  if (s.peer_qpns.size() != s.qps.size()) std::exit(4);
  s.peer.qpn = s.peer_qpns[0];
  s.peer.gid = unhex(gidhex);
  s.peer.addr = addr;
  if (scenario == "states") {
    check(state_of(s) == IBV_QPS_INIT, "query_qp says INIT");
    check_refusals(s, "INIT");
    check(post_recv(s, 99) == 0, "post_recv accepted in INIT");
    ibv_qp_attr a = rtr_attr(s);
    check(L.modify_qp(s.qp, &a, rtr_mask() & ~IBV_QP_MIN_RNR_TIMER) == EINVAL,
          "INIT -> RTR without MIN_RNR_TIMER refused");
    check(L.modify_qp(s.qp, &a, rtr_mask() | IBV_QP_SQ_PSN) == EINVAL,
          "INIT -> RTR with SQ_PSN refused");
    a.ah_attr.is_global = 0;
    check(L.modify_qp(s.qp, &a, rtr_mask()) == EINVAL, "RTR without a GRH refused (RoCE)");
  }
  for (size_t q = 0; q < s.qps.size(); ++q) {
    ibv_qp_attr a = rtr_attr(s, q);
    check(L.modify_qp(s.qps[q], &a, rtr_mask()) == 0, "modify to RTR");
  }
  if (scenario == "states") {
    check(state_of(s) == IBV_QPS_RTR, "query_qp says RTR");
    check_refusals(s, "RTR");
  }
  for (ibv_qp* qp : s.qps) {
    ibv_qp_attr r = rts_attr(psn);
    check(L.modify_qp(qp, &r, rts_mask()) == 0, "modify to RTS");
  }
  if (scenario == "states") {
    check(state_of(s) == IBV_QPS_RTS, "query_qp says RTS");
    check_misuse(s);
  }
}

void expect_statuses(const std::vector<ibv_wc>& wcs, const std::vector<ibv_wc_status>& want,
                     const std::string& what) {
  bool ok = wcs.size() == want.size();
  std::string got;
  for (size_t i = 0; i < wcs.size(); ++i) {
    got += " " + status(wcs[i]);
    if (i < want.size() && wcs[i].status != want[i]) ok = false;
  }
  check(ok, what + ":" + got);
}

// --- scenarios --------------------------------------------------------------------------------

void imm_send(Side& s) {
  for (size_t i = 0; i < 3000; ++i) s.buf[i] = static_cast<char>(pattern(i));
  for (size_t i = 0; i < 1000; ++i) s.buf2[i] = static_cast<char>(pattern(3000 + i));
  // Three SGEs from two MRs: 1000 + 2000 bytes of buf, 1000 of buf2.
  std::vector<ibv_sge> sges{{reinterpret_cast<uintptr_t>(s.buf), 1000, s.mr->lkey},
                            {reinterpret_cast<uintptr_t>(s.buf) + 1000, 2000, s.mr->lkey},
                            {reinterpret_cast<uintptr_t>(s.buf2), 1000, s.mr2->lkey}};
  check(post_write(s, true, 0x12345678, sges, s.peer.addr + 4096, s.peer.rkey, true, 7) == 0,
        "post write-with-imm");
  // A zero-length one, as weft sends for a message of no bytes: no SGE, no key checked.
  ibv_send_wr wr{}, *bad = nullptr;
  wr.wr_id = 8;
  wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.imm_data = htonl(42);
  check(s.ctx->ops.post_send(s.qp, &wr, &bad) == 0, "post a zero-length write-with-imm");
  auto wcs = poll_n(s, 2);
  check(wcs.size() == 2 && wcs[0].status == IBV_WC_SUCCESS && wcs[0].wr_id == 7 &&
            wcs[0].opcode == IBV_WC_RDMA_WRITE && wcs[1].status == IBV_WC_SUCCESS &&
            wcs[1].wr_id == 8,
        "send completions");
}

void imm_recv(Side& s) {
  auto wcs = poll_n(s, 2);
  check(wcs.size() == 2 && wcs[1].status == IBV_WC_SUCCESS && wcs[1].byte_len == 0 &&
            ntohl(wcs[1].imm_data) == 42 && wcs[1].wr_id == 2,
        "zero-length write-with-imm received");
  bool ok = wcs.size() >= 1 && wcs[0].status == IBV_WC_SUCCESS && wcs[0].wr_id == 1 &&
            wcs[0].opcode == IBV_WC_RECV_RDMA_WITH_IMM && (wcs[0].wc_flags & IBV_WC_WITH_IMM) &&
            ntohl(wcs[0].imm_data) == 0x12345678 && wcs[0].byte_len == 4000 &&
            wcs[0].qp_num == s.qp->qp_num && wcs[0].src_qp == s.peer.qpn;
  check(ok, "receive completion with imm, byte_len, qp numbers");
  bool bytes = true;
  for (size_t i = 0; i < 4000; ++i)
    bytes = bytes && static_cast<uint8_t>(s.buf[4096 + i]) == pattern(i);
  bool untouched = s.buf[4095] == 0 && s.buf[4096 + 4000] == 0;
  check(bytes && untouched, "the bytes landed, and only there");
}

// Pairs of a plain write into slot i and a write-with-imm i into slot2 i: each receive
// completion must find both of its writes in memory, and the imm values come in order.
void order_send(Side& s) {
  const long n = opt("n", 3000);
  auto* v = reinterpret_cast<uint64_t*>(s.buf);
  for (long i = 0; i < n; ++i) {
    v[2 * i] = static_cast<uint64_t>(i);
    v[2 * i + 1] = static_cast<uint64_t>(i) ^ 0xabcdef;
  }
  const size_t nq = s.qps.size();
  std::vector<long> next(nq);  // the next wr_id each QP completes
  for (size_t q = 0; q < nq; ++q) next[q] = static_cast<long>(q);
  long posted = 0, done = 0;
  bool ok = true;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (done < n && std::chrono::steady_clock::now() < end) {
    while (posted < n && posted - done < 100) {
      const uintptr_t a = reinterpret_cast<uintptr_t>(&v[2 * posted]);
      const size_t q = static_cast<size_t>(posted) % nq;
      ok &= post_write(s, false, 0, {{a, 8, s.mr->lkey}}, s.peer.addr + 16 * posted, s.peer.rkey,
                       false, 0, q) == 0;
      // The second half in two SGEs of 4 bytes.
      ok &= post_write(s, true, static_cast<uint32_t>(posted),
                       {{a + 8, 4, s.mr->lkey}, {a + 12, 4, s.mr->lkey}},
                       s.peer.addr + 16 * posted + 8, s.peer.rkey, true, posted, q) == 0;
      ++posted;
    }
    for (const ibv_wc& wc : poll_n(s, 1, 1)) {
      const size_t q = static_cast<size_t>(wc.wr_id) % nq;
      ok &= wc.status == IBV_WC_SUCCESS && wc.qp_num == s.qps[q]->qp_num &&
            wc.wr_id == static_cast<uint64_t>(next[q]);
      next[q] += static_cast<long>(nq);
      ++done;
    }
  }
  check(ok && done == n, "all " + std::to_string(n) + " send completions, in order per QP");
}

void order_recv(Side& s) {
  const long n = opt("n", 3000);
  auto* v = reinterpret_cast<volatile uint64_t*>(s.buf);
  const size_t nq = s.qps.size();
  std::vector<long> next(nq);
  for (size_t q = 0; q < nq; ++q) next[q] = static_cast<long>(q);
  long got = 0;
  bool ok = true;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (got < n && std::chrono::steady_clock::now() < end) {
    for (const ibv_wc& wc : poll_n(s, 1, 1)) {
      const long i = static_cast<long>(ntohl(wc.imm_data));
      const size_t q = static_cast<size_t>(i) % nq;
      ok &= wc.status == IBV_WC_SUCCESS && wc.qp_num == s.qps[q]->qp_num && i == next[q] &&
            v[2 * i] == static_cast<uint64_t>(i) &&
            v[2 * i + 1] == (static_cast<uint64_t>(i) ^ 0xabcdef);
      next[q] += static_cast<long>(nq);
      ++got;
      ok &= post_recv(s, 0, q) == 0;
    }
  }
  check(ok && got == n,
        "all " + std::to_string(n) + " receives in order per QP, data in place first");
}

// A bad remote key / range / access fails the write with REM_ACCESS_ERR; the WR behind it
// and any posted later flush; both QPs end in ERR.
void bad_send(Side& s, const std::string& variant) {
  uint64_t raddr = s.peer.addr;
  uint32_t rkey = s.peer.rkey;
  uint32_t len = 64;
  if (variant == "rkey") rkey ^= 0xff;  // no key of the emulator ends so
  if (variant == "bounds") raddr += kBuf - 32;
  std::vector<ibv_sge> sge{{reinterpret_cast<uintptr_t>(s.buf), len, s.mr->lkey}};
  check(post_write(s, true, 1, sge, raddr, rkey, true, 1) == 0, "post the bad write");
  check(post_write(s, true, 2, sge, s.peer.addr, s.peer.rkey, true, 2) == 0, "post a good one");
  auto wcs = poll_n(s, 2);
  expect_statuses(wcs, {IBV_WC_REM_ACCESS_ERR, IBV_WC_WR_FLUSH_ERR}, "remote access error, flush");
  check(state_of(s) == IBV_QPS_ERR, "sender QP in ERR");
  check(post_write(s, true, 3, sge, s.peer.addr, s.peer.rkey, false, 3) == 0, "post in ERR");
  expect_statuses(poll_n(s, 1), {IBV_WC_WR_FLUSH_ERR}, "posted in ERR: flushed (unsignaled too)");
}

void bad_recv(Side& s) {
  expect_statuses(poll_n(s, 2), {IBV_WC_WR_FLUSH_ERR, IBV_WC_WR_FLUSH_ERR},
                  "receiver's posted receives flushed");
  check(state_of(s) == IBV_QPS_ERR, "receiver QP in ERR");
}

void lkey_send(Side& s) {
  std::vector<ibv_sge> over{{reinterpret_cast<uintptr_t>(s.buf) + kBuf - 8, 64, s.mr->lkey}};
  check(post_write(s, false, 0, {{reinterpret_cast<uintptr_t>(s.buf), 8, s.mr->lkey}}, s.peer.addr,
                   s.peer.rkey, true, 1) == 0 &&
            post_write(s, false, 0, over, s.peer.addr, s.peer.rkey, false, 2) == 0 &&
            post_write(s, false, 0, {{reinterpret_cast<uintptr_t>(s.buf), 8, s.mr->lkey ^ 0xff}},
                       s.peer.addr, s.peer.rkey, true, 3) == 0,
        "post good, local out of bounds (unsignaled), bad lkey");
  auto wcs = poll_n(s, 3);
  expect_statuses(wcs, {IBV_WC_SUCCESS, IBV_WC_LOC_PROT_ERR, IBV_WC_WR_FLUSH_ERR},
                  "local protection error (unsignaled WR completes), then flush");
}

void rnr_send(Side& s, bool expect_ok) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<ibv_sge> sge{{reinterpret_cast<uintptr_t>(s.buf), 16, s.mr->lkey}};
  check(post_write(s, true, 5, sge, s.peer.addr, s.peer.rkey, true, 1) == 0, "post");
  auto wcs = poll_n(s, 1);
  const long ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  expect_statuses(wcs, {expect_ok ? IBV_WC_SUCCESS : IBV_WC_RNR_RETRY_EXC_ERR},
                  "completion after RNR NAKs");
  std::printf("ELAPSED_MS %ld\n", ms);
}

void rnr_late_recv(Side& s) {
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  check(post_recv(s, 1) == 0, "receive posted late");
  expect_statuses(poll_n(s, 1), {IBV_WC_SUCCESS}, "the retried write consumed it");
}

// The peer is killed (before GO, or while the write is retried): RETRY_EXC_ERR within a bound.
void dead_peer_send(Side& s, int writes) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<ibv_sge> sge{{reinterpret_cast<uintptr_t>(s.buf), 16, s.mr->lkey}};
  for (int i = 0; i < writes; ++i)
    check(post_write(s, true, 5, sge, s.peer.addr, s.peer.rkey, true, i) == 0, "post");
  std::vector<ibv_wc_status> want(writes, IBV_WC_WR_FLUSH_ERR);
  want[0] = IBV_WC_RETRY_EXC_ERR;
  expect_statuses(poll_n(s, writes, 10000), want, "retry exceeded, then flush");
  const long ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  std::printf("ELAPSED_MS %ld\n", ms);
  check(state_of(s) == IBV_QPS_ERR, "QP in ERR");
}

void inject_send(Side& s) {
  std::vector<ibv_sge> sge{{reinterpret_cast<uintptr_t>(s.buf), 16, s.mr->lkey}};
  for (int i = 0; i < 5; ++i)
    post_write(s, false, 0, sge, s.peer.addr, s.peer.rkey, true, static_cast<uint64_t>(i));
  expect_statuses(poll_n(s, 5),
                  {IBV_WC_SUCCESS, IBV_WC_SUCCESS, IBV_WC_RETRY_EXC_ERR, IBV_WC_WR_FLUSH_ERR,
                   IBV_WC_WR_FLUSH_ERR},
                  "the third signaled write: retry exceeded");
}

void overflow_send(Side& s) {
  std::vector<ibv_sge> sge{{reinterpret_cast<uintptr_t>(s.buf), 16, s.mr->lkey}};
  for (int i = 0; i < 10; ++i)
    post_write(s, true, static_cast<uint32_t>(i), sge, s.peer.addr, s.peer.rkey, true, 1);
  check(poll_n(s, 10).size() == 10, "ten writes-with-imm acknowledged");
}

bool wait_event(Side& s, ibv_event_type type, int ms, const std::string& what, bool early) {
  pollfd p{s.ctx->async_fd, POLLIN, 0};
  if (early) check(poll(&p, 1, 0) == 0, "async_fd not readable before the event");
  const bool ready = poll(&p, 1, ms) == 1;
  ibv_async_event ev{};
  const bool got = ready && L.get_async_event(s.ctx, &ev) == 0 && ev.event_type == type;
  check(got, what);
  if (got) L.ack_async_event(&ev);
  check(poll(&p, 1, 0) == 0, "async_fd not readable once the event was taken");
  return got && (type != IBV_EVENT_CQ_ERR || ev.element.cq == s.cq);
}

void overflow_recv(Side& s) {
  check(wait_event(s, IBV_EVENT_CQ_ERR, 5000, "IBV_EVENT_CQ_ERR", false), "on this CQ");
}

// Three writes-with-imm of several MiB at odd offsets and lengths, two SGEs each: the
// payloads cross the sockets in many pieces.
constexpr size_t kLarge = (5 << 20) + 3;

void large_send(Side& s) {
  for (size_t i = 0; i < kBuf; ++i) s.buf[i] = static_cast<char>(pattern(i));
  for (int k = 0; k < 3; ++k) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(s.buf) + 1 + k * kLarge;
    std::vector<ibv_sge> sges{{a, 4097, s.mr->lkey},
                              {a + 4097, static_cast<uint32_t>(kLarge - 4097), s.mr->lkey}};
    check(post_write(s, true, static_cast<uint32_t>(k), sges, s.peer.addr + 1 + k * kLarge,
                     s.peer.rkey, true, static_cast<uint64_t>(k)) == 0,
          "post a large write");
  }
  expect_statuses(poll_n(s, 3, 10000), {IBV_WC_SUCCESS, IBV_WC_SUCCESS, IBV_WC_SUCCESS},
                  "large writes complete");
}

void large_recv(Side& s) {
  auto wcs = poll_n(s, 3, 10000);
  bool ok = wcs.size() == 3;
  for (size_t k = 0; k < wcs.size(); ++k)
    ok = ok && wcs[k].status == IBV_WC_SUCCESS && ntohl(wcs[k].imm_data) == k &&
         wcs[k].byte_len == kLarge;
  size_t wrong = 0;
  for (size_t i = 1; i < 1 + 3 * kLarge; ++i) wrong += static_cast<uint8_t>(s.buf[i]) != pattern(i);
  check(ok && wrong == 0 && s.buf[0] == 0 && s.buf[1 + 3 * kLarge] == 0,
        "large writes landed (" + std::to_string(wrong) + " wrong bytes)");
}

// Posting in one thread, polling in another; an event thread blocked in
// ibv_get_async_event while the device closes.
void threads_send(Side& s) {
  const long n = opt("n", 2000);
  std::atomic<long> done{0};
  std::atomic<bool> ok{true};
  std::thread poller([&] {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (done < n && std::chrono::steady_clock::now() < end) {
      for (const ibv_wc& wc : poll_n(s, 1, 1)) {
        if (wc.status != IBV_WC_SUCCESS || wc.wr_id != static_cast<uint64_t>(done.load()))
          ok = false;
        ++done;
      }
    }
  });
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (long i = 0; i < n && std::chrono::steady_clock::now() < end;) {
    if (i - done >= 200) {
      std::this_thread::yield();
      continue;
    }
    std::vector<ibv_sge> sge{{reinterpret_cast<uintptr_t>(s.buf) + 8 * i, 8, s.mr->lkey}};
    if (post_write(s, true, static_cast<uint32_t>(i), sge, s.peer.addr + 8 * i, s.peer.rkey, true,
                   static_cast<uint64_t>(i)) != 0)
      ok = false;
    ++i;
  }
  poller.join();
  check(ok && done == n, "posted in one thread, polled in another");
}

void threads_recv(Side& s) {
  const long n = opt("n", 2000);
  long got = 0;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (got < n && std::chrono::steady_clock::now() < end) {
    for (const ibv_wc& wc : poll_n(s, 1, 1)) {
      if (wc.status == IBV_WC_SUCCESS && ntohl(wc.imm_data) == static_cast<uint32_t>(got)) ++got;
      post_recv(s, 0);
    }
  }
  check(got == n, "received in order while another thread waits for events");
}

// Send-queue slots come free when a completion at or after them is polled, as on a NIC.
void full_send(Side& s) {
  std::vector<ibv_sge> sge{{reinterpret_cast<uintptr_t>(s.buf), 8, s.mr->lkey}};
  bool ok = true;
  for (int i = 0; i < 255; ++i)
    ok &= post_write(s, false, 0, sge, s.peer.addr, s.peer.rkey, false, 0) == 0;
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // all of them placed
  ok &= post_write(s, false, 0, sge, s.peer.addr, s.peer.rkey, true, 1) == 0;
  check(ok, "max_send_wr WRs posted");
  check(post_write(s, false, 0, sge, s.peer.addr, s.peer.rkey, true, 2) == ENOMEM,
        "one more: ENOMEM until a completion is polled");
  expect_statuses(poll_n(s, 1), {IBV_WC_SUCCESS}, "the signaled one");
  check(post_write(s, false, 0, sge, s.peer.addr, s.peer.rkey, true, 3) == 0,
        "posting again after the poll");
  expect_statuses(poll_n(s, 1), {IBV_WC_SUCCESS}, "and it completes");
}

// Work outstanding (RNR-NAKed forever) when the QP is destroyed and the device closed.
void busy_send(Side& s) {
  std::vector<ibv_sge> sge{{reinterpret_cast<uintptr_t>(s.buf), 4096, s.mr->lkey}};
  for (int i = 0; i < 10; ++i)
    post_write(s, true, 0, sge, s.peer.addr, s.peer.rkey, true, static_cast<uint64_t>(i));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  check(poll_n(s, 1, 0).empty(), "nothing completed yet");
}

int entries(const char* dir) {
  int n = 0;
  if (DIR* d = opendir(dir)) {
    while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
    closedir(d);
  }
  return n;
}
int open_fds() { return entries("/proc/self/fd"); }
int threads() { return entries("/proc/self/task"); }

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s LIB SCENARIO ROLE [key=value ...]\n", argv[0]);
    return 2;
  }
  const std::string scenario = argv[2], role = argv[3];
  for (int i = 4; i < argc; ++i) {
    const std::string kv = argv[i];
    g_opt[kv.substr(0, kv.find('='))] = std::atol(kv.substr(kv.find('=') + 1).c_str());
  }
  kBuf = static_cast<size_t>(opt("buf", 1 << 20));
  void* h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    std::printf("FAIL dlopen: %s\n", dlerror());
    return 2;
  }
  resolve(h, "ibv_get_device_list", L.get_device_list);
  resolve(h, "ibv_free_device_list", L.free_device_list);
  resolve(h, "ibv_get_device_name", L.get_device_name);
  resolve(h, "ibv_open_device", L.open_device);
  resolve(h, "ibv_close_device", L.close_device);
  resolve(h, "ibv_query_port", L.query_port);
  resolve(h, "ibv_query_gid", L.query_gid);
  resolve(h, "ibv_alloc_pd", L.alloc_pd);
  resolve(h, "ibv_dealloc_pd", L.dealloc_pd);
  resolve(h, "ibv_reg_mr", L.reg_mr);
  resolve(h, "ibv_dereg_mr", L.dereg_mr);
  resolve(h, "ibv_create_cq", L.create_cq);
  resolve(h, "ibv_destroy_cq", L.destroy_cq);
  resolve(h, "ibv_create_qp", L.create_qp);
  resolve(h, "ibv_modify_qp", L.modify_qp);
  resolve(h, "ibv_query_qp", L.query_qp);
  resolve(h, "ibv_destroy_qp", L.destroy_qp);
  resolve(h, "ibv_get_async_event", L.get_async_event);
  resolve(h, "ibv_ack_async_event", L.ack_async_event);
  resolve(h, "ibv_wc_status_str", L.wc_status_str);
  check(dlsym(h, "ibv_reg_dmabuf_mr") == nullptr, "ibv_reg_dmabuf_mr is not exported");

  const int fds_before = open_fds(), threads_before = threads();
  int n = -1;
  ibv_device** list = L.get_device_list(&n);
  if (scenario == "nodevice") {
    check(list && n == 0 && list[0] == nullptr, "empty device list");
    L.free_device_list(list);
    return g_failures ? 1 : 0;
  }
  if (!list || n != 1) {
    std::printf("FAIL device list has %d devices\n", n);
    return 1;
  }
  check(std::string(L.get_device_name(list[0])) == "weft_emu0", "device weft_emu0");
  Side s{};
  s.ctx = L.open_device(list[0]);
  L.free_device_list(list);
  ibv_port_attr port{};
  check(L.query_port(s.ctx, 1, &port) == 0 && port.state == IBV_PORT_ACTIVE &&
            port.link_layer == IBV_LINK_LAYER_ETHERNET && port.gid_tbl_len == 4 && port.lid == 0,
        "port 1 active, Ethernet, 4 GIDs, lid 0");
  s.pd = L.alloc_pd(s.ctx);
  s.buf = static_cast<char*>(std::calloc(kBuf, 1));
  s.buf2 = static_cast<char*>(std::calloc(4096, 1));
  s.mr = L.reg_mr(s.pd, s.buf, kBuf, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  s.mr2 = L.reg_mr(s.pd, s.buf2, 4096,
                   scenario == "access" ? IBV_ACCESS_LOCAL_WRITE
                                        : IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (scenario == "access" && role == "recv")
    std::swap(s.mr, s.mr2);  // the peer gets a key without remote write
  s.cq = L.create_cq(s.ctx, static_cast<int>(opt("cqe", 1024)), nullptr, nullptr, 0);
  ibv_qp_init_attr init{};
  init.send_cq = s.cq;
  init.recv_cq = s.cq;
  init.qp_type = IBV_QPT_RC;
  init.cap.max_send_wr = 256;
  init.cap.max_recv_wr = 256;
  init.cap.max_send_sge = 4;
  init.cap.max_recv_sge = 1;
  for (long q = 0; q < opt("qps", 1); ++q) s.qps.push_back(L.create_qp(s.pd, &init));
  s.qp = s.qps[0];
  bool created = s.ctx && s.pd && s.mr && s.mr2 && s.cq;
  for (ibv_qp* qp : s.qps) created = created && qp;
  check(created, "objects created");
  bring_up(s, scenario, role);
  if (role == "recv") {
    int receives = 0;
    if (scenario == "imm") receives = 2;
    if (scenario == "order") receives = 64;
    if (scenario == "rkey" || scenario == "bounds" || scenario == "access") receives = 2;
    if (scenario == "overflow") receives = 10;
    if (scenario == "large") receives = 3;
    if (scenario == "threads") receives = 200;
    for (int i = 0; i < receives; ++i)
      for (size_t q = 0; q < s.qps.size(); ++q)
        post_recv(s, static_cast<uint64_t>(i + (scenario == "imm")), q);
  }
  std::atomic<int> event_rc{1};
  int event_errno = 0;
  std::thread events;
  if (scenario == "threads")
    events = std::thread([&] {
      ibv_async_event ev{};
      event_rc = L.get_async_event(s.ctx, &ev);
      event_errno = errno;
    });
  std::printf("READY\n");
  std::fflush(stdout);
  read_line();  // GO
  const bool send = role == "send";
  if (scenario == "imm") send ? imm_send(s) : imm_recv(s);
  if (scenario == "order") send ? order_send(s) : order_recv(s);
  if (scenario == "rkey" || scenario == "bounds" || scenario == "access")
    send ? bad_send(s, scenario) : bad_recv(s);
  if (scenario == "lkey" && send) lkey_send(s);
  if (scenario == "rnr" && send) rnr_send(s, false);
  if (scenario == "rnr_late") send ? rnr_send(s, true) : rnr_late_recv(s);
  if (scenario == "dead" && send) dead_peer_send(s, static_cast<int>(opt("n", 2)));
  if (scenario == "inject" && send) inject_send(s);
  if (scenario == "large") send ? large_send(s) : large_recv(s);
  if (scenario == "threads") send ? threads_send(s) : threads_recv(s);
  if (scenario == "busy" && send) busy_send(s);
  if (scenario == "full" && send) full_send(s);
  if (scenario == "overflow") send ? overflow_send(s) : overflow_recv(s);
  if (scenario == "fatal" && send)
    wait_event(s, IBV_EVENT_DEVICE_FATAL, 5000, "IBV_EVENT_DEVICE_FATAL", true);
  const bool held = scenario != "imm" && scenario != "order" && scenario != "large";
  if (!send && held) read_line();  // held until told to close
  // Tear down with work possibly outstanding.
  bool destroyed = true;
  for (ibv_qp* qp : s.qps) destroyed = destroyed && L.destroy_qp(qp) == 0;
  check(destroyed && L.destroy_cq(s.cq) == 0 && L.dereg_mr(s.mr) == 0 && L.dereg_mr(s.mr2) == 0 &&
            L.dealloc_pd(s.pd) == 0 && L.close_device(s.ctx) == 0,
        "teardown");
  if (events.joinable()) {
    events.join();
    check(event_rc == -1 && event_errno == EIO,
          "ibv_get_async_event blocked at close returned -1 (EIO)");
  }
  std::free(s.buf);
  std::free(s.buf2);
  check(open_fds() == fds_before, "every fd the emulator opened is closed");
  check(threads() == threads_before, "no thread left running");
  std::printf("DONE\n");
  return g_failures ? 1 : 0;
}
