// TCP transport. Both sides know every message's length from the Plan, so the
// wire needs no framing to find message boundaries; each message still
// carries its length and its operation's signature in a 16-byte header, sent
// in the same sendmsg and read in the same recvmsg as the payload. It costs
// nothing measurable and lets the receiver report ranks that issued different
// operations instead of reading one operation's bytes as another's, and an
// empty message is still a message the receiver waits for (a barrier is made
// of them).
//
// Sending: a FIFO of at most `slots` messages, each either staged in one of
// `slots` staging buffers (send_slot/post_send) or written straight from the
// caller's memory (send_from). Data is pushed with non-blocking sendmsg as soon
// as it is posted and again on every progress().
//
// Receiving: the receiver only learns a message's length when the executor
// asks for it, so bytes are only read for the message currently requested,
// straight into its destination (a receive staging buffer for recv_slot, the
// caller's memory for recv_into, and that only during recv_into calls).
// Everything else waits in the kernel's socket buffer, which is the
// read-ahead; reading it earlier into staging would cost a copy.
//
// Staged messages are limited to slot_bytes; send_from/recv_into need no
// staging and accept any length (both sides must still agree on it).
#include "core/transport/tcp/tcp_connection.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/common/error.h"
#include "core/transport/op_signature.h"

namespace weft {
namespace {

// Kernel socket buffers: large enough to keep a 1 MiB message stream moving
// while the other side is busy between calls.
constexpr int kSocketBufferBytes = 4 << 20;
// iovecs per sendmsg (two per message).
constexpr int kMaxIov = 64;
// The message header (ranks share an architecture).
struct Header {
  uint64_t length;
  uint64_t operation;  // op_signature.h
};
constexpr size_t kHeaderBytes = sizeof(Header);
// Receiving messages at least this long acknowledges at once. A socket that
// carried data both ways at once (a ring's or rhd's exchanges) falls into
// the kernel's delayed-ack mode and stays there; a later one-way stream on it
// then waits on late acks. With 8 ranks over tcp on 2 CPUs, a communicator's
// double tree of 16 MiB took 63-73 ms per call after ring and rhd calls had
// run on its connections, 45-49 before them or with this (the kernel leaves
// quick-ack mode again on its own, so every read asks anew).
constexpr size_t kQuickAckBytes = 64 << 10;
// How often an idle connection asks the kernel whether the peer is gone.
constexpr std::chrono::microseconds kWatchInterval{20};
// How often a connection asks whether its control socket was given up: a
// host loss takes WEFT_HOST_TIMEOUT_S (at least a second) to show anyway.
constexpr std::chrono::milliseconds kHostWatchInterval{100};

std::string socket_error(const Socket& socket, const char* op, int err) {
  if (Socket::unanswered(err)) return socket.loss(err);
  return std::string(Socket::closed_by_peer(err) ? "connection to peer closed ("
                                                 : "connection to peer failed (") +
         op + ": " + std::strerror(err) + ")";
}

class TcpConnection : public Connection {
 public:
  TcpConnection(const Socket& control, Socket socket, const TcpOptions& options)
      : control_(control),
        socket_(std::move(socket)),
        slot_bytes_(options.slot_bytes),
        slots_(checked_slots(options)),
        send_bufs_(slots_),
        queue_(slots_),
        recv_bufs_(slots_) {
    for (int i = slots_ - 1; i >= 0; --i) free_bufs_.push_back(i);
    socket_.set_nonblocking();
    socket_.set_nodelay();
    // Best effort: the kernel clamps to net.core.[rw]mem_max.
    int size = kSocketBufferBytes;
    ::setsockopt(socket_.fd(), SOL_SOCKET, SO_SNDBUF, &size, sizeof(size));
    ::setsockopt(socket_.fd(), SOL_SOCKET, SO_RCVBUF, &size, sizeof(size));
  }

  // ---- sending ----

  void* send_slot() override {
    if (!broken_.empty()) return nullptr;
    if (reserved_ >= 0) return send_bufs_[reserved_].get();
    if (!send_room()) return nullptr;
    reserved_ = free_bufs_.back();
    free_bufs_.pop_back();
    auto& buf = send_bufs_[reserved_];
    if (!buf) buf.reset(new char[slot_bytes_]);
    return buf.get();
  }

  void post_send(size_t bytes) override {
    if (reserved_ < 0) throw InvalidArgument("post_send without a slot from send_slot");
    check_size("post_send", bytes);
    enqueue(send_bufs_[reserved_].get(), bytes, reserved_);
    reserved_ = -1;
    push();
  }

  bool send_from(const void* src, size_t bytes) override {
    if (!broken_.empty() || !send_room()) return false;
    enqueue(static_cast<const char*>(src), bytes, -1);
    push();
    return true;
  }

  bool sends_complete() override {
    push();
    return queued_ == 0;
  }

  // ---- receiving ----

  const void* recv_slot(size_t bytes) override {
    check_size("recv_slot", bytes);
    if (!broken_.empty()) return nullptr;
    forget_unstarted();
    if (target_ == Target::None) {
      if (held_ == slots_) return nullptr;
      start_recv(Target::Slot, next_recv_buf(), bytes);
    } else {
      check_same("recv_slot", bytes);
      if (target_ == Target::User) {
        // Switching a half-received message to staging: move what arrived.
        if (held_ == slots_) return nullptr;
        char* slot = next_recv_buf();
        std::memcpy(slot, dst_, done_);
        dst_ = slot;
        target_ = Target::Slot;
      }
    }
    pull();
    if (!recv_finished()) return nullptr;
    ++held_;
    return dst_;
  }

  void release_recv() override {
    if (held_ == 0) throw InvalidArgument("release_recv without a message from recv_slot");
    held_head_ = (held_head_ + 1) % slots_;
    --held_;
  }

  bool recv_into(void* dst, size_t bytes) override {
    char* out = static_cast<char*>(dst);
    if (!broken_.empty()) return false;
    forget_unstarted();
    if (target_ == Target::None) {
      start_recv(Target::User, out, bytes);
    } else {
      check_same("recv_into", bytes);
      if (target_ == Target::Slot) {
        // Part of this message was staged by recv_slot: copy it, read the
        // rest straight into `dst`.
        std::memcpy(out, dst_, done_);
        dst_ = out;
        target_ = Target::User;
      } else if (out != dst_) {
        throw InvalidArgument("recv_into repeated with a different buffer mid-message");
      }
    }
    pull();
    return recv_finished();
  }

  // Reads ahead only into staging: caller memory is written inside
  // recv_into alone, so a buffer the caller gave up on (after an error
  // elsewhere) is never touched later. A socket failure is reported here,
  // where the caller adds which op and peer were affected; the other calls
  // only stop succeeding.
  void progress() override {
    push();
    const auto now = std::chrono::steady_clock::now();
    if (target_ == Target::Slot) {
      pull();
    } else if (queued_ == 0) {
      watch_peer(now);
    }
    watch_host(now);
    if (!broken_.empty()) {
      if (out_of_step_) throw OutOfStepError(broken_);
      throw PeerError(broken_);
    }
  }

  void shutdown() override { socket_.shutdown(); }

  int readiness_fd() const override { return socket_.fd(); }
  bool send_slot_copies() const override { return true; }
  bool recv_slot_copies() const override { return true; }

  size_t slot_bytes() const override { return slot_bytes_; }
  // What a sender can post with no help from the receiver: the staging
  // slots. The kernel buffers add to this but are not promised.
  size_t capacity_bytes() const override { return slot_bytes_ * static_cast<size_t>(slots_); }
  const char* transport_name() const override { return "tcp"; }

 private:
  struct Send {
    Header header;
    const char* data;
    size_t bytes;
    size_t done;  // of header and payload
    int buf;      // staging buffer to free when sent, -1 for send_from
  };
  enum class Target { None, Slot, User };

  static int checked_slots(const TcpOptions& o) {
    if (o.slots < 1 || o.slot_bytes == 0) {
      throw InvalidArgument("tcp connection needs at least one slot of at least one byte");
    }
    return o.slots;
  }

  void check_size(const char* op, size_t bytes) const {
    if (bytes > slot_bytes_) {
      throw InvalidArgument(std::string(op) + ": message of " + std::to_string(bytes) +
                            " bytes exceeds the slot size " + std::to_string(slot_bytes_));
    }
  }

  void check_same(const char* op, size_t bytes) const {
    if (bytes != length_) {
      throw InvalidArgument(std::string(op) + ": expected the pending message of " +
                            std::to_string(length_) + " bytes, asked for " + std::to_string(bytes));
    }
  }

  // A reserved send slot counts as in flight.
  bool send_room() {
    if (queued_ + (reserved_ >= 0) < slots_) return true;
    push();
    return queued_ + (reserved_ >= 0) < slots_;
  }

  void enqueue(const char* data, size_t bytes, int buf) {
    queue_[(head_ + queued_) % slots_] = Send{{bytes, operation_}, data, bytes, 0, buf};
    ++queued_;
  }

  // Writes as much of the queue as the socket takes, several messages per
  // call. Never blocks.
  void push() {
    while (broken_.empty() && queued_ > 0) {
      iovec iov[kMaxIov];
      int n_iov = 0;
      size_t wanted = 0;
      for (int i = 0; i < queued_ && n_iov + 2 <= kMaxIov; ++i) {
        const Send& s = queue_[(head_ + i) % slots_];
        if (s.done < kHeaderBytes) {
          iov[n_iov++] = {const_cast<char*>(reinterpret_cast<const char*>(&s.header) + s.done),
                          kHeaderBytes - s.done};
          if (s.bytes > 0) iov[n_iov++] = {const_cast<char*>(s.data), s.bytes};
        } else {
          size_t sent = s.done - kHeaderBytes;
          iov[n_iov++] = {const_cast<char*>(s.data + sent), s.bytes - sent};
        }
        wanted += kHeaderBytes + s.bytes - s.done;
      }
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = static_cast<size_t>(n_iov);
      ssize_t n = ::sendmsg(socket_.fd(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        return fail(socket_error(socket_, "send", errno));
      }
      // Retire what was written, oldest first.
      for (size_t left = static_cast<size_t>(n); left > 0;) {
        Send& s = queue_[head_];
        size_t take = std::min(left, kHeaderBytes + s.bytes - s.done);
        s.done += take;
        left -= take;
        if (s.done < kHeaderBytes + s.bytes) break;
        if (s.buf >= 0) free_bufs_.push_back(s.buf);
        head_ = (head_ + 1) % slots_;
        --queued_;
      }
      // A short write means the socket buffer is full: stop before EAGAIN.
      if (static_cast<size_t>(n) < wanted) return;
    }
  }

  // Without a pending read or write a dead peer would go unnoticed here. As
  // for shared memory, a peer that went away is an error when it left data of
  // ours unread (its kernel answered with a reset) or when we wait for a
  // message it can no longer send; a peer that finished cleanly is not, while
  // we wait on other connections of the same operation.
  void watch_peer(std::chrono::steady_clock::time_point now) {
    if (now - last_watch_ < kWatchInterval) return;
    last_watch_ = now;
    char byte;
    ssize_t n = ::recv(socket_.fd(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n > 0) return;
    if (n == 0) {
      if (target_ != Target::None) fail("connection to peer closed");
      return;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
    fail(socket_error(socket_, "recv", errno));
  }

  // The data socket has no keepalive (a receiver may keep its window shut
  // for as long as it likes); the control socket's tells a host that went
  // down, which sends no reset, from a peer that is slow.
  void watch_host(std::chrono::steady_clock::time_point now) {
    if (now - last_host_watch_ < kHostWatchInterval) return;
    last_host_watch_ = now;
    if (control_.gave_up()) fail(control_.loss());
  }

  void fail(std::string why) {
    if (broken_.empty()) broken_ = std::move(why);
  }

  char* next_recv_buf() {
    auto& buf = recv_bufs_[(held_head_ + held_) % slots_];
    if (!buf) buf.reset(new char[slot_bytes_]);
    return buf.get();
  }

  // A request of which no payload byte has arrived may be replaced by a
  // different one (a probe for a header on a connection that then carries
  // something else); once payload has arrived the next request must be for
  // the rest. The header, once read, is checked against the new request.
  void forget_unstarted() {
    if (done_ == 0) target_ = Target::None;
  }

  void start_recv(Target target, char* dst, size_t bytes) {
    target_ = target;
    dst_ = dst;
    length_ = bytes;
    done_ = 0;
    if (header_done_ == kHeaderBytes) check_header();
  }

  void check_header() {
    if (header_.operation != operation_) {
      out_of_step_ = true;
      return fail(op_mismatch(operation_, header_.operation));
    }
    if (header_.length == length_) return;
    out_of_step_ = true;
    fail(length_mismatch(length_, header_.length));
  }

  // Once the whole message is in, the next header belongs to the next one.
  bool recv_finished() {
    if (!broken_.empty() || header_done_ < kHeaderBytes || done_ < length_) return false;
    target_ = Target::None;
    header_done_ = 0;
    return true;
  }

  void quick_ack() {
    int one = 1;
    ::setsockopt(socket_.fd(), IPPROTO_TCP, TCP_QUICKACK, &one, sizeof(one));
  }

  // Reads the requested message (header and payload in one call); never
  // blocks.
  void pull() {
    while (broken_.empty() && target_ != Target::None &&
           (header_done_ < kHeaderBytes || done_ < length_)) {
      iovec iov[2];
      int n_iov = 0;
      if (header_done_ < kHeaderBytes) {
        iov[n_iov++] = {reinterpret_cast<char*>(&header_) + header_done_,
                        kHeaderBytes - header_done_};
      }
      if (done_ < length_) iov[n_iov++] = {dst_ + done_, length_ - done_};
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = static_cast<size_t>(n_iov);
      ssize_t n = ::recvmsg(socket_.fd(), &msg, MSG_DONTWAIT);
      if (n == 0) return fail("connection to peer closed");
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        return fail(socket_error(socket_, "recv", errno));
      }
      size_t got = static_cast<size_t>(n);
      if (length_ >= kQuickAckBytes) quick_ack();
      if (header_done_ < kHeaderBytes) {
        size_t take = std::min(got, kHeaderBytes - header_done_);
        header_done_ += take;
        got -= take;
        if (header_done_ == kHeaderBytes) check_header();
      }
      done_ += got;
    }
  }

  const Socket& control_;
  Socket socket_;
  size_t slot_bytes_;
  int slots_;

  std::vector<std::unique_ptr<char[]>> send_bufs_;  // allocated on first use
  std::vector<int> free_bufs_;
  int reserved_ = -1;        // handed out by send_slot, not yet posted
  std::vector<Send> queue_;  // ring of slots_ entries
  int head_ = 0;
  int queued_ = 0;

  std::vector<std::unique_ptr<char[]>> recv_bufs_;  // ring; allocated on first use
  int held_head_ = 0;                               // oldest message handed out by recv_slot
  int held_ = 0;
  Header header_{};  // of the next incoming message
  size_t header_done_ = 0;
  Target target_ = Target::None;  // the message being received
  char* dst_ = nullptr;
  size_t length_ = 0;
  size_t done_ = 0;  // payload bytes in dst_

  std::string broken_;        // why the socket failed; empty while it works
  bool out_of_step_ = false;  // broken_ says the peer runs another operation
  std::chrono::steady_clock::time_point last_watch_{}, last_host_watch_{};
};

}  // namespace

std::unique_ptr<Connection> make_tcp_connection(const Socket& control, Socket socket,
                                                const TcpOptions& options) {
  return std::make_unique<TcpConnection>(control, std::move(socket), options);
}

}  // namespace weft
