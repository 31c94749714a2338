// SPDX-License-Identifier: Apache-2.0
#pragma once
// The CUDA launcher: runs a LOOM_HD kernel body f(i) for i in [0, n) as a grid-stride kernel on
// the calling thread's compute stream, and sums f(i) in double with a two-pass block reduction.
// The CPU launcher (cpu/launch.hpp) runs the same bodies. Needs nvcc.
//
// The sum stays loom's own rather than cub::DeviceReduce for two reasons. (1) DeviceReduce is
// deterministic only run to run on one device: its tiles are tuned per architecture and its
// grid follows the SM count, so GPUs of two models add the same terms in different orders,
// while data-parallel replicas must compute the same clipping norm from the same averaged
// gradients (loom::clip_grad_norm) or their parameters drift apart; the fixed grid below adds in
// one order on every GPU. (2) Any CUB header declares the global namespace ::cuda (libcu++),
// which makes `cuda` ambiguous with loom::cuda in every program that says `using namespace
// loom;` (benchmarks/gpu/gpu_check.cu stops compiling).

#include <cuda_runtime.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "loom/backend/cuda/check.hpp"
#include "loom/backend/cuda/memory.hpp"
#include "loom/backend/cuda/runtime.hpp"
#include "loom/core/config.hpp"
#include "loom/core/memory.hpp"

namespace loom::detail {

inline constexpr unsigned cuda_block_threads = 256;
/// Blocks of the sum's first pass. Fixed, so that a sum adds its terms in the same order on
/// every run and every GPU.
inline constexpr unsigned cuda_sum_blocks = 512;

template <class F>
__global__ void __launch_bounds__(cuda_block_threads) for_each_kernel(std::size_t n, F f) {
  const std::size_t stride = static_cast<std::size_t>(blockDim.x) * gridDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) f(i);
}

/// Sums a block's `v` into shared memory slot 0 (a fixed tree: deterministic).
__device__ inline double block_sum(double v) {
  __shared__ double part[cuda_block_threads];
  part[threadIdx.x] = v;
  __syncthreads();
  for (unsigned s = cuda_block_threads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
    __syncthreads();
  }
  return part[0];
}

/// First pass: block b sums f(i) over a fixed grid-stride share of [0, n) into partial[b].
template <class F>
__global__ void __launch_bounds__(cuda_block_threads) sum_kernel(std::size_t n, F f, double* partial) {
  double s = 0;
  const std::size_t stride = static_cast<std::size_t>(blockDim.x) * gridDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    s += static_cast<double>(f(i));
  s = block_sum(s);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

/// Second pass: one block adds the partial sums.
__global__ void __launch_bounds__(cuda_block_threads) sum_partials_kernel(const double* partial, unsigned count,
                                                                           double* out) {
  double s = 0;
  for (unsigned i = threadIdx.x; i < count; i += blockDim.x) s += partial[i];
  s = block_sum(s);
  if (threadIdx.x == 0) *out = s;
}

/// Blocks for n elements: enough to fill the device several times over, no more (grid-stride
/// loops cover the rest).
inline unsigned cuda_blocks_for(std::size_t n) {
  struct cache {
    std::vector<unsigned> max_blocks;
  };
  thread_local cache c;
  const int d = cuda_current_device();
  if (static_cast<std::size_t>(d) >= c.max_blocks.size()) c.max_blocks.resize(static_cast<std::size_t>(d) + 1, 0);
  unsigned& m = c.max_blocks[static_cast<std::size_t>(d)];
  if (m == 0) {
    int sms = 0;
    LOOM_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, d));
    m = static_cast<unsigned>(sms > 0 ? sms : 1) * 16;
  }
  const std::size_t want = (n + cuda_block_threads - 1) / cuda_block_threads;
  return static_cast<unsigned>(want < m ? want : m);
}

[[noreturn]] inline void throw_launch_failure(cudaError_t e, const char* kernel, const char* file, int line) {
  (void)cudaGetLastError();
  throw_cuda_failure("CUDA", std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e),
                     (std::string("launching ") + kernel).c_str(), file, line);
}

/// Checks the launch just made (bad configuration, no device, too many resources).
#define LOOM_CUDA_CHECK_LAUNCH(kernel)                                                     \
  do {                                                                                     \
    const cudaError_t loom_launch_status_ = cudaGetLastError();                            \
    if (loom_launch_status_ != cudaSuccess)                                                \
      ::loom::detail::throw_launch_failure(loom_launch_status_, kernel, __FILE__, __LINE__); \
  } while (0)

template <class F>
void cuda_for_each(std::size_t n, F f) {
  if (n == 0) return;
  for_each_kernel<<<cuda_blocks_for(n), cuda_block_threads, 0, cuda_compute_stream()>>>(n, f);
  LOOM_CUDA_CHECK_LAUNCH("loom::detail::for_each_kernel");
}

/// Scratch of the sums of one thread on one device: the partials and the result, on the
/// device, and a pinned host slot the result is copied to.
struct cuda_sum_scratch {
  buffer<double, cuda_space> device{cuda_sum_blocks + 1};
  buffer<double, pinned_space> host{1};
};

template <class F>
double cuda_sum(std::size_t n, F f) {
  if (n == 0) return 0;
  thread_local std::vector<std::unique_ptr<cuda_sum_scratch>> per_device;
  const int d = cuda_current_device();
  if (static_cast<std::size_t>(d) >= per_device.size()) per_device.resize(static_cast<std::size_t>(d) + 1);
  auto& s = per_device[static_cast<std::size_t>(d)];
  if (!s) s = std::make_unique<cuda_sum_scratch>();
  cudaStream_t stream = cuda_compute_stream();
  sum_kernel<<<cuda_sum_blocks, cuda_block_threads, 0, stream>>>(n, f, s->device.data());
  LOOM_CUDA_CHECK_LAUNCH("loom::detail::sum_kernel");
  sum_partials_kernel<<<1, cuda_block_threads, 0, stream>>>(s->device.data(), cuda_sum_blocks,
                                                             s->device.data() + cuda_sum_blocks);
  LOOM_CUDA_CHECK_LAUNCH("loom::detail::sum_partials_kernel");
  LOOM_CUDA_CHECK(cudaMemcpyAsync(s->host.data(), s->device.data() + cuda_sum_blocks, sizeof(double),
                                  cudaMemcpyDeviceToHost, stream));
  LOOM_CUDA_CHECK(cudaStreamSynchronize(stream));
  return s->host[0];
}

}  // namespace loom::detail
