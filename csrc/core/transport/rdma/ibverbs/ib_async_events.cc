#include "core/transport/rdma/ibverbs/ib_async_events.h"

#include <poll.h>

#include <cerrno>

#include "core/common/log.h"
#include "core/transport/rdma/ibverbs/libibverbs.h"

namespace weft {
namespace {

constexpr int kPollMs = 50;  // how long stopping can take

}  // namespace

IbAsyncEvents::IbAsyncEvents(ibv_context* context, std::string device, IbFaults& faults)
    : context_(context), device_(std::move(device)), faults_(faults) {
  thread_ = std::thread([this] { run(); });
}

IbAsyncEvents::~IbAsyncEvents() {
  stop_ = true;
  thread_.join();
}

void IbAsyncEvents::run() {
  while (!stop_) {
    pollfd fd{context_->async_fd, POLLIN, 0};
    const int ready = ::poll(&fd, 1, kPollMs);
    if (ready < 0 && errno != EINTR) {
      faults_.device_failed("ibverbs: poll on " + device_ + "'s async events failed (errno " +
                            std::to_string(errno) + ")");
      return;
    }
    if (ready <= 0) continue;
    if (fd.revents & (POLLERR | POLLHUP | POLLNVAL)) {
      faults_.device_failed("ibverbs: " + device_ + "'s async event channel closed");
      return;
    }
    ibv_async_event event{};
    if (libibverbs().get_async_event(context_, &event) != 0) continue;
    handle(event);
    libibverbs().ack_async_event(&event);
  }
}

void IbAsyncEvents::handle(const ibv_async_event& event) {
  const std::string what =
      "ibverbs: " + device_ + ": async event " + libibverbs().event_type_str(event.event_type);
  switch (event.event_type) {
    case IBV_EVENT_QP_FATAL:
    case IBV_EVENT_QP_REQ_ERR:
    case IBV_EVENT_QP_ACCESS_ERR:
      faults_.object_failed(event.element.qp,
                            what + " on QP " + std::to_string(event.element.qp->qp_num));
      break;
    case IBV_EVENT_CQ_ERR: faults_.object_failed(event.element.cq, what); break;
    case IBV_EVENT_PORT_ERR:
      faults_.device_failed(what + " on port " + std::to_string(event.element.port_num));
      break;
    case IBV_EVENT_DEVICE_FATAL: faults_.device_failed(what); break;
    default: WEFT_LOG(Info, -1, what << " (not fatal)"); break;
  }
}

}  // namespace weft
