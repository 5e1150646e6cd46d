// Settings read once from WEFT_* environment variables. Every variable is
// documented in docs/environment.md; nothing else in the core calls getenv.
#pragma once

#include <cstddef>
#include <string>

namespace weft {

enum class TransportChoice { Auto, Tcp, Shm, Ofi, Ibverbs };
enum class LogLevel { Off, Info, Trace };
// How the torch backend moves CUDA tensors: through pinned host twins over
// shm/tcp, over cuda_ipc or over nccl (auto: nccl when weft has it and every
// rank has its own GPU, else cuda_ipc when every rank is on one host, else
// staging).
enum class CudaPath { Auto, Staging, Ipc, Nccl };
// ibverbs On-Demand Paging: where the device takes it, never, or required.
enum class IbOdp { Auto, Off, Required };
// What the nccl transport runs: NCCL's own collectives, or weft's Plans
// with ncclSend/ncclRecv as the data path.
enum class NcclMode { Native, Plans };

struct Config {
  TransportChoice transport = TransportChoice::Auto;  // WEFT_TRANSPORT=auto|tcp|shm|ofi|ibverbs
  double timeout_s = 300.0;                           // WEFT_TIMEOUT_S
  double host_timeout_s = 30.0;                       // WEFT_HOST_TIMEOUT_S: unanswered TCP
  LogLevel log_level = LogLevel::Off;                 // WEFT_DEBUG=INFO|TRACE
  std::string host_id;                                // WEFT_HOST_ID (default: hostname + boot id)
  std::string socket_ifname;                          // WEFT_SOCKET_IFNAME
  std::string socket_addr;                            // WEFT_SOCKET_ADDR
  std::string job_secret;                             // WEFT_JOB_SECRET
  size_t shm_slot_bytes = 256 * 1024;                 // WEFT_SHM_SLOT_BYTES
  int shm_slots = 8;                                  // WEFT_SHM_SLOTS
  size_t tcp_slot_bytes = 1024 * 1024;                // WEFT_TCP_SLOT_BYTES
  int tcp_slots = 4;                                  // WEFT_TCP_SLOTS
  int channels = 2;                                   // WEFT_CHANNELS: connection sets per peer
  bool tcp_geometry_set = false;                      // either one set: no crowding rule
  bool rdma_bad_key = false;           // WEFT_RDMA_FAULT=bad_key: tests' refused remote writes
  bool rdma_slow_connect = false;      // WEFT_RDMA_FAULT=slow_connect: tests' strangers first
  std::string ibverbs_lib;             // WEFT_IBVERBS_LIB (default: libibverbs.so.1)
  std::string ib_hca;                  // WEFT_IB_HCA: devices and ports ibverbs may take
  int ib_gid_index = -1;               // WEFT_IB_GID_INDEX (-1: chosen by link layer)
  int ib_qps_per_peer = 1;             // WEFT_IB_QPS_PER_PEER
  int ib_timeout = 20;                 // WEFT_IB_TIMEOUT: ack timeout, 4.096 us x 2^value
  int ib_retry_cnt = 7;                // WEFT_IB_RETRY_CNT
  IbOdp ib_odp = IbOdp::Auto;          // WEFT_IB_ODP=auto|0|1
  bool shm_cma = false;                // WEFT_SHM_CMA=1: process_vm_readv transfers
  size_t cma_min_bytes = 1024 * 1024;  // WEFT_SHM_CMA_MIN_BYTES
  size_t streaming_bytes = 8 << 20;    // WEFT_STREAMING_BYTES: outputs this large bypass the cache
  size_t scratch_cache_bytes = 256 << 20;  // WEFT_SCRATCH_CACHE_BYTES: scratch kept between ops
  std::string algo = "auto";               // WEFT_ALGO: auto or an algorithm family
  std::string tune = "measure";            // WEFT_TUNE: measure | off | <cost model file>
  CudaPath cuda_path = CudaPath::Auto;     // WEFT_CUDA_PATH=auto|staging|ipc|nccl
  size_t cuda_ipc_chunk_bytes = 64 << 20;  // WEFT_CUDA_IPC_CHUNK_BYTES: IPC staging per rank
  NcclMode nccl_mode = NcclMode::Native;   // WEFT_NCCL_MODE=native|plans
  size_t nccl_step_bytes = 4 << 20;        // WEFT_NCCL_STEP_BYTES: largest step of nccl plans
  bool cpu_placement = true;  // WEFT_CPU_PLACEMENT=auto|off: ranks may move between CPUs
  std::string trace_dir;      // WEFT_TRACE_DIR: where the flight recorder writes on failure
  int trace_ops = 256;        // WEFT_TRACE_OPS: operations the recorder keeps (0: none)
  bool debug_checks = false;  // WEFT_DEBUG_CHECKS=1: ranks compare each collective's call first
};

// The process-wide configuration, parsed from the environment on first use.
// Throws InvalidArgument naming the variable when a value is malformed.
const Config& config();

}  // namespace weft
