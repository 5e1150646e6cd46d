// Every rank's Plan in the compact form the simulator runs: eight bytes a
// step (a 4096-rank ring allreduce is 33 million steps), with the bytes each
// step moves in a shared table and its peers as indices into the rank's
// connections. Only what timing needs is kept: which peers, how many bytes,
// what is reduced, and the order (channels, Step::after, wait_sends).
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/algo/plan.h"

namespace weft::sim {

constexpr uint16_t kNoPeer = 0xFFFF;

struct SimStep {
  enum Kind : uint8_t { Fused, Exchange, Compute };
  uint8_t kind;
  uint8_t channel;
  uint16_t recv;   // index into the rank's connections, or kNoPeer
  uint16_t send;   // likewise
  uint16_t sizes;  // index into Programs::sizes
};
static_assert(sizeof(SimStep) == 8, "a step stays eight bytes");

struct StepSizes {
  uint64_t send_bytes = 0;     // what goes to the send peer
  uint64_t recv_bytes = 0;     // what comes from the receive peer
  uint64_t compute_bytes = 0;  // bytes reduced (gamma is paid on these)
  bool wait_sends = false;
  bool has_after = false;
  bool operator==(const StepSizes& o) const {
    return send_bytes == o.send_bytes && recv_bytes == o.recv_bytes &&
           compute_bytes == o.compute_bytes && wait_sends == o.wait_sends &&
           has_after == o.has_after;
  }
};

// One step as a caller describes it (from a Plan, or from Python).
struct StepSpec {
  SimStep::Kind kind = SimStep::Fused;
  int recv = -1, send = -1;
  StepSizes sizes;
  int channel = 0;
  std::vector<uint32_t> after;  // earlier steps of the rank that must have finished
};

// A connection: messages from `src` to `dst` on channel tag `tag`, in order.
struct ConnKey {
  int src, dst, tag;
};

class Programs {
 public:
  explicit Programs(int ranks);
  int ranks() const { return ranks_; }
  // Appends rank `rank`'s steps (ranks in order, from 0); `tags` holds each
  // channel's connection tag (empty: one channel of tag 0). Throws
  // InvalidArgument naming the rank and step of a malformed one.
  void add_rank(int rank, const std::vector<StepSpec>& steps, const std::vector<int>& tags);
  // The same from a Plan the generators made, `elem` bytes an element.
  void add_plan(int rank, const Plan& plan, size_t elem);

  size_t steps_of(int rank) const { return first_[rank + 1] - first_[rank]; }
  const SimStep& step(int rank, size_t i) const { return steps_[first_[rank] + i]; }
  const StepSizes& sizes(const SimStep& s) const { return sizes_[s.sizes]; }
  uint32_t conn(int rank, uint16_t index) const { return conn_index_[conn_first_[rank] + index]; }
  const std::vector<ConnKey>& conns() const { return conns_; }
  int channels_of(int rank) const { return channels_[rank]; }
  // Steps of rank `rank` that step i waits for (Step::after).
  const std::vector<uint32_t>& after(int rank, size_t i) const;
  bool any_after(int rank) const { return after_.count(rank) > 0; }
  size_t total_steps() const { return steps_.size(); }

 private:
  uint16_t conn_for(int rank, int src, int dst, int tag, std::unordered_map<uint32_t, uint16_t>&);
  // add_rank's work, the spec of step i being spec_at(i).
  template <typename SpecAt>
  void pack_rank(int rank, size_t count, SpecAt spec_at, const std::vector<int>& tags);
  int ranks_;
  std::vector<SimStep> steps_;
  std::vector<size_t> first_;  // ranks_ + 1 offsets into steps_
  std::vector<StepSizes> sizes_;
  std::unordered_map<uint64_t, uint16_t> size_index_;
  std::vector<uint32_t> conn_index_;
  std::vector<size_t> conn_first_;
  std::vector<ConnKey> conns_;
  std::unordered_map<uint64_t, uint32_t> conn_ids_;
  std::vector<int> channels_;
  // rank -> step -> its after list (only ranks with any).
  std::unordered_map<int, std::unordered_map<uint32_t, std::vector<uint32_t>>> after_;
};

}  // namespace weft::sim
