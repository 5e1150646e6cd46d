// Keeps the ranks of one host off each other's CPU.
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
#pragma once

namespace weft::cpu_placement {

// A communicator's count of ranks on this host. Moving is allowed while every
// count seen fits the CPUs this process may use; with more ranks than CPUs,
// sharing is unavoidable and moving would only shuffle them.
void note_ranks_on_host(int ranks);

// Called by a waiter whose yield gave the CPU to another task. Moves this
// thread to another allowed CPU, at most once per 10 ms in the process, unless
// it is a worker thread (below).
void crowded();

// Marks the calling thread as one that runs operations next to the caller's
// own threads (asynchronous operations, point-to-point): there the other task
// on the CPU is the process's own compute, which moving would not escape.
void mark_worker_thread();
bool on_worker_thread();

}  // namespace weft::cpu_placement
