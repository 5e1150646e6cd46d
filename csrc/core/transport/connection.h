// A Connection carries one channel of traffic between this rank and one peer,
// in both directions, as a FIFO of messages. Both sides agree on every
// message's length in advance (it follows from the Plan), so messages carry no
// framing the executor sees. Transports still send each message's length and
// the signature of the operation it belongs to, and check both on arrival, so
// that ranks out of step get an error instead of each other's bytes. Every
// call is non-blocking: the executor polls, calls progress() while it waits
// and owns the timeout.
//
// A message is at most slot_bytes() long. capacity_bytes() is how much a
// sender can have posted and not yet received by the peer without waiting for
// it: Plans keep each step within half of it so rings cannot deadlock.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace weft {

class Connection {
 public:
  virtual ~Connection() = default;

  // ---- sending ----
  // A buffer of slot_bytes() to fill with the next message, or nullptr while
  // every slot is still in flight. Follow with post_send().
  virtual void* send_slot() = 0;
  virtual void post_send(size_t bytes) = 0;
  // Sends `bytes` read from `src`, which stays valid and unchanged until
  // sends_complete() returns true. Returns false (and does nothing) while no
  // slot is free; call again. The transport may copy, or send by reference
  // (zero-copy socket write, process_vm_readv by the peer).
  virtual bool send_from(const void* src, size_t bytes) = 0;
  // True once nothing posted is still waiting to leave this process (or, for
  // sends by reference, to be read by the peer).
  virtual bool sends_complete() = 0;

  // ---- receiving ----
  // The next message, which must be `bytes` long, or nullptr until it has
  // arrived. Stays valid until release_recv().
  virtual const void* recv_slot(size_t bytes) = 0;
  virtual void release_recv() = 0;
  // Moves the next message (`bytes` long) into `dst`. Returns false until all
  // of it has arrived; call again with the same arguments.
  virtual bool recv_into(void* dst, size_t bytes) = 0;
  // recv_into for a destination that will not be read again soon (a large
  // output): a transport that copies may bypass the cache.
  virtual bool recv_into_streaming(void* dst, size_t bytes) { return recv_into(dst, bytes); }

  // Says that the next messages this connection receives are recv_into calls
  // filling [dst, dst + bytes) in order, `slice` bytes each but the last.
  // Called as a step begins, for memory that nothing else on this rank reads
  // or writes until those messages are in: a transport whose peer writes into
  // the receiver's memory (RDMA) may let it write there before recv_into asks,
  // so that no message waits on the receiver to reach it. Others ignore it.
  virtual void expect_receives(void* /*dst*/, size_t /*bytes*/, size_t /*slice*/) {}

  // Moves bytes (sockets) and checks that the peer is alive. Throws PeerError
  // when the peer is gone or broke the protocol.
  virtual void progress() = 0;

  // Closes the connection so that the peer notices (used on abort).
  virtual void shutdown() = 0;

  // A descriptor a waiter can sleep on instead of polling (a socket: readable
  // when the peer's bytes arrive, writable when sends can move), or -1 when
  // there is none (shared memory).
  virtual int readiness_fd() const { return -1; }
  // Whether readiness_fd() turns readable for both (a completion queue's
  // descriptor: room to send comes back as a completion too).
  virtual bool readiness_by_reading() const { return false; }
  // Asked just before a waiter sleeps on readiness_fd(): false when the
  // descriptor may not be slept on yet (something may be there to take at
  // once), and the waiter goes round again. A descriptor that must be armed
  // first (a completion queue's) is armed here.
  virtual bool ready_to_sleep() { return true; }
  // Sleeps until the peer may have posted a message (receiving) or freed room
  // for one (sending), for at most `timeout`. Returns false at once where the
  // transport has nothing to sleep on: the waiter then naps blind.
  virtual bool sleep_until_peer(bool /*receiving*/, std::chrono::nanoseconds /*timeout*/) {
    return false;
  }
  // The same for a step that waits on two sides at once (a message here and
  // room on `other`, say): sleeps until either peer acts. Returns false at
  // once where the two cannot be slept on together.
  virtual bool sleep_until_either_peer(bool /*receiving*/, Connection& /*other*/,
                                       bool /*other_receiving*/,
                                       std::chrono::nanoseconds /*timeout*/) {
    return false;
  }

  // Whether filling a send_slot costs a copy that send_from of memory already
  // holding the data avoids: a step whose result goes both to its dst and to
  // a peer then writes dst alone and sends it from there (a socket's staging
  // buffers, an RDMA outbox; shared memory's slots are the transfer itself).
  virtual bool send_slot_copies() const { return false; }
  // Whether recv_slot costs a copy that recv_into avoids (a socket's staging
  // buffers): a message forwarded on is then received straight into its dst
  // and sent on from there. Not RDMA's: a message forwarded from its eager
  // slot goes on eagerly, where sent from dst it would wait at every hop for
  // the next receiver's clear-to-send.
  virtual bool recv_slot_copies() const { return false; }

  virtual size_t slot_bytes() const = 0;
  virtual size_t capacity_bytes() const = 0;
  virtual const char* transport_name() const = 0;

  // The operation the messages from now on belong to (see op_signature.h):
  // sends are tagged with it, and a received message tagged otherwise makes
  // the receive throw OutOfStepError. 0 (the default) on both sides for
  // traffic that is not part of an operation.
  void set_operation(uint64_t signature) { operation_ = signature; }

 protected:
  uint64_t operation_ = 0;
};

}  // namespace weft
