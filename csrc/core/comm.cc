#include "core/comm.h"

#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <thread>
#include <utility>

#include "core/algo/algorithms.h"
#include "core/algo/validate.h"
#include "core/bootstrap/abort_notice.h"
#include "core/common/config.h"
#include "core/common/deadline.h"
#include "core/common/error.h"
#include "core/common/log.h"
#include "core/common/machine.h"
#include "core/exec/cpu_placement.h"
#include "core/exec/scratch_pool.h"
#include "core/transport/op_signature.h"
#include "core/transport/rdma/ibverbs/ibverbs_connection.h"
#include "core/transport/rdma/ofi/ofi_connection.h"
#include "core/transport/shm/shm_connection.h"
#include "core/transport/tcp/tcp_connection.h"
#include "core/tune/family_probe.h"
#include "core/tune/probe.h"

namespace weft {
namespace {

// `model` without its timed Plans.
CostModel links_only(CostModel model) {
  model.measured.clear();
  return model;
}

// Sockets per peer pair: a control socket (shared-memory setup and liveness),
// then one per TCP connection: one per collective channel tag, then
// point-to-point's.
constexpr int kControlSocket = 0;

char transport_code(TransportChoice choice) {
  switch (choice) {
    case TransportChoice::Tcp: return 't';
    case TransportChoice::Shm: return 's';
    case TransportChoice::Ofi: return 'o';
    case TransportChoice::Ibverbs: return 'i';
    case TransportChoice::Auto: return 'a';
  }
  return 'a';
}

// Input and output may share memory only in an operation's in-place form,
// for operations that have one: the input `in_place_at` bytes from the
// output's start (negative: the output lies inside the input). Any other
// overlap would be read after it is written, so it is refused.
void check_apart(const char* what, const void* in, size_t in_bytes, const void* out,
                 size_t out_bytes, std::optional<ptrdiff_t> in_place_at) {
  const auto i = reinterpret_cast<uintptr_t>(in), o = reinterpret_cast<uintptr_t>(out);
  if (in_bytes == 0 || out_bytes == 0 || i + in_bytes <= o || o + out_bytes <= i) return;
  if (in_place_at && static_cast<ptrdiff_t>(i - o) == *in_place_at) return;
  throw InvalidArgument(std::string(what) + ": the input and output buffers overlap" +
                        (in_place_at ? " but not in the in-place layout" : "") +
                        "; pass buffers that do not share memory" +
                        (in_place_at ? " (or the in-place form: see docs/core-api.md)" : ""));
}

// Best effort: a peer that is gone cannot be told.
void send_abort_notice(Socket& control, char kind, const std::string& reason) {
  const std::string notice = encode_notice(kind, reason);
  (void)control.send_nowait(notice.data(), notice.size());
}

// The rank a timeout's message (the executor's: "... waiting to receive
// from rank N: ...") says this rank waited for; -1 if it names none.
int waited_rank(const std::string& timeout_message) {
  const size_t waiting = timeout_message.find(" waiting to ");
  if (waiting == std::string::npos) return -1;
  const size_t at = timeout_message.find(" rank ", waiting);
  if (at == std::string::npos) return -1;
  return std::atoi(timeout_message.c_str() + at + 6);
}

// The kind and reason of `control`'s peer's abort notice, if it sent one.
std::optional<AbortNotice> abort_notice(const Socket& control) {
  char buf[kMostNoticeBytes];
  const ssize_t n = control.peek(buf, sizeof(buf));
  return n > 0 ? decode_notice(buf, static_cast<size_t>(n)) : std::nullopt;
}

}  // namespace

Communicator::Communicator(Store& store, int rank, int size, const std::string& name,
                           double timeout_s, const std::string& algorithm, int channels)
    : rank_(rank),
      size_(size),
      channels_(channels > 0 ? channels : config().channels),
      timeout_s_(timeout_s > 0 ? timeout_s : config().timeout_s),
      recorder_(name, rank, size) {
  if (channels < 0 || channels > 16) {
    throw InvalidArgument("channels=" + std::to_string(channels) +
                          ": give 1 to 16 connection sets per peer (0 takes WEFT_CHANNELS)");
  }
  // WEFT_ALGO=file:PATH names an Algorithm file that the torch backend runs
  // through set_plan_source(); the built-in choice stays automatic.
  const std::string& forced = algorithm.empty() ? config().algo : algorithm;
  try {
    forced_algorithm_ = is_algorithm_file(forced) ? Algorithm::Auto : parse_algorithm(forced);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(std::string(algorithm.empty() ? "WEFT_ALGO: " : "algo=: ") + e.what());
  }
  if (size < 1) throw InvalidArgument("world size must be at least 1, got " + std::to_string(size));
  if (rank < 0 || rank >= size) {
    throw InvalidArgument("rank " + std::to_string(rank) + " is outside the world of size " +
                          std::to_string(size));
  }
  recorder_.issued(0, "create", DataType::UInt8, ReduceOp::Sum, size, 0);
  try {
    connect(store, name);
  } catch (const Error& e) {
    recorder_.ended(false);
    recorder_.dump(e.what());
    // A peer lost or late while the world forms: say that it was creation.
    const std::string what = "creating communicator '" + name + "' (rank " + std::to_string(rank) +
                             " of " + std::to_string(size) + "): " + e.what();
    if (dynamic_cast<const TimeoutError*>(&e)) throw TimeoutError(what);
    if (dynamic_cast<const PeerError*>(&e) && !dynamic_cast<const OutOfStepError*>(&e)) {
      throw PeerError(what);
    }
    throw;
  }
  recorder_.ended(true);
}

Communicator::~Communicator() = default;

void Communicator::connect(Store& store, const std::string& name) {
  mesh_ = std::make_unique<Mesh>(store, "weft/" + name, rank_, size_, 1 + channels_ + 1,
                                 timeout_s(), cpu_placement::current_spread());
  const Config& cfg = config();
  // A peer whose host went down sends no reset and no error: without
  // keepalive on the control socket (which every transport watches) it would
  // be seen only at the timeout.
  for (int p = 0; p < size_; ++p) {
    if (p != rank_) mesh_->socket(p, kControlSocket).keep_alive(cfg.host_timeout_s);
  }
  collective_conns_.resize(channels_);
  for (auto& set : collective_conns_) set.resize(size_);
  p2p_conns_.resize(size_);
  // Both ends must pick the same transport: tell each peer what we were
  // asked for before deciding.
  const char mine = transport_code(cfg.transport);
  for (int p = 0; p < size_; ++p) {
    if (p != rank_) {
      mesh_->socket(p, kControlSocket)
          .send_all(&mine, 1, Deadline(timeout_s()), "transport choice");
    }
  }
  agree_on_sizes();
  learn_topology();
  // auto takes ibverbs between hosts where both ends have a usable port.
  bool rdma_here = false;
  if (cfg.transport == TransportChoice::Auto && topology_.hosts > 1) {
    const std::string why_not = ibverbs_unusable(rank_);
    rdma_here = why_not.empty();
    WEFT_LOG(Info, rank_,
             "WEFT_TRANSPORT=auto: " << (rdma_here ? "ibverbs between hosts (where the peer has "
                                                     "a port too)"
                                                   : "tcp between hosts; no ibverbs: " + why_not));
  }
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    Socket& control = mesh_->socket(p, kControlSocket);
    char theirs = 0;
    control.recv_all(&theirs, 1, Deadline(timeout_s()),
                     "transport choice of rank " + std::to_string(p));
    if (theirs != mine) {
      throw InvalidArgument("ranks " + std::to_string(rank_) + " and " + std::to_string(p) +
                            " were started with different WEFT_TRANSPORT settings; set the same "
                            "value on every rank");
    }
    const bool same_host = mesh_->peer(p).host_id == cfg.host_id;
    if (cfg.transport == TransportChoice::Shm && !same_host) {
      throw InvalidArgument("WEFT_TRANSPORT=shm, but rank " + std::to_string(p) +
                            " is on another host (host id '" + mesh_->peer(p).host_id + "' vs '" +
                            cfg.host_id + "'); use tcp or auto");
    }
    const bool use_shm = cfg.transport == TransportChoice::Shm ||
                         (cfg.transport == TransportChoice::Auto && same_host);
    bool use_ibverbs = cfg.transport == TransportChoice::Ibverbs;
    if (cfg.transport == TransportChoice::Auto && !same_host) {
      const uint8_t mine_rdma = rdma_here;
      uint8_t theirs_rdma = 0;
      control.send_all(&mine_rdma, 1, Deadline(timeout_s()), "ibverbs availability");
      control.recv_all(&theirs_rdma, 1, Deadline(timeout_s()),
                       "ibverbs availability of rank " + std::to_string(p));
      use_ibverbs = mine_rdma && theirs_rdma;
    }
    // Connection `channel` is the collective set of that tag, or (last)
    // point-to-point's.
    for (int channel = 0; channel <= channels_; ++channel) {
      std::unique_ptr<Connection> conn;
      if (use_shm) {
        ShmOptions opts{cfg.shm_slot_bytes, cfg.shm_slots, cfg.shm_cma, cfg.cma_min_bytes};
        conn =
            make_shm_connection(control, rank_, p, mesh_->peer(p).pid, channel, opts, timeout_s());
      } else if (cfg.transport == TransportChoice::Ofi || use_ibverbs) {
        // RDMA connections take tcp's geometry (WEFT_TCP_SLOT_BYTES, _SLOTS).
        RdmaOptions opts{tcp_slot_bytes_, tcp_slots_, cfg.rdma_bad_key};
        conn = use_ibverbs ? make_ibverbs_connection(control, rank_, opts, timeout_s())
                           : make_ofi_connection(control, rank_ < p, opts, timeout_s());
      } else {
        TcpOptions opts{tcp_slot_bytes_, tcp_slots_};
        conn = make_tcp_connection(control, std::move(mesh_->socket(p, 1 + channel)), opts);
      }
      (channel < channels_ ? collective_conns_[channel] : p2p_conns_)[p] = std::move(conn);
    }
    WEFT_LOG(Info, rank_, "transport to rank " << p << ": " << transport_to(p));
  }
  auto raw = [](const std::vector<std::unique_ptr<Connection>>& conns) {
    std::vector<Connection*> out;
    for (const auto& c : conns) out.push_back(c.get());
    return out;
  };
  // Control sockets carry nothing after setup but abort notices and are
  // never shut down on purpose, so one that closed without a notice means
  // the peer's process is gone or its host stopped answering (one with a
  // notice aborted, then maybe exited).
  std::vector<std::vector<Connection*>> by_tag;
  for (const auto& set : collective_conns_) by_tag.push_back(raw(set));
  PeerStatus peers;
  peers.departed_peer = [this] {
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      const Socket& control = mesh_->socket(p, kControlSocket);
      if (control.peer_closed() && !abort_notice(control)) {
        return PeerStatus::Departure{p, control.loss()};
      }
    }
    return PeerStatus::Departure{};
  };
  peers.abort_reason = [this] { return abort_reason(); };
  // The kLeft notice `peer` sent, if any.
  auto left_notice = [this](int peer) -> std::optional<std::string> {
    const auto notice = abort_notice(mesh_->socket(peer, kControlSocket));
    if (!notice || notice->kind != kLeft) return std::nullopt;
    return notice->reason;
  };
  peers.left_before = [left_notice](int peer, uint64_t seq) {
    const auto notice = left_notice(peer);
    if (!notice || seq < operations_taken(*notice)) return std::string();
    return left_words(*notice);
  };
  executor_ = std::make_unique<Executor>(std::move(by_tag), std::move(peers));
  p2p_ = std::make_unique<P2pEngine>(
      rank_, raw(p2p_conns_), timeout_s(),
      [this](const std::string& error) { fail(error, kPeerFailed); },
      [left_notice](int peer) {
        const auto notice = left_notice(peer);
        return notice ? left_words(*notice) : std::string();
      },
      config().debug_checks);
  cost_model_ = tuned_cost_model();
  if (forced_algorithm_ == Algorithm::Auto && config().tune != "off") {
    trials_ = std::make_unique<FamilyTrials>(topology_, cost_model_, rank_);
  }
}

CostModel Communicator::tuned_cost_model() {
  const std::string& tune = config().tune;
  if (tune == "off") return CostModel{};
  if (tune != "measure") return load_cost_model(tune);
  CostModel model = probe(kQuickProbe, 0);
  // Timings are for choosing; with a forced family, collectives it has no
  // form for choose by the model alone.
  if (forced_algorithm_ == Algorithm::Auto) {
    model.measured = measure_families(tuning_runner(0), plan_context(DataType::Float32), topology_);
  }
  WEFT_LOG(Info, rank_, "cost model measured:\n" << format_cost_model(model));
  return model;
}

CostModel Communicator::measure_cost_model(const ProbeEffort& effort) {
  check_usable();
  CostModel model;
  queue_.submit(
      [&](uint64_t seq, Work&) {
        recorded(seq, "measure_cost_model", DataType::Float32, ReduceOp::Sum, 0, 0, [&] {
          check_usable();
          model = probe(effort, seq);
        });
      },
      false);
  return model;
}

RunPlan Communicator::tuning_runner(uint64_t seq) {
  return [this, seq](const Plan& plan, const void* in, void* out, DataType dtype, ReduceOp op) {
    execute("tune", seq, plan, in, out, dtype, op, 0, 0);
  };
}

CostModel Communicator::probe(const ProbeEffort& effort, uint64_t seq) {
  auto is_tcp = [this](int peer) { return transport_to(peer) == "tcp"; };
  auto host_of = [this](int r) { return mesh_->peer(r).host_id; };
  return probe_cost_model(tuning_runner(seq), rank_, size_, is_tcp, host_of, CostModel{}, effort);
}

namespace {

// The ranks (in rank order) that compete for each set of CPUs, by every
// rank's cpu_identity(), so every rank groups them alike. Ranks may use the
// same CPUs as ranks of other "hosts" named by WEFT_HOST_ID
// (common/machine.h).
std::map<std::string, std::vector<int>> ranks_by_cpus(const Mesh& mesh) {
  std::map<std::string, std::vector<int>> ranks_on;
  for (int r = 0; r < mesh.size(); ++r) ranks_on[mesh.peer(r).cpus].push_back(r);
  return ranks_on;
}

// The most ranks per CPU on any machine of the world.
double most_ranks_per_cpu(const Mesh& mesh) {
  double most = 0;
  for (const auto& [cpus, ranks] : ranks_by_cpus(mesh)) {
    most = std::max(most, static_cast<double>(ranks.size()) / std::max(1, cpu_count(cpus)));
  }
  return most;
}

// More than this many ranks per CPU take turns on it, and one turn's worth of
// tcp data in flight (slots x slot bytes on each connection) then outgrows
// the cache: with 8 ranks on 2 CPUs, 256 KiB x 2 ran the ring allreduce of
// 32-256 MiB 10-20 % faster and broadcasts no slower than 1 MiB x 4; with 2 or
// 4 ranks the smaller geometry was no better (docs/algorithms.md).
constexpr double kCrowdedRanksPerCpu = 2;
constexpr size_t kCrowdedTcpSlotBytes = 256 << 10;
constexpr int kCrowdedTcpSlots = 2;

// Where ranks share CPUs, a wait is for a peer's turn on one more than for
// bytes, and a yield hands the CPU straight to the rank sharing it where a
// sleep costs the waker an interprocessor interrupt (a VM exit here). With
// two ranks per CPU every step yields: 4 tcp ranks on 2 CPUs ran the ring
// allreduce of 4-64 MiB 10-20 % faster so (5.1-5.2 ms against 6.3-6.8 at 4
// MiB). Otherwise only steps up to kYieldingStepBytes yield, latency-bound:
// crowded, 8 ranks on 2 CPUs took 204 us for a 16 B allreduce so against 297
// sleeping and 2.8 ms for 1 MiB against 3.7, while yielding in larger steps
// made 16-64 MiB 5-12 % slower (each yield cycles through three other
// ranks); 2 tcp ranks, each with a CPU of its own, ran 1-16 MiB slower
// yielding in every step.
constexpr size_t kYieldingStepBytes = 256 << 10;

// PlanContext::shared_cpu: where more than kCrowdedRanksPerCpu ranks share a
// machine's CPUs, the ranks that placement spreads to the same one; from what
// every rank published, so every rank computes the same.
std::vector<int> ranks_taking_turns(const Mesh& mesh,
                                    const std::map<std::string, std::vector<int>>& ranks_on) {
  std::vector<int> shared_cpu(mesh.size(), -1);
  std::map<std::pair<std::string, int>, int> ids;
  for (const auto& [cpus, ranks] : ranks_on) {
    const int count = static_cast<int>(ranks.size()), cpu_total = cpu_count(cpus);
    if (cpu_total == 0 || count <= kCrowdedRanksPerCpu * cpu_total) continue;
    for (int i = 0; i < count; ++i) {
      const int index = cpu_placement::spread_index_after(mesh.peer(ranks[i]).spread, count, i);
      if (index < 0) continue;
      const auto id = ids.emplace(std::make_pair(cpus, index % cpu_total), ids.size()).first;
      shared_cpu[ranks[i]] = id->second;
    }
  }
  if (ids.empty()) shared_cpu.clear();
  return shared_cpu;
}

size_t yielding_step_bytes(double ranks_per_cpu) {
  if (ranks_per_cpu > 1 && ranks_per_cpu <= kCrowdedRanksPerCpu) return SIZE_MAX;
  return kYieldingStepBytes;
}

}  // namespace

void Communicator::agree_on_sizes() {
  const Config& cfg = config();
  tcp_slot_bytes_ = cfg.tcp_slot_bytes;
  tcp_slots_ = cfg.tcp_slots;
  const double ranks_per_cpu = most_ranks_per_cpu(*mesh_);
  yielding_step_bytes_ = yielding_step_bytes(ranks_per_cpu);
  if (!cfg.tcp_geometry_set && ranks_per_cpu > kCrowdedRanksPerCpu) {
    tcp_slot_bytes_ = kCrowdedTcpSlotBytes;
    tcp_slots_ = kCrowdedTcpSlots;
    WEFT_LOG(Info, rank_,
             "more than " << kCrowdedRanksPerCpu << " ranks per CPU: tcp slots of "
                          << tcp_slot_bytes_ << " bytes x " << tcp_slots_);
  }
  bool any_shm = false, any_tcp = false;
  for (int a = 0; a < size_; ++a) {
    for (int b = a + 1; b < size_; ++b) {
      const bool same_host = mesh_->peer(a).host_id == mesh_->peer(b).host_id;
      const bool shm = cfg.transport == TransportChoice::Shm ||
                       (cfg.transport == TransportChoice::Auto && same_host);
      (shm ? any_shm : any_tcp) = true;
    }
  }
  // Every message is one slice and takes one slot of its connection, so what
  // a sender can post unanswered is (slots) x (slice), on the transport with
  // the fewest slots: a slot larger than the slice does not hold more.
  slice_bytes_ = SIZE_MAX;
  size_t slots = SIZE_MAX;
  if (any_shm) {
    slice_bytes_ = std::min(slice_bytes_, cfg.shm_slot_bytes);
    slots = std::min<size_t>(slots, cfg.shm_slots);
  }
  if (any_tcp) {
    slice_bytes_ = std::min(slice_bytes_, tcp_slot_bytes_);
    slots = std::min<size_t>(slots, tcp_slots_);
  }
  if (!any_shm && !any_tcp) {  // world of one
    slice_bytes_ = cfg.shm_slot_bytes;
    slots = cfg.shm_slots;
  }
  step_limit_bytes_ = slice_bytes_ * slots / 2;
}

void Communicator::learn_topology() {
  std::vector<std::string> hosts;
  for (int r = 0; r < size_; ++r) {
    const std::string& id = mesh_->peer(r).host_id;
    auto at = std::find(hosts.begin(), hosts.end(), id);
    host_of_rank_.push_back(static_cast<int>(at - hosts.begin()));
    if (at == hosts.end()) hosts.push_back(id);
  }
  topology_ = topology_of_hosts(host_of_rank_);
  const auto ranks_on_cpus = ranks_by_cpus(*mesh_);
  const std::vector<int>& sharing = ranks_on_cpus.at(mesh_->peer(rank_).cpus);
  const auto index = std::find(sharing.begin(), sharing.end(), rank_) - sharing.begin();
  shared_cpu_ = ranks_taking_turns(*mesh_, ranks_on_cpus);
  cpu_placement::note_ranks_sharing_cpus(static_cast<int>(sharing.size()), static_cast<int>(index));
  topology_.any_tcp = config().transport == TransportChoice::Tcp || topology_.hosts > 1;
  topology_.step_bytes = step_limit_bytes_;
  topology_.slice_bytes = slice_bytes_;
  if (forced_algorithm_ == Algorithm::Auto) return;
  for (Collective c : {Collective::Allreduce, Collective::ReduceScatter, Collective::Allgather,
                       Collective::Broadcast, Collective::Reduce}) {
    for (Algorithm a : algorithms_for(c, topology_)) {
      if (a == forced_algorithm_) return;
    }
  }
  throw InvalidArgument(std::string("algorithm ") + to_string(forced_algorithm_) +
                        " (WEFT_ALGO or algo=) has no form on this world: hier needs ranks on "
                        "several hosts, the same number on each");
}

namespace {
// Whether calls of `c` in place run (and try) Plans of their own: a
// reduce-scatter's Plan is the same whether or not its output is the rank's
// block of the input (its PlanKey is never in place).
bool own_in_place_plans(Collective c, bool in_place) {
  return in_place && c != Collective::ReduceScatter;
}
}  // namespace

Choice Communicator::choice(Collective c, size_t bytes, bool in_place) const {
  const bool own = own_in_place_plans(c, in_place);
  if (trials_) {
    if (std::optional<Choice> chosen = trials_->decided(c, bytes, own)) return *chosen;
  }
  return choose(c, bytes, topology_, cost_model_, forced_algorithm_, own);
}

bool Communicator::trying(Collective c, size_t bytes, bool in_place) const {
  return trials_ && trials_->trying(c, bytes, own_in_place_plans(c, in_place));
}

std::string Communicator::transport_to(int peer) const {
  if (peer == rank_) return "self";
  return collective_conns_.front().at(peer)->transport_name();
}

Plan Communicator::plan(Collective c, size_t count, DataType dtype, int root, bool in_place,
                        bool finalize, size_t max_step_bytes) const {
  // Plans for an executor elsewhere choose by the link model alone: the
  // timed Plans and the trials are of this communicator's executor.
  const Choice choice = choose(c, count * element_size(dtype), topology_, links_only(cost_model_),
                               forced_algorithm_, own_in_place_plans(c, in_place));
  return make_plan(PlanKey{c, count, element_size(dtype), root, in_place, finalize},
                   choice.algorithm, dtype, max_step_bytes, false);
}

PlanContext Communicator::plan_context(DataType dtype) const {
  return PlanContext{rank_,         size_, element_size(dtype), step_limit_bytes_,
                     host_of_rank_, true,  shared_cpu_,         channels_,
                     nullptr};
}

Plan Communicator::make_plan(const PlanKey& key, Algorithm a, DataType dtype, size_t max_step_bytes,
                             bool buffered_sends) const {
  const auto [c, count, elem_size, root, in_place, finalize] = key;
  PlanContext ctx = plan_context(dtype);
  if (max_step_bytes > 0) ctx.max_step_bytes = max_step_bytes;
  ctx.buffered_sends = buffered_sends;
  // A group schedule's ranks drive a device: their turns on CPUs order nothing.
  // and run one stream of steps.
  if (!buffered_sends) {
    ctx.shared_cpu.clear();
    ctx.channels = 1;
  }
  if (c == Collective::Barrier) return algo::barrier(ctx);
  WEFT_LOG(
      Info, rank_,
      to_string(c)
          << " of " << count * elem_size << " bytes: algorithm " << to_string(a) << ", predicted "
          << choose(c, count * elem_size, topology_, cost_model_, a, in_place).predicted_s * 1e6
          << " us");
  return algo::plan_for(c, a, ctx, count, root, in_place, finalize);
}

const Plan& Communicator::cached_plan(const PlanKey& key, Algorithm a, DataType dtype) {
  // A loop over ever new sizes must not grow the cache without bound; a
  // steady workload uses far fewer Plans than this.
  constexpr size_t kMostCachedPlans = 1024;
  auto it = plans_.find({key, a});
  if (it == plans_.end()) {
    if (plans_.size() >= kMostCachedPlans) plans_.clear();
    it = plans_.emplace(std::make_pair(key, a), make_plan(key, a, dtype)).first;
  }
  return it->second;
}

OpContext Communicator::op_context(const char* name, uint64_t seq, const Plan& plan, DataType dtype,
                                   ReduceOp op, size_t out_bytes, int root) const {
  const bool streaming = out_bytes >= config().streaming_bytes;
  // alltoall's and an outside Plan's output sizes are each rank's own (a
  // gather's root has more); their message lengths are checked.
  const bool own_sizes = std::strcmp(name, "alltoall") == 0 || std::strcmp(name, "plan") == 0;
  const size_t agreed_bytes = own_sizes ? 0 : out_bytes;
  return OpContext{name,
                   seq,
                   rank_,
                   size_,
                   timeout_s(),
                   dtype,
                   op,
                   streaming,
                   slice_bytes_,
                   yielding_step_bytes_,
                   op_signature(seq, name, plan.algorithm, dtype, op, agreed_bytes, root)};
}

std::string Communicator::abort_reason() const {
  if (!aborted_.load(std::memory_order_acquire)) return {};
  std::lock_guard<std::mutex> lock(abort_mu_);
  return abort_reason_;
}

void Communicator::check_usable() const {
  const std::string why = abort_reason();
  if (why.empty()) return;
  throw AbortedError(
      "this communicator was aborted by an earlier error and cannot be used "
      "again; create a new one. The error was: " +
      why);
}

bool Communicator::mark_aborted(const std::string& reason) {
  std::lock_guard<std::mutex> lock(abort_mu_);
  if (aborted_.load()) return false;
  abort_reason_ = reason;
  aborted_.store(true, std::memory_order_release);
  return true;
}

void Communicator::tell_peers(char kind, const std::string& text) {
  if (!mesh_) return;
  for (int p = 0; p < size_; ++p) {
    if (p != rank_) send_abort_notice(mesh_->socket(p, kControlSocket), kind, text);
  }
}

void Communicator::fail(const std::string& reason, char kind) {
  if (!mark_aborted(reason)) return;
  tell_peers(kind, reason);
  if (p2p_) p2p_->fail_all(std::make_exception_ptr(AbortedError(reason)));
  for (auto& set : collective_conns_) {
    for (auto& conn : set) {
      if (conn) conn->shutdown();
    }
  }
  for (auto& conn : p2p_conns_) {
    if (conn) conn->shutdown();
  }
}

void Communicator::abort(const std::string& reason) {
  fail("aborted by the user: " + reason, kUserAbort);
}

void Communicator::leave(const std::string& reason) {
  const std::string left = "this rank left the group: " + reason;
  const std::optional<uint64_t> took = queue_.close_if_idle(left);
  if (!took) return abort(reason + " during an operation");
  if (!mark_aborted(left)) return;
  // The connections stay up until the communicator goes: a peer may still be
  // reading this rank's part of the last operation.
  tell_peers(kLeft, std::to_string(*took) + " " + reason);
}

std::string Communicator::blame_chain(int peer) const {
  // The ranks stalled behind a hung one time out at about the same time,
  // each waiting for the next; each tells its peers whom it waited for
  // (fail() sends that before this runs), so follow them to the end.
  constexpr double kChainWaitS = 1.0;
  const Deadline deadline(kChainWaitS);
  std::vector<bool> seen(size_, false);
  seen[rank_] = true;
  std::string chain;
  while (peer >= 0 && peer < size_ && !seen[peer]) {
    seen[peer] = true;
    std::optional<AbortNotice> notice;
    while (!(notice = abort_notice(mesh_->socket(peer, kControlSocket))) && !deadline.expired()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    const std::string who = "rank " + std::to_string(peer);
    if (!notice) {
      return chain.empty() ? "; " + who + " is hung or slow: it did not time out itself"
                           : chain + ", which sent nothing: it is hung or slow";
    }
    if (notice->kind == kLeft) return chain + "; " + who + ": " + left_words(notice->reason);
    if (notice->kind != kTimedOut) return chain + "; " + who + " had aborted: " + notice->reason;
    peer = waited_rank(notice->reason);
    chain += chain.empty() ? "; " + who + " timed out too, waiting for rank "
                           : ", which waited for rank ";
    chain += std::to_string(peer);
  }
  return chain;
}

[[noreturn]] void Communicator::rethrow_explained(const PeerError& e) {
  // A peer that closed its connections may have aborted on an error of its
  // own: name it, with the class of its error (a timeout waiting for a hung
  // rank surfaces as a timeout on every rank).
  std::string why = e.what();
  char kind = kPeerFailed;
  for (int p = 0; p < size_ && mesh_; ++p) {
    if (p == rank_ || why.find(lost_rank(p, "")) == std::string::npos) {
      continue;
    }
    const auto notice = abort_notice(mesh_->socket(p, kControlSocket));
    if (!notice) break;
    // The transport saw the process leave after it aborted or left the
    // group: that is no death.
    const bool left = notice->kind == kLeft;
    const std::string gone = "peer process is gone";
    if (const size_t at = why.find(gone); at != std::string::npos) {
      why.replace(at, gone.size(), left ? left_words(notice->reason) : "it aborted and left");
    }
    if (!left) {
      why += "; rank " + std::to_string(p) + " had aborted: " + notice->reason;
      kind = notice->kind;
    }
    break;
  }
  fail(why, kind);
  if (kind == kTimedOut) throw TimeoutError(why);
  if (kind == kUserAbort) throw AbortedError(why);
  throw PeerError(why);
}

void Communicator::execute(const char* name, uint64_t seq, const Plan& plan, const void* in,
                           void* out, DataType dtype, ReduceOp op, size_t out_bytes, int root) {
  WEFT_LOG_CALL(rank_, this,
                name << ": " << to_string(dtype) << ", " << to_string(op) << ", " << out_bytes
                     << " bytes out, algorithm " << plan.algorithm << " (" << plan.steps.size()
                     << " steps)");
  // The tuner's and WEFT_DEBUG_CHECKS' Plans run inside the operation they
  // time or check: the entry is the operation's.
  if (std::strcmp(name, "tune") != 0 && std::strcmp(name, "check") != 0) {
    int peers[FlightRecorder::kMostPeers];
    int count = 0;
    for (const Step& s : plan.steps) {
      for (int peer : {s.recv_peer, s.send_peer}) {
        if (peer >= 0 && count < FlightRecorder::kMostPeers &&
            std::find(peers, peers + count, peer) == peers + count) {
          peers[count++] = peer;
        }
      }
      if (count == FlightRecorder::kMostPeers) break;
    }
    recorder_.running(plan.algorithm, peers, count);
  }
  const ScratchPool::Lease scratch =
      ScratchPool::process().borrow(plan.scratch_count * element_size(dtype));
  OpBuffers buffers{in, out, scratch.data()};
  try {
    executor_->run(plan, buffers, op_context(name, seq, plan, dtype, op, out_bytes, root));
  } catch (const OutOfStepError& e) {
    fail(e.what(), kPeerFailed);
    throw;
  } catch (const PeerError& e) {
    rethrow_explained(e);
  } catch (const TimeoutError& e) {
    fail(e.what(), kTimedOut);
    throw TimeoutError(e.what() + blame_chain(waited_rank(e.what())));
  } catch (const Error& e) {
    fail(e.what(), kPeerFailed);
    throw;
  }
}

namespace {

// One rank's call, as WEFT_DEBUG_CHECKS compares it across ranks.
struct Call {
  char op[24];
  uint64_t seq;
  uint64_t count;
  int32_t root;
  DataType dtype;
  ReduceOp reduce;
  bool own_counts;  // alltoall's and outside Plans' counts are each rank's own

  bool operator==(const Call& o) const {
    return std::strcmp(op, o.op) == 0 && seq == o.seq && root == o.root && dtype == o.dtype &&
           reduce == o.reduce && (own_counts || count == o.count);
  }
};

Call call_of(const char* name, uint64_t seq, DataType dtype, ReduceOp op, size_t count, int root) {
  Call c{};
  std::strncpy(c.op, name, sizeof(c.op) - 1);
  c.seq = seq;
  c.count = count;
  c.root = root;
  c.dtype = dtype;
  c.reduce = op;
  c.own_counts = std::strcmp(name, "alltoall") == 0 || std::strcmp(name, "plan") == 0;
  return c;
}

std::string describe(const Call& c) {
  return std::string(c.op) + "(count=" + std::to_string(c.count) + ", dtype=" + to_string(c.dtype) +
         ", op=" + to_string(c.reduce) + ", root=" + std::to_string(c.root) +
         ", seq=" + std::to_string(c.seq) + ")";
}

}  // namespace

void Communicator::agree_on_call(uint64_t seq, const char* name, DataType dtype, ReduceOp op,
                                 size_t count, int root) {
  const Call mine = call_of(name, seq, dtype, op, count, root);
  std::vector<Call> all(size_);
  // Every rank runs the same check whatever it was called for: the same
  // Plan and signature, so the calls arrive even where they differ.
  const PlanKey key{Collective::Allgather, sizeof(Call), 1, 0, false, false};
  execute("check", seq, cached_plan(key, Algorithm::Ring, DataType::UInt8), &mine, all.data(),
          DataType::UInt8, ReduceOp::Sum, all.size() * sizeof(Call), 0);
  if (std::all_of(all.begin(), all.end(), [&](const Call& c) { return c == all[0]; })) return;
  std::string listing;
  for (int r = 0; r < size_; ++r) {
    listing += "\n  rank " + std::to_string(r) + ": " + describe(all[r]) +
               (all[r] == mine ? "" : "  <- differs from this rank");
  }
  throw OutOfStepError(
      "ranks out of step (WEFT_DEBUG_CHECKS): the ranks called different "
      "collectives as operation #" +
      std::to_string(seq) +
      "; make every rank issue the same calls in the "
      "same order:" +
      listing);
}

void Communicator::agree_on_alltoall_counts(uint64_t seq, DataType dtype,
                                            const std::vector<size_t>& send_counts,
                                            const std::vector<size_t>& recv_counts) {
  // Row r of `all`: rank r's send counts, then its receive counts.
  const size_t row = 2 * static_cast<size_t>(size_);
  std::vector<uint64_t> mine(send_counts.begin(), send_counts.end());
  mine.insert(mine.end(), recv_counts.begin(), recv_counts.end());
  std::vector<uint64_t> all(row * size_);
  const PlanKey key{Collective::Allgather, row * sizeof(uint64_t), 1, 0, false, false};
  execute("check", seq, cached_plan(key, Algorithm::Ring, DataType::UInt8), mine.data(), all.data(),
          DataType::UInt8, ReduceOp::Sum, all.size() * sizeof(uint64_t), 0);
  auto sends = [&](int from, int to) { return all[from * row + to]; };
  auto expects = [&](int at, int from) { return all[at * row + size_ + from]; };
  constexpr int kListed = 16;
  std::string listing;
  int differ = 0;
  for (int from = 0; from < size_; ++from) {
    for (int to = 0; to < size_; ++to) {
      if (sends(from, to) == expects(to, from) || ++differ > kListed) continue;
      listing += "\n  rank " + std::to_string(from) + " sends rank " + std::to_string(to) + " " +
                 std::to_string(sends(from, to)) + " elements, rank " + std::to_string(to) +
                 " expects " + std::to_string(expects(to, from));
    }
  }
  if (differ == 0) return;
  if (differ > kListed) listing += "\n  and " + std::to_string(differ - kListed) + " pairs more";
  // Each rank's call as agree_on_call lists them (count: all it sends).
  std::string calls;
  for (int r = 0; r < size_; ++r) {
    size_t sent = 0;
    for (int to = 0; to < size_; ++to) sent += sends(r, to);
    const Call call = call_of("alltoall", seq, dtype, ReduceOp::Sum, sent, 0);
    calls += "\n  rank " + std::to_string(r) + ": " + describe(call);
  }
  throw OutOfStepError(
      "ranks out of step (WEFT_DEBUG_CHECKS): the ranks' alltoall counts as "
      "operation #" +
      std::to_string(seq) +
      " do not pair up; make what each rank sends a peer what that peer "
      "expects from it:" +
      calls + listing);
}

template <typename Body>
void Communicator::recorded(uint64_t seq, const char* name, DataType dtype, ReduceOp op,
                            size_t count, int root, Body body) {
  recorder_.issued(seq, name, dtype, op, count, root);
  try {
    if (config().debug_checks) {
      check_usable();
      agree_on_call(seq, name, dtype, op, count, root);
    }
    body();
  } catch (const Error& e) {
    recorder_.ended(false);
    recorder_.dump(e.what());
    throw;
  }
  recorder_.ended(true);
}

template <typename MakePlan>
std::shared_ptr<Work> Communicator::submit(const char* name, const void* in, void* out,
                                           DataType dtype, ReduceOp op, size_t count, int root,
                                           size_t out_bytes, bool async, MakePlan make,
                                           std::function<void(uint64_t seq)> debug_check) {
  check_usable();
  return queue_.submit(
      [=](uint64_t seq, Work&) {
        recorded(seq, name, dtype, op, count, root, [&] {
          if (debug_check && config().debug_checks) debug_check(seq);
          check_usable();
          execute(name, seq, make(), in, out, dtype, op, out_bytes, root);
        });
      },
      async);
}

void Communicator::set_plan_source(Collective c, PlanSource source) {
  plan_sources_[c] = std::move(source);
}

std::shared_ptr<Work> Communicator::submit_chosen(const char* name, const PlanKey& key,
                                                  const void* in, void* out, DataType dtype,
                                                  ReduceOp op, size_t out_bytes, bool async) {
  check_usable();
  const auto [c, count, elem_size, root, in_place, avg] = key;
  if (auto source = plan_sources_.find(c); source != plan_sources_.end()) {
    const PlanQuery query{
        count,
        elem_size,
        root,
        in_place,
        avg,
        slice_bytes_,
        static_cast<int>(std::max<size_t>(1, 2 * step_limit_bytes_ / slice_bytes_))};
    if (std::optional<Plan> outside = source->second(query)) {
      const size_t in_count = c == Collective::ReduceScatter ? size_ * count : count;
      const size_t out_count = c == Collective::Allgather ? size_ * count : count;
      algo::validate(*outside, rank_, size_, in_count, out_count, elem_size,
                     executor_->channel_tags());
      auto shared = std::make_shared<Plan>(std::move(*outside));
      return submit(name, in, out, dtype, op, count, root, out_bytes, async,
                    [shared]() -> const Plan& { return *shared; });
    }
  }
  return queue_.submit(
      [=](uint64_t seq, Work&) {
        recorded(seq, name, dtype, op, std::get<1>(key), std::get<3>(key),
                 [&] { run_chosen(name, seq, key, in, out, dtype, op, out_bytes); });
      },
      async);
}

void Communicator::run_chosen(const char* name, uint64_t seq, const PlanKey& key, const void* in,
                              void* out, DataType dtype, ReduceOp op, size_t out_bytes) {
  check_usable();
  const Collective c = std::get<0>(key);
  const size_t bytes = std::get<1>(key) * std::get<2>(key);
  const bool in_place = std::get<4>(key);
  const FamilyTrials::Turn turn =
      trials_ ? trials_->next(c, bytes, in_place)
              : FamilyTrials::Turn{choice(c, bytes, in_place).algorithm, false};
  const Plan& plan = cached_plan(key, turn.algorithm, dtype);
  if (!turn.trial) {  // decided, or nothing is tried: nothing to time
    execute(name, seq, plan, in, out, dtype, op, out_bytes, std::get<3>(key));
    return;
  }
  const double start = now_s();
  execute(name, seq, plan, in, out, dtype, op, out_bytes, std::get<3>(key));
  trials_->record(c, bytes, in_place, now_s() - start, [&](const std::vector<double>& mine) {
    return max_over_ranks(tuning_runner(seq), rank_, size_, mine);
  });
}

void Communicator::check_root(int root, const char* what) const {
  if (root < 0 || root >= size_) {
    throw InvalidArgument(std::string(what) + ": root " + std::to_string(root) +
                          " is outside the world of size " + std::to_string(size_));
  }
}

void Communicator::check_peer(int peer, const char* what, bool allow_any) const {
  if (allow_any && peer < 0) return;
  if (peer < 0 || peer >= size_ || peer == rank_) {
    throw InvalidArgument(std::string(what) + ": peer " + std::to_string(peer) +
                          " must be another rank in [0, " + std::to_string(size_) + ")");
  }
}

std::shared_ptr<Work> Communicator::allreduce(const void* in, void* out, size_t count,
                                              DataType dtype, ReduceOp op, bool async) {
  const size_t bytes = count * element_size(dtype);
  check_apart("allreduce", in, bytes, out, bytes, 0);
  PlanKey key{Collective::Allreduce, count, element_size(dtype), 0, in == out, op == ReduceOp::Avg};
  return submit_chosen("allreduce", key, in, out, dtype, op, bytes, async);
}

std::shared_ptr<Work> Communicator::reduce_scatter(const void* in, void* out, size_t count,
                                                   DataType dtype, ReduceOp op, bool async) {
  const size_t bytes = count * element_size(dtype);
  check_apart("reduce_scatter", in, size_ * bytes, out, bytes,
              -static_cast<ptrdiff_t>(rank_ * bytes));
  PlanKey key{Collective::ReduceScatter, count, element_size(dtype), 0, false, op == ReduceOp::Avg};
  return submit_chosen("reduce_scatter", key, in, out, dtype, op, bytes, async);
}

std::shared_ptr<Work> Communicator::allgather(const void* in, void* out, size_t count,
                                              DataType dtype, bool async) {
  const size_t elem = element_size(dtype);
  const bool in_place = in == static_cast<const char*>(out) + rank_ * count * elem;
  check_apart("allgather", in, count * elem, out, size_ * count * elem,
              static_cast<ptrdiff_t>(rank_ * count * elem));
  PlanKey key{Collective::Allgather, count, elem, 0, in_place, false};
  return submit_chosen("allgather", key, in, out, dtype, ReduceOp::Sum, size_ * count * elem,
                       async);
}

std::shared_ptr<Work> Communicator::broadcast(void* buf, size_t count, DataType dtype, int root,
                                              bool async) {
  check_root(root, "broadcast");
  PlanKey key{Collective::Broadcast, count, element_size(dtype), root, true, false};
  return submit_chosen("broadcast", key, buf, buf, dtype, ReduceOp::Sum,
                       count * element_size(dtype), async);
}

std::shared_ptr<Work> Communicator::reduce(const void* in, void* out, size_t count, DataType dtype,
                                           ReduceOp op, int root, bool async) {
  check_root(root, "reduce");
  const size_t bytes = count * element_size(dtype);
  check_apart("reduce", in, bytes, out, bytes, 0);
  PlanKey key{Collective::Reduce, count, element_size(dtype), root, in == out, op == ReduceOp::Avg};
  return submit_chosen("reduce", key, in, out, dtype, op, bytes, async);
}

std::shared_ptr<Work> Communicator::barrier(bool async) {
  PlanKey key{Collective::Barrier, 0, 1, 0, true, false};
  return submit(
      "barrier", &barrier_byte_, &barrier_byte_, DataType::UInt8, ReduceOp::Sum, 0, 0, 0, async,
      [this, key]() -> const Plan& { return cached_plan(key, Algorithm::Auto, DataType::UInt8); });
}

std::shared_ptr<Work> Communicator::alltoall(const void* in, void* out,
                                             std::vector<size_t> send_counts,
                                             std::vector<size_t> recv_counts, DataType dtype,
                                             bool async) {
  if (send_counts.size() != static_cast<size_t>(size_) ||
      recv_counts.size() != static_cast<size_t>(size_)) {
    throw InvalidArgument("alltoall: send and receive counts need one entry per rank (" +
                          std::to_string(size_) + ")");
  }
  if (send_counts[rank_] != recv_counts[rank_]) {
    throw InvalidArgument("alltoall: this rank sends itself " + std::to_string(send_counts[rank_]) +
                          " elements but expects " + std::to_string(recv_counts[rank_]));
  }
  size_t in_count = 0, out_count = 0;
  for (size_t c : send_counts) in_count += c;
  for (size_t c : recv_counts) out_count += c;
  check_apart("alltoall", in, in_count * element_size(dtype), out, out_count * element_size(dtype),
              std::nullopt);
  auto plan = std::make_shared<Plan>(
      algo::pairwise_alltoall(plan_context(dtype), send_counts, recv_counts));
  return submit(
      "alltoall", in, out, dtype, ReduceOp::Sum, in_count, 0, out_count * element_size(dtype),
      async, [plan]() -> const Plan& { return *plan; },
      [this, dtype, send_counts, recv_counts](uint64_t seq) {
        agree_on_alltoall_counts(seq, dtype, send_counts, recv_counts);
      });
}

std::shared_ptr<Work> Communicator::gather(const void* in, void* out, size_t count, DataType dtype,
                                           int root, bool async) {
  check_root(root, "gather");
  const size_t bytes = count * element_size(dtype);
  check_apart("gather", in, bytes, out, rank_ == root ? size_ * bytes : 0, std::nullopt);
  auto plan = std::make_shared<Plan>(algo::direct_gather(plan_context(dtype), count, root));
  return submit("gather", in, out, dtype, ReduceOp::Sum, count, root, size_ * bytes, async,
                [plan]() -> const Plan& { return *plan; });
}

std::shared_ptr<Work> Communicator::scatter(const void* in, void* out, size_t count, DataType dtype,
                                            int root, bool async) {
  check_root(root, "scatter");
  const size_t bytes = count * element_size(dtype);
  check_apart("scatter", in, rank_ == root ? size_ * bytes : 0, out, bytes, std::nullopt);
  auto plan = std::make_shared<Plan>(algo::direct_scatter(plan_context(dtype), count, root));
  return submit("scatter", in, out, dtype, ReduceOp::Sum, count, root, bytes, async,
                [plan]() -> const Plan& { return *plan; });
}

std::shared_ptr<Work> Communicator::run_plan(Plan plan, const void* in, size_t in_count, void* out,
                                             size_t out_count, DataType dtype, ReduceOp op,
                                             bool async) {
  algo::validate(plan, rank_, size_, in_count, out_count, element_size(dtype),
                 executor_->channel_tags());
  auto shared = std::make_shared<Plan>(std::move(plan));
  return submit("plan", in, out, dtype, op, out_count, 0, out_count * element_size(dtype), async,
                [shared]() -> const Plan& { return *shared; });
}

std::shared_ptr<Work> Communicator::send(const void* buf, size_t bytes, int peer, uint32_t tag,
                                         bool async, std::optional<DataType> dtype) {
  check_peer(peer, "send", false);
  check_usable();
  auto work = p2p_->send(buf, bytes, peer, tag, dtype);
  if (!async) work->wait_or_withdraw(timeout_s());
  return work;
}

std::shared_ptr<Work> Communicator::recv(void* buf, size_t bytes, int peer, uint32_t tag,
                                         bool async, std::optional<DataType> dtype) {
  check_peer(peer, "recv", true);
  check_usable();
  auto work = p2p_->recv(buf, bytes, peer, tag, dtype);
  if (!async) work->wait_or_withdraw(timeout_s());
  return work;
}

void Communicator::set_timeout(double timeout_s) {
  if (!(timeout_s > 0)) {
    throw InvalidArgument("set_timeout: the timeout must be positive (got " +
                          std::to_string(timeout_s) + " s)");
  }
  timeout_s_.store(timeout_s);
  p2p_->set_timeout(timeout_s);
}

}  // namespace weft
