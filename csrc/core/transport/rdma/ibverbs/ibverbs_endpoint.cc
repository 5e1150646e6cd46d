// The ibverbs back end: per connection, one completion queue and
// WEFT_IB_QPS_PER_PEER RC queue pairs on the process's device. The two
// sides swap each QP's number and first PSN, their GID, LID and active MTU
// over the control socket (the job's authenticated mesh), and take their
// QPs INIT -> RTR -> RTS. Writes go round-robin over the QPs, each signalled
// and counted against its QP's send queue (a full one: write_with_imm
// returns false); the protocol takes writes landing in any order across
// QPs (rdma_connection.cc). Each QP keeps zero-byte receives posted for the
// peer's immediates (twice its send depth), reposted as they complete.
// Registrations take the device's access flags: with On-Demand Paging
// (ib_device.cc) they follow the mappings, and the registration cache keeps
// them between messages.
#include "core/transport/rdma/ibverbs/ibverbs_endpoint.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/common/config.h"
#include "core/common/deadline.h"
#include "core/common/error.h"
#include "core/common/random_word.h"
#include "core/transport/rdma/ibverbs/ib_device.h"
#include "core/transport/rdma/ibverbs/libibverbs.h"
#include "core/transport/rdma/rdma_wire.h"

namespace weft {
namespace {

constexpr int kSendDepth = 256;                // per QP; twice as many receives
constexpr int kMaxQps = 16;                    // config's bound on WEFT_IB_QPS_PER_PEER
constexpr uint64_t kReceiveId = ~uint64_t{0};  // never a write's id
constexpr uint64_t kGoodbyeId = kReceiveId - 1;
// How long close() waits for its goodbye to land.
constexpr std::chrono::milliseconds kGoodbyeWait{100};
// How long a flushed completion waits for the async event that explains it.
constexpr std::chrono::milliseconds kFlushExplanationWait{100};
constexpr int kPollBatch = 16;

// What each side sends the other, once.
struct WireInfo {
  ibv_gid gid;
  uint32_t qps;
  uint16_t lid;
  uint8_t mtu;  // enum ibv_mtu
  uint8_t ethernet;
  uint32_t qpn[kMaxQps];
  uint32_t psn[kMaxQps];
};

class IbRegion : public MemoryRegion {
 public:
  IbRegion(std::shared_ptr<IbDevice> device, void* base, size_t bytes, ibv_mr* mr)
      : MemoryRegion(base, bytes), device_(std::move(device)), mr_(mr) {}
  ~IbRegion() override { libibverbs().dereg_mr(mr_); }
  uint64_t remote_address(const void* p) const override { return reinterpret_cast<uintptr_t>(p); }
  uint64_t remote_key() const override { return mr_->rkey; }
  void* local_descriptor() const override { return mr_; }

 private:
  std::shared_ptr<IbDevice> device_;  // its PD outlives the registration
  ibv_mr* mr_;
};

class IbEndpoint : public RdmaEndpoint {
 public:
  explicit IbEndpoint(std::shared_ptr<IbDevice> device) : device_(std::move(device)) {}

  ~IbEndpoint() override {
    const Libibverbs& lib = libibverbs();
    for (ibv_qp* qp : qps_) {
      device_->faults().forget(qp);
      lib.destroy_qp(qp);
    }
    if (cq_) {
      device_->faults().forget(cq_);
      lib.destroy_cq(cq_);
    }
  }

  // The CQ and the QPs (in RESET); the destructor frees what was made.
  void open() {
    const Libibverbs& lib = libibverbs();
    const ibv_device_attr& attr = device_->device_attr();
    const int qps = config().ib_qps_per_peer;
    // Every posted send and receive fits in the CQ: it never overflows.
    send_depth_ = std::min({kSendDepth, attr.max_qp_wr / 2, attr.max_cqe / (3 * qps)});
    receive_depth_ = 2 * send_depth_;
    if (send_depth_ < 1) fail_setup("the device's queue limits");
    const int cqe = qps * (send_depth_ + receive_depth_);
    cq_ = lib.create_cq(device_->context(), cqe, nullptr, nullptr, 0);
    if (!cq_) fail_setup("ibv_create_cq of " + std::to_string(cqe) + " entries");
    for (int i = 0; i < qps; ++i) {
      ibv_qp_init_attr init{};
      init.send_cq = cq_;
      init.recv_cq = cq_;
      init.qp_type = IBV_QPT_RC;
      init.cap.max_send_wr = send_depth_;
      init.cap.max_recv_wr = receive_depth_;
      init.cap.max_send_sge = 1;
      init.cap.max_recv_sge = 1;
      ibv_qp* qp = lib.create_qp(device_->pd(), &init);
      if (!qp) fail_setup("ibv_create_qp");
      qps_.push_back(qp);
      objects_.push_back(qp);
      outstanding_.push_back(0);
    }
    objects_.push_back(cq_);
  }

  void connect(Socket& control, double timeout_s) {
    open();
    WireInfo mine{};
    mine.gid = device_->gid();
    mine.qps = static_cast<uint32_t>(qps_.size());
    mine.lid = device_->port_attr().lid;
    mine.mtu = static_cast<uint8_t>(device_->port_attr().active_mtu);
    mine.ethernet = device_->ethernet();
    for (size_t i = 0; i < qps_.size(); ++i) {
      mine.qpn[i] = qps_[i]->qp_num;
      mine.psn[i] = random_word() & 0xffffff;
      to_init(qps_[i]);
    }
    WireInfo theirs{};
    const Deadline deadline(timeout_s);
    control.send_all(&mine, sizeof(mine), deadline, "ibverbs queue pairs");
    control.recv_all(&theirs, sizeof(theirs), deadline, "ibverbs queue pairs of the peer");
    if (theirs.qps != mine.qps) {
      throw InvalidArgument("WEFT_IB_QPS_PER_PEER: the peer has " + std::to_string(theirs.qps) +
                            " queue pairs per peer, this rank " + std::to_string(mine.qps) +
                            "; set the same value on every rank");
    }
    if (theirs.ethernet != mine.ethernet) {
      throw InvalidArgument("WEFT_TRANSPORT=ibverbs: this rank's port (" + device_->name() +
                            ") is " + (mine.ethernet ? "Ethernet" : "InfiniBand") +
                            ", the peer's is not; choose ports of one fabric with WEFT_IB_HCA");
    }
    const auto mtu = static_cast<ibv_mtu>(std::min(mine.mtu, theirs.mtu));
    for (size_t i = 0; i < qps_.size(); ++i) {
      to_rtr(qps_[i], theirs, i, mtu);
      to_rts(qps_[i], mine.psn[i]);
      for (int r = 0; r < receive_depth_; ++r) post_receive(qps_[i]);
    }
  }

  std::unique_ptr<MemoryRegion> register_memory(void* base, size_t bytes) override {
    ibv_mr* mr = libibverbs().reg_mr(device_->pd(), base, bytes, device_->mr_access());
    if (!mr) {
      throw Error(
          "ibverbs " + device_->name() + ": ibv_reg_mr of " + std::to_string(bytes) +
          " bytes failed: " + std::strerror(errno) +
          (device_->odp() ? "" : " (the locked-memory limit, `ulimit -l`, may be too low)"));
    }
    return std::make_unique<IbRegion>(device_, base, bytes, mr);
  }

  bool needs_local_registration() const override { return true; }
  bool registrations_follow_mappings() const override { return device_->odp(); }

  // Every write is signaled: an unsignaled one would hold its send-queue
  // entry until a later signaled write completes.
  bool write_with_imm(const void* src, size_t bytes, const MemoryRegion* local,
                      uint64_t remote_address, uint64_t remote_key, uint32_t imm, uint64_t id,
                      bool /*local_completion*/) override {
    check_faults();
    size_t at = next_qp_;
    for (size_t tried = 0; outstanding_[at] >= send_depth_; at = (at + 1) % qps_.size()) {
      if (++tried > qps_.size()) return false;
    }
    next_qp_ = (at + 1) % qps_.size();
    ibv_sge sge{};
    sge.addr = reinterpret_cast<uintptr_t>(src);
    sge.length = static_cast<uint32_t>(bytes);
    sge.lkey = local ? static_cast<ibv_mr*>(local->local_descriptor())->lkey : 0;
    ibv_send_wr wr{};
    wr.wr_id = id;
    wr.sg_list = bytes > 0 ? &sge : nullptr;
    wr.num_sge = bytes > 0 ? 1 : 0;
    wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.imm_data = htonl(imm);
    wr.wr.rdma.remote_addr = remote_address;
    wr.wr.rdma.rkey = static_cast<uint32_t>(remote_key);
    ibv_send_wr* bad = nullptr;
    const int ret = ibv_post_send(qps_[at], &wr, &bad);
    if (ret == ENOMEM) return false;
    if (ret != 0) throw PeerError(name() + ": ibv_post_send failed: " + std::strerror(ret));
    ++outstanding_[at];
    return true;
  }

  int poll(Completion* out, int max) override {
    check_faults();
    ibv_wc wc[kPollBatch];
    const int n = ibv_poll_cq(cq_, std::min(max, kPollBatch), wc);
    if (n < 0) throw PeerError(name() + ": ibv_poll_cq failed (" + std::to_string(n) + ")");
    int got = 0;
    for (int i = 0; i < n; ++i) {
      const ibv_wc& c = wc[i];
      const size_t qp = qp_index(c.qp_num);
      if (c.status != IBV_WC_SUCCESS) completion_error(c);
      if (c.wr_id == kReceiveId) {
        const uint32_t imm = ntohl(c.imm_data);
        if (imm == rdma_wire::kClosingImmediate) {
          peer_closed_ = true;
          continue;
        }
        out[got++] = Completion{Completion::Kind::Remote, 0, imm};
        post_receive(qps_[qp]);
      } else if (c.wr_id != kGoodbyeId) {
        --outstanding_[qp];
        out[got++] = Completion{Completion::Kind::Local, c.wr_id, 0};
      }
    }
    return got;
  }

  std::string closed_by_peer() override {
    check_faults();
    return peer_closed_ ? name() + ": the peer closed the connection" : "";
  }

  void close() override {
    if (closed_) return;
    closed_ = true;
    say_goodbye();
    // Into the error state: nothing lands in our memory any more, and the
    // peer's writes fail.
    for (ibv_qp* qp : qps_) {
      ibv_qp_attr attr{};
      attr.qp_state = IBV_QPS_ERR;
      libibverbs().modify_qp(qp, &attr, IBV_QP_STATE);
    }
  }

  size_t max_write_bytes() const override { return device_->port_attr().max_msg_sz; }
  std::string name() const override { return "ibverbs/" + device_->name(); }

 private:
  // RC has no disconnect event: an empty write with kClosingImmediate tells
  // the peer, which would otherwise notice only when it next writes. Waits
  // (briefly) until it landed, since the error state that follows discards
  // what has not gone out.
  // A peer that closed first is not told (its QPs are gone: the write would
  // wait for its retries).
  void say_goodbye() {
    if (qps_.empty() || outstanding_[0] >= send_depth_ || goodbye_came()) return;
    ibv_send_wr wr{};
    wr.wr_id = kGoodbyeId;
    wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.imm_data = htonl(rdma_wire::kClosingImmediate);
    ibv_send_wr* bad = nullptr;
    if (ibv_post_send(qps_[0], &wr, &bad) != 0) return;
    const auto until = std::chrono::steady_clock::now() + kGoodbyeWait;
    ibv_wc wc[kPollBatch];
    while (std::chrono::steady_clock::now() < until) {
      const int n = ibv_poll_cq(cq_, kPollBatch, wc);
      if (n < 0) return;
      for (int i = 0; i < n; ++i) {
        if (wc[i].wr_id == kGoodbyeId) return;
      }
    }
  }

  // Whether the peer's goodbye has come (now or before), reading what the
  // CQ holds: the connection is closing, nobody else wants it.
  bool goodbye_came() {
    ibv_wc wc[kPollBatch];
    for (int n; !peer_closed_ && (n = ibv_poll_cq(cq_, kPollBatch, wc)) > 0;) {
      for (int i = 0; i < n; ++i) {
        const ibv_wc& c = wc[i];
        if (c.status == IBV_WC_SUCCESS && c.wr_id == kReceiveId &&
            ntohl(c.imm_data) == rdma_wire::kClosingImmediate) {
          peer_closed_ = true;
        }
      }
    }
    return peer_closed_;
  }

  [[noreturn]] void fail_setup(const std::string& what) {
    throw Error("ibverbs " + device_->name() + ": " + what + " failed: " + std::strerror(errno));
  }

  void modify(ibv_qp* qp, ibv_qp_attr& attr, int mask, const char* state) {
    const int ret = libibverbs().modify_qp(qp, &attr, mask);
    if (ret != 0) {
      throw PeerError(name() + ": ibv_modify_qp to " + state + " failed: " + std::strerror(ret));
    }
  }

  void to_init(ibv_qp* qp) {
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_INIT;
    attr.pkey_index = 0;
    attr.port_num = device_->port();
    attr.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    modify(qp, attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, "INIT");
  }

  void to_rtr(ibv_qp* qp, const WireInfo& peer, size_t i, ibv_mtu mtu) {
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_RTR;
    attr.path_mtu = mtu;
    attr.dest_qp_num = peer.qpn[i];
    attr.rq_psn = peer.psn[i];
    attr.max_dest_rd_atomic = 1;
    attr.min_rnr_timer = 12;
    attr.ah_attr.port_num = device_->port();
    if (device_->ethernet()) {
      attr.ah_attr.is_global = 1;
      attr.ah_attr.grh.dgid = peer.gid;
      attr.ah_attr.grh.sgid_index = static_cast<uint8_t>(device_->gid_index());
      attr.ah_attr.grh.hop_limit = 255;
    } else {
      attr.ah_attr.dlid = peer.lid;
    }
    modify(qp, attr,
           IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
               IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
           "RTR");
  }

  void to_rts(ibv_qp* qp, uint32_t psn) {
    const Config& cfg = config();
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_RTS;
    attr.timeout = static_cast<uint8_t>(cfg.ib_timeout);
    attr.retry_cnt = static_cast<uint8_t>(cfg.ib_retry_cnt);
    attr.rnr_retry = 7;  // a receiver out of posted receives: retry for ever
    attr.sq_psn = psn;
    attr.max_rd_atomic = 1;
    modify(qp, attr,
           IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
               IBV_QP_MAX_QP_RD_ATOMIC,
           "RTS");
  }

  void post_receive(ibv_qp* qp) {
    ibv_recv_wr wr{};
    wr.wr_id = kReceiveId;
    ibv_recv_wr* bad = nullptr;
    const int ret = ibv_post_recv(qp, &wr, &bad);
    if (ret != 0) throw PeerError(name() + ": ibv_post_recv failed: " + std::strerror(ret));
  }

  size_t qp_index(uint32_t qp_num) const {
    for (size_t i = 0; i < qps_.size(); ++i) {
      if (qps_[i]->qp_num == qp_num) return i;
    }
    throw PeerError(name() + ": a completion of QP " + std::to_string(qp_num) +
                    ", which is not this connection's");
  }

  [[noreturn]] void completion_error(const ibv_wc& c) {
    if (c.status == IBV_WC_WR_FLUSH_ERR) explain_flush();
    const char* what = c.wr_id == kReceiveId ? "a receive for the peer's writes" : "a write";
    throw PeerError(name() + ": " + what + " failed: " + libibverbs().wc_status_str(c.status) +
                    " (status " + std::to_string(c.status) + ", vendor error " +
                    std::to_string(c.vendor_err) + ", QP " + std::to_string(c.qp_num) + ")");
  }

  // A flushed work request only says that its QP went to the error state;
  // why (a fatal device or QP event) comes on the async-event thread, which
  // may see it a moment after this thread polled the flush. Wait for it
  // briefly and name it.
  void explain_flush() {
    const auto until = std::chrono::steady_clock::now() + kFlushExplanationWait;
    while (std::chrono::steady_clock::now() < until) {
      const std::string why = device_->faults().failure(objects_);
      if (!why.empty()) throw PeerError(why);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  // What the async-event thread found, for this endpoint: checked only when
  // it found something new.
  void check_faults() {
    IbFaults& faults = device_->faults();
    const uint64_t version = faults.version();
    if (version == faults_seen_) return;
    const std::string why = faults.failure(objects_);
    if (!why.empty()) throw PeerError(why);
    faults_seen_ = version;
  }

  std::shared_ptr<IbDevice> device_;
  ibv_cq* cq_ = nullptr;
  std::vector<ibv_qp*> qps_;
  std::vector<const void*> objects_;  // qps_ and cq_, as the faults name them
  std::vector<int> outstanding_;      // per QP: signalled writes not yet completed
  size_t next_qp_ = 0;
  int send_depth_ = 0, receive_depth_ = 0;
  uint64_t faults_seen_ = 0;
  bool closed_ = false, peer_closed_ = false;
};

}  // namespace

std::unique_ptr<RdmaEndpoint> connect_ibverbs_endpoint(Socket& control, int rank,
                                                       double timeout_s) {
  auto endpoint = std::make_unique<IbEndpoint>(IbDevice::shared(rank));
  endpoint->connect(control, timeout_s);
  return endpoint;
}

}  // namespace weft
