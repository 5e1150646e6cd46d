#include "core/exec/executor.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <sstream>
#include <thread>

#include "core/common/error.h"
#include "core/common/log.h"
#include "core/exec/backoff.h"
#include "core/exec/cpu_placement.h"
#include "core/reduce/cpu_reduce.h"

namespace weft {
namespace {

// OpContext::yielding_step_bytes says which Plans yield.
Backoff::SocketWait socket_wait(const Plan& plan, size_t elem, size_t yielding_step_bytes) {
  if (cpu_placement::on_worker_thread()) return Backoff::SocketWait::Sleep;
  size_t largest = 0;
  for (const Step& s : plan.steps) {
    for (const std::optional<Span>& span : {s.local, s.dst}) {
      if (span) largest = std::max(largest, span->count);
    }
  }
  return largest * elem <= yielding_step_bytes ? Backoff::SocketWait::Yield
                                               : Backoff::SocketWait::Sleep;
}

// What a blocked channel waits for: a connection to move (receiving, or
// room to send), which the idle round may sleep on and a timeout names.
struct Wait {
  Connection* connection;
  bool receiving;
  const char* what;  // "receive from", "send to", "finish sending to"
  int peer;
  size_t lane;  // the waiting channel
};

// One side of an Exchange: a cursor over the messages of a span.
struct Cursor {
  char* start = nullptr;
  char* ptr = nullptr;
  size_t bytes = 0;  // left to move
  size_t slice = 0;
  bool pending = false;  // at least one message still to move
};

// Where a channel is inside its current step, so that a step blocked on a
// connection resumes there while the rank's other channels move on.
struct StepProgress {
  bool begun = false;     // dependencies met, earlier sends waited for
  size_t off = 0;         // Fused: elements already moved
  void* slot = nullptr;   // Fused: the send slot this slice fills
  bool emitted = false;   // Fused: this slice's data is in slot or dst
  bool received = false;  // Fused forward through staging: dst holds it
  Cursor out, in;         // Exchange
};

// One channel of the running Plan: its steps (indices into Plan::steps, or
// all of them in order for a Plan of one channel) and where it is.
struct Lane {
  std::vector<uint32_t> order;
  size_t steps = 0;  // how many
  size_t next = 0;   // position of the current step
  uint8_t tag = 0;
  StepProgress progress;
};

// The state of one Plan run: buffers, the connections it touches, its
// channels, waiting.
class Run {
 public:
  Run(const std::vector<std::vector<Connection*>>& connections, const PeerStatus& status,
      const Plan& plan, const OpBuffers& buffers, const OpContext& op)
      : conns_(connections),
        peers_(status),
        plan_(plan),
        buffers_(buffers),
        op_(op),
        elem_(element_size(op.dtype)),
        backoff_(op.timeout_s, socket_wait(plan, elem_, op.yielding_step_bytes)) {
    const size_t channels = plan.channel_count();
    lanes_.resize(channels);
    if (channels == 1) {
      lanes_[0].steps = plan.steps.size();
    } else {
      for (size_t c = 0; c < channels; ++c) lanes_[c].tag = plan.channel_tags[c];
      for (size_t i = 0; i < plan.steps.size(); ++i) {
        lanes_[plan.steps[i].channel].order.push_back(static_cast<uint32_t>(i));
      }
      for (Lane& lane : lanes_) lane.steps = lane.order.size();
      done_.assign(plan.steps.size(), false);
    }
    const size_t peers = conns_.front().size();
    std::vector<bool> seen(conns_.size() * peers, false);
    for (const Step& s : plan.steps) {
      const uint8_t tag = tag_of(s);
      for (int peer : {s.recv_peer, s.send_peer}) {
        if (peer >= 0 && !seen[tag * peers + peer]) {
          seen[tag * peers + peer] = true;
          active_.push_back({conns_[tag][peer], peer, tag});
        }
      }
    }
  }

  void execute() {
    for (const Active& a : active_) a.connection->set_operation(op_.signature);
    for (;;) {
      if (advance_all()) break;
      if (moved_) {
        backoff_.reset();
        continue;
      }
      poll();
      if (advance_all()) break;
      if (moved_) {
        backoff_.reset();
        continue;
      }
      idle();
    }
    for (const Active& a : active_) {
      wait_until([&] { return a.connection->sends_complete(); }, "finish sending to", a.peer,
                 a.connection, false);
    }
  }

 private:
  struct Active {
    Connection* connection;
    int peer;
    uint8_t tag;
  };

  uint8_t tag_of(const Step& s) const {
    return plan_.channel_tags.empty() ? 0 : plan_.channel_tags[s.channel];
  }
  Connection* connection(const Step& s, int peer) const {
    return peer >= 0 ? conns_[tag_of(s)][peer] : nullptr;
  }
  size_t step_index(const Lane& lane) const {
    return lane.order.empty() ? lane.next : lane.order[lane.next];
  }

  // Moves every channel as far as its connections allow without waiting.
  // True once every channel has finished; moved_ says whether anything
  // moved, waits_ what the blocked channels wait for.
  bool advance_all() {
    moved_ = false;
    waits_count_ = 0;
    bool finished = true;
    for (size_t c = 0; c < lanes_.size(); ++c) {
      lane_ = c;
      Lane& lane = lanes_[c];
      while (lane.next < lane.steps) {
        const size_t index = step_index(lane);
        if (!advance_step(lane, plan_.steps[index], index)) break;
        if (!done_.empty()) done_[index] = true;
        lane.progress = StepProgress{};
        ++lane.next;
        moved_ = true;
      }
      finished = finished && lane.next == lane.steps;
    }
    return finished;
  }

  // True once the step has finished.
  bool advance_step(Lane& lane, const Step& s, size_t index) {
    StepProgress& p = lane.progress;
    if (!p.begun) {
      // (With one channel, every earlier step has finished.)
      for (uint32_t d : s.after) {
        if (!done_.empty() && !done_[d]) return false;  // another channel will get there
      }
      if (s.wait_sends) {
        for (const Active& a : active_) {
          if (a.tag == lane.tag && !a.connection->sends_complete()) {
            blocked(a.connection, false, "finish sending to", a.peer);
            return false;
          }
        }
      }
      p.begun = true;
      WEFT_LOG(Trace, op_.rank,
               op_.name << " #" << op_.seq << " step " << index + 1 << "/" << plan_.steps.size()
                        << " recv_from=" << s.recv_peer << " send_to=" << s.send_peer
                        << " count=" << s.count << " channel=" << s.channel);
      if (s.kind == Step::Kind::Exchange) begin_exchange(s, p);
      if (s.kind == Step::Kind::Fused) expect_fused_receive(s);
    }
    switch (s.kind) {
      case Step::Kind::Fused: return advance_fused(s, p);
      case Step::Kind::Exchange: return advance_exchange(s, p);
      case Step::Kind::LocalReduce: run_local_reduce(s); return true;
      case Step::Kind::Reduce:
        if (s.count > 0) {
          char* dst = address(*s.dst);
          reduce::reduce(dst, nullptr, dst, address(*s.local), s.count, op_.dtype, op_.op,
                         divisor(s), false);
        }
        return true;
    }
    return true;
  }

  char* address(const Span& span) const {
    char* base = nullptr;
    switch (span.buf) {
      case Buf::Input: base = const_cast<char*>(static_cast<const char*>(buffers_.input)); break;
      case Buf::Output: base = static_cast<char*>(buffers_.output); break;
      case Buf::Scratch: base = static_cast<char*>(buffers_.scratch); break;
    }
    return base + span.offset * elem_;
  }

  int divisor(const Step& s) const {
    return (s.finalize && op_.op == ReduceOp::Avg) ? op_.size : 0;
  }

  // "allreduce #3 (ring, step 2/6) on rank 1 waiting to receive from rank 0";
  // a Plan of several channels names the channel and its step.
  std::string where(const char* waiting_for, int peer, size_t lane_index) const {
    std::ostringstream msg;
    const Lane& lane = lanes_[lane_index];
    msg << op_.name << " #" << op_.seq << " (" << plan_.algorithm << ", ";
    if (lanes_.size() > 1) msg << "channel " << lane_index << " ";
    msg << "step " << std::min(lane.next + 1, lane.steps) << "/" << lane.steps << ") on rank "
        << op_.rank << " waiting to " << waiting_for << " rank " << peer;
    return msg.str();
  }

  // progress() on every connection this op uses; a failure names the peer.
  void poll() {
    throw_if_aborted();
    for (const Active& a : active_) {
      try {
        a.connection->progress();
      } catch (const OutOfStepError& e) {
        throw_out_of_step(a.peer, e.what());
      } catch (const PeerError& e) {
        throw_lost_with_cause(a.peer, e.what());
      }
    }
  }

  // A transport failure inside a send or receive (another operation's
  // message, a peer gone mid-copy): say which operation and peer.
  template <typename Attempt>
  bool checked(Attempt attempt, int peer) {
    try {
      return attempt();
    } catch (const OutOfStepError& e) {
      throw_out_of_step(peer, e.what());
    } catch (const PeerError& e) {
      throw_lost_with_cause(peer, e.what());
    }
  }

  [[noreturn]] void throw_out_of_step(int peer, const std::string& why) const {
    std::ostringstream msg;
    msg << op_.name << " #" << op_.seq << " (" << plan_.algorithm << ") on rank " << op_.rank
        << ", message from rank " << peer << ": " << why;
    throw OutOfStepError(msg.str());
  }

  // The communicator was aborted (its connections are shut down): say so
  // rather than blame a peer.
  void throw_if_aborted() const {
    const std::string why = peers_.abort_reason();
    if (why.empty()) return;
    std::ostringstream msg;
    msg << op_.name << " #" << op_.seq << " (" << plan_.algorithm << ") on rank " << op_.rank
        << ": " << why;
    throw AbortedError(msg.str());
  }

  [[noreturn]] void throw_lost(int peer, const std::string& why) const {
    std::ostringstream msg;
    msg << op_.name << " #" << op_.seq << " (" << plan_.algorithm << ") on rank " << op_.rank
        << ": " << lost_rank(peer, why);
    throw PeerError(msg.str());
  }

  // A peer that closed its connection has often aborted because some other
  // rank was lost. Control sockets close only when a process is gone or its
  // host stopped answering, so look there (briefly) for the rank that really
  // went away and name it.
  [[noreturn]] void throw_lost_with_cause(int closed_peer, const std::string& why) {
    throw_if_aborted();
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
    while (std::chrono::steady_clock::now() < until) {
      const PeerStatus::Departure gone = peers_.departed_peer();
      if (gone.rank == closed_peer) throw_lost(gone.rank, why);
      if (gone.rank >= 0) {
        throw_lost(gone.rank, gone.why + " (rank " + std::to_string(closed_peer) +
                                  " closed its connection too)");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    throw_lost(closed_peer, why);
  }

  // Records what the current channel waits for (an Exchange waits on two).
  void blocked(Connection* connection, bool receiving, const char* what, int peer) {
    if (waits_count_ < waits_.size()) {
      waits_[waits_count_] = Wait{connection, receiving, what, peer, lane_};
    }
    ++waits_count_;
  }

  // One attempt to move: true if it moved; otherwise the channel is blocked.
  template <typename Attempt>
  bool attempt(Attempt move, Connection* connection, bool receiving, const char* what, int peer) {
    if (checked(move, peer)) {
      moved_ = true;
      return true;
    }
    blocked(connection, receiving, what, peer);
    return false;
  }

  // An idle round over what the channels wait for: sleeps on those
  // connections where there are at most two, else naps blind.
  void idle() {
    check_left();
    const auto describe = [&] {
      if (waits_count_ == 0) {
        return std::string(op_.name) + " #" + std::to_string(op_.seq) + " (" + plan_.algorithm +
               ") on rank " + std::to_string(op_.rank) + " waiting on its own channels";
      }
      return where(waits_[0].what, waits_[0].peer, waits_[0].lane);
    };
    if (waits_count_ == 1) {
      backoff_.idle(describe, {{waits_[0].connection, waits_[0].receiving}});
    } else if (waits_count_ == 2) {
      backoff_.idle(describe, {{waits_[0].connection, waits_[0].receiving},
                               {waits_[1].connection, waits_[1].receiving}});
    } else {
      backoff_.idle(describe);
    }
  }

  // Calls `attempt` until it returns true, polling and backing off between.
  template <typename Attempt>
  void wait_until(Attempt attempt, const char* waiting_for, int peer, Connection* connection,
                  bool receiving) {
    while (!checked(attempt, peer)) {
      poll();
      if (checked(attempt, peer)) break;
      check_left(peer);
      backoff_.idle([&] { return where(waiting_for, peer, 0); }, {{connection, receiving}});
    }
    backoff_.reset();
  }

  // Every so often while idle: a peer waited on that left the group before
  // this operation will never move, so say so now rather than at the timeout.
  // (Peers it does not wait on block a peer that does, which fails and closes.)
  void check_left(int peer = -1) {
    if (++idle_rounds_ % kRoundsPerLeftCheck != 0) return;
    const auto now = std::chrono::steady_clock::now();
    if (now - last_left_check_ < kLeftCheckInterval) return;
    last_left_check_ = now;
    const size_t waits = std::min(waits_count_, waits_.size());
    for (size_t i = 0; i < (peer >= 0 ? 1 : waits); ++i) {
      const int p = peer >= 0 ? peer : waits_[i].peer;
      if (p < 0) continue;
      const std::string why = peers_.left_before(p, op_.seq);
      if (!why.empty()) throw_lost(p, why);
    }
  }

  // Writes `a` (op) `b` — or `a` alone when b is null — into dst and/or slot.
  // `sent_next`: dst is about to be sent, so it stays in the cache.
  void emit(const void* a, const void* b, char* dst, void* slot, size_t len, int div,
            bool sent_next) {
    const bool streaming = op_.streaming && dst != nullptr && !sent_next;
    void* first = dst ? static_cast<void*>(dst) : slot;
    void* second = dst ? slot : nullptr;
    if (b != nullptr) {
      reduce::reduce(first, second, a, b, len, op_.dtype, op_.op, div, streaming);
    } else if (div > 0) {
      reduce::divide(first, a, len, op_.dtype, div);
      if (second) reduce::copy(second, nullptr, first, len * elem_, false);
    } else {
      reduce::copy(first, second, a, len * elem_, streaming);
    }
  }

  // Streams a Fused step slice by slice until it ends (true) or a connection
  // blocks it (false: p holds where the slice stands).
  bool advance_fused(const Step& s, StepProgress& p) {
    Connection* rc = connection(s, s.recv_peer);
    Connection* sc = connection(s, s.send_peer);
    const size_t slice = fused_slice();
    const int div = divisor(s);
    for (; p.off < s.count; p.off += std::min(slice, s.count - p.off)) {
      const size_t len = std::min(slice, s.count - p.off);
      const size_t bytes = len * elem_;
      const char* local = s.local ? address(*s.local) + p.off * elem_ : nullptr;
      char* dst = s.dst ? address(*s.dst) + p.off * elem_ : nullptr;
      const auto send = [&](const void* from) {
        return attempt([&] { return sc->send_from(from, bytes); }, sc, false, "send to",
                       s.send_peer);
      };
      const auto receive = [&](bool streaming) {
        return attempt(
            [&] {
              return streaming ? rc->recv_into_streaming(dst, bytes) : rc->recv_into(dst, bytes);
            },
            rc, true, "receive from", s.recv_peer);
      };
      // Plain send of memory that already holds the data: let the transport
      // pick copy or reference.
      if (!rc && sc && !dst && div == 0 && !s.copy_sends) {
        if (!send(local)) return false;
        continue;
      }
      // Plain receive into its destination: straight into place.
      if (receives_into_place(s)) {
        if (!receive(op_.streaming)) return false;
        continue;
      }
      // A forward whose message arrives through staging copies (tcp):
      // straight into place, and on from there (below).
      if (rc && sc && dst && !local && div == 0 && rc->recv_slot_copies()) {
        if (!p.received && !receive(false)) return false;
        p.received = true;
        if (!send(dst)) return false;
        p.received = false;
        continue;
      }
      // What a step writes into dst is the op's result there, so where
      // staging a send costs a copy, dst goes out by reference instead.
      const bool send_dst = sc && dst && sc->send_slot_copies();
      if (sc && !send_dst && !p.slot &&
          !attempt([&] { return (p.slot = sc->send_slot()) != nullptr; }, sc, false, "send to",
                   s.send_peer)) {
        return false;
      }
      if (!p.emitted) {
        if (rc) {
          const void* incoming = nullptr;
          if (!attempt([&] { return (incoming = rc->recv_slot(bytes)) != nullptr; }, rc, true,
                       "receive from", s.recv_peer)) {
            return false;
          }
          emit(incoming, local, dst, p.slot, len, div, send_dst);
          rc->release_recv();
        } else {
          emit(local, nullptr, dst, p.slot, len, div, send_dst);
        }
        p.emitted = true;
      }
      if (send_dst) {
        if (!send(dst)) return false;
      } else if (sc) {
        sc->post_send(bytes);
      }
      p.slot = nullptr;
      p.emitted = false;
    }
    return true;
  }

  Cursor cursor(const std::optional<Span>& span, Connection* conn) const {
    Cursor c;
    if (!conn) return c;
    c.start = c.ptr = span ? address(*span) : nullptr;
    c.bytes = span ? span->count * elem_ : 0;
    c.slice = std::max<size_t>(elem_, op_.slice_bytes / elem_ * elem_);
    c.pending = true;
    return c;
  }

  // An Exchange's dst is apart from what it sends, so where it takes the
  // received bytes as they come (no operand) the connection may fill it from
  // the start.
  void begin_exchange(const Step& s, StepProgress& p) const {
    p.out = cursor(s.local, connection(s, s.send_peer));
    p.in = cursor(s.dst, connection(s, s.recv_peer));
    if (p.in.pending && !s.operand && p.in.bytes > 0) {
      connection(s, s.recv_peer)->expect_receives(p.in.start, p.in.bytes, p.in.slice);
    }
  }

  // The same for a Fused step that only receives into its destination.
  void expect_fused_receive(const Step& s) const {
    if (!receives_into_place(s) || !s.dst || s.count == 0) return;
    connection(s, s.recv_peer)
        ->expect_receives(address(*s.dst), s.count * elem_, fused_slice() * elem_);
  }

  // The elements of a Fused step's slice (a message). Sender and receiver
  // must cut the stream identically: one slice size for the whole world,
  // whatever connections this rank's step uses.
  size_t fused_slice() const { return std::max<size_t>(1, op_.slice_bytes / elem_); }

  // A Fused step that only receives, as it comes, into its destination.
  bool receives_into_place(const Step& s) const {
    return s.recv_peer >= 0 && s.send_peer < 0 && !s.local && divisor(s) == 0;
  }

  // Moves one message if the connection accepts it now.
  template <typename Move>
  static bool advance(Cursor& c, Move move) {
    size_t n = std::min(c.slice, c.bytes);
    if (!move(c.ptr, n)) return false;
    c.ptr += n;
    c.bytes -= n;
    c.pending = c.bytes > 0;
    return true;
  }

  // Moves both sides of an Exchange until it ends (true) or both block.
  bool advance_exchange(const Step& s, StepProgress& p) {
    Connection* sc = connection(s, s.send_peer);
    Connection* rc = connection(s, s.recv_peer);
    Cursor& out = p.out;
    Cursor& in = p.in;
    const char* operand = s.operand ? address(*s.operand) : nullptr;
    const int div = divisor(s);
    // Received bytes reduced with the operand, which follows the dst cursor.
    auto receive_reduced = [&](char* at, size_t n) {
      const void* incoming = rc->recv_slot(n);
      if (!incoming) return false;
      const char* with = operand + (at - in.start);
      reduce::reduce(at, nullptr, incoming, with, n / elem_, op_.dtype, op_.op, div, false);
      rc->release_recv();
      return true;
    };
    while (out.pending || in.pending) {
      bool moved = false;
      if (out.pending) {
        moved |= advance(out, [&](char* at, size_t n) { return sc->send_from(at, n); });
      }
      if (in.pending) {
        moved |= checked(
            [&] {
              return operand
                         ? advance(in, receive_reduced)
                         : advance(in, [&](char* at, size_t n) { return rc->recv_into(at, n); });
            },
            s.recv_peer);
      }
      if (!moved) {
        if (in.pending) blocked(rc, true, "receive from", s.recv_peer);
        if (out.pending) blocked(sc, false, "send to", s.send_peer);
        return false;
      }
      moved_ = true;
    }
    return true;
  }

  void run_local_reduce(const Step& s) {
    const size_t blocks = s.local->count / s.count;
    const char* base = address(*s.local);
    char* dst = address(*s.dst);
    const size_t stride = s.count * elem_;
    for (size_t b = 1; b < blocks; ++b) {
      const void* acc = b == 1 ? static_cast<const void*>(base) : dst;
      int div = b + 1 == blocks ? divisor(s) : 0;
      reduce::reduce(dst, nullptr, acc, base + b * stride, s.count, op_.dtype, op_.op, div, false);
    }
  }

  const std::vector<std::vector<Connection*>>& conns_;
  const PeerStatus& peers_;
  const Plan& plan_;
  const OpBuffers& buffers_;
  const OpContext& op_;
  const size_t elem_;
  Backoff backoff_;
  std::vector<Active> active_;
  std::vector<Lane> lanes_;
  std::vector<bool> done_;  // per step, for Step::after (several channels only)
  size_t lane_ = 0;         // the channel advance_all() is moving
  bool moved_ = false;
  std::array<Wait, 2> waits_{};  // the first two of waits_count_
  size_t waits_count_ = 0;
  static constexpr unsigned kRoundsPerLeftCheck = 32;
  static constexpr std::chrono::milliseconds kLeftCheckInterval{1};
  unsigned idle_rounds_ = 0;
  std::chrono::steady_clock::time_point last_left_check_{};
};

}  // namespace

Executor::Executor(std::vector<std::vector<Connection*>> connections, PeerStatus peers)
    : connections_(std::move(connections)), peers_(std::move(peers)) {}

void Executor::run(const Plan& plan, const OpBuffers& buffers, const OpContext& op) {
  Run(connections_, peers_, plan, buffers, op).execute();
}

}  // namespace weft
