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

// Called by a waiter whose yield took `yield_us` microseconds: long enough
// means another task ran on this CPU meanwhile. Moves this thread to another
// allowed CPU, at most once per 10 ms in the process.
void after_yield(double yield_us);

}  // namespace weft::cpu_placement
