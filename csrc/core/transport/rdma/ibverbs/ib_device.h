// The device the ibverbs transport uses, one per process and shared by all
// its connections: the first active port that WEFT_IB_HCA allows, its GID
// (WEFT_IB_GID_INDEX, or ib_device.cc's choice), a protection domain,
// whether registrations use On-Demand Paging (WEFT_IB_ODP), and the
// async-event thread whose faults every endpoint checks.
#pragma once

#include <infiniband/verbs.h>

#include <memory>
#include <string>

#include "core/transport/rdma/ibverbs/ib_async_events.h"
#include "core/transport/rdma/ibverbs/ib_faults.h"

namespace weft {

class IbDevice {
 public:
  // The process's device, opened by the first caller (and logged at INFO as
  // rank `rank`); closed when the last holder lets go. Throws
  // InvalidArgument when libibverbs is missing or offers no usable port.
  static std::shared_ptr<IbDevice> shared(int rank);
  ~IbDevice();
  IbDevice(const IbDevice&) = delete;
  IbDevice& operator=(const IbDevice&) = delete;

  ibv_context* context() const { return context_; }
  ibv_pd* pd() const { return pd_; }
  uint8_t port() const { return port_; }
  const ibv_port_attr& port_attr() const { return port_attr_; }
  const ibv_device_attr& device_attr() const { return device_attr_; }
  int gid_index() const { return gid_index_; }
  const ibv_gid& gid() const { return gid_; }
  bool ethernet() const { return port_attr_.link_layer == IBV_LINK_LAYER_ETHERNET; }
  // "mlx5_0:1" and the like.
  const std::string& name() const { return name_; }
  // Whether registrations use On-Demand Paging: the NIC follows the
  // process's page tables instead of pinning pages.
  bool odp() const { return odp_; }
  // The access flags of every registration: local and remote write, and
  // IBV_ACCESS_ON_DEMAND with odp().
  int mr_access() const;
  IbFaults& faults() { return faults_; }

 private:
  explicit IbDevice(int rank);

  ibv_context* context_ = nullptr;
  ibv_pd* pd_ = nullptr;
  uint8_t port_ = 0;
  ibv_port_attr port_attr_{};
  ibv_device_attr device_attr_{};
  int gid_index_ = 0;
  ibv_gid gid_{};
  std::string name_;
  bool odp_ = false;
  IbFaults faults_;
  std::unique_ptr<IbAsyncEvents> events_;  // last member: stops first
};

}  // namespace weft
