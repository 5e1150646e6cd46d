// Layout of one single-producer single-consumer FIFO in a shared-memory
// segment. The receiver of a direction creates and initializes the segment;
// the sender maps it and checks its FifoInfo.
//
//   FifoControl   info | head | tail | closed flags | doorbell, each on its
//                 own 128 bytes
//   SlotHeader[]  one 64-byte header per message in flight: length, kind,
//                 address, and messages of up to 32 bytes
//   slot data     `slots` x stride bytes, each slot 4096-aligned
//
// head counts messages posted (written only by the sender), tail counts
// messages consumed (written only by the receiver); header i % headers holds
// message i. Only messages that travel in slot data take a slot, in order:
// data_tail counts those consumed. There are more headers than slots, so a
// sender runs further ahead with small messages (a broadcast's root, a
// reduce's leaves) than with large ones. 128-byte spacing keeps the
// adjacent-line prefetcher from pairing lines written by different processes.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "core/transport/shm/doorbell.h"

namespace weft::shm {

constexpr size_t kFifoAlign = 128;
constexpr size_t kSlotAlign = 4096;
constexpr uint64_t kFifoMagic = 0x6f6669666d687377ULL;  // "wshmfifo"
constexpr uint32_t kFifoVersion = 4;
// Messages that may be in flight at once, at the least: a broadcast's root
// that blocks on a full FIFO with its receivers sharing its CPU waits for the
// scheduler's turns, 50-400 us here, where 20 small calls take 20-60 us.
constexpr size_t kLeastHeaders = 64;

static_assert(std::atomic<uint64_t>::is_always_lock_free, "shared counters need lock-free atomics");
static_assert(std::atomic<uint32_t>::is_always_lock_free, "shared flags need lock-free atomics");

// Written once by the creator before the name is sent; read-only afterwards.
struct FifoInfo {
  uint64_t magic;
  uint32_t version;
  uint32_t slots;
  uint32_t headers;
  uint32_t reserved;
  uint64_t slot_bytes;
  uint64_t total_bytes;
};

struct FifoControl {
  alignas(kFifoAlign) FifoInfo info;
  alignas(kFifoAlign) std::atomic<uint64_t> head;
  alignas(kFifoAlign) std::atomic<uint64_t> tail;
  std::atomic<uint64_t> data_tail;  // stored before tail, by the same writer
  alignas(kFifoAlign) std::atomic<uint32_t> sender_closed;
  alignas(kFifoAlign) std::atomic<uint32_t> receiver_closed;
  // Rung on every change of head or tail, and on closing (doorbell.h).
  alignas(kFifoAlign) Doorbell doorbell;
};

enum SlotKind : uint32_t {
  kSlotInline = 1,     // the message is in the slot's data
  kSlotReference = 2,  // the message is at `address` in the sender (process_vm_readv)
  kSlotInHeader = 3,   // the message is the header's `payload`
};

// A message this small travels in its slot's header: the receiver reads that
// line anyway, so it takes one cache line from the sender's core where the
// slot's data would take two.
constexpr size_t kHeaderPayloadBytes = 32;

// Written by the sender before it publishes head; read by the receiver after.
// Only kSlotInline messages take a slot of data.
struct alignas(64) SlotHeader {
  uint64_t length;
  uint32_t kind;
  uint32_t reserved;
  uint64_t address;
  uint64_t operation;                                      // op_signature.h
  alignas(32) unsigned char payload[kHeaderPayloadBytes];  // kSlotInHeader
};
static_assert(sizeof(SlotHeader) == 64, "a slot header is one cache line");

struct FifoLayout {
  size_t slots = 0;
  size_t headers = 0;  // max(slots, kLeastHeaders)
  size_t slot_bytes = 0;
  size_t stride = 0;  // slot_bytes rounded up to kSlotAlign
  size_t headers_offset = 0;
  size_t data_offset = 0;
  size_t total_bytes = 0;

  // Throws InvalidArgument when the sizes are zero or absurd.
  static FifoLayout compute(int slots, size_t slot_bytes);
};

// Pointers into one mapped FIFO.
class FifoView {
 public:
  FifoView() = default;
  FifoView(void* base, const FifoLayout& layout)
      : control_(static_cast<FifoControl*>(base)),
        headers_(reinterpret_cast<SlotHeader*>(static_cast<char*>(base) + layout.headers_offset)),
        data_(static_cast<char*>(base) + layout.data_offset),
        stride_(layout.stride) {}

  FifoControl& control() const { return *control_; }
  SlotHeader& header(size_t index) const { return headers_[index]; }
  char* data(size_t index) const { return data_ + index * stride_; }

 private:
  FifoControl* control_ = nullptr;
  SlotHeader* headers_ = nullptr;
  char* data_ = nullptr;
  size_t stride_ = 0;
};

// Constructs the control block and headers in fresh (zeroed) memory.
void init_fifo(void* base, const FifoLayout& layout);
// Checks a mapped FIFO created by the peer against the layout we expect;
// returns an empty string when it matches, else what differs.
const char* check_fifo(const void* base, const FifoLayout& layout);

}  // namespace weft::shm
