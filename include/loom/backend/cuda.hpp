// SPDX-License-Identifier: Apache-2.0
#pragma once
// The CUDA execution space: loom::cuda, with the static interface of loom::cpu. Element-wise
// kernel bodies (backend/kernels/) run through its launcher as grid-stride kernels on the
// calling thread's compute stream; matrix products go to cuBLAS, convolutions to cuDNN. Memory
// lives in loom::cuda_space. A program that uses it is compiled by nvcc (a .cu file, or CMake's
// LANGUAGE CUDA) and links loom::cuda.

#if !defined(__CUDACC__)
#error "loom/backend/cuda.hpp launches kernels and must be compiled by nvcc: name the file .cu (or set its LANGUAGE to CUDA in CMake) and link loom::cuda"
#endif

#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <type_traits>

#include "loom/backend/cuda/batch_norm.hpp"
#include "loom/backend/cuda/check.hpp"
#include "loom/backend/cuda/conv2d.hpp"
#include "loom/backend/cuda/gemm.hpp"
#include "loom/backend/cuda/launch.hpp"
#include "loom/backend/cuda/linear.hpp"
#include "loom/backend/cuda/memory.hpp"
#include "loom/backend/cuda/pool2d.hpp"
#include "loom/backend/cuda/runtime.hpp"
#include "loom/core/math_mode.hpp"
#include "loom/core/memory.hpp"

namespace loom {

/// Execution on the calling thread's current GPU, in order on its compute stream. Memory
/// lives in cuda_space. Operations return once their work is queued, except sum (which returns
/// the value); errors of queued work surface at the next call that waits (sum, a copy to the
/// host, cuda_synchronize).
struct cuda {
  static constexpr const char* name = "cuda";
  using memory_space = cuda_space;
  /// Where the trainer fills batches before copying them over: page-locked host memory.
  using staging_space = pinned_space;
  /// The physical layout of an activation: always plain.
  using format = cuda_format;
  template <class T>
  using conv2d_plan = cuda_conv2d_plan<T>;
  template <class T>
  using pool2d_plan = cuda_pool2d_plan<T>;
  template <class T>
  using batch_norm_plan = cuda_batch_norm_plan<T>;
  /// Channels per block of an activation's layout: 1, CUDA activations are always plain.
  static constexpr std::size_t channel_block(const format&, std::size_t, std::size_t, std::size_t, std::size_t) {
    return 1;
  }

  /// Runs f(i) for every i in [0, n) on the GPU. f is a LOOM_HD functor whose pointers are
  /// device memory.
  template <class F>
  static void for_each(std::size_t n, F f) {
    detail::cuda_for_each(n, f);
  }
  /// The sum of f(i) over [0, n), in double; waits for the result. Deterministic: the same
  /// order of additions on every run.
  template <class F>
  static double sum(std::size_t n, F f) {
    return detail::cuda_sum(n, f);
  }
  /// Row-major C = alpha op(A) op(B) + beta C (cuBLAS). In math_mode::bf16 (float only) A and
  /// B are rounded to bf16 (as loom::cpu rounds them) and multiplied on the tensor cores with
  /// float accumulation; C stays float. Check supports(math_mode::bf16) first: GPUs before
  /// compute capability 8.0 have no bf16 tensor cores.
  template <class T>
  static void gemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, T alpha, const T* a,
                   std::size_t lda, const T* b, std::size_t ldb, T beta, T* c, std::size_t ldc,
                   math_mode math = math_mode::fp32) {
    detail::cuda_gemm<T>(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, math);
  }
  /// loom::linear's forward: row-major y (batch, out) = x (batch, in) W^T + b, W (out, in), and
  /// with relu its ReLU, as one cuBLASLt product whose epilogue adds the bias and applies the
  /// ReLU (fp32); in bf16 and for double, gemm and one bias (and ReLU) kernel. See
  /// backend/cuda/linear.hpp.
  static constexpr bool has_linear_forward = true;
  template <class T>
  static void linear_forward(std::size_t batch, std::size_t out, std::size_t in, const T* x, const T* w, const T* b, T* y,
                             bool relu, math_mode math = math_mode::fp32) {
    detail::cuda_linear_forward<T>(batch, out, in, x, w, b, y, relu, math);
  }
  /// Whether the current GPU runs `math`: fp32 always; bf16 with bf16 tensor cores (compute
  /// capability 8.0 and later).
  static bool supports(math_mode math) { return math == math_mode::fp32 || detail::cuda_has_bf16_tensor_cores(); }
  /// Copies n elements; either side may be device or host memory (unified addressing).
  template <class T>
  static void copy(T* dst, const T* src, std::size_t n) {
    if (n && dst != src)
      LOOM_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(T), cudaMemcpyDefault, cuda_compute_stream()));
  }
  template <class T>
  static void zero(T* dst, std::size_t n) {
    cuda_space::zero(dst, n * sizeof(T));
  }
  /// Waits for everything this thread queued.
  static void synchronize() { cuda_synchronize(); }
  /// The PCI bus id of the device this thread computes on ("0000:3b:00.0"), by which NVML
  /// finds the same device whatever CUDA_VISIBLE_DEVICES renumbered; empty when unknown.
  static std::string pci_bus_id() {
    int d = 0;
    char id[32] = {};
    if (cudaGetDevice(&d) != cudaSuccess || cudaDeviceGetPCIBusId(id, sizeof id, d) != cudaSuccess) {
      (void)cudaGetLastError();
      return "";
    }
    return id;
  }

  /// Layout conversions: CUDA activations are always plain, so these pass through or copy.
  class layout_converter {
   public:
    template <class T, class Shape>
    const T* to_plain(const T* x, const format&, std::size_t) {
      return x;
    }
    template <class T, class Shape>
    void from_plain(const T* src, const format&, T* dst, std::size_t batch) {
      copy(dst, src, batch * Shape::size);
    }
    template <class T, class Shape>
    void convert(const T* src, const format&, T* dst, const format&, std::size_t batch) {
      copy(dst, src, batch * Shape::size);
    }
  };
};

}  // namespace loom
