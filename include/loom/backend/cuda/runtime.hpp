// SPDX-License-Identifier: Apache-2.0
#pragma once
// The CUDA runtime as loom uses it: how many devices there are, which one a thread computes
// on, and each thread's compute stream on each device — the stream every loom::cuda kernel,
// copy, cuBLAS and cuDNN call of that thread is queued on, so one thread's work runs in order
// and needs no device-wide synchronisation. Host code only (no nvcc needed): loom/comm/nccl.hpp
// uses it too. Nothing here runs during static initialisation.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>
#include <vector>

#include "loom/backend/cuda/check.hpp"
#include "loom/core/error.hpp"

namespace loom {

/// The number of CUDA devices this process can use; 0 when there is none, or no driver.
/// Never throws (the error of a machine without a GPU is cleared).
inline int cuda_device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

/// The device the calling thread computes on (cudaGetDevice).
/// Throws: loom::backend_error when there is no usable device.
inline int cuda_current_device() {
  int d = 0;
  LOOM_CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

/// Makes the calling thread compute on device `d` (cudaSetDevice); its compute stream there is
/// created on first use.
/// Throws: loom::invalid_argument when d is not a device of this process.
inline void set_cuda_device(int d) {
  const int n = cuda_device_count();
  if (d < 0 || d >= n)
    throw invalid_argument("loom::set_cuda_device: device " + std::to_string(d) + " does not exist (this process sees " +
                           std::to_string(n) + " CUDA device" + (n == 1 ? "" : "s") + ")");
  LOOM_CUDA_CHECK(cudaSetDevice(d));
}

namespace detail {

/// The streams a thread has created, one per device; destroyed when the thread ends.
class thread_streams {
 public:
  thread_streams() = default;
  thread_streams(const thread_streams&) = delete;
  thread_streams& operator=(const thread_streams&) = delete;
  ~thread_streams() {
    for (cudaStream_t s : streams_)
      if (s) (void)cudaStreamDestroy(s);  // errors ignored: the runtime may already be shutting down
  }
  cudaStream_t get(int device) {
    if (static_cast<std::size_t>(device) >= streams_.size()) streams_.resize(static_cast<std::size_t>(device) + 1, nullptr);
    cudaStream_t& s = streams_[static_cast<std::size_t>(device)];
    // Non-blocking: no implicit ordering with the legacy default stream, which other
    // libraries may use; loom orders its own work with this stream and events.
    if (!s) LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return s;
  }

 private:
  std::vector<cudaStream_t> streams_;
};

inline thread_streams& this_thread_streams() {
  thread_local thread_streams s;
  return s;
}

}  // namespace detail

/// The calling thread's compute stream on its current device. Every loom::cuda operation of
/// this thread is queued on it, in call order.
/// Throws: loom::backend_error when there is no usable device.
inline cudaStream_t cuda_compute_stream() { return detail::this_thread_streams().get(cuda_current_device()); }

/// Blocks until everything queued on the calling thread's compute stream has run; reports an
/// error of earlier asynchronous work (a failed kernel) as loom::backend_error.
inline void cuda_synchronize() { LOOM_CUDA_CHECK(cudaStreamSynchronize(cuda_compute_stream())); }

/// The device's name and compute capability, e.g. "NVIDIA H200 (sm_90)"; for messages.
inline std::string cuda_device_name(int d) {
  cudaDeviceProp p{};
  LOOM_CUDA_CHECK(cudaGetDeviceProperties(&p, d));
  return std::string(p.name) + " (sm_" + std::to_string(p.major) + std::to_string(p.minor) + ")";
}

/// An owned CUDA event without timing (cheap to record); moves, never copies.
class cuda_event {
 public:
  cuda_event() { LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&e_, cudaEventDisableTiming)); }
  cuda_event(cuda_event&& o) noexcept : e_(o.e_) { o.e_ = nullptr; }
  cuda_event& operator=(cuda_event&& o) noexcept {
    if (this != &o) {
      if (e_) (void)cudaEventDestroy(e_);
      e_ = o.e_;
      o.e_ = nullptr;
    }
    return *this;
  }
  cuda_event(const cuda_event&) = delete;
  cuda_event& operator=(const cuda_event&) = delete;
  ~cuda_event() {
    if (e_) (void)cudaEventDestroy(e_);
  }
  /// Marks the point reached by `stream`'s queued work.
  void record(cudaStream_t stream) { LOOM_CUDA_CHECK(cudaEventRecord(e_, stream)); }
  /// Makes `stream` wait (on the device, not the host) until the recorded point is reached.
  void make_wait(cudaStream_t stream) const { LOOM_CUDA_CHECK(cudaStreamWaitEvent(stream, e_, 0)); }
  /// Blocks the host until the recorded point is reached.
  void synchronize() const { LOOM_CUDA_CHECK(cudaEventSynchronize(e_)); }
  /// Whether the recorded point has been reached, without blocking.
  bool done() const {
    const cudaError_t r = cudaEventQuery(e_);
    if (r == cudaErrorNotReady) return false;
    LOOM_CUDA_CHECK(r);
    return true;
  }
  cudaEvent_t get() const noexcept { return e_; }

 private:
  cudaEvent_t e_ = nullptr;
};

}  // namespace loom
