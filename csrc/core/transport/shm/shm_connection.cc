#include "core/transport/shm/shm_connection.h"

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#endif

#include "core/common/error.h"
#include "core/common/log.h"
#include "core/reduce/cpu_reduce.h"
#include "core/transport/op_signature.h"
#include "core/transport/shm/cma.h"
#include "core/transport/shm/doorbell.h"
#include "core/transport/shm/fifo_layout.h"
#include "core/transport/shm/segment.h"
#include "core/transport/shm/shm_handshake.h"

namespace weft {
namespace {

using shm::FifoView;
using shm::SlotHeader;

constexpr auto kAcquire = std::memory_order_acquire;
constexpr auto kRelease = std::memory_order_release;

// A cheap monotonic tick count for rate limiting: the TSC where there is one
// (no syscall, ~10 ns), nanoseconds of the steady clock elsewhere.
inline uint64_t ticks() {
#if defined(__x86_64__) || defined(__i386__)
  return __rdtsc();
#else
  return static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
#endif
}

// progress() asks the control socket whether the peer is alive (a poll()
// syscall) at most once per this many ticks: 0.5-2 ms at TSC rates of 1-4 GHz.
constexpr uint64_t kSocketCheckTicks = uint64_t{1} << 21;

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

class ShmConnection final : public Connection {
 public:
  ShmConnection(Socket& control, int peer_pid, const ShmOptions& options, shm::Endpoints ends)
      : control_(control),
        ends_(std::move(ends)),
        in_(ends_.incoming.data(), ends_.layout),
        out_(ends_.outgoing.data(), ends_.layout),
        slots_(ends_.layout.slots),
        headers_(ends_.layout.headers),
        slot_bytes_(ends_.layout.slot_bytes),
        peer_pid_(peer_pid),
        use_cma_(options.cma && ends_.peer_reads_us),
        cma_min_bytes_(options.cma_min_bytes > 0 ? options.cma_min_bytes : 1) {}

  ~ShmConnection() override { shutdown(); }

  // ---- sending ----
  void* send_slot() override {
    return header_free() && data_slot_free() ? out_.data(data_index_) : nullptr;
  }

  void post_send(size_t bytes) override {
    check_size(bytes, "post_send");
    if (send_slot() == nullptr) throw InvalidArgument("shm post_send: no slot was free");
    if (fits_in_header(bytes)) {
      publish_in_header(out_.data(data_index_), bytes);
      return;
    }
    publish(shm::kSlotInline, bytes, 0);
  }

  bool send_from(const void* src, size_t bytes) override {
    check_size(bytes, "send_from");
    if (!header_free()) return false;
    if (fits_in_header(bytes)) {
      publish_in_header(src, bytes);
      return true;
    }
    if (use_cma_ && bytes >= cma_min_bytes_) {
      ref_end_ = send_pos_ + 1;
      publish(shm::kSlotReference, bytes, reinterpret_cast<uintptr_t>(src));
      return true;
    }
    if (!data_slot_free()) return false;
    reduce::copy(out_.data(data_index_), nullptr, src, bytes, false);
    publish(shm::kSlotInline, bytes, 0);
    return true;
  }

  bool sends_complete() override {
    if (sent_tail_ >= ref_end_) return true;
    sent_tail_ = out_.control().tail.load(kAcquire);
    return sent_tail_ >= ref_end_;
  }

  // ---- receiving ----
  const void* recv_slot(size_t bytes) override {
    check_size(bytes, "recv_slot");
    if (!recv_ready()) return nullptr;
    const SlotHeader& header = checked_header(bytes);
    if (header.kind != shm::kSlotReference) return received_bytes(header);
    if (bounce_pos_ != recv_pos_) {
      if (!bounce_) bounce_.reset(allocate_bounce());
      shm::cma_read(peer_pid_, header.address, bounce_.get(), bytes);
      bounce_pos_ = recv_pos_;
    }
    return bounce_.get();
  }

  void release_recv() override {
    if (!recv_ready()) throw InvalidArgument("shm release_recv: no message was received");
    consume();
  }

  bool recv_into(void* dst, size_t bytes) override { return receive(dst, bytes, false); }

  bool recv_into_streaming(void* dst, size_t bytes) override { return receive(dst, bytes, true); }

  // ---- liveness ----
  void progress() override {
    if (peer_closed()) fail_if_stuck("peer closed the shared-memory connection");
    uint64_t now = ticks();
    if (now - last_socket_check_ < kSocketCheckTicks) return;
    last_socket_check_ = now;
    if (control_.peer_closed()) fail_if_stuck("peer process is gone");
  }

  void shutdown() override {
    out_.control().sender_closed.store(1, kRelease);
    in_.control().receiver_closed.store(1, kRelease);
    shm::ring(out_.control().doorbell);
    shm::ring(in_.control().doorbell);
  }

  bool sleep_until_peer(bool receiving, std::chrono::nanoseconds timeout) override {
    shm::sleep_on(bell(receiving), [&] { return peer_acted(receiving); }, timeout);
    return true;
  }

  // A step awaits a send while it has more to send, whether or not the FIFO
  // is full (the next bytes may still have to arrive on the other side), so a
  // send side wakes this sleep only once it found the FIFO full: else the
  // tail it last saw is old, and the sleep would end at once, every round.
  bool sleep_until_either_peer(bool receiving, Connection& other, bool other_receiving,
                               std::chrono::nanoseconds timeout) override {
    auto* shm_other = dynamic_cast<ShmConnection*>(&other);
    if (shm_other == nullptr) return false;
    return shm::sleep_on_either(
        bell(receiving), shm_other->bell(other_receiving),
        [&] {
          return peer_acted_on_wait(receiving) || shm_other->peer_acted_on_wait(other_receiving);
        },
        timeout);
  }

  size_t slot_bytes() const override { return slot_bytes_; }
  size_t capacity_bytes() const override { return slots_ * slot_bytes_; }
  const char* transport_name() const override { return "shm"; }

 private:
  void check_size(size_t bytes, const char* call) const {
    if (bytes > slot_bytes_) {
      throw InvalidArgument(std::string("shm ") + call + ": message of " + std::to_string(bytes) +
                            " bytes exceeds the slot size " + std::to_string(slot_bytes_));
    }
  }

  // The FIFO whose doorbell a receiver (the incoming one) or a sender sleeps on.
  shm::Doorbell& bell(bool receiving) const {
    return receiving ? in_.control().doorbell : out_.control().doorbell;
  }

  // What ends such a sleep: a message, or (for a sender) the tail moving: a
  // free slot, or the peer having read what was sent by reference. Closing
  // either side ends it too.
  bool peer_acted(bool receiving) {
    if (closed()) return true;
    return receiving ? recv_ready() : out_.control().tail.load(kAcquire) != sent_tail_;
  }

  bool peer_acted_on_wait(bool receiving) {
    return receiving || send_full_ ? peer_acted(receiving) : closed();
  }

  bool peer_closed() const {
    return in_.control().sender_closed.load(std::memory_order_relaxed) != 0 ||
           out_.control().receiver_closed.load(std::memory_order_relaxed) != 0;
  }

  // Either side closed: the peer, or this process aborting from another
  // thread (shutdown) while the executor sleeps.
  bool closed() const {
    return peer_closed() || out_.control().sender_closed.load(std::memory_order_relaxed) != 0 ||
           in_.control().receiver_closed.load(std::memory_order_relaxed) != 0;
  }

  bool receive(void* dst, size_t bytes, bool streaming) {
    check_size(bytes, "recv_into");
    if (!recv_ready()) return false;
    const SlotHeader& header = checked_header(bytes);
    if (header.kind == shm::kSlotReference) {
      shm::cma_read(peer_pid_, header.address, dst, bytes);
    } else if (bytes > 0) {
      reduce::copy(dst, nullptr, received_bytes(header), bytes, streaming);
    }
    consume();
    return true;
  }

  // The fast paths read only our cached copies of the peer's counters; the
  // shared line is read again only when a cached value says "full" or "empty".
  bool header_free() {
    if (send_pos_ - sent_tail_ >= headers_) sent_tail_ = out_.control().tail.load(kAcquire);
    return note_room(send_pos_ - sent_tail_ < headers_);
  }

  bool data_slot_free() {
    if (data_pos_ - sent_data_tail_ >= slots_) {
      // tail too, so that a sleep until the tail moves (sleep_until_peer)
      // waits for the next consumption, not one already seen.
      sent_tail_ = out_.control().tail.load(kAcquire);
      sent_data_tail_ = out_.control().data_tail.load(kAcquire);
    }
    return note_room(data_pos_ - sent_data_tail_ < slots_);
  }

  bool note_room(bool room) {
    send_full_ = !room;
    return room;
  }

  void publish(uint32_t kind, size_t bytes, uint64_t address) {
    SlotHeader& header = out_.header(send_index_);
    header.length = bytes;
    header.kind = kind;
    header.address = address;
    header.operation = operation_;
    ++send_pos_;
    if (++send_index_ == headers_) send_index_ = 0;
    if (kind == shm::kSlotInline) {
      ++data_pos_;
      if (++data_index_ == slots_) data_index_ = 0;
    }
    out_.control().head.store(send_pos_, kRelease);
    shm::ring(out_.control().doorbell);
  }

  static bool fits_in_header(size_t bytes) { return bytes <= shm::kHeaderPayloadBytes; }

  // Where a message that is not a reference lies: its slot's header or data.
  const void* received_bytes(const SlotHeader& header) const {
    return header.kind == shm::kSlotInHeader ? static_cast<const void*>(header.payload)
                                             : in_.data(recv_data_index_);
  }

  void publish_in_header(const void* src, size_t bytes) {
    std::memcpy(out_.header(send_index_).payload, src, bytes);
    publish(shm::kSlotInHeader, bytes, 0);
  }

  bool recv_ready() {
    if (recv_head_ != recv_pos_) return true;
    recv_head_ = in_.control().head.load(kAcquire);
    if (recv_head_ - recv_pos_ > headers_) {
      throw PeerError("shared-memory FIFO corrupted: the peer posted more messages than headers");
    }
    recv_waiting_ = recv_head_ == recv_pos_;
    return !recv_waiting_;
  }

  const SlotHeader& checked_header(size_t bytes) const {
    const SlotHeader& header = in_.header(recv_index_);
    if (header.operation != operation_)
      throw OutOfStepError(op_mismatch(operation_, header.operation));
    if (header.length != bytes) {
      throw OutOfStepError(length_mismatch(bytes, header.length));
    }
    if (header.kind != shm::kSlotInline && header.kind != shm::kSlotReference &&
        header.kind != shm::kSlotInHeader) {
      throw PeerError("shared-memory FIFO corrupted: unknown slot kind");
    }
    // Only a peer we told we can read may point us into its memory.
    if (header.kind == shm::kSlotReference && !ends_.we_read_peer) {
      throw PeerError(
          "shared-memory FIFO corrupted: a message by reference, which the handshake did not "
          "agree to");
    }
    // A header holds kHeaderPayloadBytes: a longer message there would be
    // read from the headers and slot data after it.
    if (header.kind == shm::kSlotInHeader && bytes > shm::kHeaderPayloadBytes) {
      throw PeerError("shared-memory FIFO corrupted: a message of " + std::to_string(bytes) +
                      " bytes in its slot header");
    }
    return header;
  }

  void consume() {
    if (in_.header(recv_index_).kind == shm::kSlotInline) {
      ++recv_data_pos_;
      if (++recv_data_index_ == slots_) recv_data_index_ = 0;
      in_.control().data_tail.store(recv_data_pos_, kRelease);
    }
    ++recv_pos_;
    if (++recv_index_ == headers_) recv_index_ = 0;
    in_.control().tail.store(recv_pos_, kRelease);
    shm::ring(in_.control().doorbell);
  }

  // The peer has gone away. It is an error once we wait to receive and it
  // left nothing more, or it left messages of ours unread. Messages it posted
  // before it went are still delivered, and a peer that finished cleanly is
  // no error while we wait on other connections of the same operation.
  void fail_if_stuck(const char* why) {
    bool unread = out_.control().tail.load(kAcquire) != send_pos_;
    bool starved = recv_waiting_ && in_.control().head.load(kAcquire) == recv_pos_;
    if (unread || starved) throw PeerError(why);
  }

  char* allocate_bounce() const {
    void* p = nullptr;
    size_t bytes = (slot_bytes_ + shm::kSlotAlign - 1) / shm::kSlotAlign * shm::kSlotAlign;
    if (::posix_memalign(&p, shm::kSlotAlign, bytes) != 0) throw std::bad_alloc();
    return static_cast<char*>(p);
  }

  Socket& control_;
  shm::Endpoints ends_;  // owns the mappings
  FifoView in_;
  FifoView out_;
  const size_t slots_;
  const size_t headers_;
  const size_t slot_bytes_;
  const int peer_pid_;
  const bool use_cma_;
  const size_t cma_min_bytes_;

  // Sender state: messages posted, last tail seen, header index, the same
  // three for messages in slot data, and the end of the last message sent by
  // reference (complete once the tail passes it).
  uint64_t send_pos_ = 0;
  uint64_t sent_tail_ = 0;
  size_t send_index_ = 0;
  uint64_t data_pos_ = 0;
  uint64_t sent_data_tail_ = 0;
  size_t data_index_ = 0;
  bool send_full_ = false;  // the last look for room found none
  uint64_t ref_end_ = 0;

  // Receiver state: messages consumed, last head seen, header index, messages
  // in slot data consumed and their slot index, and which message the bounce
  // buffer holds.
  uint64_t recv_pos_ = 0;
  uint64_t recv_head_ = 0;
  size_t recv_index_ = 0;
  uint64_t recv_data_pos_ = 0;
  size_t recv_data_index_ = 0;
  uint64_t bounce_pos_ = UINT64_MAX;
  std::unique_ptr<char, FreeDeleter> bounce_;

  bool recv_waiting_ = false;  // the last receive attempt found nothing
  uint64_t last_socket_check_ = 0;
};

}  // namespace

std::unique_ptr<Connection> make_shm_connection(Socket& control, int rank, int peer, int peer_pid,
                                                int channel, const ShmOptions& options,
                                                double timeout_s) {
  shm::Endpoints ends = shm::handshake(control, rank, peer, peer_pid, channel, options, timeout_s);
  bool cma = options.cma && ends.peer_reads_us;
  WEFT_LOG(Info, rank,
           "shm connection to rank " << peer << " channel " << channel << ": " << ends.layout.slots
                                     << " x " << ends.layout.slot_bytes << " byte slots, "
                                     << ends.layout.headers
                                     << " messages in flight, sends by reference "
                                     << (cma ? "on" : (options.cma ? "unavailable" : "off")));
  return std::make_unique<ShmConnection>(control, peer_pid, options, std::move(ends));
}

}  // namespace weft
