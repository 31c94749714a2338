// SPDX-License-Identifier: Apache-2.0
#pragma once
// loom::linear's forward on the GPU: y = x W^T + b, or relu(x W^T + b) when a loom::relu
// follows, as one cuBLASLt matrix product whose epilogue adds the bias (CUBLASLT_EPILOGUE_BIAS)
// and applies the ReLU (CUBLASLT_EPILOGUE_RELU_BIAS), instead of a bias kernel, a product and
// a ReLU kernel. FP32 only (CUBLAS_COMPUTE_32F: no TF32, as cuda_gemm). cuBLASLt picks its
// algorithm assuming 256-byte aligned matrices unless told otherwise, and its bias epilogue
// wants an aligned bias: a layer's weights and bias sit at any float offset in the flat
// parameters, so each plan is made for the alignments of its pointers, and a bias not aligned
// to 16 bytes takes the fallback. In math_mode::bf16, for double, and when cuBLASLt offers no
// algorithm, it is cuda_gemm followed by one bias (and ReLU) kernel: the same result. Needs
// nvcc (it launches that kernel).

#include <cublasLt.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <vector>

#include "loom/backend/cuda/check.hpp"
#include "loom/backend/cuda/gemm.hpp"
#include "loom/backend/cuda/launch.hpp"
#include "loom/backend/cuda/memory.hpp"
#include "loom/backend/cuda/runtime.hpp"
#include "loom/backend/kernels/elementwise.hpp"
#include "loom/core/math_mode.hpp"

namespace loom::detail {

/// The calling thread's cuBLASLt handle on its current device, created on first use.
inline cublasLtHandle_t cublaslt_handle() {
  struct handles {
    std::vector<cublasLtHandle_t> h;
    ~handles() {
      for (cublasLtHandle_t x : h)
        if (x) (void)cublasLtDestroy(x);
    }
  };
  thread_local handles hs;
  const int d = cuda_current_device();
  if (static_cast<std::size_t>(d) >= hs.h.size()) hs.h.resize(static_cast<std::size_t>(d) + 1, nullptr);
  cublasLtHandle_t& h = hs.h[static_cast<std::size_t>(d)];
  if (!h) LOOM_CUDA_CHECK(cublasLtCreate(&h));
  return h;
}

/// The alignment of p in bytes, up to 256 (what cuBLASLt's algorithm choice asks for).
inline std::uint32_t cublaslt_alignment(const void* p) noexcept {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t align = 256;
  while (align > 1 && a % align != 0) align /= 2;
  return align;
}

/// The bias alignment the epilogue is given; a less aligned bias takes the fallback.
inline constexpr std::uint32_t cublaslt_bias_alignment = 16;

/// Bytes of cuBLASLt workspace per thread and device.
inline constexpr std::size_t cublaslt_workspace_bytes = std::size_t{4} << 20;

/// The calling thread's cuBLASLt workspace on its current device (from the caching allocator).
/// One per thread and device: the products using it run one after another on its stream.
inline void* cublaslt_workspace() {
  thread_local std::vector<std::unique_ptr<buffer<unsigned char, cuda_space>>> per_device;
  const int d = cuda_current_device();
  if (static_cast<std::size_t>(d) >= per_device.size()) per_device.resize(static_cast<std::size_t>(d) + 1);
  auto& w = per_device[static_cast<std::size_t>(d)];
  if (!w) w = std::make_unique<buffer<unsigned char, cuda_space>>(cublaslt_workspace_bytes);
  return w->data();
}

/// What a plan is made for: the shape, the ReLU, and the alignments of W, x and y.
struct cublaslt_linear_key {
  int device;
  std::size_t batch, out, in;
  bool relu;
  std::uint32_t align_w, align_x, align_y;
  bool operator==(const cublaslt_linear_key&) const = default;
};

/// The descriptors and chosen algorithm of one fused product, made once and reused.
/// cuBLASLt is column-major, and row-major y (batch, out) is column-major D (out, batch):
/// D = op(A) B with A = W stored as column-major (in, out), transposed, and B = x stored as
/// column-major (in, batch). The bias has out entries, one per row of D, as the epilogue wants.
class cublaslt_linear_plan {
 public:
  explicit cublaslt_linear_plan(const cublaslt_linear_key& k) : key_(k) {
    try {
      describe();
    } catch (...) {
      release();
      throw;
    }
  }
  cublaslt_linear_plan(const cublaslt_linear_plan&) = delete;
  cublaslt_linear_plan& operator=(const cublaslt_linear_plan&) = delete;
  ~cublaslt_linear_plan() { release(); }

  const cublaslt_linear_key& key() const noexcept { return key_; }
  /// Whether cuBLASLt offered an algorithm for this product.
  bool usable() const noexcept { return usable_; }

  /// Queues y = [relu](x W^T + b) on the calling thread's compute stream.
  void run(const float* x, const float* w, const float* b, float* y) {
    LOOM_CUDA_CHECK(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &b, sizeof(b)));
    const float one = 1, zero = 0;
    LOOM_CUDA_CHECK(cublasLtMatmul(cublaslt_handle(), op_, &one, w, a_, x, b_, &zero, y, d_, y, d_, &heuristic_.algo,
                                   cublaslt_workspace(), cublaslt_workspace_bytes, cuda_compute_stream()));
  }

 private:
  void describe() {
    const cublaslt_linear_key& k = key_;
    const std::size_t batch = k.batch, out = k.out, in = k.in;
    LOOM_CUDA_CHECK(cublasLtMatmulDescCreate(&op_, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
    LOOM_CUDA_CHECK(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a)));
    LOOM_CUDA_CHECK(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b)));
    const cublasLtEpilogue_t epilogue = k.relu ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS;
    LOOM_CUDA_CHECK(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
    const auto u64 = [](std::size_t v) { return static_cast<std::uint64_t>(v); };
    const auto i64 = [](std::size_t v) { return static_cast<std::int64_t>(v); };
    LOOM_CUDA_CHECK(cublasLtMatrixLayoutCreate(&a_, CUDA_R_32F, u64(in), u64(out), i64(in)));     // W
    LOOM_CUDA_CHECK(cublasLtMatrixLayoutCreate(&b_, CUDA_R_32F, u64(in), u64(batch), i64(in)));   // x
    LOOM_CUDA_CHECK(cublasLtMatrixLayoutCreate(&d_, CUDA_R_32F, u64(out), u64(batch), i64(out)));  // y
    struct preference {
      cublasLtMatmulPreference_t p = nullptr;
      ~preference() {
        if (p) (void)cublasLtMatmulPreferenceDestroy(p);
      }
    } pref;
    LOOM_CUDA_CHECK(cublasLtMatmulPreferenceCreate(&pref.p));
    const std::uint64_t workspace = cublaslt_workspace_bytes;
    LOOM_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                                         sizeof(workspace)));
    LOOM_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &k.align_w,
                                                         sizeof(k.align_w)));
    LOOM_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &k.align_x,
                                                         sizeof(k.align_x)));
    LOOM_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &k.align_y,
                                                         sizeof(k.align_y)));
    LOOM_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &k.align_y,
                                                         sizeof(k.align_y)));
    int found = 0;
    const cublasStatus_t ask =
        cublasLtMatmulAlgoGetHeuristic(cublaslt_handle(), op_, a_, b_, d_, d_, pref.p, 1, &heuristic_, &found);
    // CUBLAS_STATUS_NOT_SUPPORTED: no algorithm for this product; it then takes the fallback.
    if (ask != CUBLAS_STATUS_NOT_SUPPORTED) LOOM_CUDA_CHECK(ask);
    usable_ = ask == CUBLAS_STATUS_SUCCESS && found > 0;
  }

  void release() noexcept {
    if (d_) (void)cublasLtMatrixLayoutDestroy(d_);
    if (b_) (void)cublasLtMatrixLayoutDestroy(b_);
    if (a_) (void)cublasLtMatrixLayoutDestroy(a_);
    if (op_) (void)cublasLtMatmulDescDestroy(op_);
    d_ = b_ = a_ = nullptr;
    op_ = nullptr;
  }

  cublaslt_linear_key key_;
  bool usable_ = false;
  cublasLtMatmulDesc_t op_ = nullptr;
  cublasLtMatrixLayout_t a_ = nullptr, b_ = nullptr, d_ = nullptr;
  cublasLtMatmulHeuristicResult_t heuristic_{};
};

/// The calling thread's plan for a key, made on first use (a few per network: one per linear
/// layer and batch size).
inline cublaslt_linear_plan& cublaslt_linear_plan_for(const cublaslt_linear_key& k) {
  thread_local std::vector<std::unique_ptr<cublaslt_linear_plan>> plans;
  for (auto& p : plans)
    if (p->key() == k) return *p;
  plans.push_back(std::make_unique<cublaslt_linear_plan>(k));
  return *plans.back();
}

/// Row-major y (batch, out) = x (batch, in) W^T + b, W (out, in), b (out); with relu, the
/// ReLU of that. Queued on the calling thread's compute stream.
template <class T>
void cuda_linear_forward(std::size_t batch, std::size_t out, std::size_t in, const T* x, const T* w, const T* b, T* y,
                         bool relu, math_mode math) {
  if (batch == 0 || out == 0) return;
  if constexpr (std::is_same_v<T, float>) {
    if (math == math_mode::fp32 && in > 0 && cublaslt_alignment(b) >= cublaslt_bias_alignment) {
      const cublaslt_linear_key key{cuda_current_device(), batch, out, in, relu,
                                    cublaslt_alignment(w), cublaslt_alignment(x), cublaslt_alignment(y)};
      cublaslt_linear_plan& plan = cublaslt_linear_plan_for(key);
      if (plan.usable()) {
        plan.run(x, w, b, y);
        return;
      }
    }
  }
  cuda_gemm<T>(false, true, batch, out, in, T(1), x, in, w, in, T(0), y, out, math);  // (batch, out)
  if (relu)
    cuda_for_each(batch * out, kernels::add_channel_bias<T, true>{y, b, out, 1});
  else
    cuda_for_each(batch * out, kernels::add_channel_bias<T, false>{y, b, out, 1});
}

}  // namespace loom::detail
