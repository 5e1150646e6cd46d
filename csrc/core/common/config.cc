#include "core/common/config.h"

#include <unistd.h>

#include <cstdlib>
#include <initializer_list>
#include <string>
#include <utility>

#include "core/common/error.h"
#include "core/common/machine.h"

namespace weft {
namespace {

const char* env(const char* name) {
  const char* value = std::getenv(name);
  return (value != nullptr && value[0] != '\0') ? value : nullptr;
}

double env_double(const char* name, double fallback) {
  const char* value = env(name);
  if (value == nullptr) return fallback;
  char* end = nullptr;
  double parsed = std::strtod(value, &end);
  if (*end != '\0' || parsed <= 0) {
    throw InvalidArgument(std::string(name) + "='" + value + "' is not a positive number");
  }
  return parsed;
}

long env_long(const char* name, long fallback) {
  const char* value = env(name);
  if (value == nullptr) return fallback;
  char* end = nullptr;
  long parsed = std::strtol(value, &end, 10);
  if (*end != '\0' || parsed <= 0) {
    throw InvalidArgument(std::string(name) + "='" + value + "' is not a positive integer");
  }
  return parsed;
}

// An integer in [low, high]; unset keeps `fallback`.
int env_int_in(const char* name, int fallback, int low, int high) {
  const char* value = env(name);
  if (value == nullptr) return fallback;
  char* end = nullptr;
  long parsed = std::strtol(value, &end, 10);
  if (*end != '\0' || parsed < low || parsed > high) {
    throw InvalidArgument(std::string(name) + "='" + value + "': give an integer from " +
                          std::to_string(low) + " to " + std::to_string(high));
  }
  return static_cast<int>(parsed);
}

// One of a fixed set of words: the value of the first whose name matches.
// Unset keeps `fallback`; anything else names the choices.
template <typename T>
T env_choice(const char* name, T fallback,
             std::initializer_list<std::pair<const char*, T>> choices) {
  const char* value = env(name);
  if (value == nullptr) return fallback;
  std::string names;
  size_t i = 0;
  for (const auto& [word, choice] : choices) {
    if (word == std::string(value)) return choice;
    if (i > 0) names += i + 1 == choices.size() ? " or " : ", ";
    names += word;
    ++i;
  }
  throw InvalidArgument(std::string(name) + "='" + value + "': use " + names);
}

std::string default_host_id() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return std::string(host) + "/" + boot_id();
}

Config parse() {
  Config c;
  c.transport = env_choice("WEFT_TRANSPORT", c.transport,
                           {{"auto", TransportChoice::Auto},
                            {"tcp", TransportChoice::Tcp},
                            {"shm", TransportChoice::Shm},
                            {"ofi", TransportChoice::Ofi},
                            {"ibverbs", TransportChoice::Ibverbs}});
  c.timeout_s = env_double("WEFT_TIMEOUT_S", c.timeout_s);
  c.host_timeout_s = env_double("WEFT_HOST_TIMEOUT_S", c.host_timeout_s);
  if (!(c.host_timeout_s >= 1 && c.host_timeout_s <= 3600)) {
    throw InvalidArgument("WEFT_HOST_TIMEOUT_S=" + std::to_string(c.host_timeout_s) +
                          ": give 1 to 3600 seconds");
  }
  if (const char* d = env("WEFT_DEBUG")) {
    std::string s(d);
    if (s == "INFO" || s == "info") {
      c.log_level = LogLevel::Info;
    } else if (s == "TRACE" || s == "trace") {
      c.log_level = LogLevel::Trace;
    } else if (s != "OFF" && s != "off" && s != "WARN" && s != "warn") {
      throw InvalidArgument("WEFT_DEBUG='" + s + "': use INFO, TRACE or OFF");
    }
  }
  const char* host = env("WEFT_HOST_ID");
  c.host_id = host ? host : default_host_id();
  if (const char* ifname = env("WEFT_SOCKET_IFNAME")) c.socket_ifname = ifname;
  if (const char* addr = env("WEFT_SOCKET_ADDR")) c.socket_addr = addr;
  if (const char* secret = env("WEFT_JOB_SECRET")) c.job_secret = secret;
  c.shm_slot_bytes = env_long("WEFT_SHM_SLOT_BYTES", c.shm_slot_bytes);
  c.shm_slots = env_long("WEFT_SHM_SLOTS", c.shm_slots);
  c.tcp_slot_bytes = env_long("WEFT_TCP_SLOT_BYTES", c.tcp_slot_bytes);
  c.tcp_slots = env_long("WEFT_TCP_SLOTS", c.tcp_slots);
  c.channels = static_cast<int>(env_long("WEFT_CHANNELS", c.channels));
  if (c.channels < 1 || c.channels > 16) {
    throw InvalidArgument("WEFT_CHANNELS=" + std::to_string(c.channels) +
                          ": give 1 to 16 connection sets per peer");
  }
  c.tcp_geometry_set = env("WEFT_TCP_SLOT_BYTES") || env("WEFT_TCP_SLOTS");
  if (const char* fault = env("WEFT_RDMA_FAULT")) {
    const std::string name = fault;
    if (name != "bad_key" && name != "slow_connect") {
      throw InvalidArgument("WEFT_RDMA_FAULT='" + name + "': use bad_key or slow_connect");
    }
    c.rdma_bad_key = name == "bad_key";
    c.rdma_slow_connect = name == "slow_connect";
  }
  if (const char* lib = env("WEFT_IBVERBS_LIB")) c.ibverbs_lib = lib;
  if (const char* hca = env("WEFT_IB_HCA")) c.ib_hca = hca;
  c.ib_gid_index = env_int_in("WEFT_IB_GID_INDEX", c.ib_gid_index, 0, 1023);
  c.ib_qps_per_peer = env_int_in("WEFT_IB_QPS_PER_PEER", c.ib_qps_per_peer, 1, 16);
  c.ib_timeout = env_int_in("WEFT_IB_TIMEOUT", c.ib_timeout, 1, 31);
  c.ib_retry_cnt = env_int_in("WEFT_IB_RETRY_CNT", c.ib_retry_cnt, 0, 7);
  c.ib_odp = env_choice("WEFT_IB_ODP", c.ib_odp,
                        {{"auto", IbOdp::Auto}, {"0", IbOdp::Off}, {"1", IbOdp::Required}});
  if (const char* cma = env("WEFT_SHM_CMA")) c.shm_cma = std::string(cma) == "1";
  c.cma_min_bytes = env_long("WEFT_SHM_CMA_MIN_BYTES", c.cma_min_bytes);
  c.streaming_bytes = env_long("WEFT_STREAMING_BYTES", c.streaming_bytes);
  c.scratch_cache_bytes = env_long("WEFT_SCRATCH_CACHE_BYTES", c.scratch_cache_bytes);
  if (const char* algo = env("WEFT_ALGO")) c.algo = algo;
  if (const char* tune = env("WEFT_TUNE")) c.tune = tune;
  c.cuda_path = env_choice("WEFT_CUDA_PATH", c.cuda_path,
                           {{"auto", CudaPath::Auto},
                            {"staging", CudaPath::Staging},
                            {"ipc", CudaPath::Ipc},
                            {"nccl", CudaPath::Nccl}});
  c.cuda_ipc_chunk_bytes = env_long("WEFT_CUDA_IPC_CHUNK_BYTES", c.cuda_ipc_chunk_bytes);
  c.nccl_mode = env_choice("WEFT_NCCL_MODE", c.nccl_mode,
                           {{"native", NcclMode::Native}, {"plans", NcclMode::Plans}});
  c.nccl_step_bytes = env_long("WEFT_NCCL_STEP_BYTES", c.nccl_step_bytes);
  c.cpu_placement =
      env_choice("WEFT_CPU_PLACEMENT", c.cpu_placement, {{"auto", true}, {"off", false}});
  if (const char* dir = env("WEFT_TRACE_DIR")) c.trace_dir = dir;
  c.trace_ops = env_int_in("WEFT_TRACE_OPS", c.trace_ops, 0, 1 << 20);
  // torch's own switch for checking collectives across ranks turns ours on too.
  const char* torch_debug = env("TORCH_DISTRIBUTED_DEBUG");
  c.debug_checks =
      env_choice("WEFT_DEBUG_CHECKS", torch_debug && std::string(torch_debug) == "DETAIL",
                 {{"0", false}, {"1", true}});
  return c;
}

}  // namespace

const Config& config() {
  static const Config parsed = parse();
  return parsed;
}

}  // namespace weft
