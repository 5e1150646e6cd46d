#include "core/exec/work.h"

#include <chrono>
#include <string>

#include "core/common/deadline.h"
#include "core/common/error.h"

namespace weft {

bool Work::test() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

void Work::wait(double timeout_s) const {
  std::unique_lock<std::mutex> lock(mu_);
  if (timeout_s < 0) {
    cv_.wait(lock, [&] { return done_; });
  } else if (!cv_.wait_for(lock, wait_duration(timeout_s), [&] { return done_; })) {
    throw TimeoutError("wait(" + std::to_string(timeout_s) +
                       " s) returned before the operation finished; it is still running");
  }
  if (error_) std::rethrow_exception(error_);
}

void Work::wait_or_withdraw(double timeout_s) {
  try {
    wait(timeout_s);
  } catch (const TimeoutError&) {
    request_cancel();
    wait(-1);
  }
}

void Work::complete(std::exception_ptr error) {
  std::function<void(std::exception_ptr)> callback;
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    error_ = error;
    callback = std::move(on_complete_);
  }
  cv_.notify_all();
  if (callback) callback(error);
}

void Work::on_complete(std::function<void(std::exception_ptr)> fn) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!done_) {
    on_complete_ = std::move(fn);
    return;
  }
  std::exception_ptr error = error_;
  lock.unlock();
  fn(error);
}

}  // namespace weft
