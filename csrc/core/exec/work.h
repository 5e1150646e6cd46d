// The handle of one issued operation.
#pragma once

#include <atomic>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>

namespace weft {

class Work {
 public:
  // True once the operation finished, successfully or not.
  bool test() const;
  // Waits up to timeout_s (< 0: until done) and rethrows the operation's
  // error. Throws TimeoutError if it is still running after timeout_s.
  void wait(double timeout_s) const;

  // For a receive from any source: who sent it (-1 until known).
  int source() const { return source_; }
  void set_source(int rank) { source_ = rank; }

  // Asks the engine running a point-to-point request to withdraw it: one
  // whose bytes have not started moving then fails with TimeoutError (a
  // receive no longer matches a message that comes later); one already
  // moving finishes, or fails with its connection.
  void request_cancel() { cancel_requested_ = true; }
  bool cancel_requested() const { return cancel_requested_; }
  // A point-to-point request's bounded wait: waits up to timeout_s, then
  // withdraws the request and waits for it to end, rethrowing its error (the
  // engine's TimeoutError, or the transfer's own outcome when its bytes were
  // already moving).
  void wait_or_withdraw(double timeout_s);

  void complete(std::exception_ptr error = nullptr);
  // Runs fn(error) once the operation has finished: at once if it already
  // has, else on the thread that completes it. One callback per Work.
  void on_complete(std::function<void(std::exception_ptr)> fn);

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
  int source_ = -1;
  std::atomic<bool> cancel_requested_{false};
  std::function<void(std::exception_ptr)> on_complete_;
};

}  // namespace weft
