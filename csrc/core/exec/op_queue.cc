#include "core/exec/op_queue.h"

#include "core/common/error.h"
#include "core/exec/cpu_placement.h"

namespace weft {

OpQueue::~OpQueue() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  for (Entry& entry : queue_) {
    entry.work->complete(std::make_exception_ptr(
        AbortedError("the communicator was destroyed before this operation ran")));
  }
}

namespace {
// The queue whose operation's completion callbacks this thread is running.
thread_local const OpQueue* completing = nullptr;
}  // namespace

void OpQueue::run(Entry& entry) {
  std::exception_ptr error;
  try {
    entry.op(entry.seq, *entry.work);
  } catch (...) {
    error = std::current_exception();
  }
  const OpQueue* outer = completing;
  completing = this;
  entry.work->complete(error);
  completing = outer;
}

std::optional<uint64_t> OpQueue::close_if_idle(const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (busy_ || !queue_.empty()) return std::nullopt;
  closed_ = why.empty() ? "closed" : why;
  return next_seq_;
}

std::shared_ptr<Work> OpQueue::submit(Op op, bool async) {
  Entry entry{std::move(op), 0, std::make_shared<Work>()};
  std::unique_lock<std::mutex> lock(mu_);
  if (!closed_.empty()) throw AbortedError(closed_);
  entry.seq = next_seq_++;
  if (completing == this) {
    // Issued by a completion callback (a comm hook chaining its next
    // collective, or waiting on one): the thread that would run it is this
    // one, so it runs now, right after the operation that completed, which
    // is the same place in the order on every rank.
    lock.unlock();
    run(entry);
    if (!async) entry.work->wait(-1);
    return entry.work;
  }
  if (!async && !busy_ && queue_.empty()) {
    busy_ = true;
    lock.unlock();
    run(entry);
    lock.lock();
    busy_ = false;
    lock.unlock();
    cv_.notify_all();
    entry.work->wait(-1);  // rethrows the error, if any
    return entry.work;
  }
  auto work = entry.work;
  queue_.push_back(std::move(entry));
  if (!worker_.joinable()) worker_ = std::thread([this] { worker_loop(); });
  lock.unlock();
  cv_.notify_all();
  if (!async) work->wait(-1);
  return work;
}

void OpQueue::worker_loop() {
  cpu_placement::mark_worker_thread();
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stopping_ || (!busy_ && !queue_.empty()); });
    if (stopping_) return;
    Entry entry = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lock.unlock();
    run(entry);
    lock.lock();
    busy_ = false;
    cv_.notify_all();
  }
}

}  // namespace weft
