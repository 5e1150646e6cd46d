// The data path: post_send / post_recv / poll_cq (the context's ops table), and the progress
// thread of each context that carries RC traffic between processes over Unix stream sockets.
//
// Each QP in RTR opens one stream to the context its dgid names; its requests (a frame, then the
// payload read from the local MRs) go out on it, the responder's ACK / NAK frames come back on
// it. The responder places the payload straight into the target MR, then (write-with-imm)
// consumes a posted receive, then acknowledges: so the data is in memory before the receive
// completion, and a send completes only once the peer has placed it. Go-back-N after an RNR NAK
// keeps every QP's requests in order.
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>

#include "emu.h"

namespace emu {
namespace {

constexpr size_t kBudget = 4 << 20;  // bytes moved on one stream before serving the others
std::atomic<long> g_signaled_writes{0};

enum class Step { kDone, kWait, kFailed };

void set_buffers(int fd) {
  const int size = 4 << 20;
  ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof size);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof size);
}

bool tx_pending(const Conn* c) {
  return c->tx_off < c->tx.size() || c->tx_iov_at < c->tx_iov.size();
}

void release(Context* ctx, Mr* mr) {
  if (--mr->busy == 0) ctx->mr_idle.notify_all();
}

// Writes what is pending on c without blocking.
Step write_some(Conn* c) {
  while (tx_pending(c)) {
    iovec iov[kMaxSgeIov + 1];
    int n = 0;
    if (c->tx_off < c->tx.size()) iov[n++] = {&c->tx[c->tx_off], c->tx.size() - c->tx_off};
    for (size_t i = c->tx_iov_at; i < c->tx_iov.size() && n < kMaxSgeIov + 1; ++i)
      iov[n++] = c->tx_iov[i];
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(n);
    const ssize_t w = ::sendmsg(c->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno == EAGAIN || errno == EWOULDBLOCK ? Step::kWait : Step::kFailed;
    }
    size_t left = static_cast<size_t>(w);
    const size_t ctl = std::min(left, c->tx.size() - c->tx_off);
    c->tx_off += ctl;
    left -= ctl;
    while (left > 0) {
      iovec& v = c->tx_iov[c->tx_iov_at];
      const size_t take = std::min(left, v.iov_len);
      v.iov_base = static_cast<char*>(v.iov_base) + take;
      v.iov_len -= take;
      left -= take;
      if (v.iov_len == 0) ++c->tx_iov_at;
    }
    while (c->tx_iov_at < c->tx_iov.size() && c->tx_iov[c->tx_iov_at].iov_len == 0) ++c->tx_iov_at;
  }
  c->tx.clear();
  c->tx_off = 0;
  c->tx_iov.clear();
  c->tx_iov_at = 0;
  return Step::kDone;
}

// Reads up to len bytes; kWait on EAGAIN, kFailed on EOF or error.
Step read_some(Conn* c, void* dst, size_t len, size_t* got) {
  for (;;) {
    const ssize_t r = ::recv(c->fd, dst, len, MSG_DONTWAIT);
    if (r > 0) {
      *got = static_cast<size_t>(r);
      return Step::kDone;
    }
    if (r == 0) return Step::kFailed;
    if (errno == EINTR) continue;
    return errno == EAGAIN || errno == EWOULDBLOCK ? Step::kWait : Step::kFailed;
  }
}

void queue_frame(Conn* c, const Frame& f) {
  c->tx.append(reinterpret_cast<const char*>(&f), sizeof f);
  stats().wire_messages++;
  stats().wire_bytes += sizeof f;
}

void complete_recv(Qp* qp, const Qp::RecvWr& wr, ibv_wc_status status, uint32_t len, uint32_t imm) {
  ibv_wc wc{};
  wc.wr_id = wr.wr_id;
  wc.status = status;
  wc.opcode = status == IBV_WC_SUCCESS ? IBV_WC_RECV_RDMA_WITH_IMM : IBV_WC_RECV;
  wc.vendor_err = status == IBV_WC_SUCCESS ? 0 : 0x81;
  wc.byte_len = len;
  wc.imm_data = imm;
  wc.qp_num = qp->base.qp_num;
  wc.src_qp = qp->attr.dest_qp_num;
  wc.wc_flags = status == IBV_WC_SUCCESS ? IBV_WC_WITH_IMM : 0;
  cq_push(qp->rcq, wc, qp->rq_slots, wr.seq + 1);
}

// The oldest WR completes with status (error completions ignore signaling); the rest flush.
void qp_fail(Qp* qp, ibv_wc_status status) {
  if (!qp->sq.empty()) {
    complete_send(qp, qp->sq.front(), status);
    qp->sq.pop_front();
  }
  qp_to_error(qp);
}

void arm_failure(Qp* qp, ibv_wc_status status, Clock::time_point at) {
  if (qp->fail_armed) return;
  qp->fail_armed = true;
  qp->fail_status = status;
  qp->fail_at = at;
}

// Requests up to psn (inclusive or not) were placed by the responder.
void ack_through(Qp* qp, uint32_t psn, bool inclusive) {
  while (!qp->sq.empty() && qp->tx_next > 0) {
    const uint32_t d = (psn - qp->sq.front().psn) & kPsnMask;
    if (d >= 0x800000 || (!inclusive && d == 0)) break;
    complete_send(qp, qp->sq.front(), IBV_WC_SUCCESS);
    qp->sq.pop_front();
    --qp->tx_next;
  }
}

void handle_response(Qp* qp, Conn* c, const Frame& f) {
  if (qp->attr.qp_state != IBV_QPS_RTS) return;
  switch (f.type) {
    case kAck: ack_through(qp, f.psn, true); break;
    case kNakRnr: {
      ack_through(qp, f.psn, false);
      stats().rnr_naks_received++;
      if (qp->sq.empty() || qp->sq.front().psn != f.psn) {
        complain("QP %u: RNR NAK for psn %u that is not outstanding", qp->base.qp_num, f.psn);
        return;
      }
      SendWr& wr = qp->sq.front();
      if (qp->attr.rnr_retry != 7 && ++wr.rnr_tries > qp->attr.rnr_retry) {
        qp_fail(qp, IBV_WC_RNR_RETRY_EXC_ERR);
        return;
      }
      qp->rnr_until = Clock::now() + rnr_delay(f.a);
      if (c->tx_request)
        qp->rewind = true;
      else
        qp->tx_next = 0;
      break;
    }
    case kNakAccess:
      ack_through(qp, f.psn, false);
      qp_fail(qp, IBV_WC_REM_ACCESS_ERR);
      break;
    case kNakDead:
      ack_through(qp, f.psn, false);
      arm_failure(qp, IBV_WC_RETRY_EXC_ERR, Clock::now() + transport_timeout(qp));
      break;
    default:
      complain("QP %u: unknown response frame %u from the peer", qp->base.qp_num, f.type);
      conn_kill(qp_context(qp), c);
      qp->peer_dead = true;
  }
}

// qp has a request it could put on the wire now.
bool wants_tx(const Qp* qp, Clock::time_point now) {
  return qp->attr.qp_state == IBV_QPS_RTS && !qp->fail_armed && now >= qp->rnr_until &&
         qp->tx_next < qp->sq.size();
}

// Puts the next frames of qp's send queue on its stream.
void pump_tx(Context* ctx, Qp* qp) {
  const Clock::time_point now = Clock::now();
  uint64_t budget = kBudget;
  while (Conn* c = qp->out) {
    if (tx_pending(c)) {
      const Step s = write_some(c);
      if (s == Step::kWait) return;
      if (s == Step::kFailed) {
        conn_kill(ctx, c);
        qp->peer_dead = true;
        return;
      }
      for (Mr* mr : c->tx_busy) release(ctx, mr);
      c->tx_busy.clear();
      if (c->tx_request) {
        c->tx_request = false;
        ++qp->tx_next;
        if (qp->rewind) {
          qp->rewind = false;
          qp->tx_next = 0;
        }
      }
      continue;
    }
    if (!wants_tx(qp, now) || budget == 0) return;  // out of budget: POLLOUT brings it back
    SendWr& wr = qp->sq[qp->tx_next];
    if (wr.fail != IBV_WC_SUCCESS) {
      if (qp->tx_next == 0)
        arm_failure(qp, wr.fail,
                    wr.fail == IBV_WC_RETRY_EXC_ERR ? now + transport_timeout(qp) : now);
      return;
    }
    std::vector<Mr*> mrs;
    for (const ibv_sge& s : wr.sges) {
      auto it = ctx->by_lkey.find(s.lkey);
      if (it == ctx->by_lkey.end()) break;  // deregistered since the post
      // An On-Demand Paging MR's pages are looked up now: unmapped, the read fails.
      if (it->second->on_demand && !mapped(reinterpret_cast<void*>(s.addr), s.length)) break;
      mrs.push_back(it->second);
    }
    if (wr.inline_data.empty() && mrs.size() != wr.sges.size()) {
      wr.fail = IBV_WC_LOC_PROT_ERR;
      continue;
    }
    Frame f{};
    f.type = wr.with_imm ? kWriteImm : kWrite;
    f.psn = wr.psn;
    f.imm = wr.imm;
    f.rkey = wr.rkey;
    f.raddr = wr.raddr;
    f.len = wr.len;
    queue_frame(c, f);
    stats().wire_bytes += wr.len;
    budget -= std::min<uint64_t>(budget, sizeof f + wr.len);
    if (!wr.inline_data.empty()) {
      c->tx_iov.push_back({&wr.inline_data[0], wr.inline_data.size()});
    } else {
      for (const ibv_sge& s : wr.sges)
        if (s.length) c->tx_iov.push_back({reinterpret_cast<void*>(s.addr), s.length});
      for (Mr* mr : mrs) ++mr->busy;
      c->tx_busy = std::move(mrs);
    }
    c->tx_request = true;
    if (wr.sent_once) stats().retransmissions++;
    wr.sent_once = true;
  }
}

// Timers and the send queue of one QP.
void advance(Context* ctx, Qp* qp, Clock::time_point now) {
  if (qp->attr.qp_state != IBV_QPS_RTS) return;
  if (qp->fail_armed && now >= qp->fail_at) {
    qp_fail(qp, qp->fail_status);
    return;
  }
  if (!qp->out) {
    if (!qp->sq.empty()) arm_failure(qp, IBV_WC_RETRY_EXC_ERR, now + transport_timeout(qp));
    return;
  }
  pump_tx(ctx, qp);
}

void respond(Conn* c, uint32_t type, uint32_t psn, uint32_t a = 0) {
  if (c->ack_pending) {
    Frame ack{};
    ack.type = kAck;
    ack.psn = c->ack_psn;
    queue_frame(c, ack);
    stats().acks_sent++;
    c->ack_pending = false;
  }
  if (type == kAck) return;
  Frame f{};
  f.type = type;
  f.psn = psn;
  f.a = a;
  queue_frame(c, f);
}

Qp* find_qp(Context* ctx, uint32_t qpn) {
  auto it = ctx->qps.find(qpn);
  return it == ctx->qps.end() ? nullptr : it->second;
}

// Decides what becomes of the request in c->rx: placed, refused, or (QP not ready) later.
bool accept_request(Context* ctx, Conn* c) {
  const Frame& f = c->rx;
  Qp* qp = find_qp(ctx, c->dst_qpn);
  c->rx_dst = nullptr;
  c->rx_left = f.len;
  c->rx_accepted = true;
  c->rx_place = false;
  if (!qp) {
    respond(c, kNakDead, f.psn);
    return true;
  }
  const ibv_qp_state state = qp->attr.qp_state;
  if (state == IBV_QPS_RESET || state == IBV_QPS_INIT) {  // a QP not yet in RTR: later
    if (!c->early_told)
      complain(
          "QP %u: a request came before the QP reached RTR; held here, but a NIC drops "
          "it and the sender resends after its transport timeout (seconds)",
          qp->base.qp_num);
    c->early_told = true;
    c->rx_accepted = false;
    return false;
  }
  if (state == IBV_QPS_ERR) {
    respond(c, kNakDead, f.psn);
    return true;
  }
  if (!(qp->remote == c->src) || qp->attr.dest_qp_num != c->src_qpn) {
    complain("QP %u: request from QP %u of %u.%u, connected to QP %u of %u.%u: dropped",
             qp->base.qp_num, c->src_qpn, c->src.pid, c->src.instance, qp->attr.dest_qp_num,
             qp->remote.pid, qp->remote.instance);
    respond(c, kNakDead, f.psn);
    return true;
  }
  if (qp->rnr_discard) {
    if (f.psn != qp->rnr_psn) return true;  // dropped: resent after the RNR wait
    qp->rnr_discard = false;
  }
  if (f.psn != qp->epsn) {
    complain("QP %u: request psn %u, expected %u (sq_psn / rq_psn exchanged wrong?): dropped",
             qp->base.qp_num, f.psn, qp->epsn);
    respond(c, kNakDead, f.psn);
    return true;
  }
  Mr* mr = nullptr;
  if (f.len > 0) {
    auto it = ctx->by_rkey.find(f.rkey);
    mr = it == ctx->by_rkey.end() ? nullptr : it->second;
    const uint64_t start = mr ? reinterpret_cast<uintptr_t>(mr->base.addr) : 0;
    const bool ok = mr && mr->pd == qp->pd && (mr->access & IBV_ACCESS_REMOTE_WRITE) &&
                    (qp->attr.qp_access_flags & IBV_ACCESS_REMOTE_WRITE) && f.raddr >= start &&
                    f.len <= mr->base.length && f.raddr - start <= mr->base.length - f.len &&
                    (!mr->on_demand || mapped(reinterpret_cast<void*>(f.raddr), f.len));
    if (!ok) {
      respond(c, kNakAccess, f.psn);
      qp_to_error(qp);
      return true;
    }
  }
  if (f.type == kWriteImm && (qp->rq.empty() || config().rnr)) {
    respond(c, kNakRnr, f.psn, qp->attr.min_rnr_timer);
    stats().rnr_naks_sent++;
    qp->rnr_discard = true;
    qp->rnr_psn = f.psn;
    return true;
  }
  c->rx_place = true;
  c->rx_dst = reinterpret_cast<char*>(f.raddr);
  if (mr) {
    c->rx_mr = mr;
    ++mr->busy;
  }
  return true;
}

void finish_request(Context* ctx, Conn* c) {
  const Frame& f = c->rx;
  if (c->rx_mr) {
    release(ctx, c->rx_mr);
    c->rx_mr = nullptr;
  }
  if (c->rx_place) {
    Qp* qp = find_qp(ctx, c->dst_qpn);
    const bool live = qp && (qp->attr.qp_state == IBV_QPS_RTR || qp->attr.qp_state == IBV_QPS_RTS);
    if (!live || (f.type == kWriteImm && qp->rq.empty())) {
      respond(c, kNakDead, f.psn);
    } else {
      qp->epsn = (qp->epsn + 1) & kPsnMask;
      if (f.type == kWriteImm) {
        complete_recv(qp, qp->rq.front(), IBV_WC_SUCCESS, static_cast<uint32_t>(f.len), f.imm);
        qp->rq.pop_front();
        stats().receives_consumed++;
      }
      c->ack_pending = true;
      c->ack_psn = f.psn;
    }
  }
  c->rx_frame = false;
  c->rx_have = 0;
  c->rx_accepted = false;
  c->rx_place = false;
}

void flush_responses(Context* ctx, Conn* c) {
  if (c->ack_pending) respond(c, kAck, 0);
  if (write_some(c) == Step::kFailed) conn_kill(ctx, c);
}

// Reads requests from an incoming stream (or responses on a QP's own stream).
void pump_rx(Context* ctx, Conn* c) {
  static thread_local char scratch[1 << 16];
  size_t budget = kBudget;
  while (!c->dead && budget > 0) {
    if (c->rx_frame) {
      if (!c->rx_accepted && !accept_request(ctx, c)) break;
      if (c->rx_left > 0) {
        const size_t want = c->rx_dst ? std::min<uint64_t>(c->rx_left, budget)
                                      : std::min<uint64_t>(c->rx_left, sizeof scratch);
        size_t got = 0;
        const Step s = read_some(c, c->rx_dst ? c->rx_dst : scratch, want, &got);
        if (s == Step::kWait) break;
        if (s == Step::kFailed) {
          conn_kill(ctx, c);
          break;
        }
        if (c->rx_dst) c->rx_dst += got;
        c->rx_left -= got;
        budget -= std::min(budget, got);
        if (c->rx_left > 0) continue;
      }
      finish_request(ctx, c);
      continue;
    }
    size_t got = 0;
    const Step s =
        read_some(c, reinterpret_cast<char*>(&c->rx) + c->rx_have, sizeof c->rx - c->rx_have, &got);
    if (s == Step::kWait) break;
    if (s == Step::kFailed) {
      if (c->outgoing && c->qp) c->qp->peer_dead = true;
      conn_kill(ctx, c);
      break;
    }
    c->rx_have += got;
    if (c->rx_have < sizeof c->rx) continue;
    c->rx_have = 0;
    if (c->outgoing) {
      if (c->qp) handle_response(c->qp, c, c->rx);
      continue;
    }
    if (!c->hello) {
      if (c->rx.type != kHello) {
        complain("a stream began without a hello: closed");
        conn_kill(ctx, c);
        break;
      }
      c->hello = true;
      c->src = {c->rx.a, c->rx.b};
      c->src_qpn = c->rx.rkey;
      c->dst_qpn = c->rx.imm;
      continue;
    }
    if (c->rx.type != kWrite && c->rx.type != kWriteImm) {
      complain("unknown request frame %u: stream closed", c->rx.type);
      conn_kill(ctx, c);
      break;
    }
    c->rx_frame = true;
    c->rx_accepted = false;
  }
  if (!c->dead && !c->outgoing) flush_responses(ctx, c);
}

void accept_all(Context* ctx) {
  for (;;) {
    const int fd = ::accept4(ctx->listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    set_buffers(fd);
    auto* c = new Conn;
    c->fd = fd;
    ctx->conns.push_back(c);
  }
}

void sweep(Context* ctx) {
  auto& v = ctx->conns;
  for (size_t i = 0; i < v.size();) {
    if (v[i]->dead) {
      ::close(v[i]->fd);
      delete v[i];
      v[i] = v.back();
      v.pop_back();
    } else {
      ++i;
    }
  }
}

// The injected fatal event, once its time has come: a QP event takes the
// first QP in RTS to ERR (waiting for one), a port or device event every QP
// (a NIC whose port went down would fail them by retries, later).
void inject_fatal_event(Context* ctx, Clock::time_point now) {
  ibv_async_event ev{};
  ev.event_type = config().fatal_event;
  const char* what = ibv_event_type_str(ev.event_type);
  if (ev.event_type == IBV_EVENT_QP_FATAL || ev.event_type == IBV_EVENT_QP_REQ_ERR ||
      ev.event_type == IBV_EVENT_QP_ACCESS_ERR) {
    Qp* hit = nullptr;
    for (auto& [qpn, qp] : ctx->qps) {
      if (qp->attr.qp_state == IBV_QPS_RTS) {
        hit = qp;
        break;
      }
    }
    if (hit == nullptr) {
      ctx->fatal_at = now + std::chrono::milliseconds(10);
      return;
    }
    complain("injected %s on QP %u", what, hit->base.qp_num);
    qp_to_error(hit);
    ev.element.qp = &hit->base;
  } else {
    complain("injected %s", what);
    for (auto& [qpn, qp] : ctx->qps) qp_to_error(qp);
    ev.element.port_num = 1;  // read only for a port event
  }
  ctx->fatal = true;
  push_async(ctx, ev);
}

Clock::time_point next_deadline(Context* ctx, Clock::time_point now) {
  Clock::time_point t = Clock::time_point::max();
  for (auto& [qpn, qp] : ctx->qps) {
    if (qp->fail_armed) t = std::min(t, qp->fail_at);
    if (qp->rnr_until > now && !qp->sq.empty()) t = std::min(t, qp->rnr_until);
  }
  if (config().fatal_ms >= 0 && !ctx->fatal) t = std::min(t, ctx->fatal_at);
  return t;
}

}  // namespace

Context* qp_context(Qp* qp) { return ctx_of(qp->base.context); }

void wake(Context* ctx) {
  const uint64_t one = 1;
  if (::write(ctx->wake_fd, &one, sizeof one) < 0 && errno != EAGAIN)
    complain("wake: %s", std::strerror(errno));
}

void cq_push(Cq* cq, const ibv_wc& wc, const SlotsRef& slots, uint64_t upto) {
  if (wc.status != IBV_WC_SUCCESS) stats().error_completions++;
  {
    std::lock_guard<std::mutex> lk(cq->mu);
    if (cq->overflowed) return;
    if (cq->entries.size() < cq->capacity) {
      cq->entries.push_back({wc, slots, upto});
      return;
    }
    cq->overflowed = true;
  }
  complain("CQ overflow: %zu completions unpolled; IBV_EVENT_CQ_ERR, later completions lost",
           cq->capacity);
  ibv_async_event ev{};
  ev.event_type = IBV_EVENT_CQ_ERR;
  ev.element.cq = &cq->base;
  push_async(ctx_of(cq->base.context), ev);
}

void complete_send(Qp* qp, const SendWr& wr, ibv_wc_status status) {
  if (status == IBV_WC_SUCCESS && !wr.signaled) return;
  ibv_wc wc{};
  wc.wr_id = wr.wr_id;
  wc.status = status;
  wc.opcode = IBV_WC_RDMA_WRITE;
  wc.vendor_err = status == IBV_WC_SUCCESS ? 0 : 0x81;
  wc.byte_len = static_cast<uint32_t>(wr.len);
  wc.qp_num = qp->base.qp_num;
  cq_push(qp->scq, wc, qp->sq_slots, wr.seq + 1);
}

void conn_kill(Context* ctx, Conn* c) {
  if (c->dead) return;
  c->dead = true;
  for (Mr* mr : c->tx_busy) release(ctx, mr);
  c->tx_busy.clear();
  if (c->rx_mr) release(ctx, c->rx_mr);
  c->rx_mr = nullptr;
  if (c->qp && c->qp->out == c) c->qp->out = nullptr;
  c->qp = nullptr;
  wake(ctx);  // the progress thread closes the socket
}

void qp_to_error(Qp* qp) {
  Context* ctx = qp_context(qp);
  if (qp->out) conn_kill(ctx, qp->out);
  qp->attr.qp_state = IBV_QPS_ERR;
  qp->base.state = IBV_QPS_ERR;
  for (const SendWr& wr : qp->sq) complete_send(qp, wr, IBV_WC_WR_FLUSH_ERR);
  qp->sq.clear();
  qp->tx_next = 0;
  for (const Qp::RecvWr& wr : qp->rq) complete_recv(qp, wr, IBV_WC_WR_FLUSH_ERR, 0, 0);
  qp->rq.clear();
  qp->fail_armed = false;
  qp->rewind = false;
}

void qp_reset(Qp* qp) {
  if (qp->out) conn_kill(qp_context(qp), qp->out);
  const ibv_qp_cap cap = qp->cap;
  qp->attr = ibv_qp_attr{};
  qp->attr.cap = cap;
  qp->attr.qp_state = IBV_QPS_RESET;
  qp->base.state = IBV_QPS_RESET;
  qp->remote = {};
  qp->sq.clear();
  qp->rq.clear();
  qp->sq_slots = std::make_shared<Slots>();
  qp->rq_slots = std::make_shared<Slots>();
  qp->sq_posted = qp->rq_posted = 0;
  qp->tx_next = 0;
  qp->next_psn = 0;
  qp->peer_dead = false;
  qp->rewind = false;
  qp->rnr_until = {};
  qp->fail_armed = false;
  qp->epsn = 0;
  qp->rnr_discard = false;
}

void connect_qp(Context* ctx, Qp* qp) {
  const std::string path = config().socket_dir + "/" + std::to_string(qp->remote.pid) + "." +
                           std::to_string(qp->remote.instance);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path) {
    qp->peer_dead = true;
    return;
  }
  std::strcpy(addr.sun_path, path.c_str());
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    qp->peer_dead = true;
    return;
  }
  set_buffers(fd);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    // Nobody there: as on a fabric, RTR succeeds and the sends time out.
    ::close(fd);
    qp->peer_dead = true;
    return;
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  auto* c = new Conn;
  c->fd = fd;
  c->qp = qp;
  c->outgoing = true;
  Frame hello{};
  hello.type = kHello;
  hello.a = ctx->self.pid;
  hello.b = ctx->self.instance;
  hello.rkey = qp->base.qp_num;
  hello.imm = qp->attr.dest_qp_num;
  queue_frame(c, hello);
  qp->out = c;
  ctx->conns.push_back(c);
}

int post_send(ibv_qp* base, ibv_send_wr* wr, ibv_send_wr** bad) {
  Context* ctx = ctx_of(base->context);
  Qp* qp = qp_of(base);
  std::lock_guard<std::mutex> lk(ctx->mu);
  const int flags_known = IBV_SEND_SIGNALED | IBV_SEND_INLINE | IBV_SEND_FENCE | IBV_SEND_SOLICITED;
  for (; wr; wr = wr->next) {
    const ibv_qp_state state = qp->attr.qp_state;
    SendWr w;
    w.wr_id = wr->wr_id;
    w.signaled = qp->sig_all || (wr->send_flags & IBV_SEND_SIGNALED);
    w.seq = qp->sq_posted;
    if (state == IBV_QPS_ERR) {
      ++qp->sq_posted;
      complete_send(qp, w, IBV_WC_WR_FLUSH_ERR);
      continue;
    }
    int err = 0;
    if (state != IBV_QPS_RTS) {
      complain("QP %u: post_send in state %d (needs RTS)", base->qp_num, state);
      err = EINVAL;
    } else if (wr->opcode != IBV_WR_RDMA_WRITE && wr->opcode != IBV_WR_RDMA_WRITE_WITH_IMM) {
      complain("QP %u: opcode %d is not emulated (RDMA write and write-with-imm are)", base->qp_num,
               wr->opcode);
      err = EINVAL;
    } else if (wr->send_flags & ~flags_known) {
      complain("QP %u: send_flags 0x%x are not emulated", base->qp_num, wr->send_flags);
      err = EINVAL;
    } else if (wr->num_sge < 0 || static_cast<uint32_t>(wr->num_sge) > qp->cap.max_send_sge) {
      complain("QP %u: %d SGEs, the QP has max_send_sge %u", base->qp_num, wr->num_sge,
               qp->cap.max_send_sge);
      err = EINVAL;
    } else if (qp->sq_posted - qp->sq_slots->freed >= qp->cap.max_send_wr) {
      err = ENOMEM;  // full: completions not polled (or no signaled WR among the last ones)
    }
    if (err) {
      *bad = wr;
      return err;
    }
    w.with_imm = wr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
    w.imm = wr->imm_data;
    w.raddr = wr->wr.rdma.remote_addr;
    w.rkey = wr->wr.rdma.rkey;
    w.len = 0;
    for (int i = 0; i < wr->num_sge; ++i) w.len += wr->sg_list[i].length;
    if (wr->send_flags & IBV_SEND_INLINE) {
      if (w.len > qp->cap.max_inline_data) {
        complain("QP %u: %lu inline bytes, max_inline_data is %u", base->qp_num,
                 static_cast<unsigned long>(w.len), qp->cap.max_inline_data);
        *bad = wr;
        return EINVAL;
      }
      for (int i = 0; i < wr->num_sge; ++i)
        w.inline_data.append(reinterpret_cast<const char*>(wr->sg_list[i].addr),
                             wr->sg_list[i].length);
    } else {
      w.sges.assign(wr->sg_list, wr->sg_list + wr->num_sge);
      for (const ibv_sge& s : w.sges) {
        auto it = ctx->by_lkey.find(s.lkey);
        const Mr* mr = it == ctx->by_lkey.end() ? nullptr : it->second;
        const uint64_t start = mr ? reinterpret_cast<uintptr_t>(mr->base.addr) : 0;
        if (!mr || mr->pd != qp->pd || s.addr < start || s.length > mr->base.length ||
            s.addr - start > mr->base.length - s.length)
          w.fail = IBV_WC_LOC_PROT_ERR;
      }
    }
    if (w.len > (1ull << 31)) w.fail = IBV_WC_LOC_LEN_ERR;
    const long nth = config().retry_exceeded_nth;
    if (nth > 0 && w.signaled && ++g_signaled_writes == nth) w.fail = IBV_WC_RETRY_EXC_ERR;
    ++qp->sq_posted;
    w.psn = qp->next_psn;
    qp->next_psn = (qp->next_psn + 1) & kPsnMask;
    (w.with_imm ? stats().writes_with_imm : stats().writes)++;
    stats().payload_bytes += w.len;
    qp->sq.push_back(std::move(w));
  }
  wake(ctx);
  return 0;
}

int post_recv(ibv_qp* base, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  Context* ctx = ctx_of(base->context);
  Qp* qp = qp_of(base);
  std::lock_guard<std::mutex> lk(ctx->mu);
  for (; wr; wr = wr->next) {
    const ibv_qp_state state = qp->attr.qp_state;
    int err = 0;
    if (state == IBV_QPS_RESET) {
      complain("QP %u: post_recv in RESET (needs INIT or later)", base->qp_num);
      err = EINVAL;
    } else if (wr->num_sge < 0 || static_cast<uint32_t>(wr->num_sge) > qp->cap.max_recv_sge) {
      complain("QP %u: %d receive SGEs, max_recv_sge is %u", base->qp_num, wr->num_sge,
               qp->cap.max_recv_sge);
      err = EINVAL;
    } else if (state != IBV_QPS_ERR && qp->rq_posted - qp->rq_slots->freed >= qp->cap.max_recv_wr) {
      err = ENOMEM;
    }
    if (err) {
      *bad = wr;
      return err;
    }
    const Qp::RecvWr r{wr->wr_id, qp->rq_posted++};
    if (state == IBV_QPS_ERR)
      complete_recv(qp, r, IBV_WC_WR_FLUSH_ERR, 0, 0);
    else
      qp->rq.push_back(r);
  }
  return 0;
}

int poll_cq(ibv_cq* base, int n, ibv_wc* wc) {
  Cq* cq = cq_of(base);
  std::lock_guard<std::mutex> lk(cq->mu);
  int k = 0;
  while (k < n && !cq->entries.empty()) {
    CqEntry& e = cq->entries.front();
    wc[k++] = e.wc;
    uint64_t freed = e.slots->freed.load();
    while (freed < e.upto && !e.slots->freed.compare_exchange_weak(freed, e.upto)) {
    }
    cq->entries.pop_front();
  }
  return k;
}

void progress_main(Context* ctx) {
  std::vector<pollfd> fds;
  std::vector<Conn*> who;
  std::unique_lock<std::mutex> lk(ctx->mu);
  while (!ctx->stop) {
    Clock::time_point now = Clock::now();
    if (config().fatal_ms >= 0 && !ctx->fatal && now >= ctx->fatal_at) {
      inject_fatal_event(ctx, now);
    }
    for (auto& [qpn, qp] : ctx->qps) advance(ctx, qp, now);
    for (size_t i = 0; i < ctx->conns.size(); ++i) {  // streams waiting on a QP's state
      Conn* c = ctx->conns[i];
      if (!c->dead && !c->outgoing && c->rx_frame && !c->rx_accepted) pump_rx(ctx, c);
    }
    sweep(ctx);
    fds.assign(2, pollfd{});
    fds[0] = {ctx->wake_fd, POLLIN, 0};
    fds[1] = {ctx->listen_fd, POLLIN, 0};
    who.assign(2, nullptr);
    for (Conn* c : ctx->conns) {
      const bool tx = tx_pending(c) || (c->outgoing && c->qp && wants_tx(c->qp, now));
      short events = tx ? POLLOUT : 0;
      if (!(c->rx_frame && !c->rx_accepted)) events |= POLLIN;
      fds.push_back({c->fd, events, 0});
      who.push_back(c);
    }
    const Clock::time_point deadline = next_deadline(ctx, now);
    timespec ts{};
    timespec* tsp = nullptr;
    if (deadline != Clock::time_point::max()) {
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
          std::max(deadline - now, Clock::duration::zero()));
      ts.tv_sec = static_cast<time_t>(ns.count() / 1000000000);
      ts.tv_nsec = static_cast<long>(ns.count() % 1000000000);
      tsp = &ts;
    }
    lk.unlock();
    const int ready = ::ppoll(fds.data(), fds.size(), tsp, nullptr);
    lk.lock();
    if (ready < 0) continue;
    if (fds[0].revents & POLLIN) {
      uint64_t v;
      while (::read(ctx->wake_fd, &v, sizeof v) > 0) {
      }
    }
    if (fds[1].revents & POLLIN) accept_all(ctx);
    for (size_t i = 2; i < fds.size(); ++i) {
      Conn* c = who[i];
      if (c->dead || !fds[i].revents) continue;
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) pump_rx(ctx, c);
      if (c->dead || !(fds[i].revents & POLLOUT)) continue;
      if (c->outgoing)
        pump_tx(ctx, c->qp);
      else
        flush_responses(ctx, c);
    }
  }
}

}  // namespace emu
