#include "core/sim/program.h"

#include "core/common/error.h"

namespace weft::sim {
namespace {

uint64_t hash_sizes(const StepSizes& s) {
  uint64_t h = s.send_bytes * 0x9E3779B97F4A7C15ull;
  h ^= (s.recv_bytes + 0x632BE59BD9B4E019ull) * 0xC2B2AE3D27D4EB4Full;
  h ^= (s.compute_bytes + 0x85EBCA77C2B2AE63ull) * 0x165667B19E3779F9ull;
  return h ^ (s.wait_sends ? 1 : 0) ^ (s.has_after ? 2 : 0);
}

std::string where(int rank, size_t step) {
  return "rank " + std::to_string(rank) + " step " + std::to_string(step);
}

}  // namespace

Programs::Programs(int ranks) : ranks_(ranks), first_{0}, conn_first_{0} {
  if (ranks < 1 || ranks >= (1 << 24)) {
    throw InvalidArgument("simulation: ranks must be 1 to " + std::to_string((1 << 24) - 1));
  }
}

uint16_t Programs::conn_for(int rank, int src, int dst, int tag,
                            std::unordered_map<uint32_t, uint16_t>& local) {
  const uint64_t key = (static_cast<uint64_t>(src) << 32) | (static_cast<uint64_t>(dst) << 8) |
                       static_cast<uint64_t>(tag);
  auto [it, fresh] = conn_ids_.try_emplace(key, static_cast<uint32_t>(conns_.size()));
  if (fresh) conns_.push_back({src, dst, tag});
  auto [at, added] = local.try_emplace(it->second, static_cast<uint16_t>(local.size()));
  if (added) {
    if (local.size() >= kNoPeer) {
      throw InvalidArgument("simulation: rank " + std::to_string(rank) + " uses more than " +
                            std::to_string(kNoPeer - 1) + " connections");
    }
    conn_index_.push_back(it->second);
  }
  return at->second;
}

void Programs::add_rank(int rank, const std::vector<StepSpec>& specs,
                        const std::vector<int>& tags) {
  pack_rank(rank, specs.size(), [&](size_t i) -> const StepSpec& { return specs[i]; }, tags);
}

template <typename SpecAt>
void Programs::pack_rank(int rank, size_t count, SpecAt spec_at, const std::vector<int>& tags) {
  if (rank != static_cast<int>(first_.size()) - 1 || rank >= ranks_) {
    throw InvalidArgument("simulation: ranks must be added in order; got rank " +
                          std::to_string(rank));
  }
  const int channels = tags.empty() ? 1 : static_cast<int>(tags.size());
  if (channels > 255)
    throw InvalidArgument("simulation: rank " + std::to_string(rank) +
                          " has more than 255 channels");
  for (int tag : tags) {
    if (tag < 0 || tag > 255) {
      throw InvalidArgument("simulation: rank " + std::to_string(rank) + " channel tag " +
                            std::to_string(tag) + " outside 0..255");
    }
  }
  // Ranks mostly plan alike: room for every rank's steps at once saves regrowing.
  if (rank == 0) steps_.reserve(count * static_cast<size_t>(ranks_));
  std::unordered_map<uint32_t, uint16_t> local;
  // Neighbouring steps mostly repeat their peers and sizes: look those up once.
  int last_peer[2] = {-2, -2}, last_tag[2] = {-1, -1};
  uint16_t last_index[2] = {kNoPeer, kNoPeer};
  StepSizes last_sizes;
  int last_sizes_index = -1;
  auto peer_index = [&](int side, int src, int dst, int tag) {
    const int peer = side == 0 ? src : dst;
    if (peer != last_peer[side] || tag != last_tag[side]) {
      last_peer[side] = peer;
      last_tag[side] = tag;
      last_index[side] = conn_for(rank, src, dst, tag, local);
    }
    return last_index[side];
  };
  for (size_t i = 0; i < count; ++i) {
    const StepSpec& spec = spec_at(i);
    if (spec.channel < 0 || spec.channel >= channels) {
      throw InvalidArgument("simulation: " + where(rank, i) + " runs on channel " +
                            std::to_string(spec.channel) + " of " + std::to_string(channels));
    }
    for (int peer : {spec.recv, spec.send}) {
      if (peer < -1 || peer >= ranks_) {
        throw InvalidArgument("simulation: " + where(rank, i) + " names peer " +
                              std::to_string(peer) + " in a world of " + std::to_string(ranks_));
      }
    }
    for (uint32_t dep : spec.after) {
      if (dep >= i) {
        throw InvalidArgument("simulation: " + where(rank, i) + " waits for step " +
                              std::to_string(dep) + ", which is not earlier");
      }
    }
    const int tag = tags.empty() ? 0 : tags[spec.channel];
    SimStep s;
    s.kind = spec.kind;
    s.channel = static_cast<uint8_t>(spec.channel);
    s.recv = spec.recv < 0 ? kNoPeer : peer_index(0, spec.recv, rank, tag);
    s.send = spec.send < 0 ? kNoPeer : peer_index(1, rank, spec.send, tag);
    StepSizes sizes = spec.sizes;
    sizes.has_after = !spec.after.empty();
    if (sizes.has_after) after_[rank][static_cast<uint32_t>(i)] = spec.after;
    if (last_sizes_index >= 0 && sizes == last_sizes) {
      s.sizes = static_cast<uint16_t>(last_sizes_index);
      steps_.push_back(s);
      continue;
    }
    uint64_t h = hash_sizes(sizes);
    for (;; ++h) {
      auto [it, fresh] = size_index_.try_emplace(h, static_cast<uint16_t>(sizes_.size()));
      if (fresh) {
        if (sizes_.size() >= 0xFFFF) {
          throw InvalidArgument("simulation: more than 65535 distinct step sizes");
        }
        sizes_.push_back(sizes);
      }
      if (sizes_[it->second] == sizes) {
        s.sizes = it->second;
        last_sizes = sizes;
        last_sizes_index = it->second;
        break;
      }
    }
    steps_.push_back(s);
  }
  first_.push_back(steps_.size());
  conn_first_.push_back(conn_index_.size());
  channels_.push_back(channels);
}

void Programs::add_plan(int rank, const Plan& plan, size_t elem) {
  StepSpec s;  // one, refilled for each step: packing makes no copy of the Plan
  auto spec_at = [&](size_t i) -> const StepSpec& {
    const Step& st = plan.steps[i];
    s.kind = SimStep::Fused;
    s.recv = st.recv_peer;
    s.send = st.send_peer;
    s.channel = st.channel;
    s.after.clear();
    if (!st.after.empty()) s.after = st.after;
    s.sizes = StepSizes{};
    s.sizes.wait_sends = st.wait_sends;
    switch (st.kind) {
      case Step::Kind::Fused:
        s.sizes.send_bytes = s.sizes.recv_bytes = st.count * elem;
        // A received stream combined with local data is a reduction.
        if (st.recv_peer >= 0 && st.local) s.sizes.compute_bytes = st.count * elem;
        break;
      case Step::Kind::Exchange:
        s.kind = SimStep::Exchange;
        s.sizes.send_bytes = st.local ? st.local->count * elem : 0;
        s.sizes.recv_bytes = st.dst ? st.dst->count * elem : 0;
        if (st.operand) s.sizes.compute_bytes = s.sizes.recv_bytes;
        break;
      case Step::Kind::Reduce:
        s.kind = SimStep::Compute;
        s.recv = s.send = -1;
        s.sizes.compute_bytes = st.count * elem;
        break;
      case Step::Kind::LocalReduce:
        s.kind = SimStep::Compute;
        s.recv = s.send = -1;
        if (st.count > 0 && st.local) {
          s.sizes.compute_bytes = (st.local->count / st.count - 1) * st.count * elem;
        }
        break;
    }
    return s;
  };
  const std::vector<int> tags(plan.channel_tags.begin(), plan.channel_tags.end());
  pack_rank(rank, plan.steps.size(), spec_at, tags);
}

const std::vector<uint32_t>& Programs::after(int rank, size_t i) const {
  static const std::vector<uint32_t> none;
  auto r = after_.find(rank);
  if (r == after_.end()) return none;
  auto s = r->second.find(static_cast<uint32_t>(i));
  return s == r->second.end() ? none : s->second;
}

}  // namespace weft::sim
