#include "core/algo/validate.h"

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <utility>

#include "core/common/error.h"

namespace weft::algo {
namespace {

bool overlap(const Span& a, const Span& b) {
  return a.buf == b.buf && a.offset < b.offset + b.count && b.offset < a.offset + a.count;
}

bool same(const Span& a, const Span& b) {
  return a.buf == b.buf && a.offset == b.offset && a.count == b.count;
}

}  // namespace

void validate(const Plan& plan, int rank, int size, size_t in_count, size_t out_count,
              size_t elem_size, size_t tags) {
  const auto refuse = [&](const std::string& what) {
    throw InvalidArgument("plan '" + plan.algorithm + "' on rank " + std::to_string(rank) + ": " +
                          what);
  };
  if (elem_size == 0 || plan.scratch_count > SIZE_MAX / elem_size) {
    refuse("scratch of " + std::to_string(plan.scratch_count) + " elements is beyond memory");
  }
  for (size_t c = 0; c < plan.channel_tags.size(); ++c) {
    if (plan.channel_tags[c] >= tags) {
      refuse("channel " + std::to_string(c) + " has tag " + std::to_string(plan.channel_tags[c]) +
             ", but this communicator has " + std::to_string(tags) +
             " connection sets per peer; create it with WEFT_CHANNELS=" +
             std::to_string(plan.channel_tags[c] + 1) + " or more");
    }
  }
  // The channel using each (tag, peer, direction): one at most.
  std::map<std::tuple<int, int, bool>, uint16_t> user;
  for (size_t i = 0; i < plan.steps.size(); ++i) {
    const Step& s = plan.steps[i];
    const auto fail = [&](const std::string& what) {
      refuse("step " + std::to_string(i) + ": " + what);
    };
    if (s.channel >= plan.channel_count()) {
      fail("channel " + std::to_string(s.channel) + " is not one of the plan's " +
           std::to_string(plan.channel_count()));
    }
    for (uint32_t d : s.after) {
      if (d >= i) fail("waits for step " + std::to_string(d) + ", which is not an earlier one");
    }
    const int tag = plan.channel_tags.empty() ? 0 : plan.channel_tags[s.channel];
    for (const auto& [peer, sending] : {std::pair{s.recv_peer, false}, {s.send_peer, true}}) {
      if (peer < 0 || peer >= size) continue;
      const auto [at, fresh] = user.emplace(std::make_tuple(tag, peer, sending), s.channel);
      if (!fresh && at->second != s.channel) {
        fail("channels " + std::to_string(at->second) + " and " + std::to_string(s.channel) +
             " both " + (sending ? "send to" : "receive from") + " rank " + std::to_string(peer) +
             " on tag " + std::to_string(tag) +
             ", so their messages would interleave; give one a tag of its own");
      }
    }
    for (int peer : {s.recv_peer, s.send_peer}) {
      if (peer >= size || peer == rank || peer < -1) {
        fail("peer " + std::to_string(peer) + " is not another rank of " + std::to_string(size));
      }
    }
    for (const std::optional<Span>* span : {&s.local, &s.dst, &s.operand}) {
      if (!*span) continue;
      const Span& sp = **span;
      const size_t limit = sp.buf == Buf::Input    ? in_count
                           : sp.buf == Buf::Output ? out_count
                                                   : plan.scratch_count;
      if (sp.offset > limit || sp.count > limit - sp.offset) {
        fail(std::string(to_string(sp.buf)) + "[" + std::to_string(sp.offset) + ":" +
             std::to_string(sp.offset + sp.count) + "] lies outside " + to_string(sp.buf) + " (" +
             std::to_string(limit) + " elements)");
      }
    }
    // The input is the caller's to read: results go to output or scratch (in place, the
    // output is the input's memory anyway).
    if (s.dst && s.dst->buf == Buf::Input && s.dst->count > 0) fail("writes into the input");
    switch (s.kind) {
      case Step::Kind::Fused:
        if (s.operand) fail("a fused step has no operand");
        for (const std::optional<Span>* span : {&s.local, &s.dst}) {
          if (*span && (*span)->count != s.count) fail("a span's length differs from the step's");
        }
        if (s.count > 0 && ((s.recv_peer < 0 && !s.local) || (s.send_peer < 0 && !s.dst))) {
          fail("a fused step needs data (a peer to receive from, or local) and a use for it");
        }
        break;
      case Step::Kind::Exchange:
        if (s.recv_peer < 0 && s.send_peer < 0) fail("an exchange needs a peer");
        if ((s.send_peer < 0 && s.local && s.local->count > 0) ||
            (s.recv_peer < 0 && s.dst && s.dst->count > 0)) {
          fail("an exchange's local needs a peer to send to, and its dst one to receive from");
        }
        if (s.operand && (!s.dst || s.operand->count != s.dst->count || s.recv_peer < 0)) {
          fail("an operand needs a dst of its length and a peer to receive from");
        }
        if (s.finalize && !s.operand) fail("an exchange divides (finalize) only with an operand");
        if (s.local && s.dst && overlap(*s.local, *s.dst)) {
          fail("an exchange's dst may not overlap what it sends");
        }
        break;
      case Step::Kind::LocalReduce: {
        // The executor reduces block 0 with block 1 into dst, then dst with each later
        // block: dst may be block 0 or 1, but must not cover a block still to be read.
        if (!s.local || !s.dst || s.count == 0 || s.dst->count != s.count ||
            s.local->count % s.count != 0 || s.local->count / s.count < 2) {
          fail(
              "a local reduce needs local of two or more blocks of count elements and a dst "
              "of count");
        }
        const Span block0{s.local->buf, s.local->offset, s.count};
        const Span block1{s.local->buf, s.local->offset + s.count, s.count};
        if (overlap(*s.dst, *s.local) && !same(*s.dst, block0) && !same(*s.dst, block1)) {
          fail("a local reduce's dst overlaps a block it has yet to read");
        }
        break;
      }
      case Step::Kind::Reduce:
        if (s.recv_peer >= 0 || s.send_peer >= 0 || s.operand || !s.local || !s.dst ||
            s.local->count != s.count || s.dst->count != s.count) {
          fail("a reduce needs no peers, and a local and a dst of count elements");
        }
        if (overlap(*s.local, *s.dst) && !same(*s.local, *s.dst)) {
          fail("a reduce's dst overlaps its local without being it");
        }
        break;
    }
  }
}

}  // namespace weft::algo
