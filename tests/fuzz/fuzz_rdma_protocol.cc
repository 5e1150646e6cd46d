// libFuzzer target: the RDMA protocol (rdma_connection.cc), receiving and
// sending, against a peer that writes whatever it likes into the memory it
// may write and announces whatever it likes. A real connection
// (make_rdma_connection, its Hello exchanged over a socketpair) runs over
// FakeEndpoint, a test double of RdmaEndpoint that lives in this process:
// its regions are keyed, addressed by virtual address, and the input, playing
// the peer, writes our inbox (eager slots, clear-to-send entries, anything at
// any offset of it), hands the connection completions with any immediates,
// completes our posted writes in any order, and has the application send.
//
// The input's first 12 bytes set up the run: the operation signature (8
// bytes), the length every message must have (2 bytes: up to 4095, plus
// 64 KiB when flagged, above the size send_from copies), a flags byte (bit 0
// receives through recv_slot, bits 1-2 are the slots less one, bits 3-4 pick
// the slot size: the expected length, 64, 4096 or 64 KiB + 1024; bit 5 adds
// the 64 KiB, bit 6 makes the endpoint want local registrations, bit 7 holds
// recv_slot's messages until the script releases them) and the endpoint's
// send-queue depth less one (low 3 bits). The rest is the peer's script (see
// Op), run in rounds while the receiver waits. Messages are received one
// after another until one fails.
//
// The oracle. Each receive must either raise a weft::Error or return a
// message the peer delivered: its eager immediate came, a header naming the
// expected length and operation was in its slot while the receiver waited,
// and the bytes are those of the slot (an eager message, which must fit the
// slot) or those the peer's payload writes placed in the destination after
// a Payload immediate (a rendezvous). Once the script is spent, a receive
// that finds nothing while such a message is complete is a hang. Every write
// the connection posts is checked as it is posted: a message, clear-to-send
// or credit goes exactly to its place in the peer's inbox (the address and
// key of the peer's Hello) and says what the application sent, received or
// freed (never a slot still held); a clear-to-send names the receive's
// destination, under a key registered for it; a payload goes only where the
// peer's clear-to-send entry for it says, after its immediate, and is
// exactly the message; sends are complete only once all of that is written
// and completed. The fake lands a write only inside a region registered on
// that side (the peer's buffer lies between guard bytes), refusing others as
// a NIC would. Our inbox must hold exactly what the peer wrote. Anything else
// (and any read or write out of bounds, or a claimed size allocated) is a
// bug, and the target aborts.
#include <sys/socket.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/bootstrap/socket.h"
#include "core/common/deadline.h"
#include "core/common/error.h"
#include "core/transport/rdma/endpoint.h"
#include "core/transport/rdma/rdma_connection.h"
#include "core/transport/rdma/rdma_wire.h"
#include "fuzz_script.h"

namespace {

using weft::Completion;
using weft::MemoryRegion;
using weft::rdma_wire::ClearToSend;
using weft::rdma_wire::Header;
using weft::rdma_wire::Kind;
using weft::rdma_wire::kSeqMask;

constexpr size_t kSetupBytes = 12;
// Scripts are short enough that every run ends quickly: each round takes at
// least one byte and lets the receiver try at most 16 times.
constexpr size_t kMaxScript = 16 << 10;
constexpr size_t kEagerCopyBytes = 64 << 10;  // rdma_connection.cc's
constexpr size_t kMaxSends = 64;
constexpr size_t kMaxSentBytes = 1 << 20;
constexpr uint64_t kPeerInboxKey = 0x1b0c5;
constexpr uint64_t kPeerBufferKey = 0xb0ffe2;
constexpr uint64_t kFirstKey = 0x100;  // ours count up from here
constexpr double kSetupTimeoutS = 10.0;

[[noreturn]] void bug(const char* what) {
  std::fprintf(stderr, "fuzz_rdma_protocol: %s\n", what);
  std::abort();
}

struct Expected {
  uint64_t operation;
  size_t length;
  bool into_slot;
};

// Offsets in an inbox as rdma_connection.cc lays it out, both sides alike:
// the eager slots (header and payload), the clear-to-send entries, the
// credit word.
struct Layout {
  Layout(size_t slot_bytes, size_t slots)
      : slot_bytes(slot_bytes),
        slots(slots),
        stride(round_up(sizeof(Header) + slot_bytes, 64)),
        half_bytes(round_up(slots * stride + slots * sizeof(ClearToSend) + 64, 4096)) {}
  static size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }
  size_t slot(uint64_t seq) const { return seq % slots * stride; }
  size_t cts(uint64_t seq) const { return slots * stride + seq % slots * sizeof(ClearToSend); }
  size_t credit() const { return slots * (stride + sizeof(ClearToSend)); }

  size_t slot_bytes, slots, stride, half_bytes;
};

// Whether [address, address + bytes) lies in [base, base + size).
bool inside(uint64_t address, size_t bytes, uintptr_t base, size_t size) {
  return address >= base && address - base <= size && bytes <= size - (address - base);
}

// The peer's registered buffer that its clear-to-send entries name, between
// guard bytes that no write may change.
class PeerBuffer {
 public:
  static constexpr size_t kGuard = 4096;
  static constexpr size_t kBytes = 256 << 10;

  PeerBuffer() : memory_(2 * kGuard + kBytes, kGuardByte) {}
  uint8_t* base() { return memory_.data() + kGuard; }
  // The address the script's `field` names: anywhere in the buffer or its
  // guards.
  uint64_t address(uint64_t field) const {
    return reinterpret_cast<uintptr_t>(memory_.data()) + field % memory_.size();
  }
  bool guards_intact() const {
    const auto guard = [](uint8_t b) { return b == kGuardByte; };
    return std::all_of(memory_.begin(), memory_.begin() + kGuard, guard) &&
           std::all_of(memory_.end() - kGuard, memory_.end(), guard);
  }

 private:
  static constexpr uint8_t kGuardByte = 0xd7;
  std::vector<uint8_t> memory_;
};

// What the peer's script does. Each operation is a tag byte (taken modulo
// kOps) and its operands, little-endian; an operation cut short ends the
// script.
enum Op : uint8_t {
  // offset u32, count u16, count bytes: writes them into our inbox at
  // offset (modulo the inbox), cut at its end.
  kWrite,
  // flags u8, then (bit 0 clear) the payload: the next message as a sender
  // writes it, header (the expected length and operation; bit 0: a
  // rendezvous) and payload into its slot, then its Eager immediate.
  kPost,
  // kind u8 (modulo 5; 0 is no kind), seq u16: an immediate.
  kSignal,
  // imm u32: any immediate.
  kImmediate,
  // index u8: completes one of our writes not yet completed.
  kComplete,
  // seq u8, flags u8, offset u32, [length u32 when flags bit 2]: writes a
  // clear-to-send entry for our message seq and its immediate. The address
  // is the peer buffer's (or its guards') at offset; flags bits 0-1 pick the
  // key (0, 3: the buffer's; 1: the peer's inbox's, with the address in it;
  // 2: none); bit 2 takes the length from the script instead of the
  // message's; bit 3 names another operation.
  kClearToSend,
  // seq u8, then bytes: the peer's payload write for its message seq, to
  // where our clear-to-send entry for it says (up to its length), then the
  // Payload immediate.
  kPayload,
  // flags u8, length u32: the application sends a message of length modulo
  // twice the slot size plus 2, through send_slot and post_send (bit 0, when
  // it fits a slot) or send_from.
  kSend,
  // The application asks whether its sends are complete.
  kSendsComplete,
  // count u8: the receiver tries up to count % 16 + 1 times (or until a try
  // finds nothing) before the peer acts again.
  kYield,
  // The application releases the oldest message it holds from recv_slot.
  kRelease,
  kOps,
};

class Peer;

// A region registered with FakeEndpoint: keyed, addressed by virtual
// address, and forgotten by the peer when released.
class FakeRegion : public MemoryRegion {
 public:
  FakeRegion(Peer& peer, void* base, size_t bytes, uint64_t key)
      : MemoryRegion(base, bytes), peer_(peer), key_(key) {}
  ~FakeRegion() override;
  uint64_t remote_address(const void* p) const override { return reinterpret_cast<uintptr_t>(p); }
  uint64_t remote_key() const override { return key_; }
  void* local_descriptor() const override { return nullptr; }

 private:
  Peer& peer_;
  uint64_t key_;
};

// The peer, and the NIC between it and us: the state FakeEndpoint works on,
// which outlives the connection.
class Peer {
 public:
  Peer(const Expected& want, const Layout& layout, bool local_registration, bool hold,
       size_t queue_depth, Script script, PeerBuffer& buffer)
      : want_(want),
        layout_(layout),
        local_registration_(local_registration),
        hold_(hold && want.into_slot),
        queue_depth_(queue_depth),
        script_(script),
        buffer_(buffer),
        inbox_(layout.half_bytes),
        shadow_(layout.half_bytes),
        header_tick_(layout.slots),
        entry_tick_(layout.slots) {}

  uint64_t inbox_address() const { return reinterpret_cast<uintptr_t>(inbox_.data()); }

  // Our Hello must name the inbox the connection registered first (the
  // inbox and outbox block), with the slots it was given.
  void connected(weft::Connection& conn, const weft::rdma_wire::Hello& ours, uint8_t* dst,
                 size_t dst_bytes) {
    if (!ours_ || ours.inbox_address != reinterpret_cast<uintptr_t>(ours_) ||
        ours.inbox_key != kFirstKey || ours.slot_bytes != layout_.slot_bytes ||
        ours.slots != layout_.slots || registrations_[0].bytes != 2 * layout_.half_bytes) {
      bug("the connection's Hello is not its first registration, laid out as expected");
    }
    conn_ = &conn;
    dst_ = dst;
    dst_model_.resize(dst_bytes);
  }

  // ---- FakeEndpoint ----

  std::unique_ptr<MemoryRegion> register_memory(void* base, size_t bytes) {
    const uint64_t key = kFirstKey + registrations_.size();
    registrations_.push_back(Registration{reinterpret_cast<uintptr_t>(base), bytes, true});
    if (!ours_) ours_ = static_cast<uint8_t*>(base);
    return std::make_unique<FakeRegion>(*this, base, bytes, key);
  }
  void deregister(uint64_t key) { registrations_[key - kFirstKey].live = false; }
  bool needs_local_registration() const { return local_registration_; }

  // A write of ours: checked, then landed in the peer's memory by the NIC.
  bool write_with_imm(const void* src, size_t bytes, const MemoryRegion* local, uint64_t address,
                      uint64_t key, uint32_t imm, uint64_t id) {
    if (outstanding_.size() >= queue_depth_) return false;
    if (local_registration_ && bytes > 0 &&
        (!local || !inside(reinterpret_cast<uintptr_t>(src), bytes,
                           reinterpret_cast<uintptr_t>(local->base()), local->bytes()))) {
      bug("a write from memory outside its registration");
    }
    const auto* from = static_cast<const uint8_t*>(src);
    const uint64_t seq = imm & kSeqMask;
    const Kind kind = weft::rdma_wire::kind_of(imm);
    ++tick_;
    switch (kind) {
      case Kind::Eager: write_message(from, bytes, address, key, seq); break;
      case Kind::ClearToSend: write_clear_to_send(from, bytes, address, key, seq); break;
      case Kind::Payload: write_payload(from, bytes, address, key, seq); break;
      case Kind::Credit: write_credit(from, bytes, address, key, seq); break;
      default: bug("a write with an immediate of no kind");
    }
    outstanding_.push_back(Posted{id, kind});
    return true;
  }

  int poll(Completion* out, int max) {
    if (failed_) throw weft::PeerError("fake endpoint: a write was refused");
    int n = 0;
    for (; n < max && !queue_.empty(); ++n) {
      const Completion c = queue_.front().completion;
      queue_.pop_front();
      if (c.kind == Completion::Kind::Remote) {
        const Kind kind = weft::rdma_wire::kind_of(c.imm);
        delivered_[delivery(kind, c.imm & kSeqMask)] = ++tick_;
        if (kind == Kind::Credit) max_credit_ = std::max<uint64_t>(max_credit_, c.imm & kSeqMask);
        // An eager immediate's header carries a credit too, as it is in our
        // inbox when the connection takes the completion.
        if (kind == Kind::Eager) {
          Header header;
          std::memcpy(&header, ours_ + layout_.slot(c.imm & kSeqMask), sizeof(header));
          max_credit_ = std::max<uint64_t>(max_credit_, header.freed);
        }
      }
      out[n] = c;
    }
    return n;
  }

  std::string closed_by_peer() const {
    if (failed_) throw weft::PeerError("fake endpoint: a write was refused");
    return "";
  }

  // ---- the receiver's side of the run ----

  // recv_into's destination starts each message with a pattern of its own,
  // which the peer's writes and the slots' bytes hardly match by chance.
  void start_message(uint64_t pos) {
    pos_ = pos;
    eager_seen_ = rendezvous_seen_ = false;
    for (size_t i = 0; i < dst_model_.size(); ++i) {
      dst_model_[i] = static_cast<uint8_t>(0xa5 ^ pos ^ (i >> 3));
    }
    if (!dst_model_.empty()) std::memcpy(dst_, dst_model_.data(), dst_model_.size());
  }

  // Before each try of the receiver: the peer's next round, once the
  // receiver has used the tries the last one allowed. False once the peer
  // has nothing left to do.
  bool before_try() {
    const bool acting = allowance_ > 0 || !script_.done();
    if (allowance_ > 0) {
      --allowance_;
    } else {
      act();
    }
    // The receiver checks the header on the try that finds the message.
    Header header;
    std::memcpy(&header, &shadow_[layout_.slot(pos_)], sizeof(header));
    if (header.length == want_.length && header.operation == want_.operation) {
      (header.rendezvous ? rendezvous_seen_ : eager_seen_) = true;
    }
    return acting;
  }
  // The receiver found nothing: the peer acts before its next try.
  void receiver_waits() { allowance_ = 0; }

  // A receive of message pos_ returned `got` (`slot`: where recv_slot
  // found it).
  void check_received(const uint8_t* got, const void* slot) const {
    const size_t n = want_.length;
    const uint8_t* in_slot = &shadow_[layout_.slot(pos_) + sizeof(Header)];
    if (want_.into_slot && slot != ours_ + layout_.slot(pos_) + sizeof(Header)) {
      bug("recv_slot returned another address than the message's slot");
    }
    if (!delivered(Kind::Eager, pos_)) bug("a message received before its immediate");
    const auto same = [&](const uint8_t* expected) {
      return n == 0 || std::memcmp(got, expected, n) == 0;
    };
    const bool eager = eager_seen_ && n <= layout_.slot_bytes && same(in_slot);
    const bool rendezvous = rendezvous_seen_ && delivered(Kind::Payload, pos_) &&
                            same(want_.into_slot ? in_slot : dst_model_.data());
    if (!eager && !rendezvous) bug("a message received that the peer did not deliver");
  }

  // Whether the application keeps the message recv_slot just returned
  // (until the script releases it) instead of releasing it now.
  bool hold() {
    if (hold_) held_.push_back(pos_);
    return hold_;
  }

  // Whether message pos_ has fully arrived, so that a receive must take it:
  // its eager immediate came after its header was last written, the header
  // names the expected length and operation, and for a rendezvous our
  // clear-to-send left before the Payload immediate came.
  bool complete() const {
    const uint64_t arrived = delivered(Kind::Eager, pos_);
    if (arrived == 0 || header_tick_[pos_ % layout_.slots] > arrived) return false;
    Header header;
    std::memcpy(&header, &shadow_[layout_.slot(pos_)], sizeof(header));
    if (header.length != want_.length || header.operation != want_.operation) return false;
    if (!header.rendezvous) return want_.length <= layout_.slot_bytes;
    const auto cleared = our_cts_tick_.find(pos_);
    return cleared != our_cts_tick_.end() && delivered(Kind::Payload, pos_) > cleared->second;
  }

  // The end of a run: our inbox holds what the peer wrote (the connection
  // writes only its outbox), and the peer's guards are untouched.
  void finish() const {
    if (std::memcmp(ours_, shadow_.data(), shadow_.size()) != 0) {
      bug("the connection wrote into its own inbox");
    }
    if (!buffer_.guards_intact()) bug("a write landed in the peer buffer's guards");
  }

 private:
  struct Registration {
    uintptr_t base;
    size_t bytes;
    bool live;
  };
  struct Posted {
    uint64_t id;
    Kind kind;  // what the write carried
  };
  struct Sent {
    std::vector<uint8_t> bytes;  // send_from's source, which stays put until done
    bool staged;
    bool header_written = false;
    bool rendezvous = false;
    bool payload_written = false;
  };
  struct Queued {
    Completion completion;
    Kind wrote;  // a local completion's write
  };

  static uint64_t delivery(Kind kind, uint64_t low_bits) {
    return (static_cast<uint64_t>(kind) << 32) | low_bits;
  }
  // When an immediate of `kind` for `seq` was last handed to the
  // connection; 0 when never.
  uint64_t delivered(Kind kind, uint64_t seq) const {
    const auto it = delivered_.find(delivery(kind, seq & kSeqMask));
    return it == delivered_.end() ? 0 : it->second;
  }

  const Registration* registration(uint64_t key) const {
    if (key < kFirstKey || key - kFirstKey >= registrations_.size()) return nullptr;
    return &registrations_[key - kFirstKey];
  }

  // ---- our writes, as the peer receives them ----

  // A message (or its ready-to-send header) into its slot of the peer's inbox.
  void write_message(const uint8_t* src, size_t bytes, uint64_t address, uint64_t key,
                     uint64_t seq) {
    if (seq != next_header_ || seq >= sent_.size()) {
      bug("a message written out of order or before it was sent");
    }
    if (seq >= max_credit_ + layout_.slots) bug("a message written before the peer freed its slot");
    if (key != kPeerInboxKey || address != inbox_address() + layout_.slot(seq) ||
        bytes < sizeof(Header) || bytes > layout_.stride) {
      bug("a message written outside its slot");
    }
    Sent& message = sent_[seq];
    Header header;
    std::memcpy(&header, src, sizeof(header));
    if (header.length != message.bytes.size() || header.operation != want_.operation ||
        header.rendezvous > 1) {
      bug("a message header that does not describe the message");
    }
    if (header.freed > free_below() || header.freed < last_credit_) {
      bug("a header crediting slots that were not freed, or fewer than before");
    }
    last_credit_ = header.freed;
    const size_t n = message.bytes.size();
    if (header.rendezvous) {
      if (message.staged || bytes != sizeof(Header)) bug("a ready-to-send that is not one");
    } else if (bytes != sizeof(Header) + n || n > layout_.slot_bytes ||
               (n > 0 && std::memcmp(src + sizeof(Header), message.bytes.data(), n) != 0)) {
      bug("an eager message that is not the message");
    }
    message.header_written = true;
    message.rendezvous = header.rendezvous != 0;
    ++next_header_;
    std::memcpy(&inbox_[layout_.slot(seq)], src, bytes);
  }

  // Our clear-to-send for the message we receive: into its entry of the
  // peer's inbox, naming the receive's destination under a key of ours that
  // covers it.
  void write_clear_to_send(const uint8_t* src, size_t bytes, uint64_t address, uint64_t key,
                           uint64_t seq) {
    if (key != kPeerInboxKey || address != inbox_address() + layout_.cts(seq) ||
        bytes != sizeof(ClearToSend)) {
      bug("a clear-to-send written outside its entry");
    }
    if (seq > pos_) bug("a clear-to-send for a message the receiver has not reached");
    ClearToSend entry;
    std::memcpy(&entry, src, sizeof(entry));
    if (entry.seq != seq || entry.operation != want_.operation || entry.length != want_.length) {
      bug("a clear-to-send that does not describe the receive");
    }
    if (entry.length > 0) {
      const uintptr_t destination =
          want_.into_slot ? reinterpret_cast<uintptr_t>(ours_ + layout_.slot(seq) + sizeof(Header))
                          : reinterpret_cast<uintptr_t>(dst_);
      const Registration* region = registration(entry.key);
      if (entry.address != destination || !region ||
          !inside(entry.address, entry.length, region->base, region->bytes)) {
        bug("a clear-to-send naming memory that is not the receive's destination");
      }
    }
    our_cts_tick_[seq] = tick_;
    std::memcpy(&inbox_[layout_.cts(seq)], src, bytes);
  }

  // A rendezvous payload: the message, exactly where the peer's entry for
  // it says, once the peer cleared it.
  void write_payload(const uint8_t* src, size_t bytes, uint64_t address, uint64_t key,
                     uint64_t seq) {
    if (seq >= sent_.size() || !sent_[seq].header_written || !sent_[seq].rendezvous ||
        sent_[seq].payload_written) {
      bug("a payload that is not owed");
    }
    Sent& message = sent_[seq];
    if (src != message.bytes.data() || bytes != message.bytes.size()) {
      bug("a payload that is not the message");
    }
    const uint64_t cleared = delivered(Kind::ClearToSend, seq);
    if (cleared == 0) bug("a payload written before the peer cleared it");
    ClearToSend entry;
    std::memcpy(&entry, &shadow_[layout_.cts(seq)], sizeof(entry));
    if (address != entry.address || key != entry.key) {
      bug("a payload written elsewhere than the peer's clear-to-send says");
    }
    // Unchanged since its immediate: the sender took it then, so it asked
    // for this message.
    if (entry_tick_[seq % layout_.slots] < cleared &&
        (entry.length != bytes || entry.operation != want_.operation)) {
      bug("a payload for a clear-to-send that asked for another message");
    }
    message.payload_written = true;
    // What the peer named is its own business: a NIC refuses a write outside
    // its regions, and the connection breaks.
    uint8_t* base = nullptr;
    size_t size = 0;
    if (key == kPeerInboxKey) {
      base = inbox_.data();
      size = inbox_.size();
    } else if (key == kPeerBufferKey) {
      base = buffer_.base();
      size = PeerBuffer::kBytes;
    }
    if (!base || !inside(address, bytes, reinterpret_cast<uintptr_t>(base), size)) {
      failed_ = true;
      return;
    }
    std::memcpy(reinterpret_cast<void*>(address), src, bytes);
  }

  void write_credit(const uint8_t* src, size_t bytes, uint64_t address, uint64_t key,
                    uint64_t low_bits) {
    if (key != kPeerInboxKey || address != inbox_address() + layout_.credit() ||
        bytes != sizeof(uint64_t)) {
      bug("a credit written outside the credit word");
    }
    uint64_t freed;
    std::memcpy(&freed, src, sizeof(freed));
    if ((freed & kSeqMask) != low_bits || freed <= last_credit_ || freed > free_below()) {
      bug("a credit for slots that were not freed");
    }
    last_credit_ = freed;
    std::memcpy(&inbox_[layout_.credit()], src, bytes);
  }

  // How many of the peer's messages we may have freed: the receiver is at
  // most at pos_ + 1 (a receive frees its slot before it returns), and the
  // oldest message held is not free.
  uint64_t free_below() const { return held_.empty() ? pos_ + 1 : held_.front(); }

  // ---- the peer's script ----

  // Runs the script up to its next yield, or to its end.
  void act() {
    while (!script_.done()) {
      uint8_t tag = 0;
      script_.get(tag);
      switch (tag % kOps) {
        case kWrite: {
          uint32_t offset = 0;
          uint16_t count = 0;
          if (script_.get(offset) && script_.get(count)) {
            const size_t at = offset % layout_.half_bytes;
            write_ours(at, std::min({size_t{count}, layout_.half_bytes - at, script_.left()}));
          }
          break;
        }
        case kPost: post(); break;
        case kSignal: {
          uint8_t kind = 0;
          uint16_t seq = 0;
          if (script_.get(kind) && script_.get(seq)) signal(static_cast<Kind>(kind % 5), seq);
          break;
        }
        case kImmediate: {
          uint32_t imm = 0;
          if (script_.get(imm)) queue_.push_back({{Completion::Kind::Remote, 0, imm}, Kind{}});
          break;
        }
        case kComplete: {
          uint8_t index = 0;
          if (script_.get(index) && !outstanding_.empty()) {
            const auto it = outstanding_.begin() + index % outstanding_.size();
            queue_.push_back({{Completion::Kind::Local, it->id, 0}, it->kind});
            outstanding_.erase(it);
          }
          break;
        }
        case kClearToSend: clear_to_send(); break;
        case kPayload: payload(); break;
        case kSend: {
          uint8_t flags = 0;
          uint32_t length = 0;
          if (script_.get(flags) && script_.get(length)) {
            send(length % (2 * layout_.slot_bytes + 2), (flags & 1) != 0);
          }
          break;
        }
        case kSendsComplete:
          if (conn_->sends_complete()) check_sends_complete();
          break;
        case kYield: {
          uint8_t count = 0;
          script_.get(count);
          allowance_ = count % 16;
          return;
        }
        case kRelease:
          if (!held_.empty()) {
            held_.pop_front();  // first: the connection frees its slot before returning
            conn_->release_recv();
          }
          break;
      }
    }
  }

  void signal(Kind kind, uint64_t seq) {
    queue_.push_back({{Completion::Kind::Remote, 0, weft::rdma_wire::immediate(kind, seq)}, kind});
  }

  // The script's next `bytes` into our inbox at `offset`, noting which
  // headers and clear-to-send entries they touch.
  void write_ours(size_t offset, size_t bytes) {
    if (!script_.take(&shadow_[offset], bytes)) return;
    std::memcpy(ours_ + offset, &shadow_[offset], bytes);
    note_written(offset, bytes);
  }
  void note_written(size_t offset, size_t bytes) {
    ++tick_;
    const auto overlaps = [&](size_t at, size_t n) {
      return offset < at + n && at < offset + bytes;
    };
    for (size_t i = 0; i < layout_.slots; ++i) {
      if (overlaps(layout_.slot(i), sizeof(Header))) header_tick_[i] = tick_;
      if (overlaps(layout_.cts(i), sizeof(ClearToSend))) entry_tick_[i] = tick_;
    }
  }

  void post() {
    uint8_t flags = 0;
    if (!script_.get(flags)) return;
    const Header header{want_.length, want_.operation, flags & 1u, max_credit_};
    const size_t at = layout_.slot(posted_);
    std::memcpy(&shadow_[at], &header, sizeof(header));
    std::memcpy(ours_ + at, &header, sizeof(header));
    note_written(at, sizeof(header));
    if (!header.rendezvous) {
      write_ours(at + sizeof(header), std::min({want_.length, layout_.slot_bytes, script_.left()}));
    }
    signal(Kind::Eager, posted_++);
  }

  void clear_to_send() {
    uint8_t seq = 0, flags = 0;
    uint32_t offset = 0;
    if (!script_.get(seq) || !script_.get(flags) || !script_.get(offset)) return;
    ClearToSend entry{buffer_.address(offset), kPeerBufferKey,
                      seq < sent_.size() ? sent_[seq].bytes.size() : 0, seq, want_.operation};
    switch (flags & 3) {
      case 1:
        entry.address = inbox_address() + offset % inbox_.size();
        entry.key = kPeerInboxKey;
        break;
      case 2: entry.key = kPeerBufferKey + 1; break;
    }
    uint32_t length = 0;
    if ((flags & 4) && !script_.get(length)) return;
    if (flags & 4) entry.length = length;
    if (flags & 8) entry.operation = ~want_.operation;
    const size_t at = layout_.cts(seq);
    std::memcpy(&shadow_[at], &entry, sizeof(entry));
    std::memcpy(ours_ + at, &entry, sizeof(entry));
    note_written(at, sizeof(entry));
    signal(Kind::ClearToSend, seq);
  }

  // The peer writes (part of) its message seq's payload where our entry for
  // it says, as far as the NIC lets it: only inside a live region of ours.
  void payload() {
    uint8_t seq = 0;
    if (!script_.get(seq)) return;
    ClearToSend entry;
    std::memcpy(&entry, &inbox_[layout_.cts(seq)], sizeof(entry));
    const size_t n = std::min<uint64_t>(entry.length, script_.left());
    std::vector<uint8_t> bytes(n);
    script_.take(bytes.data(), n);
    const Registration* region = registration(entry.key);
    if (n > 0 &&
        (!region || !region->live || !inside(entry.address, n, region->base, region->bytes))) {
      failed_ = true;  // the peer's write fails, and the connection with it
      return;
    }
    if (n > 0) {
      const auto inbox = reinterpret_cast<uintptr_t>(ours_);
      const auto dst = reinterpret_cast<uintptr_t>(dst_);
      // Our clear-to-send entries were checked to name these only.
      if (inside(entry.address, n, inbox, layout_.half_bytes)) {
        std::memcpy(&shadow_[entry.address - inbox], bytes.data(), n);
        note_written(entry.address - inbox, n);
      } else if (inside(entry.address, n, dst, dst_model_.size())) {
        std::memcpy(&dst_model_[entry.address - dst], bytes.data(), n);
      } else {
        bug("a clear-to-send of ours named memory outside the inbox and the destination");
      }
      std::memcpy(reinterpret_cast<void*>(entry.address), bytes.data(), n);
    }
    signal(Kind::Payload, seq);
  }

  // The application sends message sent_.size() of `bytes` bytes.
  void send(size_t bytes, bool staged) {
    if (sent_.size() >= kMaxSends || sent_bytes_ + bytes > kMaxSentBytes) return;
    Sent message{std::vector<uint8_t>(bytes), staged && bytes <= layout_.slot_bytes};
    for (size_t i = 0; i < bytes; ++i) {
      message.bytes[i] = static_cast<uint8_t>(i * 131 + sent_.size() * 17 + (i >> 8));
    }
    // Recorded first: the connection may write it before the call returns.
    sent_.push_back(std::move(message));
    const std::vector<uint8_t>& payload = sent_.back().bytes;
    bool posted = false;
    if (sent_.back().staged) {
      if (void* slot = conn_->send_slot()) {
        if (bytes > 0) std::memcpy(slot, payload.data(), bytes);
        conn_->post_send(bytes);
        posted = true;
      }
    } else {
      posted = conn_->send_from(payload.data(), bytes);
    }
    if (posted) {
      sent_bytes_ += bytes;
    } else {
      sent_.pop_back();
    }
  }

  // sends_complete() said so: every message and payload was written and
  // its completion handed back.
  void check_sends_complete() const {
    for (const Sent& message : sent_) {
      if (!message.header_written || (message.rendezvous && !message.payload_written)) {
        bug("sends complete with a message or payload not written");
      }
    }
    const auto carries_message = [](Kind kind) {
      return kind == Kind::Eager || kind == Kind::Payload;
    };
    for (const Posted& write : outstanding_) {
      if (carries_message(write.kind)) bug("sends complete with a write not completed");
    }
    for (const Queued& queued : queue_) {
      if (queued.completion.kind == Completion::Kind::Local && carries_message(queued.wrote)) {
        bug("sends complete with a completion not taken");
      }
    }
  }

  const Expected want_;
  const Layout layout_;
  const bool local_registration_;
  const bool hold_;
  const size_t queue_depth_;
  Script script_;
  PeerBuffer& buffer_;
  weft::Connection* conn_ = nullptr;

  std::vector<uint8_t> inbox_;  // the peer's, which our writes land in
  // Ours: every registration by key, the inbox (the first one's first
  // half), what it must hold, and recv_into's destination with what it must
  // hold (the peer's payload writes on a pattern).
  std::vector<Registration> registrations_;
  uint8_t* ours_ = nullptr;
  std::vector<uint8_t> shadow_;
  uint8_t* dst_ = nullptr;
  std::vector<uint8_t> dst_model_;

  std::deque<Queued> queue_;         // completions for the connection's next polls
  std::vector<Posted> outstanding_;  // our writes not completed yet
  bool failed_ = false;              // a write was refused

  // Events in order: when each immediate was last delivered, when the peer
  // last wrote each header and clear-to-send entry of our inbox, and when
  // we wrote our clear-to-send for each message.
  uint64_t tick_ = 0;
  std::map<uint64_t, uint64_t> delivered_;
  std::vector<uint64_t> header_tick_, entry_tick_;
  std::map<uint64_t, uint64_t> our_cts_tick_;

  std::deque<Sent> sent_;
  size_t sent_bytes_ = 0;
  uint64_t next_header_ = 0;  // the next message ours to write
  uint64_t max_credit_ = 0;   // the most slots the peer said it freed
  uint64_t last_credit_ = 0;  // the slots we said we freed

  uint64_t pos_ = 0;           // the message received now
  uint64_t posted_ = 0;        // messages posted by kPost
  std::deque<uint64_t> held_;  // messages recv_slot returned that the application holds
  bool eager_seen_ = false, rendezvous_seen_ = false;
  unsigned allowance_ = 0;
};

FakeRegion::~FakeRegion() { peer_.deregister(key_); }

// The test double of RdmaEndpoint the connection runs over: every call goes
// to the peer.
class FakeEndpoint : public weft::RdmaEndpoint {
 public:
  explicit FakeEndpoint(Peer& peer) : peer_(peer) {}
  std::unique_ptr<MemoryRegion> register_memory(void* base, size_t bytes) override {
    return peer_.register_memory(base, bytes);
  }
  bool needs_local_registration() const override { return peer_.needs_local_registration(); }
  bool write_with_imm(const void* src, size_t bytes, const MemoryRegion* local,
                      uint64_t remote_address, uint64_t remote_key, uint32_t imm, uint64_t id,
                      bool /*local_completion*/) override {
    return peer_.write_with_imm(src, bytes, local, remote_address, remote_key, imm, id);
  }
  int poll(Completion* out, int max) override { return peer_.poll(out, max); }
  std::string closed_by_peer() override { return peer_.closed_by_peer(); }
  void close() override {}
  size_t max_write_bytes() const override { return kMaxSentBytes; }
  std::string name() const override { return "fake"; }

 private:
  Peer& peer_;
};

enum class Try { kGot, kNothing, kFailed };

// One try at the next message: got it (into `dst`, or at `slot` for
// recv_slot, not yet released), found nothing yet, or the connection failed.
Try try_receive(weft::Connection& conn, const Expected& want, uint8_t* dst, const void*& slot) {
  try {
    if (want.into_slot) {
      if ((slot = conn.recv_slot(want.length)) != nullptr) return Try::kGot;
    } else if (conn.recv_into(dst, want.length)) {
      return Try::kGot;
    }
    conn.progress();
    return Try::kNothing;
  } catch (const weft::Error&) {
    return Try::kFailed;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < kSetupBytes || size - kSetupBytes > kMaxScript) return 0;
  uint64_t operation;
  std::memcpy(&operation, data, sizeof(operation));
  const uint8_t flags = data[10];
  const Expected want{operation,
                      (data[8] | ((data[9] & 0x0f) << 8)) + ((flags & 0x20) ? kEagerCopyBytes : 0),
                      (flags & 1) != 0};
  // 0: the expected length (at least a byte).
  static const size_t kSlotBytes[] = {0, 64, 4096, kEagerCopyBytes + 1024};
  const size_t slot_bytes = kSlotBytes[(flags >> 3) & 3];
  const Layout layout(slot_bytes > 0 ? slot_bytes : std::max<size_t>(want.length, 1),
                      1 + ((flags >> 1) & 3));
  static PeerBuffer buffer;

  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) return 0;
  weft::Socket control(fds[0]), control_peer(fds[1]);
  Peer peer(want, layout, (flags & 0x40) != 0, (flags & 0x80) != 0, 1 + (data[11] & 7),
            Script(data + kSetupBytes, size - kSetupBytes), buffer);
  // The peer's Hello first: the connection sends its own, then reads this.
  const weft::Deadline deadline(kSetupTimeoutS);
  const weft::rdma_wire::Hello theirs{peer.inbox_address(), kPeerInboxKey, layout.slot_bytes,
                                      layout.slots};
  control_peer.send_all(&theirs, sizeof(theirs), deadline, "the peer's Hello");
  const weft::RdmaOptions options{layout.slot_bytes, static_cast<int>(layout.slots)};
  auto conn = weft::make_rdma_connection(std::make_unique<FakeEndpoint>(peer), control, options,
                                         kSetupTimeoutS, "rdma");
  weft::rdma_wire::Hello ours;
  control_peer.recv_all(&ours, sizeof(ours), deadline, "our Hello");
  std::vector<uint8_t> dst(want.into_slot ? 0 : want.length);
  peer.connected(*conn, ours, dst.data(), dst.size());
  conn->set_operation(want.operation);

  for (uint64_t pos = 0;; ++pos) {
    peer.start_message(pos);
    for (;;) {
      bool acting;
      try {
        acting = peer.before_try();  // the application's calls in it may throw too
      } catch (const weft::Error&) {
        peer.finish();
        return 0;
      }
      const void* slot = nullptr;
      const Try result = try_receive(*conn, want, dst.data(), slot);
      if (result == Try::kFailed) {
        peer.finish();
        return 0;
      }
      if (result == Try::kGot) {
        peer.check_received(want.into_slot ? static_cast<const uint8_t*>(slot) : dst.data(), slot);
        if (want.into_slot && !peer.hold()) conn->release_recv();
        break;
      }
      if (!acting) {
        // The peer is done: whatever it delivered in full must have been taken.
        if (peer.complete()) bug("a receive that does not take a message that arrived");
        peer.finish();
        return 0;
      }
      peer.receiver_waits();
    }
  }
}
