// A thread per device context that reads its asynchronous events and turns
// the fatal ones into IbFaults: a QP's (IBV_EVENT_QP_FATAL, _REQ_ERR,
// _ACCESS_ERR) or a CQ's (IBV_EVENT_CQ_ERR) for the endpoint that owns it,
// the port's (IBV_EVENT_PORT_ERR) or the device's (IBV_EVENT_DEVICE_FATAL)
// for every endpoint. Other events are logged and acknowledged. It polls
// the context's async_fd with a short timeout, so that it stops promptly.
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <string>
#include <thread>

#include "core/transport/rdma/ibverbs/ib_faults.h"

namespace weft {

class IbAsyncEvents {
 public:
  IbAsyncEvents(ibv_context* context, std::string device, IbFaults& faults);
  ~IbAsyncEvents();
  IbAsyncEvents(const IbAsyncEvents&) = delete;
  IbAsyncEvents& operator=(const IbAsyncEvents&) = delete;

 private:
  void run();
  void handle(const ibv_async_event& event);

  ibv_context* context_;
  std::string device_;
  IbFaults& faults_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace weft
