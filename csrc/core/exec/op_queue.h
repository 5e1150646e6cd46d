// Runs a communicator's operations one at a time, in issue order. A blocking
// call made while nothing is queued runs on the caller's thread (no thread
// hand-off on the small-message path); asynchronous calls, and blocking calls
// issued behind them, run on one worker thread started on first use. An
// operation issued from a completion callback of this queue's operations runs
// at once on the callback's thread (see submit).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "core/exec/work.h"

namespace weft {

class OpQueue {
 public:
  // The operation receives its sequence number and its Work.
  using Op = std::function<void(uint64_t seq, Work& work)>;

  OpQueue() = default;
  ~OpQueue();
  OpQueue(const OpQueue&) = delete;
  OpQueue& operator=(const OpQueue&) = delete;

  // async=false: returns once the op finished, rethrowing its error.
  std::shared_ptr<Work> submit(Op op, bool async);
  // When idle: takes no operation from now on (submit throws AbortedError
  // with `why`) and returns how many it took; else nullopt and nothing
  // changes.
  std::optional<uint64_t> close_if_idle(const std::string& why);

 private:
  struct Entry {
    Op op;
    uint64_t seq;
    std::shared_ptr<Work> work;
  };
  void worker_loop();
  void run(Entry& entry);

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Entry> queue_;
  bool busy_ = false;  // an op is running (inline or on the worker)
  bool stopping_ = false;
  std::string closed_;  // why close_if_idle() closed it; empty while open
  uint64_t next_seq_ = 0;
  std::thread worker_;
};

}  // namespace weft
