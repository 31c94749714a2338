// SPDX-License-Identifier: Apache-2.0
#pragma once
// 2-D convolution on the GPU through cuDNN: forward, backward-data, backward-weights and the
// bias gradient, on plain NCHW data. Algorithms are chosen once per batch size (cuDNN's
// heuristics, FMA math only so that float results agree with the CPU's to float rounding,
// deterministic backward-weights algorithms preferred) and cached; the workspace comes from
// the caching allocator. The bias and a fused ReLU are one element-wise pass after the
// convolution. Needs nvcc (it launches that pass).
//
// math_mode::bf16: cuDNN's convolutions take bf16 only as bf16 tensors in *and out*
// (BFLOAT16 x, w and y, float compute), which would round outputs and weight gradients to bf16.
// The legacy API offers no bf16 math on float tensors, so in bf16 mode loom lets cuDNN use
// tensor-core (TF32) algorithms on the float tensors instead: float in and out, operands with
// 11 significant bits (bf16 has 8), float accumulation. docs/gpu.md, "Mixed precision".

#include <cudnn.h>

#include <algorithm>
#include <cstddef>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "loom/backend/cuda/check.hpp"
#include "loom/backend/cuda/launch.hpp"
#include "loom/backend/cuda/memory.hpp"
#include "loom/backend/cuda/runtime.hpp"
#include "loom/backend/kernels/activation.hpp"
#include "loom/backend/kernels/elementwise.hpp"
#include "loom/core/geometry.hpp"
#include "loom/core/math_mode.hpp"

namespace loom {

/// The layout of a CUDA activation: always plain row-major (batch, features...), NCHW for
/// images. A type so that layers treat both backends alike.
struct cuda_format {
  constexpr bool plain() const noexcept { return true; }
  friend constexpr bool operator==(const cuda_format&, const cuda_format&) noexcept { return true; }
};

namespace detail {

/// The calling thread's cuDNN handle on its current device, bound to its compute stream.
inline cudnnHandle_t cudnn_handle() {
  struct handles {
    std::vector<cudnnHandle_t> h;
    ~handles() {
      for (cudnnHandle_t x : h)
        if (x) (void)cudnnDestroy(x);
    }
  };
  thread_local handles hs;
  const int d = cuda_current_device();
  if (static_cast<std::size_t>(d) >= hs.h.size()) hs.h.resize(static_cast<std::size_t>(d) + 1, nullptr);
  cudnnHandle_t& h = hs.h[static_cast<std::size_t>(d)];
  if (!h) {
    LOOM_CUDA_CHECK(cudnnCreate(&h));
    LOOM_CUDA_CHECK(cudnnSetStream(h, cuda_compute_stream()));
  }
  return h;
}

/// Workspace shared by every cuDNN call of the calling thread on its current device: calls on
/// one stream run one after another, so one buffer serves them all. Grows, never shrinks.
inline void* cudnn_workspace(std::size_t bytes) {
  thread_local std::vector<std::unique_ptr<buffer<unsigned char, cuda_space>>> per_device;
  if (bytes == 0) return nullptr;
  const int d = cuda_current_device();
  if (static_cast<std::size_t>(d) >= per_device.size()) per_device.resize(static_cast<std::size_t>(d) + 1);
  auto& b = per_device[static_cast<std::size_t>(d)];
  if (!b || b->size() < bytes) b = std::make_unique<buffer<unsigned char, cuda_space>>(bytes);
  return b->data();
}

template <class T>
constexpr cudnnDataType_t cudnn_type() {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "loom::cuda conv2d: float or double");
  return std::is_same_v<T, float> ? CUDNN_DATA_FLOAT : CUDNN_DATA_DOUBLE;
}

/// An owned cuDNN descriptor (tensor, filter or convolution).
template <class Handle, cudnnStatus_t (*Destroy)(Handle)>
class cudnn_descriptor {
 public:
  cudnn_descriptor() = default;
  explicit cudnn_descriptor(Handle h) : h_(h) {}
  cudnn_descriptor(cudnn_descriptor&& o) noexcept : h_(o.h_) { o.h_ = nullptr; }
  cudnn_descriptor& operator=(cudnn_descriptor&& o) noexcept {
    if (this != &o) {
      if (h_) (void)Destroy(h_);
      h_ = o.h_;
      o.h_ = nullptr;
    }
    return *this;
  }
  cudnn_descriptor(const cudnn_descriptor&) = delete;
  cudnn_descriptor& operator=(const cudnn_descriptor&) = delete;
  ~cudnn_descriptor() {
    if (h_) (void)Destroy(h_);
  }
  Handle get() const noexcept { return h_; }

 private:
  Handle h_ = nullptr;
};

using cudnn_tensor = cudnn_descriptor<cudnnTensorDescriptor_t, cudnnDestroyTensorDescriptor>;
using cudnn_filter = cudnn_descriptor<cudnnFilterDescriptor_t, cudnnDestroyFilterDescriptor>;
using cudnn_convolution = cudnn_descriptor<cudnnConvolutionDescriptor_t, cudnnDestroyConvolutionDescriptor>;

inline int cudnn_dim(std::size_t v) {
  if (v > 0x7fffffff) throw invalid_argument("loom::cuda conv2d: extent " + std::to_string(v) + " exceeds cuDNN's int range");
  return static_cast<int>(v);
}

template <class T>
cudnn_tensor make_nchw(std::size_t n, std::size_t c, std::size_t h, std::size_t w) {
  cudnnTensorDescriptor_t d = nullptr;
  LOOM_CUDA_CHECK(cudnnCreateTensorDescriptor(&d));
  cudnn_tensor t(d);
  LOOM_CUDA_CHECK(cudnnSetTensor4dDescriptor(d, CUDNN_TENSOR_NCHW, cudnn_type<T>(), cudnn_dim(n), cudnn_dim(c),
                                             cudnn_dim(h), cudnn_dim(w)));
  return t;
}

/// The first usable algorithm of cuDNN's ranked list: status success, deterministic when one
/// such is offered, and in fp32 mode no tensor-core math (TF32 would not agree with the CPU).
/// In bf16 mode tensor-core (TF32) algorithms are welcome; never ALLOW_CONVERSION (float
/// operands converted to fp16, whose range is too small for gradients).
template <class Perf>
Perf pick_algorithm(const Perf* perf, int count, const char* what, math_mode math = math_mode::fp32) {
  const Perf* any = nullptr;
  for (int i = 0; i < count; ++i) {
    if (perf[i].status != CUDNN_STATUS_SUCCESS) continue;
    if (perf[i].mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION) continue;
    if (perf[i].mathType == CUDNN_TENSOR_OP_MATH && math != math_mode::bf16) continue;
    if (perf[i].determinism == CUDNN_DETERMINISTIC) return perf[i];
    if (!any) any = &perf[i];
  }
  if (any) return *any;
  throw backend_error(std::string("loom: cuDNN offers no FP32/FP64 (non-tensor-core) algorithm for the convolution's ") +
                      what + " (" + std::to_string(count) + " candidates)");
}

}  // namespace detail

/// A convolution of fixed geometry on the GPU, ready to run on batches. One per conv2d layer.
/// Creates nothing on the GPU until its first forward.
template <class T>
class cuda_conv2d_plan {
 public:
  explicit cuda_conv2d_plan(conv2d_geometry g) : g_(g) {}

  /// Makes forward write relu(conv(x) + b): the ReLU of the next layer, fused into the bias pass.
  void fuse_relu() { relu_ = true; }

  /// y = conv(x, w) + b, on plain NCHW data. Returns y's layout (plain). math_mode::bf16
  /// (float only) lets cuDNN run tensor-core (TF32) algorithms, see the top of this file.
  cuda_format forward(const T* x, const cuda_format&, const T* w, const T* b, T* y, std::size_t batch,
                      math_mode math = math_mode::fp32) {
    entry& e = get(batch, math);
    const T one = 1, zero = 0;
    LOOM_CUDA_CHECK(cudnnConvolutionForward(detail::cudnn_handle(), &one, e.x.get(), x, filter_.get(), w, conv(e.math),
                                            e.fwd, detail::cudnn_workspace(e.workspace), e.workspace, &zero, e.y.get(), y));
    const std::size_t pixels = g_.oh() * g_.ow(), count = batch * g_.oc * pixels;
    if (!b) {  // a convolution without bias (conv2d's no_bias): only the fused ReLU is left
      if (relu_) detail::cuda_for_each(count, kernels::pointwise_forward<kernels::relu_op, T>{y, y});
    } else if (relu_) {
      detail::cuda_for_each(count, kernels::add_channel_bias<T, true>{y, b, g_.oc, pixels});
    } else {
      detail::cuda_for_each(count, kernels::add_channel_bias<T, false>{y, b, g_.oc, pixels});
    }
    return {};
  }

  /// Given dy, writes dx when non-null, and dw, db — overwritten, or added to when accumulate.
  /// x is forward's input.
  void backward(const T* x, const cuda_format&, const T* w, const T* dy, T* dx, T* dw, T* db, std::size_t batch,
                bool accumulate, math_mode math = math_mode::fp32) {
    entry& e = get(batch, math);
    cudnnHandle_t h = detail::cudnn_handle();
    const T one = 1, zero = 0, keep = accumulate ? T(1) : T(0);
    void* ws = detail::cudnn_workspace(e.workspace);
    if (dx)
      LOOM_CUDA_CHECK(cudnnConvolutionBackwardData(h, &one, filter_.get(), w, e.y.get(), dy, conv(e.math), e.bwd_data, ws,
                                                   e.workspace, &zero, e.x.get(), dx));
    LOOM_CUDA_CHECK(cudnnConvolutionBackwardFilter(h, &one, e.x.get(), x, e.y.get(), dy, conv(e.math), e.bwd_filter, ws,
                                                   e.workspace, &keep, filter_.get(), dw));
    if (db) LOOM_CUDA_CHECK(cudnnConvolutionBackwardBias(h, &one, e.y.get(), dy, &keep, bias_.get(), db));
  }

  const conv2d_geometry& geometry() const { return g_; }

 private:
  struct entry {
    std::size_t batch;
    math_mode math;
    detail::cudnn_tensor x, y;
    cudnnConvolutionFwdAlgo_t fwd;
    cudnnConvolutionBwdDataAlgo_t bwd_data;
    cudnnConvolutionBwdFilterAlgo_t bwd_filter;
    std::size_t workspace;  // bytes, the largest of the three
  };

  /// The convolution descriptor of a math mode: FMA math for fp32, tensor-op math for bf16.
  cudnnConvolutionDescriptor_t conv(math_mode math) const {
    return (math == math_mode::bf16 ? conv_tensor_op_ : conv_).get();
  }

  void describe_once() {
    if (conv_.get()) return;
    using namespace detail;
    cudnnFilterDescriptor_t f = nullptr;
    LOOM_CUDA_CHECK(cudnnCreateFilterDescriptor(&f));
    filter_ = cudnn_filter(f);
    LOOM_CUDA_CHECK(cudnnSetFilter4dDescriptor(f, cudnn_type<T>(), CUDNN_TENSOR_NCHW, cudnn_dim(g_.oc), cudnn_dim(g_.c),
                                               cudnn_dim(g_.k), cudnn_dim(g_.k)));
    bias_ = make_nchw<T>(1, g_.oc, 1, 1);
    auto make_conv = [&](cudnnMathType_t math) {
      cudnnConvolutionDescriptor_t c = nullptr;
      LOOM_CUDA_CHECK(cudnnCreateConvolutionDescriptor(&c));
      cudnn_convolution conv(c);
      LOOM_CUDA_CHECK(cudnnSetConvolution2dDescriptor(c, cudnn_dim(g_.pad), cudnn_dim(g_.pad), cudnn_dim(g_.stride),
                                                      cudnn_dim(g_.stride), 1, 1, CUDNN_CROSS_CORRELATION, cudnn_type<T>()));
      LOOM_CUDA_CHECK(cudnnSetConvolutionMathType(c, math));
      return conv;
    };
    conv_tensor_op_ = make_conv(CUDNN_TENSOR_OP_MATH);
    conv_ = make_conv(CUDNN_FMA_MATH);
  }

  entry& get(std::size_t batch, math_mode math) {
    if constexpr (!std::is_same_v<T, float>) math = math_mode::fp32;  // double always computes in double
    for (auto& e : entries_)
      if (e->batch == batch && e->math == math) return *e;
    describe_once();
    using namespace detail;
    cudnnHandle_t h = cudnn_handle();
    auto e = std::make_unique<entry>();
    e->batch = batch;
    e->math = math;
    cudnnConvolutionDescriptor_t cd = conv(math);
    e->x = make_nchw<T>(batch, g_.c, g_.h, g_.w);
    e->y = make_nchw<T>(batch, g_.oc, g_.oh(), g_.ow());
    int got = 0;
    cudnnConvolutionFwdAlgoPerf_t fwd[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    LOOM_CUDA_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, e->x.get(), filter_.get(), cd, e->y.get(),
                                                           CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &got, fwd));
    const auto f = pick_algorithm(fwd, got, "forward", math);
    cudnnConvolutionBwdDataAlgoPerf_t bd[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    LOOM_CUDA_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, filter_.get(), e->y.get(), cd, e->x.get(),
                                                                CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &got, bd));
    const auto d = pick_algorithm(bd, got, "backward-data", math);
    cudnnConvolutionBwdFilterAlgoPerf_t bf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    LOOM_CUDA_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, e->x.get(), e->y.get(), cd, filter_.get(),
                                                                  CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &got, bf));
    const auto w = pick_algorithm(bf, got, "backward-weights", math);
    e->fwd = f.algo;
    e->bwd_data = d.algo;
    e->bwd_filter = w.algo;
    std::size_t a = 0, b = 0, c = 0;
    LOOM_CUDA_CHECK(cudnnGetConvolutionForwardWorkspaceSize(h, e->x.get(), filter_.get(), cd, e->y.get(), e->fwd, &a));
    LOOM_CUDA_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(h, filter_.get(), e->y.get(), cd, e->x.get(),
                                                                 e->bwd_data, &b));
    LOOM_CUDA_CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(h, e->x.get(), e->y.get(), cd, filter_.get(),
                                                                   e->bwd_filter, &c));
    e->workspace = std::max(a, std::max(b, c));
    entries_.push_back(std::move(e));
    return *entries_.back();
  }

  conv2d_geometry g_;
  bool relu_ = false;
  detail::cudnn_filter filter_;
  detail::cudnn_tensor bias_;
  detail::cudnn_convolution conv_, conv_tensor_op_;
  std::vector<std::unique_ptr<entry>> entries_;
};

}  // namespace loom
