// The verbs emulator's internal types: a libibverbs stand-in for tests on machines without an
// RDMA device (see README.md here for what it emulates, its knobs and what it cannot prove).
// Every object the caller sees (ibv_context, ibv_pd, ibv_mr, ibv_cq, ibv_qp) is the first
// member of the emulator's own struct, so a cast goes from one to the other.
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#define EMU_API extern "C" __attribute__((visibility("default")))

namespace emu {

using Clock = std::chrono::steady_clock;

// Knobs read once from the environment (README.md lists them).
struct Config {
  bool no_device = false;
  bool rnr = false;             // never accept a receive
  long retry_exceeded_nth = 0;  // the N-th signaled write fails with RETRY_EXC_ERR
  long cq_clamp = 0;            // CQ capacity clamped to this many entries
  // An injected fatal async event (device, port or QP) this long after open.
  ibv_event_type fatal_event = IBV_EVENT_DEVICE_FATAL;
  long fatal_ms = -1;
  long timeout_cap_ms = 200;  // longest modeled transport timeout
  bool odp = false;           // the device has On-Demand Paging (IBV_ACCESS_ON_DEMAND)
  uint32_t odp_rc_caps = 0;   // what ibv_query_device_ex says ODP covers on RC QPs
  std::string stats_dir;      // where each process writes its counters
  std::string socket_dir;     // where contexts listen
};
const Config& config();
void complain(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

struct Stats {
  std::atomic<uint64_t> writes{0}, writes_with_imm{0}, receives_consumed{0}, rnr_naks_sent{0},
      rnr_naks_received{0}, payload_bytes{0}, wire_messages{0}, wire_bytes{0}, acks_sent{0},
      retransmissions{0}, error_completions{0};
  // Bit v set: some QP entered RTS with that ack timeout / retry count.
  std::atomic<uint64_t> rts_timeouts{0}, rts_retry_cnts{0};
  // Successful ibv_reg_mr calls (those with IBV_ACCESS_ON_DEMAND too), ibv_dereg_mr calls, MRs
  // registered now and the most at once.
  std::atomic<uint64_t> reg_mrs{0}, reg_mrs_on_demand{0}, dereg_mrs{0}, mrs_live{0}, mrs_peak{0};
};
Stats& stats();
void write_stats();

// The wire: fixed frames, a request's payload follows its frame.
enum FrameType : uint32_t {
  kHello = 1,      // a = pid, b = instance, rkey = source qpn, imm = destination qpn
  kWrite = 2,      // psn, raddr, rkey, len (+ payload)
  kWriteImm = 3,   // and imm
  kAck = 4,        // every request up to psn placed
  kNakRnr = 5,     // psn found no receive; a = responder's min_rnr_timer
  kNakAccess = 6,  // psn failed the rkey / bounds / access check
  kNakDead = 7,    // psn was dropped: no such QP, QP in error, wrong source or PSN
};
struct Frame {
  uint32_t type, psn, imm, rkey;
  uint64_t raddr, len;
  uint32_t a, b;
};
static_assert(sizeof(Frame) == 40, "frame layout");

struct Context;
struct Qp;

struct Pd {
  ibv_pd base;
  int refs = 0;  // MRs and QPs on it
};

struct Mr {
  ibv_mr base;
  Pd* pd;
  int access;
  bool on_demand;  // IBV_ACCESS_ON_DEMAND: its pages are looked up at each access
  int busy = 0;    // frames reading or writing its memory right now
};

// A work queue's slots: a WR holds its slot until a completion at or after it is polled, as a
// NIC's queue frees slots when the CQ is read; an unsignaled WR holds its slot until a later
// signaled WR's completion is polled.
struct Slots {
  std::atomic<uint64_t> freed{0};  // WRs (numbered from 0 in posting order) whose slots are free
};
using SlotsRef = std::shared_ptr<Slots>;

struct CqEntry {
  ibv_wc wc;
  SlotsRef slots;  // polling this frees the slots of WRs before upto
  uint64_t upto;
};

struct Cq {
  ibv_cq base;
  std::mutex mu;
  std::deque<CqEntry> entries;
  size_t capacity;
  bool overflowed = false;
  int qp_refs = 0;
};
void cq_push(Cq* cq, const ibv_wc& wc, const SlotsRef& slots, uint64_t upto);

struct SendWr {
  uint64_t wr_id;
  uint64_t seq;  // its number in the send queue's slots
  uint32_t psn;
  bool with_imm;
  bool signaled;
  uint32_t imm;
  uint64_t raddr;
  uint32_t rkey;
  uint64_t len;
  std::vector<ibv_sge> sges;
  std::string inline_data;
  ibv_wc_status fail = IBV_WC_SUCCESS;  // known before sending: completes with this
  int rnr_tries = 0;
  bool sent_once = false;
};

struct Endpoint {  // a context, as a GID names it
  uint32_t pid = 0, instance = 0;
  bool operator==(const Endpoint& o) const { return pid == o.pid && instance == o.instance; }
};

struct Conn;

struct Qp {
  ibv_qp base;
  Pd* pd;
  Cq* scq;
  Cq* rcq;
  bool sig_all;
  ibv_qp_cap cap;
  ibv_qp_attr attr{};  // the attributes set so far; attr.qp_state is the state
  Endpoint remote;
  // Requester.
  std::deque<SendWr> sq;  // posted, not completed, in order
  SlotsRef sq_slots = std::make_shared<Slots>();
  uint64_t sq_posted = 0;
  size_t tx_next = 0;  // sq[tx_next] is the next to put on the wire
  uint32_t next_psn = 0;
  Conn* out = nullptr;
  bool peer_dead = false;
  bool rewind = false;  // go back to sq[0] once the frame on the wire is out
  Clock::time_point rnr_until{};
  bool fail_armed = false;
  Clock::time_point fail_at{};
  ibv_wc_status fail_status = IBV_WC_SUCCESS;
  // Responder.
  struct RecvWr {
    uint64_t wr_id, seq;
  };
  std::deque<RecvWr> rq;  // posted, not consumed
  SlotsRef rq_slots = std::make_shared<Slots>();
  uint64_t rq_posted = 0;
  uint32_t epsn = 0;
  bool rnr_discard = false;  // dropping everything until rnr_psn comes again
  uint32_t rnr_psn = 0;
};

// A stream socket: outgoing (a QP's requests, acks back) or incoming (requests to our QPs).
struct Conn {
  int fd = -1;
  Qp* qp = nullptr;  // outgoing: its owner
  bool outgoing = false;
  bool dead = false;
  // Incoming: who speaks.
  bool hello = false;
  Endpoint src;
  uint32_t src_qpn = 0, dst_qpn = 0;
  // Reading.
  Frame rx{};
  size_t rx_have = 0;      // bytes of rx read
  bool rx_frame = false;   // rx complete, payload (if any) pending
  char* rx_dst = nullptr;  // payload destination, nullptr = discard
  uint64_t rx_left = 0;
  Mr* rx_mr = nullptr;
  bool rx_accepted = false;
  bool rx_place = false;  // the payload goes into rx_dst (else it is read and dropped)
  bool ack_pending = false;
  bool early_told = false;  // complained of a request before RTR
  uint32_t ack_psn = 0;
  // Writing: control bytes, then the payload of the request being sent.
  std::string tx;
  size_t tx_off = 0;
  std::vector<iovec> tx_iov;
  size_t tx_iov_at = 0;
  std::vector<Mr*> tx_busy;
  bool tx_request = false;  // the bytes in flight end a request frame
};

struct Context {
  // Its `context` is the ibv_context callers see; the extended part carries query_device_ex,
  // which verbs.h's inline ibv_query_device_ex calls through it.
  verbs_context ext;
  Endpoint self;
  std::string socket_path;
  int listen_fd = -1;
  int wake_fd = -1;
  std::mutex mu;  // everything below but the async queue
  std::condition_variable mr_idle;
  std::map<uint32_t, Qp*> qps;
  std::map<uint32_t, Mr*> by_lkey, by_rkey;
  std::vector<Conn*> conns;
  std::vector<Pd*> pds;
  std::vector<Cq*> cqs;
  uint32_t next_key = 1;
  bool stop = false;
  bool fatal = false;
  Clock::time_point fatal_at{};
  std::thread progress;
  // Async events.
  std::mutex async_mu;
  std::condition_variable async_cv;
  std::deque<ibv_async_event> events;
  bool closing = false;
  int async_waiters = 0;
};

// `ext` is Context's first member.
inline Context* ctx_of(ibv_context* c) {
  return reinterpret_cast<Context*>(reinterpret_cast<char*>(c) - offsetof(verbs_context, context));
}
inline Qp* qp_of(ibv_qp* q) { return reinterpret_cast<Qp*>(q); }
inline Cq* cq_of(ibv_cq* c) { return reinterpret_cast<Cq*>(c); }

// Every page of [addr, addr + len) is mapped.
bool mapped(const void* addr, size_t len);
void wake(Context* ctx);
void push_async(Context* ctx, const ibv_async_event& ev);
void progress_main(Context* ctx);
// Under ctx->mu.
void qp_to_error(Qp* qp);
void qp_reset(Qp* qp);
void complete_send(Qp* qp, const SendWr& wr, ibv_wc_status status);
void conn_kill(Context* ctx, Conn* c);  // the progress thread closes it later
Context* qp_context(Qp* qp);
void connect_qp(Context* ctx, Qp* qp);
int post_send(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad);
int post_recv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad);
int poll_cq(ibv_cq* cq, int n, ibv_wc* wc);
std::chrono::microseconds transport_timeout(const Qp* qp);
std::chrono::microseconds rnr_delay(uint32_t min_rnr_timer);

// GIDs, as a RoCE port's table has them: indices 0 and 1 link-local,
// fe80:0000:'w''e''m'<index>:<pid, 4 bytes BE>:<instance, 4 bytes BE>; indices 2 and 3
// IPv4-mapped, ::ffff:<pid << 8 | instance, BE> (link-local too if the pid or instance does not
// fit). Each names the same context.
ibv_gid make_gid(const Endpoint& e, int index);
bool parse_gid(const ibv_gid& gid, Endpoint* e);
constexpr int kGidTableLen = 4;
constexpr int kMaxSgeIov = 16;  // the device's max_sge
constexpr uint32_t kPsnMask = 0xffffff;

}  // namespace emu
