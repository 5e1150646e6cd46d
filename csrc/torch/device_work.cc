#include "device_work.h"

#include <ATen/core/ivalue.h>
#include <c10/core/StreamGuard.h>

#include "cuda_staging.h"

namespace weft::backend {

DeviceWork::DeviceWork(int rank, c10d::OpType type, c10::Stream stream,
                       std::vector<at::Tensor> result)
    : c10d::Work(rank, type),
      device_(stream.device()),
      result_(std::move(result)),
      done_(stream.device_type()),
      future_(c10::make_intrusive<c10::ivalue::Future>(
          c10::ListType::create(c10::TensorType::get()), std::vector<c10::Device>{device_})) {
  done_.record(stream);
  c10::StreamGuard guard(stream);
  // A CUDA future: completed on weft's stream, its users wait for it.
  future_->markCompleted(c10::IValue(result_));
  completed_ = true;
}

bool DeviceWork::wait(std::chrono::milliseconds timeout) {
  const bool finished = c10d::Work::wait(timeout);
  done_.block(current_stream(device_));
  return finished;
}

}  // namespace weft::backend
