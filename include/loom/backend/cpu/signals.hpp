// SPDX-License-Identifier: Apache-2.0
#pragma once
// Keeps asynchronous signals away from the threads while they run oneDNN.
//
// Why: oneDNN's JIT f32 GEMM kernels (AVX2 and AVX-512; every oneDNN before 3.11.1, Debian 12
// ships 2.7) point the stack pointer at a heap workspace while they run. A signal delivered to
// the thread then has its frame written there by the kernel, over the workspace and malloc's
// bookkeeping: a wrong product, or an abort later in an unrelated free() ("corrupted size vs.
// prev_size"). oneDNN issue #4845, fixed by its pull request #4855. loom handles SIGTERM and
// SIGUSR1 (checkpoint and stop), and MPI and profilers use signals too, so loom:
//   - blocks the asynchronous signals on the calling thread for the length of every oneDNN
//     call (signal_shield, in dnnl_checked and around dnnl_sgemm): a signal that comes then
//     waits, pending, and is handled as the call returns — microseconds to milliseconds later;
//   - blocks them for good in the OpenMP pool's other threads (set_threads does it), which
//     run oneDNN's kernels too and nothing that waits for a signal: a signal sent to the
//     process goes to a thread that can take it (the main thread between calls, MPI's).
// Synchronous signals (a fault of the thread itself: SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP,
// SIGSYS) and SIGABRT are never blocked. Cost: two rt_sigprocmask system calls per oneDNN call,
// 0.45-0.54 us alone; the mlp's step (batch 64) makes 8 sgemm calls, which took 0.6-1.6% longer
// than raw dnnl_sgemm in a paired run (docs/checkpoints.md). One shield per micro-step's
// compute, with nested shields free, would cut that; not done yet.
// tests/layers/signal_storm_test.cpp fails without this (wrong products or a heap abort in
// every run, AVX2 and AVX-512 alike) and passes with it.

#include <pthread.h>
#include <signal.h>

#include <initializer_list>

namespace loom::detail {

/// Every signal but those a thread raises by what it executes, and SIGABRT.
inline const sigset_t& asynchronous_signals() noexcept {
  static const sigset_t set = [] {
    sigset_t s;
    sigfillset(&s);
    for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS, SIGABRT}) sigdelset(&s, sig);
    return s;
  }();
  return set;
}

/// While it lives, the asynchronous signals wait (pending) instead of interrupting this thread;
/// the thread's previous mask comes back after, and with it any signal that came meanwhile.
class signal_shield {
 public:
  signal_shield() noexcept { ::pthread_sigmask(SIG_BLOCK, &asynchronous_signals(), &old_); }
  signal_shield(const signal_shield&) = delete;
  signal_shield& operator=(const signal_shield&) = delete;
  ~signal_shield() { ::pthread_sigmask(SIG_SETMASK, &old_, nullptr); }

 private:
  sigset_t old_;
};

/// Blocks the asynchronous signals on this thread for good (an OpenMP pool thread).
inline void shield_this_thread_for_good() noexcept { ::pthread_sigmask(SIG_BLOCK, &asynchronous_signals(), nullptr); }

}  // namespace loom::detail
