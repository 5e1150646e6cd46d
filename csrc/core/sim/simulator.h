// An event simulation of Programs on a Network, with the CPU executor's
// semantics (exec/executor.cc): a channel runs its steps one after another;
// a rank's channels run concurrently, a step waiting for the steps its
// `after` names; a fused step streams its bytes in slices, each needing a
// free slot of the send connection (slots per connection, freed when the
// receiver has consumed the message) and the next message of the receive
// connection; an exchange progresses its two sides together; wait_sends
// waits until every message the rank sent has arrived; the Plan ends when
// its sends have arrived. With `calls`, every rank runs its Programs that
// many times back to back, as a benchmark's loop does: a rank starts its next
// call once all its channels have finished the last; the first warmup_calls
// of them fill the links' state (token buckets) as a benchmark's warm-up does.
//
// Links: a message crosses its route's links cut-through: on each link it
// starts when its head arrives and the wire is free, holds the wire for
// bytes / bandwidth, and its head reaches the next link a latency later.
// A wire serves messages in the order they were sent (in simulated time),
// which is all the contention modelled: no packets, no congestion control.
// A rank in a CPU pool (network.h) first takes a core of it for the message:
// the pool's cores serve messages in the order sent, each on the core free
// soonest. Reductions cost gamma seconds a byte, on the channel that makes them; local
// copies cost nothing. A reduction moves its channel's own clock rather than
// waiting for an event, so what the channel sends after it may take a wire
// ahead of a message sent while it reduced (by at most that reduction's time):
// that keeps the events to about one a message.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/sim/network.h"
#include "core/sim/program.h"

namespace weft::sim {

struct SimOptions {
  size_t slice_bytes = 256 << 10;  // the largest message
  int slots = 8;                   // messages in flight per connection
  double gamma_s_per_b = 0;        // reduction cost
  size_t trace_limit = 0;          // keep the first this many wire uses (for pictures)
  int calls = 1;                   // runs of the Programs, back to back
  int warmup_calls = 0;            // of them, those before warmed_s
};

// A message on one wire: when it held it.
struct WireUse {
  Hop hop;
  int rank;  // the sender
  double start_s, end_s;
};

struct SimResult {
  double time_s = 0;              // when the last rank finished (its last call)
  double warmed_s = 0;            // when the last rank finished its warm-up calls
  std::vector<double> rank_done;  // per rank
  // Per hop (link * 2 + direction): bytes carried, seconds the wire was busy.
  std::vector<double> hop_bytes, hop_busy_s;
  std::vector<WireUse> trace;  // the first SimOptions::trace_limit, in the order sent
  uint64_t messages = 0;
  uint64_t events = 0;
  double min_route_latency_s = 0;  // the quickest route any connection used
};

// Throws InvalidArgument when a connection has no route, and Error naming
// the stuck ranks, channels and steps when the Programs deadlock.
SimResult simulate(const Network& net, const Programs& programs, const SimOptions& options);

}  // namespace weft::sim
