// Tagged point-to-point messages on their own channel, progressed together
// by one engine thread, so that any mix of posted sends and receives
// completes (post the receive, then the send, then wait: the usual pattern)
// and never mixes with collective traffic.
//
// On the wire a message is a 16-byte header {magic, element type, tag,
// length} followed by its payload in slot-sized pieces. A message is matched
// to the oldest posted receive that names its source (or any source) and its
// tag; one that arrives before its receive is set aside until it is posted,
// held as its bytes come in (never allocated by the length its header
// claims); one whose receive has another size fails that receive and is read
// and dropped; so does one whose elements the sender typed otherwise than the
// receive, where the engine checks types (WEFT_DEBUG_CHECKS: otherwise a
// message is bytes, which a receive may take as any type). Messages from one
// source with one tag are matched in the order they were sent.
//
// Timeouts: a message that stops moving part way (its peer stopped reading or
// writing) fails the engine after timeout_s, since the connection's stream is
// then lost. A receive whose message never comes only waits: whoever waits
// for it bounds the wait and then withdraws it (Work::request_cancel). One
// from a rank that left the group (destroy_process_group) fails once nothing
// has arrived from it for a grace, and so does a send to it not yet started.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/common/types.h"
#include "core/exec/work.h"
#include "core/transport/connection.h"

namespace weft {

class P2pEngine {
 public:
  // connections[p] is the point-to-point connection to rank p (null for this
  // rank). `on_error` runs (once, on the engine thread) when a peer is lost
  // or a message in flight stops moving for timeout_s; every pending request
  // fails with it. `left_group(p)` says why rank p left the group, or is
  // empty while it has not. `check_types`: a receive refuses a message whose
  // sender typed its elements otherwise.
  P2pEngine(int rank, std::vector<Connection*> connections, double timeout_s,
            std::function<void(const std::string&)> on_error,
            std::function<std::string(int)> left_group, bool check_types = false);
  ~P2pEngine();
  P2pEngine(const P2pEngine&) = delete;
  P2pEngine& operator=(const P2pEngine&) = delete;

  // `dtype`: what the bytes are, where the caller knows (none: raw bytes,
  // which are never refused for their type).
  std::shared_ptr<Work> send(const void* data, size_t bytes, int peer, uint32_t tag,
                             std::optional<DataType> dtype = std::nullopt);
  // peer < 0: any source; Work::source() tells which.
  std::shared_ptr<Work> recv(void* data, size_t bytes, int peer, uint32_t tag,
                             std::optional<DataType> dtype = std::nullopt);

  // Fails every pending and later request with `error`.
  void fail_all(std::exception_ptr error);

  // The timeout for messages that stop moving from now on.
  void set_timeout(double timeout_s) { timeout_s_.store(timeout_s); }

 private:
  // kUntyped, or a DataType's value.
  using TypeCode = uint8_t;
  static constexpr TypeCode kUntyped = 0xff;
  static TypeCode type_code(std::optional<DataType> dtype);
  struct Header {
    uint16_t magic;
    TypeCode dtype;
    uint8_t unused;
    uint32_t tag;
    uint64_t bytes;
  };
  struct SendRequest {
    std::shared_ptr<Work> work;
    const char* data;
    size_t bytes;
    uint32_t tag;
    TypeCode dtype;
    uint64_t seq;
    bool header_sent = false;
    size_t posted = 0;  // payload bytes handed to the connection
  };
  struct RecvRequest {
    std::shared_ptr<Work> work;
    char* data;
    size_t bytes;
    int peer;
    uint32_t tag;
    TypeCode dtype;
    uint64_t seq;
  };
  struct Stashed {
    uint32_t tag;
    TypeCode dtype;
    std::vector<char> payload;
  };
  // The message currently arriving from one peer: into its receive's
  // buffer, else into the stash, or drained (its receive had the wrong size).
  struct Arrival {
    bool active = false;
    uint32_t tag = 0;
    TypeCode dtype = kUntyped;
    size_t bytes = 0;  // as its header claims: nothing is sized by it
    size_t received = 0;
    std::shared_ptr<RecvRequest> request;
    bool drained = false;
    std::vector<char> stash;  // what has arrived so far
  };

  void loop();
  bool progress_sends(int peer);
  bool progress_arrival(int peer);
  void start_arrival(int peer, const Header& header);
  // Where the next `n` bytes of the arrival from `peer` go; the same place
  // when asked again for a piece that has not all arrived.
  char* next_piece(int peer, size_t n);
  void finish_arrival(int peer);
  bool match_stashed(const std::shared_ptr<RecvRequest>& request);
  // Why `request` cannot take the message from `peer` of `bytes` typed
  // `dtype` (its tag matched), or empty when it can.
  std::string refusal(const RecvRequest& request, int peer, size_t bytes, TypeCode dtype) const;
  bool pending() const;
  // A message is on its way in or out (not just a receive waiting).
  bool in_flight() const;
  // Fails the receives and the sends not yet started for which `recv` or
  // `send` gives an error (null: the request stays).
  void fail_unstarted(const std::function<std::exception_ptr(const RecvRequest&)>& recv,
                      const std::function<std::exception_ptr(int, const SendRequest&)>& send);
  // Fails the requests whose Work asked to be cancelled and have not started.
  void withdraw_cancelled();
  // Fails the receives from, and the sends not yet started to, ranks that
  // left the group and sent nothing for a grace; and the any-source receives
  // once every other rank did.
  void fail_requests_of_departed();
  std::string oldest_pending() const;
  // `why` the connection to `peer` failed, as an error naming the oldest
  // request with that peer.
  std::string lost_peer(int peer, const std::string& why) const;
  std::string describe(const char* op, uint64_t seq, int peer) const;
  // Works finish under mu_ but complete after it is released: their
  // callbacks may post sends and receives of their own.
  void finish(const std::shared_ptr<Work>& work, std::exception_ptr error = nullptr);
  void complete_finished();

  const int rank_;
  const std::vector<Connection*> conns_;
  std::atomic<double> timeout_s_;
  const std::function<void(const std::string&)> on_error_;
  const std::function<std::string(int)> left_group_;
  const bool check_types_;
  // Per peer: why it left (empty while it has not; asked every
  // kDepartureCheck at most), and when, since this rank saw it leave,
  // something last arrived from it.
  std::vector<std::string> left_why_;
  std::vector<std::chrono::steady_clock::time_point> last_from_;
  std::chrono::steady_clock::time_point last_departure_check_{};

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::deque<SendRequest>> sends_;     // per peer, in order
  std::list<std::shared_ptr<RecvRequest>> recvs_;  // posted, oldest first
  std::vector<Arrival> arrivals_;
  std::vector<std::deque<Stashed>> stash_;  // per peer, arrival order
  // One slot (the largest connection's), shared by the drained messages'
  // pieces, which are thrown away as they arrive; allocated on first use.
  std::vector<char> drain_;
  uint64_t next_seq_ = 0;
  std::vector<std::pair<std::shared_ptr<Work>, std::exception_ptr>> finished_;
  std::string failed_;  // non-empty once the engine has failed
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace weft
