// libFuzzer target: the shared-memory transport's receiving side reading
// whatever its peer process writes into their FIFO: slot headers (length,
// kind, address, operation, the in-header payload), slot data, the head
// counter, the closed flags and the doorbells. Each input sets up a real
// connection (make_shm_connection, over a socketpair as the control socket)
// against a peer half of the handshake run by this target, which then plays
// the peer through its mapping of the FIFO.
//
// The input's first 11 bytes say what the receiver expects (an operation
// signature of 8 bytes, a length up to 64 KiB, and in a flags byte whether it
// stages through recv_slot or reads into its own buffer, whether each side
// asks for sends by reference, and the FIFO's slots); the rest is the peer's
// script (see Op), run in rounds while the receiver waits, and at its end the
// peer closes the FIFO. Messages are received one after another until one
// fails: each must either raise a weft::Error or return exactly the bytes the
// peer published for a header naming that length and operation. Anything
// else (a success the FIFO does not hold, a read out of bounds, a claimed
// size allocated, a receive that neither ends nor fails) is a bug, and the
// target aborts.
//
// A message by reference (kSlotReference) is read with process_vm_readv from
// the peer's pid, which is this process: the address the script gives is an
// offset into a buffer of this target between two regions that cannot be
// read, so the target knows what a correct read returns, and one that leaves
// the buffer must fail. The receiver reads references only from a peer that
// asked for them in the handshake and whose memory its probe could read,
// whatever its own ShmOptions::cma says (that option decides how it sends).
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/bootstrap/socket.h"
#include "core/common/error.h"
#include "core/transport/shm/doorbell.h"
#include "core/transport/shm/fifo_layout.h"
#include "core/transport/shm/shm_connection.h"
#include "core/transport/shm/shm_handshake.h"
#include "fuzz_script.h"

namespace {

using weft::shm::FifoView;
using weft::shm::SlotHeader;

// Operation (8 bytes), length (2), flags (1): bit 0 receives through
// recv_slot, bit 1 the receiver and bit 2 the peer ask to send by reference,
// bits 3-4 are the slots less one and bits 5-6 pick the slot size (see connect).
constexpr size_t kSetupBytes = 11;
constexpr int kChannel = 0;
constexpr double kSetupTimeoutS = 10.0;  // only a broken setup takes this long
// Every poll that finds nothing lets the peer take at least one byte of its
// script (or close, at its end), after which a receive settles within two
// polls: this many is more than twice the longest script.
constexpr int kMaxPolls = 1 << 18;

struct Expected {
  uint64_t operation;
  size_t length;
  bool into_slot;
};

// What the peer's script does. Each operation is a tag byte (taken modulo
// kOps) and its operands, little-endian; an operation cut short ends the
// script.
enum Op : uint8_t {
  // index u16, length u64, kind u32, address u64, operation u64, payload 32
  // bytes: writes one slot header (index modulo the headers).
  kHeader,
  // slot u8, offset u16, count u16, count bytes: writes slot data.
  kData,
  // value u64: stores head (and posts on from there).
  kHead,
  // kind u8, address u64, then the message's bytes: posts the next message
  // as a sender would, with the expected length and operation.
  kPost,
  // flags u8: 1 sets sender_closed, 2 receiver_closed on the other
  // direction's FIFO, 4 shuts the control socket down.
  kClose,
  // count u8: the receiver tries count + 1 times (or until a try finds
  // nothing) before the peer acts again.
  kYield,
  // value u64: stores tail on the other direction's FIFO, whose receiver the
  // peer is.
  kPeerTail,
  // which u8 (1: the other direction's), rings u32, sleepers u32: overwrites
  // a doorbell, then rings it.
  kDoorbell,
  kOps,
};

// The peer's memory that references point into: kBuffer bytes of a known
// pattern between two guards that no read can reach.
class SenderMemory {
 public:
  static constexpr size_t kGuard = size_t{1} << 20;
  static constexpr size_t kBuffer = size_t{256} << 10;
  static constexpr size_t kReserve = 2 * kGuard + kBuffer;

  SenderMemory() {
    void* p =
        ::mmap(nullptr, kReserve, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) std::abort();
    reserve_ = static_cast<uint8_t*>(p);
    if (::mprotect(reserve_ + kGuard, kBuffer, PROT_READ | PROT_WRITE) != 0) std::abort();
    uint32_t x = 2463534242u;  // xorshift: no period a shifted read could match
    for (size_t i = 0; i < kBuffer; ++i) {
      x ^= x << 13;
      x ^= x >> 17;
      x ^= x << 5;
      reserve_[kGuard + i] = static_cast<uint8_t>(x);
    }
  }

  // The address the peer publishes for the script's `field`: an offset from
  // the buffer's start, wrapping around the reservation into the guards. A
  // read starts in one or the other, and no read is long enough to leave the
  // reservation.
  uint64_t address(uint64_t field) const {
    return reinterpret_cast<uintptr_t>(reserve_) + (kGuard + field % kReserve) % kReserve;
  }

  // The `length` bytes a read at `address` returns, or nullptr where it must
  // fail.
  const uint8_t* read(uint64_t address, size_t length) const {
    const uint8_t* buffer = reserve_ + kGuard;
    if (length == 0) return buffer;  // nothing to read, nothing to fail
    const uint64_t offset = address - reinterpret_cast<uintptr_t>(buffer);
    if (offset > kBuffer || length > kBuffer - offset) return nullptr;
    return buffer + offset;
  }

 private:
  uint8_t* reserve_ = nullptr;
};

// What the FIFO holds for one receive: its bytes (nullptr where the receive
// must fail) and whether it takes a slot of data.
struct Message {
  const uint8_t* bytes = nullptr;
  bool inline_slot = false;
};

// The peer: writes what its script says into the FIFO the connection
// receives from, and keeps a copy of everything it wrote there (the receiver
// writes none of it) to tell what each receive must return.
class HostilePeer {
 public:
  HostilePeer(weft::shm::Endpoints& ends, weft::Socket& control, const SenderMemory& memory,
              const Expected& want, Script script)
      : layout_(ends.layout),
        fifo_(ends.outgoing.data(), ends.layout),
        back_(ends.incoming.data(), ends.layout),
        control_(control),
        memory_(memory),
        references_agreed_(ends.peer_reads_us),
        want_(want),
        script_(script),
        headers_(layout_.headers),
        data_(layout_.slots * layout_.stride) {}

  // Before each try of the receiver: the peer's next round, once the
  // receiver has used the tries the last one allowed.
  void before_try() {
    if (allowance_ == 0) {
      act();
    } else {
      --allowance_;
    }
  }
  // The receiver found nothing: the peer acts before its next try.
  void receiver_waits() { allowance_ = 0; }

  // What the FIFO holds for the receive of message `pos` when `inlines`
  // messages before it took slot data.
  Message message_at(uint64_t pos, uint64_t inlines) const {
    if (want_.length > layout_.slot_bytes) return {};
    // Published: head was stored past it, by at most the headers there are.
    const auto head = heads_.upper_bound(pos);
    if (head == heads_.end() || *head - pos > layout_.headers) return {};
    const SlotHeader& header = headers_[pos % layout_.headers];
    if (header.length != want_.length || header.operation != want_.operation) return {};
    switch (header.kind) {
      case weft::shm::kSlotInline: return {&data_[inlines % layout_.slots * layout_.stride], true};
      case weft::shm::kSlotInHeader:
        if (want_.length > weft::shm::kHeaderPayloadBytes) return {};
        return {header.payload, false};
      case weft::shm::kSlotReference:
        if (!references_agreed_) return {};
        return {memory_.read(header.address, want_.length), false};
      default: return {};
    }
  }

 private:
  // Runs the script up to its next yield, or to its end, where the peer
  // closes the FIFO (as a process that exits would).
  void act() {
    while (!script_.done()) {
      uint8_t tag = 0;
      script_.get(tag);
      switch (tag % kOps) {
        case kHeader: {
          uint16_t index = 0;
          SlotHeader header{};
          if (script_.get(index) && script_.get(header.length) && script_.get(header.kind) &&
              script_.get(header.address) && script_.get(header.operation) &&
              script_.take(header.payload, sizeof(header.payload))) {
            header.address = memory_.address(header.address);
            write_header(index % layout_.headers, header);
          }
          break;
        }
        case kData: {
          uint8_t slot = 0;
          uint16_t offset = 0, count = 0;
          if (script_.get(slot) && script_.get(offset) && script_.get(count)) {
            const size_t at = offset % layout_.stride;
            write_data(slot % layout_.slots, at, std::min<size_t>(count, layout_.stride - at));
          }
          break;
        }
        case kHead: {
          uint64_t value = 0;
          if (script_.get(value)) store_head(value);
          break;
        }
        case kPost: post(); break;
        case kClose: {
          uint8_t flags = 0;
          if (script_.get(flags)) close(flags);
          break;
        }
        case kYield: {
          uint8_t count = 0;
          script_.get(count);
          allowance_ = count;
          return;
        }
        case kPeerTail: {
          uint64_t value = 0;
          if (script_.get(value)) {
            back_.control().tail.store(value, std::memory_order_release);
            weft::shm::ring(back_.control().doorbell);
          }
          break;
        }
        case kDoorbell: {
          uint8_t which = 0;
          uint32_t rings = 0, sleepers = 0;
          if (script_.get(which) && script_.get(rings) && script_.get(sleepers)) {
            weft::shm::Doorbell& bell =
                (which & 1) ? back_.control().doorbell : fifo_.control().doorbell;
            bell.rings.store(rings, std::memory_order_relaxed);
            bell.sleepers.store(sleepers, std::memory_order_relaxed);
            weft::shm::ring(bell);
          }
          break;
        }
      }
    }
    if (!closed_) close(1);
    closed_ = true;
  }

  // The next message as a sender posts it: its header (the expected length
  // and operation, the script's kind and address), its bytes from the script
  // where its kind says they travel, and head past it.
  void post() {
    uint8_t kind = 0;
    uint64_t address = 0;
    if (!script_.get(kind) || !script_.get(address)) return;
    SlotHeader header{};
    header.length = want_.length;
    header.kind = kind;
    header.address = memory_.address(address);
    header.operation = want_.operation;
    if (kind == weft::shm::kSlotInHeader) {
      const size_t bytes = std::min({want_.length, sizeof(header.payload), script_.left()});
      script_.take(header.payload, bytes);
    } else if (kind == weft::shm::kSlotInline) {
      write_data(data_posted_++ % layout_.slots, 0,
                 std::min({want_.length, layout_.slot_bytes, script_.left()}));
    }
    write_header(posted_ % layout_.headers, header);
    store_head(posted_ + 1);
  }

  void write_header(size_t index, const SlotHeader& header) {
    headers_[index] = header;
    std::memcpy(&fifo_.header(index), &header, sizeof(header));
  }

  // The script's next `bytes` into slot `slot` at `offset`.
  void write_data(size_t slot, size_t offset, size_t bytes) {
    uint8_t* copy = &data_[slot * layout_.stride + offset];
    if (!script_.take(copy, bytes)) return;
    std::memcpy(fifo_.data(slot) + offset, copy, bytes);
  }

  void store_head(uint64_t value) {
    heads_.insert(value);
    posted_ = value;
    fifo_.control().head.store(value, std::memory_order_release);
    weft::shm::ring(fifo_.control().doorbell);
  }

  void close(uint8_t flags) {
    if (flags & 1) {
      fifo_.control().sender_closed.store(1, std::memory_order_release);
      weft::shm::ring(fifo_.control().doorbell);
    }
    if (flags & 2) {
      back_.control().receiver_closed.store(1, std::memory_order_release);
      weft::shm::ring(back_.control().doorbell);
    }
    if (flags & 4) control_.shutdown();
  }

  const weft::shm::FifoLayout layout_;
  const FifoView fifo_;  // the connection's incoming FIFO, which the peer sends through
  const FifoView back_;  // the other direction, which the peer receives from
  weft::Socket& control_;
  const SenderMemory& memory_;
  // The receiver told us it can read our memory (we asked, its probe worked):
  // only then may a message be a reference.
  const bool references_agreed_;
  const Expected want_;
  Script script_;
  // The peer's copy of the headers and slot data it wrote, and every value it
  // stored in head.
  std::vector<SlotHeader> headers_;
  std::vector<uint8_t> data_;
  std::set<uint64_t> heads_;
  uint64_t posted_ = 0;
  uint64_t data_posted_ = 0;
  unsigned allowance_ = 0;
  bool closed_ = false;
};

enum class Try { kGot, kNothing, kFailed };

// One try at the next message: got it into `out`, found nothing yet (after
// progress() and a sleep that ends at once), or the connection failed.
Try try_receive(weft::Connection& conn, const Expected& want, std::vector<uint8_t>& out) {
  try {
    if (want.into_slot) {
      if (const void* got = conn.recv_slot(want.length)) {
        if (want.length > 0) std::memcpy(out.data(), got, want.length);
        conn.release_recv();
        return Try::kGot;
      }
    } else if (conn.recv_into(out.data(), want.length)) {
      return Try::kGot;
    }
    conn.progress();
    conn.sleep_until_peer(true, std::chrono::nanoseconds(0));
    return Try::kNothing;
  } catch (const weft::Error&) {
    return Try::kFailed;
  }
}

// Both halves of the handshake at once (each waits for the other's hello):
// the connection under test's on a thread, the peer's here, with the slots
// the flags choose (a size of 0 there: the expected length) and each side's
// wish to send by reference. Both sides use valid, equal settings, so a
// failure is a bug (or /dev/shm filled up by segments left behind).
std::unique_ptr<weft::Connection> connect(weft::Socket& control, weft::Socket& control_peer,
                                          uint8_t flags, const Expected& want,
                                          weft::shm::Endpoints& peer_ends) {
  static const size_t kSlotBytes[] = {0, 4096, 64 << 10, 33};
  const size_t slot_bytes = kSlotBytes[(flags >> 5) & 3];
  weft::ShmOptions options{slot_bytes > 0 ? slot_bytes : std::max<size_t>(want.length, 1),
                           1 + ((flags >> 3) & 3), (flags & 2) != 0, 1};
  weft::ShmOptions peer_options = options;
  peer_options.cma = (flags & 4) != 0;
  std::unique_ptr<weft::Connection> conn;
  std::string failed;
  std::thread under_test([&] {
    try {
      conn =
          weft::make_shm_connection(control, 0, 1, ::getpid(), kChannel, options, kSetupTimeoutS);
    } catch (const weft::Error& e) {
      failed = e.what();
    }
  });
  try {
    peer_ends = weft::shm::handshake(control_peer, 1, 0, ::getpid(), kChannel, peer_options,
                                     kSetupTimeoutS);
  } catch (const weft::Error& e) {
    std::fprintf(stderr, "fuzz_shm_fifo: the peer's handshake failed: %s\n", e.what());
    std::abort();
  }
  under_test.join();
  if (!conn) {
    std::fprintf(stderr, "fuzz_shm_fifo: make_shm_connection failed: %s\n", failed.c_str());
    std::abort();
  }
  return conn;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < kSetupBytes || size - kSetupBytes > (64 << 10)) return 0;
  uint64_t operation;
  std::memcpy(&operation, data, sizeof(operation));
  const Expected want{operation, static_cast<size_t>(data[8] | (data[9] << 8)),
                      (data[10] & 1) != 0};
  static const SenderMemory memory;

  int control_fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, control_fds) != 0) return 0;
  weft::Socket control(control_fds[0]), control_peer(control_fds[1]);
  weft::shm::Endpoints peer_ends;  // the peer's mappings (both names are gone already)
  auto conn = connect(control, control_peer, data[10], want, peer_ends);
  conn->set_operation(want.operation);
  HostilePeer peer(peer_ends, control_peer, memory, want,
                   Script(data + kSetupBytes, size - kSetupBytes));

  std::vector<uint8_t> got;
  for (uint64_t pos = 0, inlines = 0;; ++pos) {
    got.assign(want.length, 0);
    for (int poll = 0;; ++poll) {
      if (poll == kMaxPolls) std::abort();  // a receive that never settles
      peer.before_try();
      const Message expected = peer.message_at(pos, inlines);
      const Try result = try_receive(*conn, want, got);
      if (result == Try::kFailed) return 0;
      if (result == Try::kNothing) {
        peer.receiver_waits();
        continue;
      }
      // A success must be what the peer published for this message, byte for byte.
      if (expected.bytes == nullptr) std::abort();
      if (want.length > 0 && std::memcmp(got.data(), expected.bytes, want.length) != 0) {
        std::abort();
      }
      inlines += expected.inline_slot;
      break;
    }
  }
}
