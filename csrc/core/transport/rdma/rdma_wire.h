// What the RDMA protocol (rdma_connection.cc) writes into a peer's memory,
// and the 32-bit immediates that announce each write. Ranks share an
// architecture, so structures travel as they are.
//
// Each side registers one region: an inbox the peer writes into (its eager
// slots, its clear-to-send entries for this side's rendezvous messages, its
// credit word) and an outbox this side writes from (its own staged messages,
// clear-to-send entries and credit word). Message `seq` (counted from 0 per
// direction) takes eager slot and clear-to-send entry `seq % slots`.
#pragma once

#include <cstddef>
#include <cstdint>

namespace weft {
namespace rdma_wire {

// Precedes every message in its eager slot. A rendezvous message sends the
// header alone (ready-to-send): its payload waits for the receiver's
// clear-to-send entry naming where it goes.
struct Header {
  uint64_t length;
  uint64_t operation;   // op_signature.h
  uint64_t rendezvous;  // 1: the payload follows by clear-to-send
  uint64_t freed;       // the writer's credit for the other direction (its slots freed)
};

// Written when the receiver reaches the message, which may be before its
// ready-to-send arrived (then the sender checks length and operation against
// the message before it writes).
struct ClearToSend {
  uint64_t address;  // as the sender's write names it (RdmaEndpoint::remote_address)
  uint64_t key;
  uint64_t length;
  uint64_t seq;
  uint64_t operation;  // the receiver's, op_signature.h
};

// What an immediate announces (its top bits); the rest is a message's seq
// (or, for Credit, how many slots the receiver has freed) modulo 2^kSeqBits.
enum class Kind : uint32_t {
  Eager = 1,        // a message's header (and payload) landed in its eager slot
  ClearToSend = 2,  // the receiver wants message seq's payload
  Payload = 3,      // message seq's payload landed where clear-to-send said
  Credit = 4,       // the receiver freed eager slots (count in the low bits)
};
// An immediate no protocol write carries (kind 15): back ends that have no
// disconnect event of their own (ibverbs' RC QPs) write it to say goodbye.
constexpr uint32_t kClosingImmediate = 0xffffffff;
constexpr int kSeqBits = 28;
constexpr uint64_t kSeqMask = (uint64_t{1} << kSeqBits) - 1;

inline uint32_t immediate(Kind kind, uint64_t seq) {
  return (static_cast<uint32_t>(kind) << kSeqBits) | static_cast<uint32_t>(seq & kSeqMask);
}
inline Kind kind_of(uint32_t imm) { return static_cast<Kind>(imm >> kSeqBits); }
// The full count nearest above `known` whose low bits are `imm`'s.
inline uint64_t seq_after(uint64_t known, uint32_t imm) {
  return known + ((imm - known) & kSeqMask);
}

// Sent over the control socket once per connection, both ways.
struct Hello {
  uint64_t inbox_address;  // remote address of the inbox's first byte
  uint64_t inbox_key;
  uint64_t slot_bytes;
  uint64_t slots;
};

}  // namespace rdma_wire
}  // namespace weft
