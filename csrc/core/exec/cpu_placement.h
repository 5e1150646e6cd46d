// Keeps the ranks of one machine off each other's CPU, or, when they
// outnumber the CPUs, spread evenly over them. A machine is a running kernel
// (its boot id): "hosts" that WEFT_HOST_ID names apart, such as containers or
// network namespaces, may share one and its CPUs.
//
// The kernel's scheduler sometimes puts two ranks that wait on each other on
// one CPU while another CPU of theirs idles, and keeps them there for seconds:
// both are always runnable and always cache-hot, so the balancer leaves them.
// They then take turns: every hand-off waits for the other's time slice (about
// 60 us per small allreduce at world size 2 instead of 1 us) and large
// transfers run at a fraction of their speed. A waiting rank that finds that
// another task ran on its CPU while it yielded moves itself to another CPU of
// its allowed set, once, and is free to move again afterwards: nothing is
// pinned, and a set the user chose is kept.
//
// With more ranks than CPUs, sharing is unavoidable, but not its shape: 4
// ranks on 2 CPUs sat 3 on one and 1 on the other in half the launches, for
// whole runs, and a small allreduce took 19-30 us there against 8-12 us on a
// 2 + 2 split. There every rank goes to CPU (its index among the machine's
// ranks) mod (CPUs it may use), of its allowed set, when its communicator is created
// and again when a crowded wait finds it elsewhere; again nothing is pinned.
#pragma once

namespace weft::cpu_placement {

// A communicator's count of ranks on this machine and this rank's index among
// them. Moving is among the CPUs this process may use; the communicator with
// the most ranks on the machine (the first of them) sets the index a rank
// spreads by, and with more ranks than CPUs the rank moves there now.
void note_ranks_on_machine(int ranks, int index);

// Called by a waiter whose yield gave the CPU to another task. Moves this
// thread, at most once per 10 ms in the process, unless it is a worker thread
// (below): to another allowed CPU, or with more ranks than CPUs back to its
// spread CPU if it has left it.
void crowded();

// Marks the calling thread as one that runs operations next to the caller's
// own threads (asynchronous operations, point-to-point): there the other task
// on the CPU is the process's own compute, which moving would not escape.
void mark_worker_thread();
bool on_worker_thread();

}  // namespace weft::cpu_placement
