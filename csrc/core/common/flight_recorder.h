// The flight recorder: each communicator keeps its last WEFT_TRACE_OPS operations
// (what was called, the algorithm and peers it ran with, its state and wall
// clock times) in a fixed ring, and writes them to WEFT_TRACE_DIR when an
// operation fails, when the communicator is aborted, or when the process gets
// SIGTERM or SIGABRT (what torchrun sends). `python -m weft.trace DIR` reads
// every rank's file and says which rank died, is behind or differs.
//
// Recording costs a few stores and two clock reads per operation: no
// allocation, no lock (WEFT_TRACE_OPS=0 records nothing, to measure that).
// Only the thread running the communicator's operations (one at a time)
// writes; the signal handler reads whatever is there.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/common/types.h"

namespace weft {

class FlightRecorder {
 public:
  static constexpr int kMostPeers = 8;  // peers listed per entry (the first ones)
  static constexpr size_t kTextBytes = 512;

  enum class State : uint8_t { Issued, Running, Completed, Failed };

  // Registers the recorder for the signal handler when WEFT_TRACE_DIR is set
  // (and installs the handler on first use, chained to the previous one).
  FlightRecorder(const std::string& comm_name, int rank, int size);
  ~FlightRecorder();
  FlightRecorder(const FlightRecorder&) = delete;
  FlightRecorder& operator=(const FlightRecorder&) = delete;

  // An operation starts: what the caller asked for. `op` must be a string
  // literal (it is kept as a pointer).
  void issued(uint64_t seq, const char* op, DataType dtype, ReduceOp reduce, size_t count,
              int root);
  // The operation's Plan is known: its algorithm and the peers it talks to.
  void running(const std::string& algorithm, const int* peers, int peer_count);
  // The operation ended.
  void ended(bool ok);
  // Writes every live recorder's file (the signal handler's job).
  static void write_all(int signal);
  // Writes this recorder's file now (once per reason worth telling: the
  // first failure). A no-op without WEFT_TRACE_DIR.
  void dump(const std::string& reason);

 private:
  struct Entry {
    std::atomic<uint64_t> number{0};  // 1 + the ring position; 0 while unused
    uint64_t seq = 0;
    const char* op = "";
    DataType dtype = DataType::Float32;
    ReduceOp reduce = ReduceOp::Sum;
    int root = 0;
    uint64_t count = 0;
    char algorithm[24] = {};
    int peers[kMostPeers] = {};
    int peer_count = 0;
    std::atomic<State> state{State::Issued};
    std::atomic<int64_t> start_us{0};
    std::atomic<int64_t> end_us{0};
  };

  // Async-signal-safe: open, write, close and fixed buffers only.
  void write_file(const char* reason, int signal) const;

  char name_[128] = {};  // the communicator's name, as a file name
  const int rank_;
  const int size_;
  const bool enabled_;
  std::atomic<uint64_t> next_{0};  // entries issued so far
  Entry* current_ = nullptr;
  std::atomic<bool> dumped_{false};
  char reason_[kTextBytes] = {};
  const uint64_t capacity_;  // WEFT_TRACE_OPS
  std::unique_ptr<Entry[]> entries_;
};

}  // namespace weft
