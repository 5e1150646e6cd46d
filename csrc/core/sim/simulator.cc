#include "core/sim/simulator.h"

#include <algorithm>
#include <queue>
#include <sstream>
#include <unordered_map>

#include "core/common/error.h"
#include "core/sim/core_calendar.h"

namespace weft::sim {
namespace {

struct Conn {
  uint32_t posted = 0, consumed = 0;
  int32_t send_waiter = -1, recv_waiter = -1;
  uint32_t route_first = 0, route_len = 0;
};

// One channel of one rank, running its steps in order.
struct Proc {
  int32_t rank;
  uint8_t channel;
  bool started = false;  // the current step's waits (after, wait_sends) are over
  bool done = false;
  uint32_t pos = 0;                 // the current step, an index into the rank's steps
  uint32_t sent = 0, received = 0;  // messages of the current step
  double scheduled = -1;            // when the next resume is due; -1 for none
  double clock = 0;                 // where its own work (reductions) has taken it; never behind
};

// Ties between events are broken by process, so a run is the same every time.
struct Event {
  double t;
  uint32_t proc;
  bool operator>(const Event& o) const { return t > o.t || (t == o.t && proc > o.proc); }
};

size_t messages_of(uint64_t bytes, size_t slice) { return (bytes + slice - 1) / slice; }
uint64_t slice_len(uint64_t bytes, size_t slice, uint32_t k) {
  return std::min<uint64_t>(slice, bytes - static_cast<uint64_t>(k) * slice);
}

class Sim {
 public:
  Sim(const Network& net, const Programs& programs, const SimOptions& options)
      : net_(net), prog_(programs), opt_(options) {
    if (net.ranks() != programs.ranks()) {
      throw InvalidArgument("simulate: the topology has " + std::to_string(net.ranks()) +
                            " ranks and the algorithm " + std::to_string(programs.ranks()));
    }
    if (opt_.slice_bytes < 1 || opt_.slots < 1 || opt_.calls < 1 || opt_.warmup_calls < 0 ||
        opt_.warmup_calls >= opt_.calls || !(opt_.gamma_s_per_b >= 0)) {
      throw InvalidArgument(
          "simulate: needs slice_bytes >= 1, slots >= 1, 0 <= warmup_calls < calls and "
          "gamma >= 0");
    }
    const auto& keys = prog_.conns();
    conns_.resize(keys.size());
    arrival_.assign(keys.size() * opt_.slots, 0);
    result_.min_route_latency_s = 0;
    bool any_route = false;
    for (size_t c = 0; c < keys.size(); ++c) {
      conns_[c].route_first = static_cast<uint32_t>(routes_.size());
      if (!net.route(keys[c].src, keys[c].dst, routes_, keys[c].tag)) {
        throw InvalidArgument("simulate: the topology has no route from rank " +
                              std::to_string(keys[c].src) + " to rank " +
                              std::to_string(keys[c].dst));
      }
      conns_[c].route_len = static_cast<uint32_t>(routes_.size()) - conns_[c].route_first;
      double latency = 0;
      for (uint32_t i = 0; i < conns_[c].route_len; ++i) {
        latency += net.link(routes_[conns_[c].route_first + i]).latency_s;
      }
      if (conns_[c].route_len > 0 && (!any_route || latency < result_.min_route_latency_s)) {
        result_.min_route_latency_s = latency;
        any_route = true;
      }
    }
    const size_t hops = 2 * net.links().size();
    free_at_.assign(hops, 0);
    token_stamp_.assign(hops, 0);
    for (const CpuPool& pool : net.pools()) cores_.emplace_back(pool.cores);
    if (!cores_.empty()) threads_.assign(prog_.ranks(), CoreCalendar(1));
    tokens_.resize(hops);
    for (size_t h = 0; h < hops; ++h) tokens_[h] = net.link(static_cast<Hop>(h)).burst_bytes;
    result_.hop_bytes.assign(hops, 0);
    result_.hop_busy_s.assign(hops, 0);
    last_arrival_.assign(prog_.ranks(), 0);
    result_.rank_done.assign(prog_.ranks(), 0);
    calls_done_.assign(prog_.ranks(), 0);
    channels_left_.resize(prog_.ranks());
    first_proc_.push_back(0);
    for (int r = 0; r < prog_.ranks(); ++r) {
      for (int c = 0; c < prog_.channels_of(r); ++c) {
        Proc p;
        p.rank = r;
        p.channel = static_cast<uint8_t>(c);
        procs_.push_back(p);
      }
      first_proc_.push_back(static_cast<uint32_t>(procs_.size()));
      channels_left_[r] = prog_.channels_of(r);
      if (prog_.any_after(r)) done_at_[r].assign(prog_.steps_of(r), -1);
    }
  }

  SimResult run() {
    for (uint32_t p = 0; p < procs_.size(); ++p) schedule(p, 0);
    while (!queue_.empty()) {
      const Event e = queue_.top();
      queue_.pop();
      Proc& p = procs_[e.proc];
      if (p.scheduled != e.t) continue;  // superseded by an earlier resume
      p.scheduled = -1;
      ++result_.events;
      now_ = e.t;
      advance(e.proc, e.t);
    }
    report_deadlock();
    for (int r = 0; r < prog_.ranks(); ++r) {
      result_.rank_done[r] = std::max(result_.rank_done[r], last_arrival_[r]);
      result_.time_s = std::max(result_.time_s, result_.rank_done[r]);
    }
    return std::move(result_);
  }

 private:
  void schedule(uint32_t pid, double t) {
    Proc& p = procs_[pid];
    if (p.scheduled >= 0 && p.scheduled <= t) return;
    p.scheduled = t;
    queue_.push(Event{t, pid});
  }

  double arrival(uint32_t c, uint32_t k) const {
    return arrival_[static_cast<size_t>(c) * opt_.slots + k % opt_.slots];
  }
  bool slot_free(uint32_t c) const {
    return conns_[c].posted - conns_[c].consumed < static_cast<uint32_t>(opt_.slots);
  }

  void wait_send(uint32_t c, uint32_t pid) { set_waiter(conns_[c].send_waiter, c, pid, "send"); }
  void wait_recv(uint32_t c, uint32_t pid) { set_waiter(conns_[c].recv_waiter, c, pid, "receive"); }
  void set_waiter(int32_t& waiter, uint32_t c, uint32_t pid, const char* what) {
    if (waiter >= 0 && waiter != static_cast<int32_t>(pid)) {
      const ConnKey& k = prog_.conns()[c];
      throw InvalidArgument("simulate: two channels of rank " + std::to_string(procs_[pid].rank) +
                            " " + what + " on one connection (rank " + std::to_string(k.src) +
                            " to " + std::to_string(k.dst) + ", tag " + std::to_string(k.tag) +
                            "): give them different tags");
    }
    waiter = static_cast<int32_t>(pid);
  }

  void consume(uint32_t c, double t) {
    Conn& conn = conns_[c];
    ++conn.consumed;
    if (conn.send_waiter >= 0) {
      const uint32_t w = static_cast<uint32_t>(conn.send_waiter);
      conn.send_waiter = -1;
      schedule(w, t);
    }
  }

  // Puts a message on the wires of connection c at time t.
  void post(uint32_t c, uint64_t bytes, double t, int rank) {
    Conn& conn = conns_[c];
    double head = t, tail = t;
    if (const int pool = net_.pool_of(rank); pool >= 0) {
      const CpuPool& cpus = net_.pools()[pool];
      const double seconds = cpus.s_per_message + static_cast<double>(bytes) * cpus.s_per_b;
      tail = cpu_work(rank, t, seconds);
      head = tail - seconds;
    }
    for (uint32_t i = 0; i < conn.route_len; ++i) {
      const Hop h = routes_[conn.route_first + i];
      const Link& l = net_.link(h);
      const uint32_t w = net_.wire(h);
      double& free = free_at_[w];
      const double start = std::max(head, free);
      const double size = static_cast<double>(bytes);
      const double saved = l.burst_bytes > 0 ? tokens_at(w, l, start) : 0;
      // What the saved tokens do not cover goes at the link's rate.
      const double busy = std::max(0.0, size - saved) / l.bandwidth_bps;
      const double end = std::max(start + busy, tail);
      if (l.burst_bytes > 0) spend_tokens(w, l, saved, size, start, end);
      free = end;
      result_.hop_bytes[h] += static_cast<double>(bytes);
      result_.hop_busy_s[h] += busy;
      if (result_.trace.size() < opt_.trace_limit) result_.trace.push_back({h, rank, start, end});
      head = start + l.latency_s;
      tail = end + l.latency_s;
    }
    arrival_[static_cast<size_t>(c) * opt_.slots + conn.posted % opt_.slots] = tail;
    ++conn.posted;
    ++result_.messages;
    last_arrival_[rank] = std::max(last_arrival_[rank], tail);
    if (conn.recv_waiter >= 0) {
      const uint32_t w = static_cast<uint32_t>(conn.recv_waiter);
      conn.recv_waiter = -1;
      schedule(w, tail);
    }
  }

  // CPU work of `seconds` that rank r can start at t, ending when returned:
  // where r is in a pool, on one of its cores while r's thread does nothing
  // else (its channels share the thread), else at once.
  double cpu_work(int r, double t, double seconds) {
    const int pool = net_.pool_of(r);
    if (pool < 0) return t + seconds;
    if (!(seconds > 0)) return t;
    CoreCalendar &cores = cores_[pool], &thread = threads_[r];
    cores.forget_until(now_);
    thread.forget_until(now_);
    CoreCalendar::Gap mine = thread.earliest(t, seconds),
                      core = cores.earliest(mine.start, seconds);
    while (core.start > mine.start) {
      mine = thread.earliest(core.start, seconds);
      core = cores.earliest(mine.start, seconds);
    }
    thread.take(mine, seconds);
    cores.take(core, seconds);
    return mine.start + seconds;
  }

  // A token-bucket wire's tokens at t (it refills at its rate while idle).
  double tokens_at(uint32_t w, const Link& l, double t) const {
    return std::min(l.burst_bytes, tokens_[w] + (t - token_stamp_[w]) * l.bandwidth_bps);
  }
  // A message of `size` bytes crossed from start to end with `saved` tokens
  // there at its start; tokens kept coming at the rate meanwhile.
  void spend_tokens(uint32_t w, const Link& l, double saved, double size, double start,
                    double end) {
    tokens_[w] = std::clamp(saved - size + (end - start) * l.bandwidth_bps, 0.0, l.burst_bytes);
    token_stamp_[w] = end;
  }

  // Whether message `received` of connection c is here at t; if not, arranges
  // to be resumed when it is.
  bool message_here(uint32_t c, uint32_t pid, double t) {
    const Conn& conn = conns_[c];
    if (conn.consumed == conn.posted) {
      wait_recv(c, pid);
      return false;
    }
    const double a = arrival(c, conn.consumed);
    if (a > t) {
      schedule(pid, a);
      return false;
    }
    return true;
  }

  // Runs channel process pid from time t until it must wait.
  void advance(uint32_t pid, double now) {
    Proc& p = procs_[pid];
    double t = std::max(now, p.clock);
    const int r = p.rank;
    const size_t n = prog_.steps_of(r);
    const size_t slice = opt_.slice_bytes;
    while (p.pos < n) {
      const SimStep& s = prog_.step(r, p.pos);
      if (s.channel != p.channel) {
        ++p.pos;
        continue;
      }
      const StepSizes& z = prog_.sizes(s);
      const uint32_t rc = s.recv == kNoPeer ? UINT32_MAX : prog_.conn(r, s.recv);
      const uint32_t sc = s.send == kNoPeer ? UINT32_MAX : prog_.conn(r, s.send);
      if (!p.started) {
        if (z.has_after) {
          for (uint32_t dep : prog_.after(r, p.pos)) {
            if (done_at_[r][dep] < 0) {
              p.clock = t;
              dep_waiters_[r].push_back(pid);
              return;
            }
            t = std::max(t, done_at_[r][dep]);
          }
        }
        if (z.wait_sends && last_arrival_[r] > t) {
          p.clock = t;
          schedule(pid, last_arrival_[r]);
          return;
        }
        p.started = true;
      }
      if (s.kind == SimStep::Fused) {
        const uint32_t total = static_cast<uint32_t>(messages_of(z.send_bytes, slice));
        while (p.sent < total) {
          const uint64_t len = slice_len(z.send_bytes, slice, p.sent);
          if (sc != UINT32_MAX && !slot_free(sc)) {
            p.clock = t;
            return wait_send(sc, pid);
          }
          if (rc != UINT32_MAX && !message_here(rc, pid, t)) return void(p.clock = t);
          // The reduction runs on this channel's clock, without an event: what it then
          // sends leaves when the reduction is done.
          if (z.compute_bytes > 0)
            t = cpu_work(r, t, static_cast<double>(len) * opt_.gamma_s_per_b);
          if (rc != UINT32_MAX) consume(rc, t);
          if (sc != UINT32_MAX) post(sc, len, t, r);
          ++p.sent;
        }
      } else if (s.kind == SimStep::Exchange) {
        const uint32_t sends =
            sc == UINT32_MAX ? 0 : std::max<size_t>(1, messages_of(z.send_bytes, slice));
        const uint32_t recvs =
            rc == UINT32_MAX ? 0 : std::max<size_t>(1, messages_of(z.recv_bytes, slice));
        while (p.sent < sends || p.received < recvs) {
          bool moved = false;
          if (p.sent < sends && slot_free(sc)) {
            post(sc, z.send_bytes ? slice_len(z.send_bytes, slice, p.sent) : 0, t, r);
            ++p.sent;
            moved = true;
          }
          if (p.received < recvs && conns_[rc].consumed < conns_[rc].posted &&
              arrival(rc, conns_[rc].consumed) <= t) {
            const uint64_t len = z.recv_bytes ? slice_len(z.recv_bytes, slice, p.received) : 0;
            if (z.compute_bytes > 0)
              t = cpu_work(r, t, static_cast<double>(len) * opt_.gamma_s_per_b);
            consume(rc, t);
            ++p.received;
            moved = true;
          }
          if (moved) continue;
          p.clock = t;
          if (p.sent < sends) wait_send(sc, pid);
          if (p.received < recvs) message_here(rc, pid, t);
          return;
        }
      } else {
        t = cpu_work(r, t, static_cast<double>(z.compute_bytes) * opt_.gamma_s_per_b);
      }
      finish_step(p, t);
    }
    p.clock = t;
    if (!p.done) {
      p.done = true;
      result_.rank_done[r] = std::max(result_.rank_done[r], t);
      if (--channels_left_[r] == 0) end_call(r);
    }
  }

  // Rank r's channels are all done with a call: the next one, if any, starts
  // on all of them now, as a loop of calls does.
  void end_call(int r) {
    const double t = result_.rank_done[r];
    if (++calls_done_[r] == opt_.warmup_calls) result_.warmed_s = std::max(result_.warmed_s, t);
    if (calls_done_[r] == opt_.calls) return;
    channels_left_[r] = prog_.channels_of(r);
    if (auto d = done_at_.find(r); d != done_at_.end()) {
      std::fill(d->second.begin(), d->second.end(), -1.0);
    }
    for (uint32_t pid = first_proc_[r]; pid < first_proc_[r + 1]; ++pid) {
      Proc& q = procs_[pid];
      q.done = q.started = false;
      q.pos = q.sent = q.received = 0;
      q.clock = t;
      schedule(pid, t);
    }
  }

  void finish_step(Proc& p, double t) {
    const int r = p.rank;
    auto d = done_at_.find(r);
    if (d != done_at_.end()) {
      d->second[p.pos] = t;
      std::vector<uint32_t> waiting;
      waiting.swap(dep_waiters_[r]);
      for (uint32_t w : waiting) schedule(w, t);
    }
    p.started = false;
    p.sent = p.received = 0;
    ++p.pos;
  }

  void report_deadlock() const {
    std::ostringstream stuck;
    int shown = 0, count = 0;
    for (const Proc& p : procs_) {
      if (p.done) continue;
      ++count;
      if (shown++ < 6) {
        const SimStep& s = prog_.step(p.rank, p.pos);
        size_t index = 0;  // the step's place in its channel
        for (size_t i = 0; i < p.pos; ++i) index += prog_.step(p.rank, i).channel == p.channel;
        stuck << (shown > 1 ? "; " : "") << "rank " << p.rank << " channel " << int(p.channel)
              << " step " << index;
        if (s.recv != kNoPeer)
          stuck << " receiving from " << prog_.conns()[prog_.conn(p.rank, s.recv)].src;
        if (s.send != kNoPeer)
          stuck << " sending to " << prog_.conns()[prog_.conn(p.rank, s.send)].dst;
      }
    }
    if (count > 0) {
      throw Error("simulate: deadlock: " + std::to_string(count) +
                  " channel(s) cannot go on: " + stuck.str());
    }
  }

  const Network& net_;
  const Programs& prog_;
  const SimOptions opt_;
  std::vector<Conn> conns_;
  std::vector<double> arrival_;  // slots per connection, a ring of arrival times
  std::vector<Hop> routes_;
  std::vector<double> free_at_;        // per wire
  std::vector<CoreCalendar> cores_;    // per CPU pool
  std::vector<CoreCalendar> threads_;  // per rank, where there are pools
  double now_ = 0;                     // the time of the event being run
  // Token buckets, per wire: tokens at token_stamp_ (full at the start).
  std::vector<double> tokens_, token_stamp_;
  std::vector<double> last_arrival_;
  std::vector<Proc> procs_;
  std::vector<uint32_t> first_proc_;
  std::vector<int> calls_done_, channels_left_;           // per rank, in the current call
  std::unordered_map<int, std::vector<double>> done_at_;  // ranks with `after`: step -> end
  std::unordered_map<int, std::vector<uint32_t>> dep_waiters_;
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> queue_;
  SimResult result_;
};

}  // namespace

SimResult simulate(const Network& net, const Programs& programs, const SimOptions& options) {
  return Sim(net, programs, options).run();
}

}  // namespace weft::sim
