#include "core/exec/p2p.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <sstream>

#include "core/common/error.h"
#include "core/exec/backoff.h"
#include "core/exec/cpu_placement.h"

namespace weft {
namespace {

constexpr uint16_t kMagic = 0x7077;  // "wp"
// How often a waiting engine asks whether peers left the group (a syscall a
// peer), and how long nothing must arrive from one that left before the
// requests naming it fail: what it sent before it left may still be coming.
constexpr auto kDepartureCheck = std::chrono::milliseconds(1);
constexpr auto kLeftGrace = std::chrono::milliseconds(50);

}  // namespace

P2pEngine::P2pEngine(int rank, std::vector<Connection*> connections, double timeout_s,
                     std::function<void(const std::string&)> on_error,
                     std::function<std::string(int)> left_group, bool check_types)
    : rank_(rank),
      conns_(std::move(connections)),
      timeout_s_(timeout_s),
      on_error_(std::move(on_error)),
      left_group_(std::move(left_group)),
      check_types_(check_types),
      left_why_(conns_.size()),
      last_from_(conns_.size()),
      sends_(conns_.size()),
      arrivals_(conns_.size()),
      stash_(conns_.size()) {
  thread_ = std::thread([this] { loop(); });
}

P2pEngine::~P2pEngine() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
  fail_all(std::make_exception_ptr(
      AbortedError("the communicator was destroyed before this operation finished")));
}

std::string P2pEngine::describe(const char* op, uint64_t seq, int peer) const {
  std::ostringstream msg;
  msg << op << " #" << seq << " (point-to-point) on rank " << rank_;
  if (peer >= 0) {
    msg << " with rank " << peer;
  } else {
    msg << " from any rank";
  }
  return msg.str();
}

P2pEngine::TypeCode P2pEngine::type_code(std::optional<DataType> dtype) {
  return dtype ? static_cast<TypeCode>(*dtype) : kUntyped;
}

std::shared_ptr<Work> P2pEngine::send(const void* data, size_t bytes, int peer, uint32_t tag,
                                      std::optional<DataType> dtype) {
  auto work = std::make_shared<Work>();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failed_.empty()) throw AbortedError(failed_);
    sends_[peer].push_back(SendRequest{work, static_cast<const char*>(data), bytes, tag,
                                       type_code(dtype), next_seq_++});
  }
  cv_.notify_all();
  return work;
}

std::shared_ptr<Work> P2pEngine::recv(void* data, size_t bytes, int peer, uint32_t tag,
                                      std::optional<DataType> dtype) {
  auto work = std::make_shared<Work>();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failed_.empty()) throw AbortedError(failed_);
    auto request = std::make_shared<RecvRequest>(RecvRequest{
        work, static_cast<char*>(data), bytes, peer, tag, type_code(dtype), next_seq_++});
    if (!match_stashed(request)) recvs_.push_back(request);
  }
  cv_.notify_all();
  complete_finished();
  return work;
}

void P2pEngine::fail_all(std::exception_ptr error) {
  std::unique_lock<std::mutex> lock(mu_);
  if (failed_.empty()) {
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      failed_ = e.what();
    }
  }
  for (auto& queue : sends_) {
    for (auto& request : queue) finish(request.work, error);
    queue.clear();
  }
  for (auto& request : recvs_) finish(request->work, error);
  recvs_.clear();
  for (auto& arrival : arrivals_) {
    if (arrival.request) finish(arrival.request->work, error);
    arrival = Arrival();
  }
  lock.unlock();
  complete_finished();
}

void P2pEngine::finish(const std::shared_ptr<Work>& work, std::exception_ptr error) {
  finished_.emplace_back(work, error);
}

void P2pEngine::complete_finished() {
  std::vector<std::pair<std::shared_ptr<Work>, std::exception_ptr>> finished;
  {
    std::lock_guard<std::mutex> lock(mu_);
    finished.swap(finished_);
  }
  for (auto& [work, error] : finished) work->complete(error);
}

std::string P2pEngine::oldest_pending() const {
  const RecvRequest* recv = recvs_.empty() ? nullptr : recvs_.front().get();
  const SendRequest* send = nullptr;
  int send_peer = -1;
  for (size_t p = 0; p < sends_.size(); ++p) {
    if (!sends_[p].empty() && (!send || sends_[p].front().seq < send->seq)) {
      send = &sends_[p].front();
      send_peer = static_cast<int>(p);
    }
  }
  if (send && (!recv || send->seq < recv->seq)) {
    return describe("send", send->seq, send_peer) + " waiting for the peer to receive";
  }
  return recv ? describe("recv", recv->seq, recv->peer) + " waiting for a message with tag " +
                    std::to_string(recv->tag)
              : std::string("point-to-point");
}

std::string P2pEngine::lost_peer(int peer, const std::string& why) const {
  // The receive under way from it, else its oldest request.
  const RecvRequest* recv = arrivals_[peer].request.get();
  if (recv == nullptr) {
    const auto it = std::find_if(recvs_.begin(), recvs_.end(),
                                 [&](const auto& r) { return r->peer == peer || r->peer < 0; });
    if (it != recvs_.end()) recv = it->get();
  }
  const SendRequest* send = sends_[peer].empty() ? nullptr : &sends_[peer].front();
  std::string request;
  if (send && (recv == nullptr || send->seq < recv->seq)) {
    request = describe("send", send->seq, peer);
  } else if (recv != nullptr) {
    request = describe("recv", recv->seq, recv->peer);
  } else {
    request = "point-to-point on rank " + std::to_string(rank_);
  }
  return request + ": " + lost_rank(peer, why);
}

bool P2pEngine::pending() const { return !recvs_.empty() || in_flight(); }

bool P2pEngine::in_flight() const {
  for (const auto& arrival : arrivals_) {
    if (arrival.active) return true;
  }
  for (const auto& queue : sends_) {
    if (!queue.empty()) return true;
  }
  return false;
}

void P2pEngine::fail_unstarted(
    const std::function<std::exception_ptr(const RecvRequest&)>& recv,
    const std::function<std::exception_ptr(int, const SendRequest&)>& send) {
  for (auto it = recvs_.begin(); it != recvs_.end();) {
    std::exception_ptr error = recv(**it);
    if (!error) {
      ++it;
      continue;
    }
    finish((*it)->work, error);
    it = recvs_.erase(it);
  }
  // A send under way may still be read from the caller's buffer (by
  // reference): it stays, bounded by the timeout of messages that stop.
  for (size_t p = 0; p < sends_.size(); ++p) {
    auto& queue = sends_[p];
    for (auto it = queue.begin(); it != queue.end();) {
      std::exception_ptr error = it->header_sent ? nullptr : send(static_cast<int>(p), *it);
      if (!error) {
        ++it;
        continue;
      }
      finish(it->work, error);
      it = queue.erase(it);
    }
  }
}

void P2pEngine::withdraw_cancelled() {
  auto timed_out = [&](const char* op, uint64_t seq, int peer, const std::string& what) {
    return std::make_exception_ptr(
        TimeoutError(describe(op, seq, peer) + ": " + what +
                     " in time (the communicator's timeout, or the one given to wait); withdrawn"));
  };
  fail_unstarted(
      [&](const RecvRequest& r) {
        return r.work->cancel_requested()
                   ? timed_out("recv", r.seq, r.peer,
                               "no message with tag " + std::to_string(r.tag) + " arrived")
                   : nullptr;
      },
      [&](int peer, const SendRequest& s) {
        return s.work->cancel_requested()
                   ? timed_out("send", s.seq, peer, "the message could not be sent")
                   : nullptr;
      });
}

void P2pEngine::fail_requests_of_departed() {
  const auto now = std::chrono::steady_clock::now();
  if (now - last_departure_check_ < kDepartureCheck) return;
  last_departure_check_ = now;
  // Only the peers a request names are asked about; for an any-source
  // receive, every peer in turn up to the first still in the group.
  std::vector<bool> awaited(conns_.size(), false);
  bool any_source = false;
  for (const auto& r : recvs_) {
    if (r->peer >= 0) awaited[r->peer] = true;
    any_source = any_source || r->peer < 0;
  }
  for (size_t p = 0; p < sends_.size(); ++p) awaited[p] = awaited[p] || !sends_[p].empty();
  bool asking_all = any_source;
  for (size_t p = 0; p < conns_.size(); ++p) {
    if (conns_[p] == nullptr || !left_why_[p].empty() || !(awaited[p] || asking_all)) continue;
    left_why_[p] = left_group_(static_cast<int>(p));
    if (!left_why_[p].empty()) {
      last_from_[p] = now;
    } else {
      asking_all = false;
    }
  }
  auto gone = [&](int p) {
    return !left_why_[p].empty() && !arrivals_[p].active && now - last_from_[p] >= kLeftGrace;
  };
  bool all_gone = any_source;
  for (size_t p = 0; all_gone && p < conns_.size(); ++p) {
    all_gone = conns_[p] == nullptr || gone(static_cast<int>(p));
  }
  auto lost = [&](const char* op, uint64_t seq, int peer, const std::string& what) {
    return std::make_exception_ptr(
        PeerError(describe(op, seq, peer) + ": " + lost_rank(peer, left_why_[peer] + "; " + what)));
  };
  fail_unstarted(
      [&](const RecvRequest& r) -> std::exception_ptr {
        const std::string never = "its message with tag " + std::to_string(r.tag) + " never came";
        if (r.peer >= 0) return gone(r.peer) ? lost("recv", r.seq, r.peer, never) : nullptr;
        if (!all_gone) return nullptr;
        const int first = rank_ == 0 ? 1 : 0;
        return std::make_exception_ptr(
            PeerError(describe("recv", r.seq, -1) + ": every other rank left the group (rank " +
                      std::to_string(first) + ": " + left_why_[first] + "); " + never));
      },
      [&](int peer, const SendRequest& s) {
        return gone(peer) ? lost("send", s.seq, peer, "nobody will receive the message") : nullptr;
      });
}

std::string P2pEngine::refusal(const RecvRequest& request, int peer, size_t bytes,
                               TypeCode dtype) const {
  const bool sizes_differ = bytes != request.bytes;
  const bool types_differ =
      check_types_ && dtype != request.dtype && dtype != kUntyped && request.dtype != kUntyped;
  if (!sizes_differ && !types_differ) return "";
  std::string why = describe("recv", request.seq, peer) + ": rank " + std::to_string(peer) +
                    " sent a message with tag " + std::to_string(request.tag) + " of " +
                    std::to_string(bytes) + " bytes";
  if (sizes_differ) {
    return why + " but the receive buffer has " + std::to_string(request.bytes) +
           "; post a receive of the size that was sent";
  }
  const auto name = [](TypeCode code) { return to_string(static_cast<DataType>(code)); };
  return why + ", " + name(dtype) + " elements, but the receive takes " + name(request.dtype) +
         " (WEFT_DEBUG_CHECKS); receive the type that was sent";
}

// A posted receive may already have its message set aside.
bool P2pEngine::match_stashed(const std::shared_ptr<RecvRequest>& request) {
  for (size_t p = 0; p < stash_.size(); ++p) {
    if (request->peer >= 0 && static_cast<int>(p) != request->peer) continue;
    auto& queue = stash_[p];
    auto it = std::find_if(queue.begin(), queue.end(),
                           [&](const Stashed& s) { return s.tag == request->tag; });
    if (it == queue.end()) continue;
    const int peer = static_cast<int>(p);
    const std::string refused = refusal(*request, peer, it->payload.size(), it->dtype);
    if (!refused.empty()) {
      finish(request->work, std::make_exception_ptr(InvalidArgument(refused)));
    } else {
      // An empty message's buffers may be null, which memcpy may not get.
      if (request->bytes > 0) std::memcpy(request->data, it->payload.data(), request->bytes);
      request->work->set_source(peer);
      finish(request->work);
    }
    queue.erase(it);
    return true;
  }
  return false;
}

bool P2pEngine::progress_sends(int peer) {
  auto& queue = sends_[peer];
  if (queue.empty()) return false;
  Connection* conn = conns_[peer];
  SendRequest& request = queue.front();
  bool moved = false;
  if (!request.header_sent) {
    void* slot = conn->send_slot();
    if (slot == nullptr) return false;
    Header header{kMagic, request.dtype, 0, request.tag, request.bytes};
    std::memcpy(slot, &header, sizeof(header));
    conn->post_send(sizeof(header));
    request.header_sent = true;
    moved = true;
  }
  while (request.posted < request.bytes) {
    size_t n = std::min(conn->slot_bytes(), request.bytes - request.posted);
    if (!conn->send_from(request.data + request.posted, n)) return moved;
    request.posted += n;
    moved = true;
  }
  // Sends may go by reference: the buffer is the caller's again only once
  // the connection has let go of it.
  if (!conn->sends_complete()) return moved;
  finish(request.work);
  queue.pop_front();
  return true;
}

void P2pEngine::start_arrival(int peer, const Header& header) {
  Arrival& a = arrivals_[peer];
  a = Arrival();
  a.active = true;
  a.tag = header.tag;
  a.dtype = header.dtype;
  a.bytes = header.bytes;
  auto it = std::find_if(recvs_.begin(), recvs_.end(), [&](const auto& r) {
    return (r->peer < 0 || r->peer == peer) && r->tag == header.tag;
  });
  if (it == recvs_.end()) return;
  const std::string refused = refusal(**it, peer, header.bytes, header.dtype);
  if (refused.empty()) {
    a.request = *it;
  } else {
    // The receive fails, and the message is read and dropped.
    finish((*it)->work, std::make_exception_ptr(InvalidArgument(refused)));
    a.drained = true;
  }
  recvs_.erase(it);
}

char* P2pEngine::next_piece(int peer, size_t n) {
  Arrival& a = arrivals_[peer];
  if (a.request) return a.request->data + a.received;
  if (a.drained) {
    // As large as any connection's slot from the start, so that it never
    // moves under a piece another connection has filled in part.
    if (drain_.empty()) {
      size_t slot = 0;
      for (const Connection* conn : conns_) {
        if (conn != nullptr) slot = std::max(slot, conn->slot_bytes());
      }
      drain_.resize(slot);
    }
    return drain_.data();
  }
  // The stash grows by the piece about to arrive, not by the length the
  // header claims: a peer can make this rank hold only what it really sent.
  // Asked again for the same piece, it keeps its size and place.
  a.stash.resize(a.received + n);
  return a.stash.data() + a.received;
}

void P2pEngine::finish_arrival(int peer) {
  Arrival& a = arrivals_[peer];
  if (a.request) {
    a.request->work->set_source(peer);
    finish(a.request->work);
  } else if (!a.drained) {
    stash_[peer].push_back(Stashed{a.tag, a.dtype, std::move(a.stash)});
    // A receive posted while this message was arriving may want it.
    for (auto it = recvs_.begin(); it != recvs_.end(); ++it) {
      if (match_stashed(*it)) {
        recvs_.erase(it);
        break;
      }
    }
  }
  a = Arrival();
}

bool P2pEngine::progress_arrival(int peer) {
  Connection* conn = conns_[peer];
  Arrival& a = arrivals_[peer];
  bool moved = false;
  if (!a.active) {
    const void* slot = conn->recv_slot(sizeof(Header));
    if (slot == nullptr) return false;
    Header header;
    std::memcpy(&header, slot, sizeof(header));
    conn->release_recv();
    if (header.magic != kMagic) {
      throw PeerError("corrupt point-to-point header from rank " + std::to_string(peer));
    }
    start_arrival(peer, header);
    moved = true;
  }
  while (a.received < a.bytes) {
    const size_t n = std::min(conn->slot_bytes(), a.bytes - a.received);
    if (!conn->recv_into(next_piece(peer, n), n)) return moved;
    a.received += n;
    moved = true;
  }
  finish_arrival(peer);
  return true;
}

void P2pEngine::loop() {
  cpu_placement::mark_worker_thread();
  // A message that stopped moving fails after the timeout; receives that
  // are only waiting for theirs are bounded by their waiters (see p2p.h).
  // Restarted (with the timeout then current) whenever messages move.
  std::optional<Backoff> moving(std::in_place, timeout_s_.load());
  Backoff waiting(std::numeric_limits<double>::infinity());
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stopping_ || (failed_.empty() && pending()); });
    if (stopping_) return;
    withdraw_cancelled();
    bool moved = false;
    std::exception_ptr error;
    try {
      for (size_t p = 0; p < conns_.size(); ++p) {
        if (conns_[p] == nullptr) continue;
        bool sent = false, arrived = false;
        try {
          conns_[p]->progress();
          sent = progress_sends(static_cast<int>(p));
          arrived = progress_arrival(static_cast<int>(p));
        } catch (const OutOfStepError&) {
          throw;
        } catch (const PeerError& e) {
          throw PeerError(lost_peer(static_cast<int>(p), e.what()));
        }
        if (arrived && !left_why_[p].empty()) last_from_[p] = std::chrono::steady_clock::now();
        moved = moved || sent || arrived;
      }
    } catch (const std::exception&) {
      // Not only weft's errors: memory for a stash running out fails the
      // requests too, rather than the process from this thread.
      error = std::current_exception();
    }
    lock.unlock();
    complete_finished();
    lock.lock();
    if (!error && !moved && pending()) {
      fail_requests_of_departed();
      if (!finished_.empty()) {
        lock.unlock();
        complete_finished();
        lock.lock();
        continue;
      }
      const bool stalled = in_flight();
      std::string awaited = oldest_pending();
      if (!stalled) moving.emplace(timeout_s_.load());
      lock.unlock();
      try {
        (stalled ? *moving : waiting).idle([&] { return awaited; });
      } catch (const TimeoutError&) {
        error = std::current_exception();
      }
      lock.lock();
    } else {
      moving.emplace(timeout_s_.load());
      waiting.reset();
    }
    if (error) {
      lock.unlock();
      fail_all(error);
      on_error_(failed_);
      lock.lock();
    }
  }
}

}  // namespace weft
