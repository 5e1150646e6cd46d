// libFuzzer target: point-to-point's receiving side (exec/p2p.cc) reading
// whatever its peers send. A real P2pEngine, rank 1 of a world of 3, runs
// over FakeConnection, a test double of weft::Connection that lives in this
// process: the input, playing ranks 0 and 2, writes each one's stream
// (messages with the 16-byte header {magic, element type, tag, length} and a
// payload, headers claiming any length, raw bytes) while the application posts
// receives (from rank 0, rank 2 or any rank) and sends, withdraws receives
// and has a connection fail, at moments the input chooses. The fake hands
// the engine what a stream holds so far and no more: a piece that has not
// all arrived is copied in part and must be asked for again with the same
// destination and length.
//
// The input's first byte picks the slot size (16, 64, 1000 or 4096 bytes);
// the rest is the script (see Op). Once it is spent the engine runs until
// it has read every stream to its end (or failed, or has nothing pending),
// the receives still waiting are withdrawn and the engine is destroyed.
//
// The oracle. Each stream is read as the engine must read it: messages one
// after another up to a header with another magic (corrupt) or the end,
// where the last message may be cut short. For each rank and tag, the
// receives that took one of its messages (those completed with that rank as
// source, and those refused for their size, whose error names the rank, the
// message's length and the buffer's), in the order they were posted, took
// its messages with that tag in the stream's order, one each: a completed
// receive holds exactly the message's payload and has its length; a refused
// one has another length. A receive withdrawn at the end has no complete
// message left unclaimed from a rank it names with its tag; one still
// waiting when the engine is destroyed was taking the stream's last message,
// which is cut short. The engine fails only where a stream has a corrupt
// header or a connection failed, and then its requests fail with a
// PeerError; until it does, every send completes, and each peer receives
// exactly the sends to it that completed, header and payload, in the order
// posted. No allocation is larger than twice the input plus a constant (a
// length a header claims is never allocated), and the run ends within a
// deadline. Anything else (and any read or write out of bounds) is a bug,
// and the target aborts.
#include <sanitizer/allocator_interface.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/common/error.h"
#include "core/exec/p2p.h"
#include "core/exec/work.h"
#include "core/transport/connection.h"
#include "fuzz_script.h"

namespace {

constexpr uint16_t kMagic = 0x7077;  // p2p.cc's
constexpr size_t kHeaderBytes = 16;  // magic u16, element type u8, unused u8, tag u32, length u64
constexpr uint8_t kUntyped = 0xff;
constexpr size_t kSlotBytes[] = {16, 64, 1000, 4096};
constexpr size_t kMaxInput = 64 << 10;
constexpr size_t kMaxLength = 4095;  // of the script's messages, receives and sends
constexpr size_t kMaxRequests = 64;  // receives, and sends
constexpr uint32_t kTags = 4;
constexpr int kRank = 1;
constexpr int kPeers[] = {0, 2};
// What a run may allocate at once besides twice the input (a stream, a
// stash that grows by doubling): a request's buffer, what the engine sent,
// a slot.
constexpr size_t kAllocSlack = 1 << 20;
constexpr auto kSettleFor = std::chrono::milliseconds(2);
constexpr auto kHang = std::chrono::seconds(5);
// Never reached: a message that stops moving is the script's doing, and the
// run withdraws or destroys what waits on it.
constexpr double kEngineTimeoutS = 600;
constexpr char kConnectionFailed[] = "the script failed the connection";

[[noreturn]] void bug(const char* what) {
  std::fprintf(stderr, "fuzz_p2p: %s\n", what);
  std::abort();
}

// While non-zero, an allocation larger than this is a bug.
std::atomic<size_t> allocation_bound{0};

void check_allocation(const volatile void*, size_t bytes) {
  const size_t bound = allocation_bound.load(std::memory_order_relaxed);
  if (bound != 0 && bytes > bound) {
    // No stdio here: it may allocate.
    static const char kWhat[] = "fuzz_p2p: an allocation larger than the input carried\n";
    (void)!::write(2, kWhat, sizeof(kWhat) - 1);
    std::abort();
  }
}

void ignore_free(const volatile void*) {}

uint32_t u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

uint64_t u64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

std::vector<uint8_t> header(uint32_t tag, uint64_t bytes) {
  std::vector<uint8_t> h(kHeaderBytes);
  std::memcpy(&h[0], &kMagic, 2);
  h[2] = kUntyped;
  std::memcpy(&h[4], &tag, 4);
  std::memcpy(&h[8], &bytes, 8);
  return h;
}

// A test double of weft::Connection: this rank's end of the point-to-point
// channel with one peer. Receiving hands out the peer's stream as far as
// the script has written it; sending records what the engine sends, always
// at once. The engine calls it on its thread, the script on the fuzzer's.
class FakeConnection final : public weft::Connection {
 public:
  explicit FakeConnection(size_t slot_bytes) : slot_bytes_(slot_bytes), send_slot_(slot_bytes) {}

  // ---- the script's side ----
  void write(const uint8_t* bytes, size_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    stream_.insert(stream_.end(), bytes, bytes + n);
    starved_ = false;
  }
  void write(const std::vector<uint8_t>& bytes) { write(bytes.data(), bytes.size()); }
  void fail() { failed_ = true; }
  // Whether the engine asked for more than the stream holds since it last
  // grew: it has read (and dealt with) everything before.
  bool starved() {
    std::lock_guard<std::mutex> lock(mu_);
    return starved_;
  }
  uint64_t rounds() const { return rounds_.load(); }
  bool failed() const { return failed_; }
  // Once the engine is gone.
  const std::vector<uint8_t>& stream() const { return stream_; }
  const std::vector<uint8_t>& sent() const { return sent_; }

  // ---- weft::Connection ----
  void* send_slot() override { return send_slot_.data(); }
  void post_send(size_t bytes) override {
    if (bytes > slot_bytes_) bug("a message posted longer than a slot");
    sent_.insert(sent_.end(), send_slot_.begin(), send_slot_.begin() + bytes);
  }
  bool send_from(const void* src, size_t bytes) override {
    if (bytes > slot_bytes_) bug("a message sent longer than a slot");
    const auto* p = static_cast<const uint8_t*>(src);
    sent_.insert(sent_.end(), p, p + bytes);
    return true;
  }
  bool sends_complete() override { return true; }

  const void* recv_slot(size_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (bytes > slot_bytes_ || piece_ > 0 || held_) bug("recv_slot out of turn");
    if (stream_.size() - pos_ < bytes) {
      starved_ = true;
      return nullptr;
    }
    // Exactly as long as asked, so that reading past it is caught.
    held_ = std::make_unique<uint8_t[]>(bytes);
    held_bytes_ = bytes;
    std::memcpy(held_.get(), stream_.data() + pos_, bytes);
    return held_.get();
  }
  void release_recv() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!held_) bug("release_recv with no message held");
    pos_ += held_bytes_;
    held_.reset();
  }
  bool recv_into(void* dst, size_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (bytes > slot_bytes_ || held_) bug("recv_into out of turn");
    if (piece_ > 0 && (dst != piece_dst_ || bytes != piece_bytes_)) {
      bug("a piece that had partly arrived asked for with another destination or length");
    }
    const size_t n = std::min(bytes - piece_, stream_.size() - pos_);
    if (n > 0) std::memcpy(static_cast<uint8_t*>(dst) + piece_, stream_.data() + pos_, n);
    pos_ += n;
    piece_ += n;
    if (piece_ < bytes) {
      piece_dst_ = dst;
      piece_bytes_ = bytes;
      starved_ = true;
      return false;
    }
    piece_ = 0;
    return true;
  }
  void progress() override {
    rounds_.fetch_add(1);
    if (failed_) throw weft::PeerError(kConnectionFailed);
  }
  void shutdown() override {}
  size_t slot_bytes() const override { return slot_bytes_; }
  size_t capacity_bytes() const override { return 2 * slot_bytes_; }
  const char* transport_name() const override { return "fake"; }

 private:
  const size_t slot_bytes_;
  std::vector<uint8_t> send_slot_;
  std::vector<uint8_t> sent_;
  std::atomic<uint64_t> rounds_{0};
  std::atomic<bool> failed_{false};

  std::mutex mu_;
  std::vector<uint8_t> stream_;
  size_t pos_ = 0;  // read up to here
  bool starved_ = false;
  std::unique_ptr<uint8_t[]> held_;  // recv_slot's message until released
  size_t held_bytes_ = 0;
  // The piece a recv_into has copied in part.
  size_t piece_ = 0;
  void* piece_dst_ = nullptr;
  size_t piece_bytes_ = 0;
};

// What the script does. Each operation is a tag byte (taken modulo kOps)
// and its operands, little-endian; an operation cut short ends the script.
// A peer byte's bit 0 picks rank 2 over rank 0; tags are taken modulo kTags
// and lengths modulo kMaxLength + 1.
enum Op : uint8_t {
  // peer u8, count u16, then count bytes (fewer where the input ends):
  // written to the peer's stream as they are.
  kBytes,
  // peer u8, tag u8, length u16, then the payload (cut where the input
  // ends): a message as the peer sends it.
  kMessage,
  // peer u8, tag u8, length u64: a header alone, claiming any length.
  kHeader,
  // source u8, tag u8, length u16: posts a receive from (source % 3) rank 0,
  // rank 2 or any rank.
  kRecv,
  // peer u8, tag u8, length u16: posts a send.
  kSend,
  // index u8: asks to withdraw the index-th receive posted (modulo their
  // number).
  kCancel,
  // peer u8: the connection fails (progress() throws PeerError from now on).
  kFail,
  // Waits (a few ms at most) until the engine has read what the streams hold
  // so far, failed, or has nothing pending.
  kSettle,
  kOps
};

struct Receive {
  int peer;  // -1: any
  uint32_t tag;
  std::vector<uint8_t> buffer;
  std::shared_ptr<weft::Work> work;  // null: refused when posted
  bool cancelled = false;            // by the script, before the end
  bool withdrawn_at_end = false;
};

struct Send {
  int peer;
  uint32_t tag;
  std::vector<uint8_t> payload;
  std::shared_ptr<weft::Work> work;  // null: refused when posted
};

enum class Outcome { kRefused, kDone, kWrongSize, kWithdrawn, kPeerError, kAborted };

Outcome outcome_of(const std::shared_ptr<weft::Work>& work, std::string& what) {
  if (!work) return Outcome::kRefused;
  if (!work->test()) bug("a request still running once the engine is gone");
  try {
    work->wait(0);
    return Outcome::kDone;
  } catch (const weft::InvalidArgument& e) {
    what = e.what();
    return Outcome::kWrongSize;
  } catch (const weft::TimeoutError&) {
    return Outcome::kWithdrawn;
  } catch (const weft::PeerError&) {
    return Outcome::kPeerError;
  } catch (const weft::AbortedError&) {
    return Outcome::kAborted;
  } catch (...) {
    bug("a request failed with something other than a weft error");
  }
}

// The number written just before, or just after, text[at].
uint64_t number_before(const std::string& text, size_t at) {
  size_t start = at;
  while (start > 0 && text[start - 1] >= '0' && text[start - 1] <= '9') --start;
  if (start == at) bug("a refusal without the message's length");
  return std::strtoull(text.c_str() + start, nullptr, 10);
}

uint64_t number_after(const std::string& text, size_t at) {
  at = text.find_first_of("0123456789", at);
  if (at == std::string::npos) bug("a refusal without the buffer's length");
  return std::strtoull(text.c_str() + at, nullptr, 10);
}

// A refusal for the size: the rank it names and the message's length.
struct Refusal {
  int rank;
  uint64_t length;
};

Refusal parse_refusal(const std::string& what, size_t buffer) {
  static const std::string kRank = " with rank ", kBut = " bytes but the receive buffer";
  const size_t rank = what.find(kRank), but = what.find(kBut);
  if (rank == std::string::npos || but == std::string::npos) {
    bug("a receive failed with InvalidArgument that is not a refusal for its size");
  }
  if (number_after(what, but + kBut.size()) != buffer) bug("a refusal naming another buffer");
  return {static_cast<int>(number_after(what, rank + kRank.size())), number_before(what, but)};
}

struct Message {
  uint32_t tag;
  uint64_t bytes;
  const uint8_t* payload;
  bool complete;
};

struct Stream {
  std::vector<Message> messages;
  bool corrupt = false;
};

// The stream as the engine must read it.
Stream parse(const std::vector<uint8_t>& bytes) {
  Stream s;
  for (size_t pos = 0; bytes.size() - pos >= kHeaderBytes;) {
    uint16_t magic;
    std::memcpy(&magic, &bytes[pos], sizeof(magic));
    if (magic != kMagic) {
      s.corrupt = true;
      break;
    }
    const uint64_t length = u64(&bytes[pos + 8]);
    const size_t left = bytes.size() - pos - kHeaderBytes;
    s.messages.push_back(
        Message{u32(&bytes[pos + 4]), length, &bytes[pos + kHeaderBytes], length <= left});
    if (length > left) break;
    pos += kHeaderBytes + length;
  }
  return s;
}

int peer_index(int rank) { return rank == kPeers[0] ? 0 : rank == kPeers[1] ? 1 : -1; }

bool names(const Receive& r, int index) { return r.peer < 0 || r.peer == kPeers[index]; }

template <typename Pred>
bool wait_until(std::chrono::steady_clock::duration limit, Pred pred) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::yield();
  }
  return true;
}

class Run {
 public:
  explicit Run(size_t slot_bytes) : fakes_{FakeConnection(slot_bytes), FakeConnection(slot_bytes)} {
    engine_ = std::make_unique<weft::P2pEngine>(
        kRank, std::vector<weft::Connection*>{&fakes_[0], nullptr, &fakes_[1]}, kEngineTimeoutS,
        [this](const std::string& error) {
          std::lock_guard<std::mutex> lock(mu_);
          failure_ = error;
          failed_ = true;
        },
        [](int) { return std::string(); });
  }

  void play(Script& script);
  void finish();
  void check();

 private:
  FakeConnection& fake(uint8_t peer) { return fakes_[peer & 1]; }
  bool failed() const { return failed_.load(); }
  template <typename Request>
  static bool done(const std::vector<Request>& requests) {
    for (const auto& r : requests) {
      if (r.work && !r.work->test()) return false;
    }
    return true;
  }
  bool all_done() const { return done(receives_) && done(sends_); }
  // The engine has nothing left to do with what the streams hold so far.
  bool quiet() { return failed() || all_done() || (fakes_[0].starved() && fakes_[1].starved()); }
  void check_receives(const Stream (&streams)[2]);
  void check_sends();

  FakeConnection fakes_[2];
  std::unique_ptr<weft::P2pEngine> engine_;
  // The engine holds pointers into their buffers: never moved.
  std::vector<Receive> receives_;
  std::vector<Send> sends_;
  std::atomic<bool> failed_{false};
  std::mutex mu_;
  std::string failure_;
};

void Run::play(Script& script) {
  receives_.reserve(kMaxRequests);
  sends_.reserve(kMaxRequests);
  uint8_t op;
  while (script.get(op)) {
    uint8_t peer = 0, tag = 0;
    uint16_t length = 0;
    switch (op % kOps) {
      case kBytes: {
        if (!script.get(peer) || !script.get(length)) return;
        const auto [bytes, n] = script.some(length);
        fake(peer).write(bytes, n);
        break;
      }
      case kMessage: {
        if (!script.get(peer) || !script.get(tag) || !script.get(length)) return;
        const size_t bytes = length % (kMaxLength + 1);
        fake(peer).write(header(tag % kTags, bytes));
        const auto [payload, n] = script.some(bytes);
        fake(peer).write(payload, n);
        break;
      }
      case kHeader: {
        uint64_t claimed;
        if (!script.get(peer) || !script.get(tag) || !script.get(claimed)) return;
        fake(peer).write(header(tag % kTags, claimed));
        break;
      }
      case kRecv: {
        if (!script.get(peer) || !script.get(tag) || !script.get(length)) return;
        if (receives_.size() == kMaxRequests) break;
        const int source = peer % 3 == 2 ? -1 : kPeers[peer % 3];
        Receive& r = receives_.emplace_back(
            Receive{source, tag % kTags, std::vector<uint8_t>(length % (kMaxLength + 1)), nullptr});
        try {
          r.work = engine_->recv(r.buffer.data(), r.buffer.size(), source, r.tag);
        } catch (const weft::AbortedError&) {
        }
        break;
      }
      case kSend: {
        if (!script.get(peer) || !script.get(tag) || !script.get(length)) return;
        if (sends_.size() == kMaxRequests) break;
        Send& s =
            sends_.emplace_back(Send{kPeers[peer & 1], tag % kTags,
                                     std::vector<uint8_t>(length % (kMaxLength + 1)), nullptr});
        for (size_t i = 0; i < s.payload.size(); ++i) {
          s.payload[i] = static_cast<uint8_t>(sends_.size() * 31 + i);
        }
        try {
          s.work = engine_->send(s.payload.data(), s.payload.size(), s.peer, s.tag);
        } catch (const weft::AbortedError&) {
        }
        break;
      }
      case kCancel: {
        uint8_t index;
        if (!script.get(index)) return;
        if (receives_.empty()) break;
        Receive& r = receives_[index % receives_.size()];
        if (r.work) r.work->request_cancel();
        r.cancelled = true;
        break;
      }
      case kFail:
        if (!script.get(peer)) return;
        fake(peer).fail();
        break;
      case kSettle: wait_until(kSettleFor, [&] { return quiet(); }); break;
    }
  }
}

void Run::finish() {
  if (!wait_until(kHang, [&] { return quiet(); })) {
    bug("the engine neither read its streams to the end nor failed while requests waited");
  }
  for (auto& r : receives_) {
    if (r.work && !r.work->test()) {
      r.work->request_cancel();
      r.withdrawn_at_end = true;
    }
  }
  // The engine withdraws them at the start of its next round, but one that
  // is taking a message cut short waits on; the sends complete (one per peer
  // a round) unless the engine failed.
  const uint64_t rounds = fakes_[0].rounds();
  if (!wait_until(kHang, [&] {
        return failed() || (done(sends_) && (done(receives_) || fakes_[0].rounds() >= rounds + 2));
      })) {
    bug("the engine stopped going round while requests waited");
  }
  engine_.reset();
}

void Run::check() {
  const Stream streams[2] = {parse(fakes_[0].stream()), parse(fakes_[1].stream())};
  if (failed()) {
    const bool cause =
        streams[0].corrupt || streams[1].corrupt || fakes_[0].failed() || fakes_[1].failed();
    if (!cause) bug("the engine failed with no corrupt header or failed connection");
    if (failure_.find("corrupt point-to-point header") == std::string::npos &&
        failure_.find(kConnectionFailed) == std::string::npos) {
      bug("the engine failed with another error than its peer's");
    }
  }
  check_receives(streams);
  check_sends();
}

void Run::check_receives(const Stream (&streams)[2]) {
  struct Taker {
    size_t receive;
    bool refused;
    uint64_t claimed;  // the length a refusal names
  };
  std::vector<Taker> takers[2][kTags];
  std::vector<size_t> aborted;
  for (size_t i = 0; i < receives_.size(); ++i) {
    const Receive& r = receives_[i];
    std::string what;
    switch (outcome_of(r.work, what)) {
      case Outcome::kDone: {
        const int index = peer_index(r.work->source());
        if (index < 0 || !names(r, index)) bug("a receive completed from a rank it does not name");
        takers[index][r.tag].push_back({i, false, 0});
        break;
      }
      case Outcome::kWrongSize: {
        const Refusal refusal = parse_refusal(what, r.buffer.size());
        const int index = peer_index(refusal.rank);
        if (index < 0 || !names(r, index)) bug("a refusal naming a rank the receive does not");
        takers[index][r.tag].push_back({i, true, refusal.length});
        break;
      }
      case Outcome::kWithdrawn:
        if (!r.cancelled && !r.withdrawn_at_end) bug("a receive withdrawn that was not");
        break;
      case Outcome::kRefused:
      case Outcome::kPeerError:
        if (!failed()) bug("a receive failed while the engine had not");
        break;
      case Outcome::kAborted:
        if (failed()) bug("a receive aborted rather than failed with the engine");
        aborted.push_back(i);
        break;
    }
  }

  std::vector<const Message*> tagged[2][kTags];
  for (int p = 0; p < 2; ++p) {
    for (const Message& m : streams[p].messages) {
      if (m.tag < kTags) tagged[p][m.tag].push_back(&m);
    }
  }
  for (int p = 0; p < 2; ++p) {
    for (uint32_t t = 0; t < kTags; ++t) {
      const auto& messages = tagged[p][t];
      const auto& taken = takers[p][t];
      if (taken.size() > messages.size()) bug("more receives took messages than were sent");
      for (size_t k = 0; k < taken.size(); ++k) {
        const Message& m = *messages[k];
        const Receive& r = receives_[taken[k].receive];
        if (taken[k].refused) {
          if (m.bytes == r.buffer.size() || taken[k].claimed != m.bytes) {
            bug("a receive refused for its size, but the message has that size or another "
                "than the refusal says");
          }
        } else if (!m.complete || m.bytes != r.buffer.size() ||
                   (m.bytes > 0 && std::memcmp(r.buffer.data(), m.payload, m.bytes) != 0)) {
          bug("a receive completed with other bytes than its message's");
        }
      }
    }
  }

  // Still waiting at the end: taking a message cut short, the last of its
  // stream (at most one per stream), posted after the receives that took
  // the earlier ones.
  bool taking[2] = {false, false};
  for (size_t i : aborted) {
    const Receive& r = receives_[i];
    bool found = false;
    for (int p = 0; p < 2 && !found; ++p) {
      const auto& messages = tagged[p][r.tag];
      const auto& taken = takers[p][r.tag];
      found = names(r, p) && !taking[p] && messages.size() == taken.size() + 1 &&
              !messages.back()->complete && messages.back()->bytes == r.buffer.size() &&
              (taken.empty() || taken.back().receive < i);
      taking[p] = taking[p] || found;
    }
    if (!found) bug("a receive left waiting with no message arriving for it");
  }

  // Withdrawn at the end, once the engine had read every stream: no
  // complete message was left for it.
  if (failed()) return;
  for (const Receive& r : receives_) {
    if (!r.withdrawn_at_end || r.cancelled) continue;
    for (int p = 0; p < 2; ++p) {
      const auto& messages = tagged[p][r.tag];
      const size_t taken = takers[p][r.tag].size();
      if (names(r, p) && messages.size() > taken && messages[taken]->complete) {
        bug("a receive withdrawn while a message for it had arrived");
      }
    }
  }
}

void Run::check_sends() {
  std::vector<uint8_t> expected[2];
  for (const Send& s : sends_) {
    std::string what;
    switch (outcome_of(s.work, what)) {
      case Outcome::kDone: {
        auto& bytes = expected[peer_index(s.peer)];
        const auto h = header(s.tag, s.payload.size());
        bytes.insert(bytes.end(), h.begin(), h.end());
        bytes.insert(bytes.end(), s.payload.begin(), s.payload.end());
        break;
      }
      case Outcome::kRefused:
      case Outcome::kPeerError:
        if (!failed()) bug("a send failed while the engine had not");
        break;
      default: bug("a send neither completed nor failed with the engine");
    }
  }
  for (int p = 0; p < 2; ++p) {
    if (fakes_[p].sent() != expected[p]) bug("a peer received other bytes than the sends to it");
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  __sanitizer_install_malloc_and_free_hooks(check_allocation, ignore_free);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1 || size > kMaxInput) return 0;
  allocation_bound = 2 * size + kAllocSlack;
  {
    Run run(kSlotBytes[data[0] % 4]);
    Script script(data + 1, size - 1);
    run.play(script);
    run.finish();
    run.check();
  }
  allocation_bound = 0;
  return 0;
}
