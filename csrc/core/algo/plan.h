// A Plan is what every algorithm produces and the executor runs: for one
// rank, one or more channels, each an ordered list of steps over element
// ranges of the operation's buffers. A channel's steps run one after another,
// and a rank's channels progress concurrently, waiting on each other only
// where a step says so (Step::after). Inside a step the executor streams
// slices through the connections, so neighbouring ranks work on different
// steps at the same time (that is the pipeline).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/algo/host_groups.h"

namespace weft {

// The buffers a step can name. Scratch is per-communicator memory the
// executor sizes from Plan::scratch_count.
enum class Buf : uint8_t { Input, Output, Scratch };

// "input", "output", "scratch": how errors and Python name the buffers.
inline const char* to_string(Buf b) {
  switch (b) {
    case Buf::Input: return "input";
    case Buf::Output: return "output";
    case Buf::Scratch: return "scratch";
  }
  return "?";
}

struct Span {
  Buf buf;
  size_t offset;  // elements
  size_t count;   // elements
};

struct Step {
  enum class Kind : uint8_t {
    // One stream of `count` elements: data = received (from recv_peer) reduced
    // with `local` (either may be absent); written to `dst` and/or sent to
    // send_peer. Covers send, copy, recv, recv-reduce, recv-reduce-send,
    // recv-reduce-copy-send and recv-copy-send.
    Fused,
    // Two transfers progressed together: `local` is sent to send_peer while
    // `dst` is received from recv_peer (all-to-all, gather), or, when
    // `operand` is set, dst = received (op) operand (recursive doubling and
    // halving). A side whose span is empty still sends (or awaits) one empty
    // message. dst may be operand (and operand local); dst may not overlap `local`.
    Exchange,
    // No communication: `local` holds size() blocks of `count` elements and
    // dst = block 0 (op) block 1 (op) ... in that order.
    LocalReduce,
    // No communication: dst = dst (op) local, `count` elements each (MSCCL's
    // "re"); dst is local or apart from it.
    Reduce,
  };
  Kind kind = Kind::Fused;
  int recv_peer = -1;
  int send_peer = -1;
  std::optional<Span> local;
  std::optional<Span> dst;
  std::optional<Span> operand;  // Exchange only
  // Divide the result by the world size (ReduceOp::Avg's last reduction).
  bool finalize = false;
  // Wait until every earlier send has left the process first: set on steps
  // that overwrite memory an earlier step sent by reference (in-place ops).
  bool wait_sends = false;
  // Fused: send copies of `local`, never `local` itself by reference, so that
  // a later step may overwrite it at once (waiting instead for a reference to
  // be read can deadlock when the peer reads it only after its own wait).
  // Only the CPU executor reads it: the nccl group schedule closes a batch of
  // sends before anything overwrites what they read.
  bool copy_sends = false;
  // Fused: the stream length (every present span has this count).
  size_t count = 0;
  // The channel the step runs on (an index into Plan::channel_tags). Its
  // messages use this rank's connections of that channel's tag, so they
  // reach, in order, the peer's channel of the same tag.
  uint16_t channel = 0;
  // Steps (indices into Plan::steps, each earlier than this one) that must
  // have finished before this step starts: how channels wait on each other.
  std::vector<uint32_t> after;
};

struct Plan {
  std::string algorithm;  // for logs and tests, e.g. "ring", "oneshot"
  // Every channel's steps; those of one channel in the order they run.
  std::vector<Step> steps;
  size_t scratch_count = 0;  // elements of Scratch the steps use
  // The connection tag of each channel (MSCCL's "chan"): two channels of a
  // rank may share a tag where they talk to different peers. Empty for the
  // one channel of tag 0 that most generators plan.
  std::vector<uint8_t> channel_tags;
  size_t channel_count() const { return channel_tags.empty() ? 1 : channel_tags.size(); }
};

// What every generator needs to know about the world it plans for.
struct PlanContext {
  int rank;
  int size;
  size_t elem_size;
  // Largest number of bytes one step may push into a connection before the
  // peer consumes it; bounds ring chunks so rings cannot deadlock.
  size_t max_step_bytes;
  // Host index of every rank (ranks with equal indices share memory).
  std::vector<int> host;
  // Whether a send completes before the peer receives it, as through the CPU
  // executor's buffered connections. Schedules of rendezvous sends (the nccl
  // transport's group schedules) plan with false: there a rank must not wait
  // on one peer while its send to another is still unmatched, so plans keep
  // each phase's sends next to the receives they pair with.
  bool buffered_sends = true;
  // Where more than two ranks per CPU share a machine's CPUs and placement
  // spreads them (exec/cpu_placement.h): ranks with the same value run on
  // the same CPU (a rank alone on its CPU has a value of its own); -1 for a
  // rank placement does not spread. Empty where no ranks are spread so.
  std::vector<int> shared_cpu;
  // How many channel tags a Plan may use (the communicator's connection
  // sets per peer, WEFT_CHANNELS): generators that can run several channels
  // plan as many as this allows.
  int channels = 1;
  // host_groups(host), where the caller makes many ranks' Plans of one world
  // and groups it once; null: the generators that need it group `host`.
  std::shared_ptr<const algo::HostGroups> groups;
};

// a mod n in [0, n), for rank arithmetic around a ring or tree.
inline int positive_mod(int a, int n) { return ((a % n) + n) % n; }

// Elements per chunk so that one step never pushes more than the budget.
inline size_t chunk_limit(const PlanContext& ctx) {
  return std::max<size_t>(1, ctx.max_step_bytes / ctx.elem_size);
}

// A Fused step of `count` elements; the caller fills in peers and spans.
inline Step fused_step(size_t count) {
  Step s;
  s.count = count;
  return s;
}

// A step that copies `from` to `to` locally (same count), or nothing for an
// empty span.
inline void add_copy(std::vector<Step>& steps, const Span& from, const Span& to) {
  if (from.count == 0) return;
  Step s;
  s.count = from.count;
  s.local = from;
  s.dst = to;
  steps.push_back(s);
}

// An Exchange step: `send` goes to send_peer while `receive` comes from
// recv_peer (-1 and nullopt for a side that is absent).
inline Step exchange_step(int send_peer, std::optional<Span> send, int recv_peer,
                          std::optional<Span> receive) {
  Step s;
  s.kind = Step::Kind::Exchange;
  s.send_peer = send_peer;
  s.local = send;
  s.recv_peer = recv_peer;
  s.dst = receive;
  return s;
}

// Splits `count` elements into `parts` nearly equal pieces; piece i starts at
// part_offset(count, parts, i) and has part_count(count, parts, i) elements.
inline size_t part_count(size_t count, size_t parts, size_t i) {
  return count / parts + (i < count % parts ? 1 : 0);
}
inline size_t part_offset(size_t count, size_t parts, size_t i) {
  return i * (count / parts) + (i < count % parts ? i : count % parts);
}

}  // namespace weft
