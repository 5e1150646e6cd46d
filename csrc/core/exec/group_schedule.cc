#include "core/exec/group_schedule.h"

#include <algorithm>

#include "core/common/error.h"

namespace weft::group {
namespace {

// Temporaries start on this boundary (vector loads, NCCL's alignment).
constexpr size_t kTempAlign = 256;

// A byte range in one address space: Input shares Output's when it aliases.
struct Interval {
  int space;
  size_t begin, end;
  bool overlaps(const Interval& o) const {
    return space == o.space && begin < o.end && o.begin < end;
  }
};

class Builder {
 public:
  Builder(const Plan& plan, size_t elem, std::optional<size_t> input_in_output, int max_inputs)
      : plan_(plan), elem_(elem), alias_(input_in_output), max_inputs_(max_inputs) {}

  Schedule build() {
    for (const Step& s : plan_.steps) {
      switch (s.kind) {
        case Step::Kind::Fused: fused(s); break;
        case Step::Kind::Exchange: exchange(s); break;
        case Step::Kind::LocalReduce: local_reduce(s); break;
        case Step::Kind::Reduce:
          if (s.count > 0) reduce(at(*s.dst), {at(*s.dst), at(*s.local)}, s.count, s.finalize);
          break;
      }
    }
    close_batch();
    return std::move(out_);
  }

 private:
  Ref at(const Span& span, size_t elements = 0) const {
    Region r = Region::Output;
    switch (span.buf) {
      case Buf::Input: r = Region::Input; break;
      case Buf::Output: r = Region::Output; break;
      case Buf::Scratch: r = Region::Scratch; break;
    }
    return Ref{r, (span.offset + elements) * elem_};
  }

  Interval interval(const Ref& ref, size_t bytes) const {
    size_t begin = ref.offset;
    int space = static_cast<int>(ref.region);
    if (ref.region == Region::Input && alias_) {
      space = static_cast<int>(Region::Output);
      begin += *alias_;
    }
    return Interval{space, begin, begin + bytes};
  }

  static bool any(const std::vector<Interval>& set, const Interval& iv) {
    for (const Interval& o : set) {
      if (o.overlaps(iv)) return true;
    }
    return false;
  }

  // A temporary of `bytes` in this batch's arena.
  Ref temp(size_t bytes) {
    const int arena = batches_ % 2;
    const Ref ref{arena ? Region::Temp1 : Region::Temp0, used_[arena]};
    used_[arena] += (bytes + kTempAlign - 1) / kTempAlign * kTempAlign;
    out_.temp_bytes = std::max(out_.temp_bytes, used_[arena]);
    return ref;
  }

  void close_batch() {
    if (pending_.empty()) return;
    Action a;
    a.kind = Action::Kind::Batch;
    a.transfers = std::move(pending_);
    out_.actions.push_back(std::move(a));
    pending_.clear();
    sending_.clear();
    receiving_.clear();
    ++batches_;
    used_[batches_ % 2] = 0;  // its temporaries were last used two batches ago
  }

  void send(int peer, const Ref& from, size_t bytes) {
    if (bytes == 0) return;
    const Interval iv = interval(from, bytes);
    if (any(receiving_, iv)) close_batch();
    pending_.push_back(Transfer{true, peer, from, bytes});
    sending_.push_back(iv);
  }

  void receive(int peer, const Ref& into, size_t bytes) {
    if (bytes == 0) return;
    const Interval iv = interval(into, bytes);
    if (any(sending_, iv) || any(receiving_, iv)) close_batch();
    pending_.push_back(Transfer{false, peer, into, bytes});
    receiving_.push_back(iv);
  }

  void reduce(const Ref& dst, std::vector<Ref> srcs, size_t count, bool finalize) {
    if (count == 0) return;
    const size_t bytes = count * elem_;
    bool conflict = false;
    for (const Ref& src : srcs) conflict |= any(receiving_, interval(src, bytes));
    const Interval d = interval(dst, bytes);
    conflict |= any(receiving_, d) || any(sending_, d);
    if (conflict) close_batch();
    Action a;
    a.kind = Action::Kind::Reduce;
    a.dst = dst;
    a.srcs = std::move(srcs);
    a.count = count;
    a.finalize = finalize;
    out_.actions.push_back(std::move(a));
  }

  static bool same(const Ref& a, const Ref& b) {
    return a.region == b.region && a.offset == b.offset;
  }

  // A Fused step (see plan.h), one message: data = received (op) local, to
  // dst and/or send_peer.
  void fused(const Step& s) {
    const size_t len = s.count;
    const size_t bytes = len * elem_;
    if (bytes == 0) return;
    const std::optional<Ref> local = s.local ? std::optional<Ref>(at(*s.local)) : std::nullopt;
    const std::optional<Ref> dst = s.dst ? std::optional<Ref>(at(*s.dst)) : std::nullopt;
    const bool recv = s.recv_peer >= 0, sends = s.send_peer >= 0;
    if (!recv) {
      if (!local) return;
      if (s.finalize) {
        // The division goes to dst, or to a temporary for the send alone.
        const Ref out = dst ? *dst : temp(bytes);
        reduce(out, {*local}, len, true);
        if (sends) send(s.send_peer, out, bytes);
        return;
      }
      if (sends) send(s.send_peer, *local, bytes);
      if (dst && !same(*dst, *local)) reduce(*dst, {*local}, len, false);
      return;
    }
    if (!local) {
      if (dst) {
        receive(s.recv_peer, *dst, bytes);
        if (s.finalize) reduce(*dst, {*dst}, len, true);
        if (sends) send(s.send_peer, *dst, bytes);
        return;
      }
      if (!sends) return;
      const Ref through = temp(bytes);
      receive(s.recv_peer, through, bytes);
      if (s.finalize) reduce(through, {through}, len, true);
      send(s.send_peer, through, bytes);
      return;
    }
    const Ref incoming = temp(bytes);
    receive(s.recv_peer, incoming, bytes);
    const Ref out = dst ? *dst : incoming;
    reduce(out, {incoming, *local}, len, s.finalize);
    if (sends) send(s.send_peer, out, bytes);
  }

  // An Exchange step, one message each way.
  void exchange(const Step& s) {
    if (s.send_peer >= 0 && s.local) send(s.send_peer, at(*s.local), s.local->count * elem_);
    if (s.recv_peer < 0 || !s.dst) return;
    const size_t len = s.dst->count;
    if (!s.operand) {
      receive(s.recv_peer, at(*s.dst), len * elem_);
      return;
    }
    const Ref incoming = temp(len * elem_);
    receive(s.recv_peer, incoming, len * elem_);
    reduce(at(*s.dst), {incoming, at(*s.operand)}, len, s.finalize);
  }

  void local_reduce(const Step& s) {
    if (s.count == 0) return;
    const size_t blocks = s.local->count / s.count;
    const Ref dst = at(*s.dst);
    for (size_t first = 0; first < blocks;) {
      std::vector<Ref> srcs;
      if (first > 0) srcs.push_back(dst);  // the fold so far
      while (srcs.size() < static_cast<size_t>(max_inputs_) && first < blocks) {
        srcs.push_back(at(*s.local, first * s.count));
        ++first;
      }
      reduce(dst, std::move(srcs), s.count, s.finalize && first == blocks);
    }
  }

  const Plan& plan_;
  const size_t elem_;
  const std::optional<size_t> alias_;
  const int max_inputs_;
  Schedule out_;
  std::vector<Transfer> pending_;
  std::vector<Interval> sending_, receiving_;  // what the pending batch reads and writes
  int batches_ = 0;
  size_t used_[2] = {0, 0};
};

}  // namespace

Schedule schedule(const Plan& plan, size_t elem, std::optional<size_t> input_in_output,
                  int max_inputs) {
  if (elem == 0 || max_inputs < 2) {
    throw InvalidArgument("group::schedule: element size 0, or fewer than 2 inputs per reduction");
  }
  return Builder(plan, elem, input_in_output, max_inputs).build();
}

}  // namespace weft::group
