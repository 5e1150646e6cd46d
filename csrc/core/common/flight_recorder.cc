#include "core/common/flight_recorder.h"

#include <fcntl.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <mutex>

#include "core/common/config.h"

namespace weft {
namespace {

constexpr int kMostRecorders = 64;  // live communicators with a trace (more are not written)
std::atomic<FlightRecorder*> g_recorders[kMostRecorders];
char g_dir[512] = {};
struct sigaction g_previous[2];
constexpr int kSignals[2] = {SIGTERM, SIGABRT};

int64_t now_us() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000 + ts.tv_nsec / 1000;
}

// Copies `text` into `dst` (a C string of `size` bytes), newlines as spaces.
void copy_text(char* dst, size_t size, const char* text) {
  size_t i = 0;
  for (; i + 1 < size && text[i] != '\0'; ++i) dst[i] = text[i] == '\n' ? ' ' : text[i];
  dst[i] = '\0';
}

// One line of a trace file, built without allocation (signal handlers use it).
class Line {
 public:
  Line& text(const char* s) {
    while (*s != '\0' && n_ + 1 < sizeof(buf_)) buf_[n_++] = *s++;
    return *this;
  }
  Line& number(int64_t v) {
    char digits[24];
    int k = 0;
    const bool negative = v < 0;
    uint64_t u = negative ? 0 - static_cast<uint64_t>(v) : static_cast<uint64_t>(v);
    do {
      digits[k++] = static_cast<char>('0' + u % 10);
      u /= 10;
    } while (u != 0);
    if (negative) digits[k++] = '-';
    while (k > 0 && n_ + 1 < sizeof(buf_)) buf_[n_++] = digits[--k];
    return *this;
  }
  void write_to(int fd) {
    buf_[n_++] = '\n';
    size_t done = 0;
    while (done < n_) {
      const ssize_t w = ::write(fd, buf_ + done, n_ - done);
      if (w <= 0) break;
      done += static_cast<size_t>(w);
    }
    n_ = 0;
  }

 private:
  char buf_[FlightRecorder::kTextBytes + 512];
  size_t n_ = 0;
};

const char* state_name(FlightRecorder::State s) {
  switch (s) {
    case FlightRecorder::State::Issued: return "issued";
    case FlightRecorder::State::Running: return "running";
    case FlightRecorder::State::Completed: return "completed";
    case FlightRecorder::State::Failed: return "failed";
  }
  return "?";
}

const char* signal_name(int signal) {
  switch (signal) {
    case SIGTERM: return "SIGTERM";
    case SIGABRT: return "SIGABRT";
  }
  return "signal";
}

void on_signal(int signal, siginfo_t* info, void* context) {
  FlightRecorder::write_all(signal);
  const struct sigaction& previous = g_previous[signal == SIGTERM ? 0 : 1];
  if (previous.sa_flags & SA_SIGINFO) {
    previous.sa_sigaction(signal, info, context);
  } else if (previous.sa_handler == SIG_DFL) {
    // Die as the signal would have killed us: it is blocked while we run and
    // is delivered again once the handler returns.
    ::sigaction(signal, &previous, nullptr);
    ::raise(signal);
  } else if (previous.sa_handler != SIG_IGN) {
    previous.sa_handler(signal);
  }
}

void install_signal_handlers() {
  struct sigaction action{};
  action.sa_sigaction = on_signal;
  action.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&action.sa_mask);
  for (int i = 0; i < 2; ++i) ::sigaction(kSignals[i], &action, &g_previous[i]);
}

}  // namespace

void FlightRecorder::write_all(int signal) {
  for (auto& slot : g_recorders) {
    const FlightRecorder* r = slot.load(std::memory_order_acquire);
    if (r != nullptr) r->write_file(r->reason_, signal);
  }
}

FlightRecorder::FlightRecorder(const std::string& comm_name, int rank, int size)
    : rank_(rank),
      size_(size),
      enabled_(!config().trace_dir.empty()),
      capacity_(static_cast<uint64_t>(config().trace_ops)),
      entries_(new Entry[capacity_]) {
  copy_text(name_, sizeof(name_), comm_name.c_str());
  for (char* c = name_; *c != '\0'; ++c) {
    if (*c == '/' || *c == ' ') *c = '_';
  }
  if (!enabled_) return;
  static std::once_flag installed;
  std::call_once(installed, [] {
    copy_text(g_dir, sizeof(g_dir), config().trace_dir.c_str());
    install_signal_handlers();
  });
  for (auto& slot : g_recorders) {
    FlightRecorder* empty = nullptr;
    if (slot.compare_exchange_strong(empty, this)) break;
  }
}

FlightRecorder::~FlightRecorder() {
  for (auto& slot : g_recorders) {
    FlightRecorder* self = this;
    slot.compare_exchange_strong(self, nullptr);
  }
}

void FlightRecorder::issued(uint64_t seq, const char* op, DataType dtype, ReduceOp reduce,
                            size_t count, int root) {
  if (capacity_ == 0) return;
  Entry& e = entries_[next_.load(std::memory_order_relaxed) % capacity_];
  e.number.store(0, std::memory_order_relaxed);
  e.seq = seq;
  e.op = op;
  e.dtype = dtype;
  e.reduce = reduce;
  e.count = count;
  e.root = root;
  e.algorithm[0] = '\0';
  e.peer_count = 0;
  e.state.store(State::Issued, std::memory_order_relaxed);
  e.start_us.store(now_us(), std::memory_order_relaxed);
  e.end_us.store(0, std::memory_order_relaxed);
  const uint64_t number = next_.load(std::memory_order_relaxed) + 1;
  e.number.store(number, std::memory_order_release);
  next_.store(number, std::memory_order_release);
  current_ = &e;
}

void FlightRecorder::running(const std::string& algorithm, const int* peers, int peer_count) {
  if (current_ == nullptr) return;
  copy_text(current_->algorithm, sizeof(current_->algorithm), algorithm.c_str());
  current_->peer_count = std::min(peer_count, kMostPeers);
  std::copy(peers, peers + current_->peer_count, current_->peers);
  current_->state.store(State::Running, std::memory_order_release);
}

void FlightRecorder::ended(bool ok) {
  if (current_ == nullptr) return;
  current_->end_us.store(now_us(), std::memory_order_relaxed);
  current_->state.store(ok ? State::Completed : State::Failed, std::memory_order_release);
  current_ = nullptr;
}

void FlightRecorder::dump(const std::string& reason) {
  if (!enabled_) return;
  // The first failure is the cause; later ones (operations refused because
  // of it) only update the entries.
  if (!dumped_.exchange(true)) copy_text(reason_, sizeof(reason_), reason.c_str());
  write_file(reason_, 0);
}

void FlightRecorder::write_file(const char* reason, int signal) const {
  Line line;
  char path[sizeof(g_dir) + sizeof(name_) + 64];
  size_t n = 0;
  auto put = [&](const char* s) {
    while (*s != '\0' && n + 1 < sizeof(path)) path[n++] = *s++;
  };
  put(g_dir);
  put("/");
  put(name_);
  put(".rank");
  char digits[12];
  int k = 0, r = rank_;
  do {
    digits[k++] = static_cast<char>('0' + r % 10);
    r /= 10;
  } while (r != 0);
  while (k > 0 && n + 1 < sizeof(path)) path[n++] = digits[--k];
  put(".weft-trace");
  path[n] = '\0';
  const int fd = ::open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return;
  line.text("weft-trace 1").write_to(fd);
  line.text("comm ").text(name_).write_to(fd);
  line.text("rank ").number(rank_).write_to(fd);
  line.text("size ").number(size_).write_to(fd);
  line.text("pid ").number(::getpid()).write_to(fd);
  line.text("written_us ").number(now_us()).write_to(fd);
  if (signal != 0) line.text("signal ").text(signal_name(signal)).write_to(fd);
  if (reason[0] != '\0') line.text("reason ").text(reason).write_to(fd);
  // Oldest first: the ring from the entry after the newest.
  const uint64_t newest = next_.load(std::memory_order_acquire);
  const uint64_t first = newest > capacity_ ? newest - capacity_ : 0;
  for (uint64_t i = first; i < newest; ++i) {
    const Entry& e = entries_[i % capacity_];
    if (e.number.load(std::memory_order_acquire) != i + 1) continue;  // being rewritten
    line.text("op seq=").number(static_cast<int64_t>(e.seq)).text(" name=").text(e.op);
    line.text(" dtype=").text(to_string(e.dtype)).text(" reduce=").text(to_string(e.reduce));
    line.text(" count=").number(static_cast<int64_t>(e.count)).text(" root=").number(e.root);
    line.text(" algorithm=").text(e.algorithm[0] != '\0' ? e.algorithm : "-").text(" peers=");
    for (int p = 0; p < e.peer_count; ++p) {
      if (p > 0) line.text(",");
      line.number(e.peers[p]);
    }
    if (e.peer_count == 0) line.text("-");
    line.text(" state=").text(state_name(e.state.load(std::memory_order_acquire)));
    line.text(" start_us=").number(e.start_us.load(std::memory_order_relaxed));
    line.text(" end_us=").number(e.end_us.load(std::memory_order_relaxed));
    line.write_to(fd);
  }
  ::close(fd);
}

}  // namespace weft
