// Keeps ranks that share CPUs off each other's CPU, or, when they outnumber
// the CPUs, spread evenly over them. Ranks share CPUs when they run on one
// machine (one running kernel: "hosts" that WEFT_HOST_ID names apart, such as
// containers or network namespaces, may be one) with the same allowed set
// (common/machine.h). WEFT_CPU_PLACEMENT=off leaves placement to the kernel.
//
// The kernel's scheduler sometimes puts two ranks that wait on each other on
// one CPU while another CPU of theirs idles, and keeps them there for seconds:
// both are always runnable and always cache-hot, so the balancer leaves them.
// They then take turns: every hand-off waits for the other's time slice (about
// 60 us per small allreduce at world size 2 instead of 1 us) and large
// transfers run at a fraction of their speed. A waiting thread that finds that
// another task ran on its CPU while it yielded moves itself to another CPU of
// its allowed set, once, and is free to move again afterwards: nothing is
// pinned, and a set the user chose is kept.
//
// With more ranks than CPUs, sharing is unavoidable, but not its shape: 4
// ranks on 2 CPUs sat 3 on one and 1 on the other in half the launches, for
// whole runs, and a small allreduce took 19-30 us there against 8-12 us on a
// 2 + 2 split. There the thread that creates a communicator goes to CPU (its
// rank's index among the ranks sharing the CPUs) mod (their number), of the
// allowed set, and so does a crowded waiting thread that finds itself
// elsewhere; again nothing is pinned.
#pragma once

#include "core/common/machine.h"

namespace weft::cpu_placement {

// A communicator's count of ranks that share this rank's CPUs and this rank's
// index among them. The communicator with the most such ranks (the first of
// them) sets the index this process spreads by; with more ranks than CPUs the
// calling thread moves there now.
void note_ranks_sharing_cpus(int ranks, int index);

// Where this process spreads, for its peers to know which ranks take turns on
// a CPU (bootstrap publishes it).
CpuSpread current_spread();
// The index a process that reported `before` spreads by once it joins a
// communicator in which `ranks` ranks share its CPUs, with it at `index`
// (note_ranks_sharing_cpus); -1 with placement off.
int spread_index_after(const CpuSpread& before, int ranks, int index);

// Called by a waiter whose yield gave the CPU to another task. Moves the
// calling thread, at most once per 10 ms in the process, unless it is a
// worker thread (below): to another allowed CPU, or with more ranks than CPUs
// back to its spread CPU if it has left it.
void crowded();

// Marks the calling thread as one that runs operations next to the caller's
// own threads (asynchronous operations, point-to-point): there the other task
// on the CPU is the process's own compute, which moving would not escape.
void mark_worker_thread();
bool on_worker_thread();

}  // namespace weft::cpu_placement
