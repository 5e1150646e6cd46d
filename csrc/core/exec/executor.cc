#include "core/exec/executor.h"

#include <algorithm>
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

// The state of one Plan run: buffers, the peers it touches, waiting.
class Run {
 public:
  Run(const std::vector<Connection*>& connections, const std::function<int()>& departed_peer,
      const std::function<std::string()>& abort_reason, const Plan& plan, const OpBuffers& buffers,
      const OpContext& op)
      : conns_(connections),
        departed_peer_(departed_peer),
        abort_reason_(abort_reason),
        plan_(plan),
        buffers_(buffers),
        op_(op),
        elem_(element_size(op.dtype)),
        backoff_(op.timeout_s, socket_wait(plan, elem_, op.yielding_step_bytes)) {
    std::vector<bool> seen(conns_.size(), false);
    for (const Step& s : plan.steps) {
      for (int peer : {s.recv_peer, s.send_peer}) {
        if (peer >= 0 && !seen[peer]) {
          seen[peer] = true;
          active_.push_back(peer);
        }
      }
    }
  }

  void execute() {
    for (int peer : active_) conns_[peer]->set_operation(op_.signature);
    for (step_index_ = 0; step_index_ < plan_.steps.size(); ++step_index_) {
      const Step& s = plan_.steps[step_index_];
      WEFT_LOG(Trace, op_.rank,
               op_.name << " #" << op_.seq << " step " << step_index_ + 1 << "/"
                        << plan_.steps.size() << " recv_from=" << s.recv_peer
                        << " send_to=" << s.send_peer << " count=" << s.count);
      if (s.wait_sends) wait_sends_complete();
      switch (s.kind) {
        case Step::Kind::Fused: run_fused(s); break;
        case Step::Kind::Exchange: run_exchange(s); break;
        case Step::Kind::LocalReduce: run_local_reduce(s); break;
      }
    }
    wait_sends_complete();
  }

 private:
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

  std::string where(const char* waiting_for, int peer) const {
    std::ostringstream msg;
    msg << op_.name << " #" << op_.seq << " (" << plan_.algorithm << ", step " << step_index_ + 1
        << "/" << plan_.steps.size() << ") on rank " << op_.rank << " waiting to " << waiting_for
        << " rank " << peer;
    return msg.str();
  }

  // progress() on every connection this op uses; a failure names the peer.
  void poll() {
    throw_if_aborted();
    for (int peer : active_) {
      try {
        conns_[peer]->progress();
      } catch (const OutOfStepError& e) {
        throw_out_of_step(peer, e.what());
      } catch (const PeerError& e) {
        throw_lost_with_cause(peer, e.what());
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
    const std::string why = abort_reason_();
    if (why.empty()) return;
    std::ostringstream msg;
    msg << op_.name << " #" << op_.seq << " (" << plan_.algorithm << ") on rank " << op_.rank
        << ": " << why;
    throw AbortedError(msg.str());
  }

  [[noreturn]] void throw_lost(int peer, const std::string& why) const {
    std::ostringstream msg;
    msg << op_.name << " #" << op_.seq << " (" << plan_.algorithm << ") on rank " << op_.rank
        << ": lost rank " << peer << ": " << why;
    throw PeerError(msg.str());
  }

  // A peer that closed its connection has often aborted because some other
  // rank died. Control sockets close only when a process is gone, so look
  // there (briefly) for the rank that really went away and name it.
  [[noreturn]] void throw_lost_with_cause(int closed_peer, const std::string& why) {
    throw_if_aborted();
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
    while (std::chrono::steady_clock::now() < until) {
      int gone = departed_peer_();
      if (gone == closed_peer) throw_lost(gone, why);
      if (gone >= 0) {
        throw_lost(gone, "its process is gone (rank " + std::to_string(closed_peer) +
                             " closed its connection too)");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    throw_lost(closed_peer, why);
  }

  // Calls `attempt` until it returns true, polling and backing off between.
  template <typename Attempt>
  void wait_until(Attempt attempt, const char* waiting_for, int peer, bool receiving) {
    while (!checked(attempt, peer)) {
      poll();
      if (checked(attempt, peer)) break;
      backoff_.idle([&] { return where(waiting_for, peer); }, {{conns_[peer], receiving}});
    }
    backoff_.reset();
  }

  void wait_sends_complete() {
    for (int peer : active_) {
      wait_until([&] { return conns_[peer]->sends_complete(); }, "finish sending to", peer, false);
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

  void run_fused(const Step& s) {
    if (s.count == 0) return;
    Connection* rc = s.recv_peer >= 0 ? conns_[s.recv_peer] : nullptr;
    Connection* sc = s.send_peer >= 0 ? conns_[s.send_peer] : nullptr;
    // Sender and receiver must cut the stream identically: one slice size
    // for the whole world, whatever connections this rank's step uses.
    const size_t slice = std::max<size_t>(1, op_.slice_bytes / elem_);
    const int div = divisor(s);
    for (size_t off = 0; off < s.count; off += slice) {
      const size_t len = std::min(slice, s.count - off);
      const size_t bytes = len * elem_;
      const char* local = s.local ? address(*s.local) + off * elem_ : nullptr;
      char* dst = s.dst ? address(*s.dst) + off * elem_ : nullptr;
      // Plain send of memory that already holds the data: let the transport
      // pick copy or reference.
      if (!rc && sc && !dst && div == 0 && !s.copy_sends) {
        wait_until([&] { return sc->send_from(local, bytes); }, "send to", s.send_peer, false);
        continue;
      }
      // Plain receive into its destination: straight into place.
      if (rc && !sc && !local && div == 0) {
        wait_until(
            [&] {
              return op_.streaming ? rc->recv_into_streaming(dst, bytes)
                                   : rc->recv_into(dst, bytes);
            },
            "receive from", s.recv_peer, true);
        continue;
      }
      // A forward whose message arrives through staging copies (tcp):
      // straight into place, and on from there (below).
      if (rc && sc && dst && !local && div == 0 && rc->stages_by_copy()) {
        wait_until([&] { return rc->recv_into(dst, bytes); }, "receive from", s.recv_peer, true);
        wait_until([&] { return sc->send_from(dst, bytes); }, "send to", s.send_peer, false);
        continue;
      }
      // What a step writes into dst is the op's result there, so where
      // staging a send costs a copy, dst goes out by reference instead.
      const bool send_dst = sc && dst && sc->stages_by_copy();
      void* slot = nullptr;
      if (sc && !send_dst) {
        wait_until([&] { return (slot = sc->send_slot()) != nullptr; }, "send to", s.send_peer,
                   false);
      }
      const void* incoming = nullptr;
      if (rc) {
        wait_until([&] { return (incoming = rc->recv_slot(bytes)) != nullptr; }, "receive from",
                   s.recv_peer, true);
      }
      if (incoming) {
        emit(incoming, local, dst, slot, len, div, send_dst);
        rc->release_recv();
      } else {
        emit(local, nullptr, dst, slot, len, div, send_dst);
      }
      if (send_dst) {
        wait_until([&] { return sc->send_from(dst, bytes); }, "send to", s.send_peer, false);
      } else if (sc) {
        sc->post_send(bytes);
      }
    }
  }

  // One side of an Exchange: a cursor over the messages of a span.
  struct Cursor {
    char* start = nullptr;
    char* ptr = nullptr;
    size_t bytes = 0;  // left to move
    size_t slice = 0;
    bool pending = false;  // at least one message still to move
  };

  Cursor cursor(const std::optional<Span>& span, Connection* conn) const {
    Cursor c;
    if (!conn) return c;
    c.start = c.ptr = span ? address(*span) : nullptr;
    c.bytes = span ? span->count * elem_ : 0;
    c.slice = std::max<size_t>(elem_, op_.slice_bytes / elem_ * elem_);
    c.pending = true;
    return c;
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

  void run_exchange(const Step& s) {
    Connection* sc = s.send_peer >= 0 ? conns_[s.send_peer] : nullptr;
    Connection* rc = s.recv_peer >= 0 ? conns_[s.recv_peer] : nullptr;
    Cursor out = cursor(s.local, sc);
    Cursor in = cursor(s.dst, rc);
    const char* operand = s.operand ? address(*s.operand) : nullptr;
    const int div = divisor(s);
    // Received bytes reduced with the operand, which follows the dst cursor.
    auto receive_reduced = [&](char* p, size_t n) {
      const void* incoming = rc->recv_slot(n);
      if (!incoming) return false;
      const char* with = operand + (p - in.start);
      reduce::reduce(p, nullptr, incoming, with, n / elem_, op_.dtype, op_.op, div, false);
      rc->release_recv();
      return true;
    };
    while (out.pending || in.pending) {
      bool moved = false;
      if (out.pending) {
        moved |= advance(out, [&](char* p, size_t n) { return sc->send_from(p, n); });
      }
      if (in.pending) {
        moved |= checked(
            [&] {
              return operand ? advance(in, receive_reduced)
                             : advance(in, [&](char* p, size_t n) { return rc->recv_into(p, n); });
            },
            s.recv_peer);
      }
      if (moved) {
        backoff_.reset();
        continue;
      }
      poll();
      const auto describe = [&] {
        return in.pending ? where("receive from", s.recv_peer) : where("send to", s.send_peer);
      };
      if (in.pending && out.pending) {
        backoff_.idle(describe, {{rc, true}, {sc, false}});
      } else if (in.pending) {
        backoff_.idle(describe, {{rc, true}});
      } else {
        backoff_.idle(describe, {{sc, false}});
      }
    }
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

  const std::vector<Connection*>& conns_;
  const std::function<int()>& departed_peer_;
  const std::function<std::string()>& abort_reason_;
  const Plan& plan_;
  const OpBuffers& buffers_;
  const OpContext& op_;
  const size_t elem_;
  Backoff backoff_;
  std::vector<int> active_;
  size_t step_index_ = 0;
};

}  // namespace

Executor::Executor(std::vector<Connection*> connections, std::function<int()> departed_peer,
                   std::function<std::string()> abort_reason)
    : connections_(std::move(connections)),
      departed_peer_(std::move(departed_peer)),
      abort_reason_(std::move(abort_reason)) {}

void Executor::run(const Plan& plan, const OpBuffers& buffers, const OpContext& op) {
  Run(connections_, departed_peer_, abort_reason_, plan, buffers, op).execute();
}

}  // namespace weft
