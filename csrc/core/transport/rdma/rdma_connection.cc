// The RDMA protocol, as NCCL's net_ib runs it, over any RdmaEndpoint.
//
// Every message takes the next of the receiver's `slots` eager slots, which
// are the sender's credits: the sender may write message seq once the
// receiver has freed slot seq - slots. The receiver says how many it has
// freed in the header of each message it writes back. Where short messages
// go both ways (it wrote to the sender since the sender's last but one
// message came, which two messages of an exchange in either order satisfy,
// and the last was eager), it writes a Credit of its own only once half
// its slots wait to be returned, or when the sender has used every slot it
// was told of: a sender can wait on credits only then, so it waits no longer
// than if each freed slot were returned at once, and a Plan's buffering is
// what the slots say. Elsewhere each freed slot is a Credit at once: where
// messages go one way (a ring) nothing would carry it, and beside a long
// message a Credit costs little. A message staged by send_slot, or sent with
// send_from up to kEagerCopyBytes (copied into staging), is written eagerly:
// header and payload in one write with immediate. A larger send_from is a
// rendezvous: the header alone goes into the slot (ready-to-send); when the
// receiver reaches that message it registers its destination (recv_into's
// buffer or the slot itself) and writes a clear-to-send entry (address, key,
// length) into the sender's FIFO; the sender then writes the payload
// straight from the caller's memory with immediate Payload. A recv_into of
// more than kEagerCopyBytes that finds its message not yet there writes the
// clear-to-send at once, as NCCL's net_ib posts its receives: when the
// sender gets to the message it writes the header and the payload back to
// back, and the rendezvous costs no round trip (the entry goes unused if the
// message comes eagerly). Where the executor says which receives come next
// (expect_receives: a step's messages into one span), the entries for as many
// of them as there are slots go at once, and each received message clears the
// next: the sender writes a step's payloads back to back instead of waiting a
// round trip for each. Clear-to-send entries thus carry the rendezvous, and
// the slots they belong to the credits. Immediates name every write
// (rdma_wire.h), so the receiver learns of every message from its completion
// queue without polling memory, in whatever order the endpoint delivers them
// (a reliable connection keeps order; FI_EP_RDM endpoints need not).
//
// Counted per transfer: an eager message is one write one way (and a Credit
// write back for every half of the slots freed, unless messages going back
// carried it); a rendezvous message is three (ready-to-send, clear-to-send,
// payload): 1.5 round trips when the receiver comes second, half of one when
// it came first.
//
// The header's length and operation are checked against what the receiver
// asks for, as tcp and shm check theirs, before any payload is accepted.
#include "core/transport/rdma/rdma_connection.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "core/common/deadline.h"
#include "core/common/error.h"
#include "core/transport/op_signature.h"
#include "core/transport/rdma/rdma_wire.h"
#include "core/transport/rdma/registration_cache.h"

namespace weft {
namespace {

using rdma_wire::ClearToSend;
using rdma_wire::Header;
using rdma_wire::Kind;

// send_from copies messages up to this size into staging and writes them
// eagerly: below it a copy costs less than a round trip.
constexpr size_t kEagerCopyBytes = 64 << 10;
// How often an idle connection asks the endpoint whether the peer is gone.
constexpr std::chrono::microseconds kWatchInterval{50};
// How often a connection waiting on its peer looks at the control socket. A
// reliable connection with nothing to send never learns that its peer died
// (on a NIC as in the emulator), so a rank only receiving from a killed one
// would wait out its timeout; the kernel closes a dead process's sockets.
constexpr std::chrono::milliseconds kControlInterval{1};
// How long a connection still waits once its peer is gone (its control socket
// or the endpoint closed): a peer that finished its part and left may have
// written what is still on its way (on another QP, say), and a connection
// that waits on nothing more from it has no error at all.
constexpr std::chrono::milliseconds kGoneGrace{50};
constexpr int kPollBatch = 16;

// rdma_writes(), counted as writes are posted.
std::atomic<uint64_t> g_eager{0}, g_ready{0}, g_cts{0}, g_payload{0}, g_credit{0};
std::atomic<uint64_t> g_cts_early{0}, g_cts_unused{0};

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

// Local completion ids: what was written, for which message. Control writes
// (credits, clear-to-send entries) ask for no local completion: nothing waits
// on one.
enum class Wrote : uint64_t { Message = 1, Payload = 2, Control = 3 };
uint64_t completion_id(Wrote what, uint64_t seq) {
  return (static_cast<uint64_t>(what) << 56) | seq;
}

class RdmaConnection : public Connection {
 public:
  RdmaConnection(std::unique_ptr<RdmaEndpoint> endpoint, Socket& control,
                 const RdmaOptions& options, double timeout_s, const char* name)
      : slot_bytes_(options.slot_bytes),
        slots_(options.slots),
        bad_key_(options.bad_key),
        stride_(round_up(sizeof(Header) + options.slot_bytes, 64)),
        name_(name),
        control_(control),
        endpoint_(std::move(endpoint)),
        sends_(static_cast<size_t>(slots_)),
        early_cts_(static_cast<size_t>(slots_), 0),
        arrived_(static_cast<size_t>(slots_), 0),
        freed_(static_cast<size_t>(slots_), false),
        clears_(static_cast<size_t>(slots_)),
        cache_(*endpoint_) {
    if (slots_ < 1 || slot_bytes_ == 0) {
      throw InvalidArgument(std::string(name) +
                            " connection needs at least one slot of at least one byte");
    }
    // inbox: eager slots, clear-to-send FIFO, credit word; outbox: the same.
    const size_t slots = static_cast<size_t>(slots_);
    half_bytes_ = round_up(slots * stride_ + slots * sizeof(ClearToSend) + 64, 4096);
    void* memory = nullptr;
    if (::posix_memalign(&memory, 4096, 2 * half_bytes_) != 0) {
      throw Error(std::string(name) + ": cannot allocate " + std::to_string(2 * half_bytes_) +
                  " bytes of connection buffers");
    }
    memory_.reset(static_cast<char*>(memory));
    std::memset(memory_.get(), 0, 2 * half_bytes_);
    region_ = endpoint_->register_memory(memory_.get(), 2 * half_bytes_);
    exchange_hello(control, timeout_s);
  }

  ~RdmaConnection() override {
    // Nothing may write into our memory once it is freed.
    try {
      endpoint_->close();
    } catch (...) {
    }
  }

  // ---- sending ----

  void* send_slot() override {
    if (!broken_.empty()) return nullptr;
    if (!reserved_) {
      if (!send_room()) return nullptr;
      reserved_ = true;
    }
    return outbox_slot(send_seq_) + sizeof(Header);
  }

  void post_send(size_t bytes) override {
    if (!reserved_) throw InvalidArgument("post_send without a slot from send_slot");
    check_size("post_send", bytes);
    reserved_ = false;
    enqueue(bytes, nullptr);
  }

  bool send_from(const void* src, size_t bytes) override {
    if (!broken_.empty() || !send_room()) return false;
    if (bytes <= kEagerCopyBytes && bytes <= slot_bytes_) {
      if (bytes > 0) std::memcpy(outbox_slot(send_seq_) + sizeof(Header), src, bytes);
      enqueue(bytes, nullptr);
    } else {
      enqueue(bytes, static_cast<const char*>(src));
    }
    return true;
  }

  bool sends_complete() override {
    pump();
    return done_seq_ == send_seq_;
  }

  // ---- receiving ----

  const void* recv_slot(size_t bytes) override {
    check_size("recv_slot", bytes);
    char* payload = inbox_slot(next_) + sizeof(Header);
    if (!receive(bytes, payload, true)) return nullptr;
    held_.push_back(next_++);
    clear_offered();
    return payload;
  }

  void release_recv() override {
    if (held_.empty()) throw InvalidArgument("release_recv without a message from recv_slot");
    free_slot(held_.front());
    held_.pop_front();
  }

  bool recv_into(void* dst, size_t bytes) override {
    if (!receive(bytes, static_cast<char*>(dst), false)) return false;
    if (!rendezvous_ && bytes > 0) std::memcpy(dst, inbox_slot(next_) + sizeof(Header), bytes);
    const uint64_t seq = next_++;
    clear_offered();
    free_slot(seq);
    return true;
  }

  void expect_receives(void* dst, size_t bytes, size_t slice) override {
    if (next_ < offer_end_) {
      throw InvalidArgument(std::string(name_) +
                            ": receives expected before the ones expected earlier came");
    }
    if (bytes <= kEagerCopyBytes || slice <= kEagerCopyBytes || !broken_.empty()) return;
    offer_dst_ = static_cast<char*>(dst);
    offer_bytes_ = bytes;
    offer_slice_ = slice;
    offer_first_ = offer_next_ = next_;
    offer_end_ = next_ + (bytes + offer_slice_ - 1) / offer_slice_;
    // One registration for the span, which the messages' own share.
    offer_region_ = &cache_.acquire(dst, bytes);
    clear_offered();
  }

  void progress() override {
    pump();
    const auto now = std::chrono::steady_clock::now();
    if (intact() && now - last_watch_ >= kWatchInterval) {
      last_watch_ = now;
      try {
        lost_ = endpoint_->closed_by_peer();
      } catch (const PeerError& e) {
        lost_ = e.what();
      }
      if (!lost_.empty()) pump();  // what the peer wrote before it left
    }
    // Only while waiting, and still after a grace: a peer may finish its
    // part and exit while its last acknowledgement or message is in flight.
    const bool waiting = recv_waiting_ || done_seq_ != send_seq_;
    if (!waiting) gone_since_.reset();
    if (broken_.empty() && waiting && now - last_control_check_ >= kControlInterval) {
      last_control_check_ = now;
      if (!gone_since_ && (!lost_.empty() || control_.peer_closed())) {
        gone_since_ = now;
      } else if (gone_since_ && now - *gone_since_ >= kGoneGrace) {
        fail(lost_.empty() ? control_.loss() : lost_);
      }
    }
    if (!broken_.empty()) {
      if (out_of_step_) throw OutOfStepError(broken_);
      throw PeerError(broken_);
    }
  }

  void shutdown() override { endpoint_->close(); }

  int readiness_fd() const override { return intact() ? endpoint_->sleep_fd() : -1; }
  bool readiness_by_reading() const override { return true; }
  // After the pump that found nothing (every receive and send call ends with
  // one).
  bool ready_to_sleep() override { return intact() && endpoint_->arm_sleep_fd(); }

  bool send_slot_copies() const override { return true; }
  size_t slot_bytes() const override { return slot_bytes_; }
  size_t capacity_bytes() const override { return slot_bytes_ * static_cast<size_t>(slots_); }
  const char* transport_name() const override { return name_; }

 private:
  struct Send {
    size_t bytes;
    uint64_t operation;
    const char* src;             // rendezvous: the caller's memory; null when staged
    const MemoryRegion* region;  // src's registration while its payload is written
    bool cleared;                // the receiver's clear-to-send arrived
    bool payload_posted;
    int pending;  // writes posted and not completed
  };

  // Layout of memory_: inbox then outbox, each [slots x stride][slots x cts][credit].
  char* inbox_slot(uint64_t seq) const { return memory_.get() + (seq % slots_) * stride_; }
  char* outbox_slot(uint64_t seq) const { return inbox_slot(seq) + half_bytes_; }
  size_t cts_offset(uint64_t seq) const {
    return static_cast<size_t>(slots_) * stride_ + (seq % slots_) * sizeof(ClearToSend);
  }
  size_t credit_offset() const {
    return static_cast<size_t>(slots_) * (stride_ + sizeof(ClearToSend));
  }
  ClearToSend* inbox_cts(uint64_t seq) const {
    return reinterpret_cast<ClearToSend*>(memory_.get() + cts_offset(seq));
  }
  ClearToSend* outbox_cts(uint64_t seq) const {
    return reinterpret_cast<ClearToSend*>(memory_.get() + half_bytes_ + cts_offset(seq));
  }
  char* outbox_credit() const { return memory_.get() + half_bytes_ + credit_offset(); }

  void exchange_hello(Socket& control, double timeout_s) {
    rdma_wire::Hello mine{region_->remote_address(memory_.get()), region_->remote_key(),
                          slot_bytes_, static_cast<uint64_t>(slots_)};
    rdma_wire::Hello theirs{};
    const Deadline deadline(timeout_s);
    control.send_all(&mine, sizeof(mine), deadline, std::string(name_) + " connection setup");
    control.recv_all(&theirs, sizeof(theirs), deadline, std::string(name_) + " connection setup");
    if (theirs.slot_bytes != mine.slot_bytes || theirs.slots != mine.slots) {
      throw InvalidArgument(std::string(name_) + ": the peer's slots (" +
                            std::to_string(theirs.slots) + " x " +
                            std::to_string(theirs.slot_bytes) + " bytes) differ from ours (" +
                            std::to_string(slots_) + " x " + std::to_string(slot_bytes_) +
                            "); set the same slot variables on every rank");
    }
    peer_inbox_ = theirs.inbox_address;
    peer_key_ = theirs.inbox_key;
  }

  void check_size(const char* op, size_t bytes) const {
    if (bytes > slot_bytes_) {
      throw InvalidArgument(std::string(op) + ": message of " + std::to_string(bytes) +
                            " bytes exceeds the slot size " + std::to_string(slot_bytes_));
    }
  }

  // A reserved send slot counts as in flight.
  bool send_room() {
    if (send_seq_ - done_seq_ + reserved_ < static_cast<uint64_t>(slots_)) return true;
    pump();
    return send_seq_ - done_seq_ + reserved_ < static_cast<uint64_t>(slots_);
  }

  void enqueue(size_t bytes, const char* src) {
    if (src && bytes > endpoint_->max_write_bytes()) {
      throw InvalidArgument(std::string(name_) + ": message of " + std::to_string(bytes) +
                            " bytes exceeds the endpoint's largest write of " +
                            std::to_string(endpoint_->max_write_bytes()));
    }
    sends_[send_seq_ % slots_] = Send{bytes, operation_, src, nullptr, false, false, 0};
    ++send_seq_;
    pump();
  }

  // Posts what can go, then takes completions, until nothing moves. Once the
  // endpoint failed (a write the peer did not take, the peer gone) it only
  // takes what completions are left: the error is the next waiter's (see
  // progress()), since a peer that finished and left fails the writes that
  // no longer matter to it (a credit, say).
  void pump() {
    if (!broken_.empty()) return;
    try {
      if (lost_.empty()) post_all();
      Completion done[kPollBatch];
      for (int n; (n = endpoint_->poll(done, kPollBatch)) > 0;) {
        for (int i = 0; i < n; ++i) handle(done[i]);
        if (lost_.empty()) post_all();
      }
    } catch (const PeerError& e) {
      if (lost_.empty()) lost_ = e.what();
    }
  }

  void post_all() {
    post_cts();
    post_messages();
    post_credit();
  }

  bool write(const void* src, size_t bytes, uint64_t remote, uint64_t key, Kind kind, uint64_t seq,
             Wrote what, const MemoryRegion* local) {
    if (!endpoint_->write_with_imm(src, bytes, local, remote, key, rdma_wire::immediate(kind, seq),
                                   completion_id(what, seq), what != Wrote::Control)) {
      return false;
    }
    switch (kind) {
      case Kind::Eager:
        ++(bytes == sizeof(Header) && sends_[seq % slots_].src ? g_ready : g_eager);
        break;
      case Kind::ClearToSend: ++g_cts; break;
      case Kind::Payload: ++g_payload; break;
      case Kind::Credit: ++g_credit; break;
    }
    return true;
  }

  // Messages (or their ready-to-send headers) into the peer's free slots,
  // then the payloads the peer has cleared.
  void post_messages() {
    while (written_seq_ < send_seq_ && written_seq_ < peer_freed_ + slots_) {
      Send& s = sends_[written_seq_ % slots_];
      const size_t bytes = sizeof(Header) + (s.src ? 0 : s.bytes);
      *reinterpret_cast<Header*>(outbox_slot(written_seq_)) =
          Header{s.bytes, s.operation, s.src != nullptr, freed_seq_};
      if (!write(outbox_slot(written_seq_), bytes, peer_inbox_ + (written_seq_ % slots_) * stride_,
                 peer_key_, Kind::Eager, written_seq_, Wrote::Message, region_.get())) {
        return;
      }
      credit_sent_ = freed_seq_;
      ++s.pending;
      if (early_cts_[written_seq_ % slots_] == written_seq_ + 1 && s.src) {
        take_clear_to_send(written_seq_, s);
      }
      ++written_seq_;
    }
    for (uint64_t seq = done_seq_; seq < written_seq_; ++seq) {
      Send& s = sends_[seq % slots_];
      if (!s.cleared || s.payload_posted) continue;
      const ClearToSend& cts = *inbox_cts(seq);
      if (endpoint_->needs_local_registration() && !s.region && s.bytes > 0) {
        s.region = &cache_.acquire(s.src, s.bytes);
      }
      if (!write(s.src, s.bytes, cts.address, cts.key, Kind::Payload, seq, Wrote::Payload,
                 s.region)) {
        return;
      }
      s.payload_posted = true;
      ++s.pending;
    }
  }

  void post_credit() {
    const uint64_t owed = freed_seq_ - credit_sent_, slots = static_cast<uint64_t>(slots_);
    const bool defer = short_exchange_ && 2 * owed < slots && arrived_top_ < credit_sent_ + slots;
    if (owed == 0 || defer) return;
    std::memcpy(outbox_credit(), &freed_seq_, sizeof(freed_seq_));
    if (write(outbox_credit(), sizeof(freed_seq_), peer_inbox_ + credit_offset(), peer_key_,
              Kind::Credit, freed_seq_, Wrote::Control, region_.get())) {
      credit_sent_ = freed_seq_;
    }
  }

  void handle(const Completion& c) {
    if (c.kind == Completion::Kind::Local) {
      const auto what = static_cast<Wrote>(c.id >> 56);
      const uint64_t seq = c.id & ((uint64_t{1} << 56) - 1);
      if (what == Wrote::Control) return;
      Send& s = sends_[seq % slots_];
      --s.pending;
      if (what == Wrote::Payload && s.region) {
        cache_.release(*s.region);
        s.region = nullptr;
      }
      retire_sends();
      return;
    }
    switch (rdma_wire::kind_of(c.imm)) {
      case Kind::Eager: {
        const uint64_t seq = rdma_wire::seq_after(next_, c.imm);
        if (seq >= next_ + slots_ || arrived_[seq % slots_] != 0) {
          return protocol_error("a message into a slot that is not free");
        }
        arrived_[seq % slots_] = seq + 1;
        arrived_top_ = std::max(arrived_top_, seq + 1);
        const Header& header = *reinterpret_cast<const Header*>(inbox_slot(seq));
        const bool wrote = written_seq_ != written_at_arrival_;
        short_exchange_ =
            (wrote || wrote_before_) && header.rendezvous == 0 && header.length <= kEagerCopyBytes;
        wrote_before_ = wrote;
        written_at_arrival_ = written_seq_;
        return take_credit(header.freed);
      }
      case Kind::ClearToSend: {
        // When it was written the receiver was at most `slots_` messages
        // behind what was sent, and fewer than `slots_` ahead of the next
        // message to write (early entries). Seen as beyond that, it is an
        // early entry for a message that went eagerly long ago, overtaken by
        // the writes after it (several QPs deliver in any order): nothing to
        // do.
        const uint64_t slots = static_cast<uint64_t>(slots_);
        const uint64_t seq =
            rdma_wire::seq_after(done_seq_ >= slots ? done_seq_ - slots : 0, c.imm);
        if (seq >= written_seq_ + slots) return;
        if (seq >= written_seq_) {
          early_cts_[seq % slots_] = seq + 1;  // taken when its header is written
          return;
        }
        if (seq < done_seq_ || !sends_[seq % slots_].src) return;  // it went eagerly
        Send& s = sends_[seq % slots_];
        if (s.cleared) return protocol_error("a second clear-to-send for one message");
        take_clear_to_send(seq, s);
        return;
      }
      case Kind::Payload: {
        const uint64_t seq = rdma_wire::seq_after(next_, c.imm);
        Clear& clear = clears_[seq % slots_];
        if (seq >= next_ + slots_ || clear.seq != seq + 1 || clear.payload_arrived) {
          return protocol_error("payload that was not asked for");
        }
        clear.payload_arrived = true;
        return;
      }
      case Kind::Credit: {
        // An older count overtaken by a newer one (unordered endpoints).
        const uint64_t behind = (peer_freed_ - c.imm) & rdma_wire::kSeqMask;
        if (behind != 0 && behind <= static_cast<uint64_t>(slots_)) return;
        return take_credit(rdma_wire::seq_after(peer_freed_, c.imm));
      }
    }
    protocol_error("unknown immediate " + std::to_string(c.imm));
  }

  // The peer's count of our messages it has freed, from a Credit or a header
  // (either may be overtaken by a newer one on unordered endpoints).
  void take_credit(uint64_t freed) {
    if (freed > written_seq_) return protocol_error("credit for slots never used");
    peer_freed_ = std::max(peer_freed_, freed);
  }

  // Message seq's payload may go where the receiver's entry says, if the
  // entry is for this message: one asking for another length or operation is
  // left unanswered, and the receiver, finding the header differ, fails.
  void take_clear_to_send(uint64_t seq, Send& s) {
    const ClearToSend& cts = *inbox_cts(seq);
    if (cts.length == s.bytes && cts.operation == s.operation) s.cleared = true;
  }

  void retire_sends() {
    while (done_seq_ < written_seq_) {
      const Send& s = sends_[done_seq_ % slots_];
      if (s.pending > 0 || (s.src && !s.payload_posted)) return;
      ++done_seq_;
    }
  }

  // Whether message next_ (`bytes` long) is complete in its slot or in
  // `dst`; for a rendezvous, clears it to be written to `dst` (inside the
  // inbox when `into_slot`).
  bool receive(size_t bytes, char* dst, bool into_slot) {
    pump();
    recv_waiting_ = true;
    if (!broken_.empty()) return false;
    Clear& clear = clears_[next_ % slots_];
    const bool cleared = clear.seq == next_ + 1;
    if (cleared && clear.dst != dst) {
      throw InvalidArgument(std::string(name_) +
                            ": a receive into other memory than its clear-to-send named (the "
                            "receive's first try, or expect_receives)");
    }
    if (arrived_[next_ % slots_] != next_ + 1) {
      if (!cleared && !into_slot && bytes > kEagerCopyBytes) {
        clear_to_send(next_, bytes, dst, false);
        ++g_cts_early;
        pump();
      }
      return false;
    }
    const Header& header = *reinterpret_cast<const Header*>(inbox_slot(next_));
    if (!header_checked_) {
      if (header.operation != operation_) {
        out_of_step_ = true;
        fail(op_mismatch(operation_, header.operation));
        return false;
      }
      if (header.length != bytes) {
        out_of_step_ = true;
        fail(length_mismatch(bytes, header.length));
        return false;
      }
      // Decided once: the peer may rewrite the header while we wait for a
      // rendezvous payload, and an eager copy must come from within the slot.
      rendezvous_ = header.rendezvous != 0;
      if (!rendezvous_ && bytes > slot_bytes_) {
        protocol_error("an eager message of " + std::to_string(bytes) +
                       " bytes, longer than a slot");
        return false;
      }
      header_checked_ = true;
    }
    if (rendezvous_) {
      if (!cleared) {
        clear_to_send(next_, bytes, dst, into_slot);
        pump();
      }
      if (!clear.payload_arrived) return false;
      end_clear_to_send(next_);
    } else if (cleared) {
      end_clear_to_send(next_);  // an early entry the eager message did not need
      ++g_cts_unused;
    }
    header_checked_ = false;
    recv_waiting_ = false;
    return true;
  }

  // Message seq (from next_ to fewer than `slots_` beyond it) may be written
  // to dst. Its entry takes the outbox's place of message seq - slots_, whose
  // payload has come, so that entry's write was done.
  void clear_to_send(uint64_t seq, size_t bytes, char* dst, bool into_slot) {
    Clear& clear = clears_[seq % slots_];
    const MemoryRegion* region = region_.get();
    if (!into_slot && bytes > 0) region = clear.region = &cache_.acquire(dst, bytes);
    ClearToSend& cts = *outbox_cts(seq);
    const uint64_t key = bad_key_ ? ~region->remote_key() : region->remote_key();
    cts = ClearToSend{region->remote_address(dst), key, bytes, seq, operation_};
    clear.seq = seq + 1;
    clear.dst = dst;
    // A clear-to-send that does not fit now goes on the next pump.
    pending_cts_.push_back(seq);
  }

  void end_clear_to_send(uint64_t seq) {
    Clear& clear = clears_[seq % slots_];
    if (clear.region) cache_.release(*clear.region);
    clear = Clear{};
  }

  // Clears the expected messages that have a slot's room ahead of the next
  // one received: those long enough to come by rendezvous, and not already
  // come eagerly. The span's registration goes with the last of them.
  void clear_offered() {
    if (offer_region_ && next_ >= offer_end_) {
      cache_.release(*offer_region_);
      offer_region_ = nullptr;
    }
    const uint64_t end = std::min(offer_end_, next_ + slots_);
    if (offer_next_ >= end || !broken_.empty()) return;
    bool cleared_any = false;
    for (; offer_next_ < end; ++offer_next_) {
      const uint64_t seq = offer_next_;
      const size_t at = (seq - offer_first_) * offer_slice_;
      const size_t bytes = std::min(offer_slice_, offer_bytes_ - at);
      const bool arrived = arrived_[seq % slots_] == seq + 1;
      if (bytes <= kEagerCopyBytes || clears_[seq % slots_].seq == seq + 1) continue;
      if (arrived && reinterpret_cast<const Header*>(inbox_slot(seq))->rendezvous == 0) continue;
      clear_to_send(seq, bytes, offer_dst_ + at, false);
      if (!arrived) ++g_cts_early;
      cleared_any = true;
    }
    if (cleared_any) pump();
  }

  void post_cts() {
    while (!pending_cts_.empty()) {
      const uint64_t seq = pending_cts_.front();
      if (!write(outbox_cts(seq), sizeof(ClearToSend), peer_inbox_ + cts_offset(seq), peer_key_,
                 Kind::ClearToSend, seq, Wrote::Control, region_.get())) {
        return;
      }
      pending_cts_.pop_front();
    }
  }

  void free_slot(uint64_t seq) {
    arrived_[seq % slots_] = 0;
    freed_[seq % slots_] = true;
    while (freed_seq_ < next_ && freed_[freed_seq_ % slots_]) {
      freed_[freed_seq_ % slots_] = false;
      ++freed_seq_;
    }
    pump();
  }

  // Neither broken nor lost: the endpoint is still worth watching and sleeping on.
  bool intact() const { return broken_.empty() && lost_.empty(); }

  void protocol_error(const std::string& what) {
    fail(endpoint_->name() + " protocol error from the peer: " + what);
  }

  void fail(std::string why) {
    if (broken_.empty()) broken_ = std::move(why);
  }

  const size_t slot_bytes_;
  const int slots_;
  const bool bad_key_;
  const size_t stride_;  // of an eager slot: header and payload
  const char* name_;
  const Socket& control_;  // the Mesh's, which outlives the connection; watched for liveness
  size_t half_bytes_ = 0;  // of memory_: the inbox, then the outbox
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  std::unique_ptr<char, Free> memory_;
  std::unique_ptr<RdmaEndpoint> endpoint_;
  std::unique_ptr<MemoryRegion> region_;  // all of memory_
  uint64_t peer_inbox_ = 0, peer_key_ = 0;

  // Sending: messages send_seq_ > seq >= done_seq_ are in flight in sends_;
  // those below written_seq_ have their headers written.
  std::vector<Send> sends_;
  uint64_t send_seq_ = 0, written_seq_ = 0, done_seq_ = 0;
  uint64_t peer_freed_ = 0;  // slots the peer freed: we may write below peer_freed_ + slots_
  bool reserved_ = false;
  // Per slot: seq + 1 of a clear-to-send that came before its header went.
  std::vector<uint64_t> early_cts_;

  // Receiving: arrived_[slot] is 1 + the seq of the message that landed in
  // it (0: none; writes may land out of order on unordered endpoints, as
  // FI_EP_RDM's); next_ is the next one
  // asked for; held_ the ones recv_slot handed out; freed_seq_ the slots
  // free in order (the credits), freed_ the ones freed out of order.
  std::vector<uint64_t> arrived_;
  uint64_t next_ = 0, freed_seq_ = 0, credit_sent_ = 0;
  uint64_t arrived_top_ = 0;  // 1 + the highest seq that landed
  // Whether we wrote to the peer between its last three messages (wrote_before_:
  // between the two before the last; written_at_arrival_: our written_seq_
  // when the last landed) and the last was short: then our messages carry
  // the credits.
  bool short_exchange_ = false, wrote_before_ = false;
  uint64_t written_at_arrival_ = 0;
  std::deque<uint64_t> held_;
  std::vector<bool> freed_;
  bool header_checked_ = false;
  bool rendezvous_ = false;    // next_'s header, as checked, asked for a clear-to-send
  bool recv_waiting_ = false;  // a receive of next_ was asked for and has not completed
  // Per slot: the clear-to-send entry written for a message.
  struct Clear {
    uint64_t seq = 0;  // the message's seq + 1 (0: none)
    const char* dst = nullptr;
    const MemoryRegion* region = nullptr;  // dst's, held until the payload came
    bool payload_arrived = false;
  };
  std::vector<Clear> clears_;
  std::deque<uint64_t> pending_cts_;
  // expect_receives: messages offer_first_ to offer_end_ - 1 go into
  // offer_dst_ (offer_bytes_ in all, offer_slice_ each); those before
  // offer_next_ have been looked at.
  char* offer_dst_ = nullptr;
  size_t offer_bytes_ = 0, offer_slice_ = 0;
  uint64_t offer_first_ = 0, offer_next_ = 0, offer_end_ = 0;
  const MemoryRegion* offer_region_ = nullptr;

  RegistrationCache cache_;
  std::string broken_;
  bool out_of_step_ = false;
  std::chrono::steady_clock::time_point last_watch_{}, last_control_check_{};
  // Why the endpoint can no longer carry messages (the peer closed it, a write
  // failed); empty while it can.
  std::string lost_;
  // When, while waiting, the peer was first seen gone.
  std::optional<std::chrono::steady_clock::time_point> gone_since_;
};

}  // namespace

RdmaWrites rdma_writes() {
  return RdmaWrites{g_eager.load(),      g_ready.load(),   g_cts.load(),   g_cts_early.load(),
                    g_cts_unused.load(), g_payload.load(), g_credit.load()};
}

std::unique_ptr<Connection> make_rdma_connection(std::unique_ptr<RdmaEndpoint> endpoint,
                                                 Socket& control, const RdmaOptions& options,
                                                 double timeout_s, const char* transport_name) {
  return std::make_unique<RdmaConnection>(std::move(endpoint), control, options, timeout_s,
                                          transport_name);
}

}  // namespace weft
