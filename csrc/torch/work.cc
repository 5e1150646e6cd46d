#include "work.h"

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/ivalue.h>

#include "core/common/deadline.h"
#include "errors.h"

namespace weft::backend {

void run_finishing_step(const std::function<void()>& finish) {
  if (!finish) return;
  at::AutoDispatchBelowADInplaceOrView no_autograd;
  finish();
}

BackendWork::BackendWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs, int source)
    : c10d::Work(rank, type), outputs_(std::move(outputs)), source_(source) {
  completed_ = true;
}

BackendWork::BackendWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs,
                         std::vector<at::Tensor> keep_alive, std::function<void()> finish)
    : c10d::Work(rank, type),
      outputs_(std::move(outputs)),
      keep_alive_(std::move(keep_alive)),
      finish_(std::move(finish)) {}

void BackendWork::track(const std::vector<std::shared_ptr<weft::Work>>& works) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    pending_ = works.size();
    works_ = works;
  }
  if (works.empty()) {
    complete(nullptr);
    return;
  }
  for (const auto& work : works) {
    std::weak_ptr<weft::Work> weak = work;
    // The core holds the callback, and so this Work, until the operation ends.
    work->on_complete([self = c10::intrusive_ptr<BackendWork>::reclaim_copy(this),
                       weak](std::exception_ptr error) {
      auto finished = weak.lock();
      self->core_work_done(error, finished ? finished->source() : -1);
    });
  }
}

void BackendWork::bound_waits(double timeout_s) {
  std::lock_guard<std::mutex> lock(mutex_);
  bounded_wait_s_ = timeout_s;
}

bool BackendWork::wait(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!bounded_wait_s_) {
    lock.unlock();
    return c10d::Work::wait(timeout);
  }
  {
    const auto limit =
        timeout == kNoTimeout
            ? weft::wait_duration(*bounded_wait_s_)
            : std::chrono::duration_cast<std::chrono::steady_clock::duration>(timeout);
    if (!cv_.wait_for(lock, limit, [&] { return completed_; })) {
      // It then completes soon, with a TimeoutError, unless its bytes are
      // moving (then the engine's own timeout bounds the rest).
      for (const auto& work : works_) work->request_cancel();
    }
  }
  lock.unlock();
  return c10d::Work::wait(kNoTimeout);
}

void BackendWork::core_work_done(std::exception_ptr error, int source) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (error && !first_error_) first_error_ = error;
    if (source >= 0) source_ = source;
    if (--pending_ > 0) return;
    error = first_error_;
  }
  if (!error) {
    try {
      run_finishing_step(finish_);
    } catch (...) {
      error = std::current_exception();
    }
  }
  complete(error ? to_torch_error(error) : nullptr);
}

void BackendWork::complete(std::exception_ptr error) {
  c10::intrusive_ptr<c10::ivalue::Future> future;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    completed_ = true;
    exception_ = error;
    future = future_;
    finish_ = nullptr;
    keep_alive_.clear();
  }
  cv_.notify_all();
  if (future) settle(*future);
}

int BackendWork::sourceRank() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return source_;
}

c10::intrusive_ptr<c10::ivalue::Future> BackendWork::make_future() const {
  return c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
}

void BackendWork::settle(c10::ivalue::Future& future) const {
  if (exception_) {
    future.setError(exception_);
  } else {
    future.markCompleted(c10::IValue(outputs_));
  }
}

c10::intrusive_ptr<c10::ivalue::Future> BackendWork::getFuture() {
  std::unique_lock<std::mutex> lock(mutex_);
  if (future_) return future_;
  future_ = make_future();
  auto future = future_;
  // Settled here if the operation already ended, else by complete().
  if (completed_) {
    lock.unlock();
    settle(*future);
  }
  return future;
}

}  // namespace weft::backend
