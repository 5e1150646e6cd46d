// The narrow interface the RDMA protocol (rdma_connection.h) needs from a
// back end (ofi/, and ibverbs/ later): one reliable, connected, in-order
// endpoint to one peer that registers memory, writes into the peer's
// registered memory with a 32-bit immediate that raises a completion there,
// and reports completions. Everything is non-blocking; errors are PeerError.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace weft {

// Memory registered with an endpoint's domain. Releasing it deregisters.
class MemoryRegion {
 public:
  virtual ~MemoryRegion() = default;
  // What a peer needs to write into [p, p + bytes) of this region: the
  // address to name in its write (virtual or offset, as the back end wants)
  // and the remote key.
  virtual uint64_t remote_address(const void* p) const = 0;
  virtual uint64_t remote_key() const = 0;
  // What the back end wants with a local buffer of this region (a
  // descriptor or lkey), opaque to the protocol.
  virtual void* local_descriptor() const = 0;
  const char* base() const { return base_; }
  size_t bytes() const { return bytes_; }

 protected:
  MemoryRegion(const void* base, size_t bytes)
      : base_(static_cast<const char*>(base)), bytes_(bytes) {}

 private:
  const char* base_;
  size_t bytes_;
};

struct Completion {
  // Local: a write of ours finished (its source may be reused); `id` is
  // what we passed. Remote: the peer's write with immediate `imm` landed.
  enum class Kind { Local, Remote } kind;
  uint64_t id;
  uint32_t imm;
};

class RdmaEndpoint {
 public:
  virtual ~RdmaEndpoint() = default;
  // Registers [base, base + bytes) for local sources and remote writes.
  virtual std::unique_ptr<MemoryRegion> register_memory(void* base, size_t bytes) = 0;
  // Whether local sources of writes must lie in registered memory.
  virtual bool needs_local_registration() const = 0;
  // Whether a registration stays right for its virtual range however the
  // memory under it is unmapped and mapped again (ibverbs On-Demand Paging:
  // the NIC follows the process's page tables instead of pinning pages), so
  // that it may be kept past its last use (registration_cache.h).
  virtual bool registrations_follow_mappings() const { return false; }
  // Writes `bytes` from `src` (inside `local`, or null where no local
  // registration is needed) to the peer's (remote_address, remote_key), and
  // raises a completion carrying `imm` there once all of it landed. Returns
  // false when the send queue is full (try again after polling). Without
  // `local_completion` the caller waits on nothing of this write here: a back
  // end may leave out its local completion (one that reports it anyway
  // reports it with `id`).
  virtual bool write_with_imm(const void* src, size_t bytes, const MemoryRegion* local,
                              uint64_t remote_address, uint64_t remote_key, uint32_t imm,
                              uint64_t id, bool local_completion) = 0;
  // Up to `max` completions into `out`; returns how many.
  virtual int poll(Completion* out, int max) = 0;
  // A descriptor that turns readable when a completion may be ready, for a
  // waiter to sleep on once arm_sleep_fd() allowed it; -1 where the back end
  // has none (then waiters poll).
  virtual int sleep_fd() const { return -1; }
  // Readies sleep_fd() to be slept on, just before a waiter sleeps; false
  // when a completion may be ready at once (the waiter polls again instead).
  virtual bool arm_sleep_fd() { return false; }
  // Empty while the peer keeps the connection; once it closed it, the words
  // for that. A closing peer writes nothing more, and what it wrote before
  // comes out of poll() first (a peer that finished its work and left may
  // have written what this side has yet to take). Throws PeerError when the
  // connection failed.
  virtual std::string closed_by_peer() = 0;
  // Closes the connection so that the peer notices.
  virtual void close() = 0;
  // The largest write the endpoint takes.
  virtual size_t max_write_bytes() const = 0;
  // "ofi/tcp", "ofi/shm" and the like, for error messages.
  virtual std::string name() const = 0;
};

}  // namespace weft
