// Point-to-point operations and the monitored barrier built on them.
#include <chrono>
#include <cstdint>
#include <string>

#include "backend.h"
#include "core/common/error.h"
#include "errors.h"
#include "op_helpers.h"
#include "tensors.h"

namespace weft::backend {
namespace {

// Tags of the monitored barrier's messages: the top bit set, which user tags
// (nonnegative ints) never have, and the call's number below it, so that a
// message of a call that timed out is never taken for a later call's.
constexpr uint32_t kMonitoredBarrierTags = 0x80000000u;

// torch's int tag as the core takes it; negative tags are refused, as gloo
// refuses them, which keeps the top bit for the library's own messages.
uint32_t user_tag(int tag) {
  TORCH_CHECK(tag >= 0, "Tag must be nonnegative");
  return static_cast<uint32_t>(tag);
}

// `role` ("input", "output") names the tensor in errors, as gloo does.
const at::Tensor& single_contiguous(const std::vector<at::Tensor>& tensors, const char* what,
                                    const char* role) {
  check_count(tensors.size(), 1, what, "tensor");
  check_cpu(tensors, what);
  TORCH_CHECK(tensors[0].is_contiguous(), "weft ", what, ": ", role,
              " tensor has to be contiguous");
  return tensors[0];
}

}  // namespace

c10::intrusive_ptr<c10d::Work> WeftBackend::send(std::vector<at::Tensor>& tensors, int dst_rank,
                                                 int tag) {
  if (auto device = cuda_device_of(tensors)) {
    CudaStaging s = staging(*device, "send");
    std::vector<at::Tensor> host = s.twins(tensors, true, false);
    return s.run(rank_, [&] { return send(host, dst_rank, tag); });
  }
  const at::Tensor& t = single_contiguous(tensors, "send", "input");
  return launch(c10d::OpType::SEND, /*async=*/true, {}, {t}, {}, [&](bool a) {
    return Works{comm_->send(t.data_ptr(), t.nbytes(), dst_rank, user_tag(tag), a,
                             core_type_of(t.scalar_type()))};
  });
}

c10::intrusive_ptr<c10d::Work> WeftBackend::recv(std::vector<at::Tensor>& tensors, int src_rank,
                                                 int tag) {
  if (auto device = cuda_device_of(tensors)) {
    CudaStaging s = staging(*device, "recv");
    std::vector<at::Tensor> host = s.twins(tensors, false, true);
    return s.run(rank_, [&] { return recv(host, src_rank, tag); });
  }
  const at::Tensor& t = single_contiguous(tensors, "recv", "output");
  return launch(c10d::OpType::RECV, /*async=*/true, tensors, {t}, {}, [&](bool a) {
    return Works{comm_->recv(t.data_ptr(), t.nbytes(), src_rank, user_tag(tag), a,
                             core_type_of(t.scalar_type()))};
  });
}

c10::intrusive_ptr<c10d::Work> WeftBackend::recvAnysource(std::vector<at::Tensor>& tensors,
                                                          int tag) {
  if (auto device = cuda_device_of(tensors)) {
    CudaStaging s = staging(*device, "recv");
    std::vector<at::Tensor> host = s.twins(tensors, false, true);
    return s.run(rank_, [&] { return recvAnysource(host, tag); });
  }
  const at::Tensor& t = single_contiguous(tensors, "recv", "output");
  return launch(c10d::OpType::RECVANYSOURCE, /*async=*/true, tensors, {t}, {}, [&](bool a) {
    return Works{
        comm_->recv(t.data_ptr(), t.nbytes(), -1, user_tag(tag), a, core_type_of(t.scalar_type()))};
  });
}

// Every rank but 0 sends rank 0 a byte and waits for its answer; rank 0
// waits for each of them within the timeout and names those that did not
// arrive (the first one, or all of them with wait_all_ranks).
void WeftBackend::monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) {
  const auto timeout =
      opts.timeout == c10d::kUnsetTimeout
          ? std::chrono::milliseconds(static_cast<int64_t>(comm_->timeout_s() * 1e3))
          : opts.timeout;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto seconds_left = [&] {
    const std::chrono::duration<double> left = deadline - std::chrono::steady_clock::now();
    return std::max(0.0, left.count());
  };
  const std::string in_time =
      " failed to pass monitoredBarrier in " + std::to_string(timeout.count()) + " ms";
  // A request still waiting at the deadline is withdrawn, so that it cannot
  // take a later barrier's message.
  auto wait_or_withdraw = [&](weft::Work& work) { work.wait_or_withdraw(seconds_left()); };
  const uint32_t tag = kMonitoredBarrierTags | (monitored_barriers_++ & ~kMonitoredBarrierTags);
  // A message already moving when a wait gave up lands in these bytes later:
  // they live as long as the communicator.
  char* byte = &monitored_barrier_bytes_[rank_];
  try {
    if (rank_ != 0) {
      wait_or_withdraw(*comm_->send(byte, 1, 0, tag, true));
      wait_or_withdraw(*comm_->recv(byte, 1, 0, tag, true));
      return;
    }
    std::vector<std::shared_ptr<weft::Work>> arrivals(size_);
    for (int r = 1; r < size_; ++r) {
      arrivals[r] = comm_->recv(&monitored_barrier_bytes_[r], 1, r, tag, true);
    }
    std::vector<int> missing;
    for (int r = 1; r < size_; ++r) {
      try {
        wait_or_withdraw(*arrivals[r]);
      } catch (const weft::TimeoutError&) {
        if (!wait_all_ranks) {
          for (int later = r + 1; later < size_; ++later) arrivals[later]->request_cancel();
          TORCH_CHECK(false, "[Rank 0]: Rank ", r, in_time);
        }
        missing.push_back(r);
      }
    }
    if (!missing.empty()) {
      std::string ranks;
      for (int r : missing) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
      TORCH_CHECK(false, "[Rank 0]: Ranks ", ranks, in_time);
    }
    for (int r = 1; r < size_; ++r) {
      wait_or_withdraw(*comm_->send(byte, 1, r, tag, true));
    }
  } catch (const weft::Error&) {
    rethrow_as_torch_error(std::current_exception());
  }
}

}  // namespace weft::backend
