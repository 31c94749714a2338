// SPDX-License-Identifier: Apache-2.0
#pragma once
// loom::linear<Out>: y = x W^T + b on a 1-D input. W is (Out, In) row-major, then b (Out),
// in the network's flat parameter buffer. Matrix products go to the backend's GEMM, in the
// run's math mode (ctx.math: fp32, or bf16 operands with float accumulation); a backend with a
// linear forward of its own (loom::cuda: one cuBLASLt product with a bias epilogue) runs the
// forward there, with the ReLU that follows fused into it.

#include <algorithm>
#include <cstddef>
#include <string>

#include "loom/backend/kernels/elementwise.hpp"
#include "loom/core/config.hpp"
#include "loom/layers/describe.hpp"
#include "loom/layers/layer.hpp"

namespace loom {

namespace detail {
/// A backend whose linear_forward(batch, out, in, x, w, b, y, relu, math) computes
/// [relu](x W^T + b) in one pass (loom::cuda, through cuBLASLt's epilogues).
template <class Backend>
concept has_linear_forward = Backend::has_linear_forward;

/// linear's ONNX node (one function for every linear<Out>, compiled once: impl/linear.ipp).
LOOM_DECL std::string linear_onnx(onnx_graph& g, const layer_description& d, const std::string& x);
}  // namespace detail

/// A fully connected layer with Out outputs. Input: a 1-D shape<In>; output: shape<Out>.
/// Parameters: Out * In weights, then Out biases. Init: Init (default He normal) for the
/// weights, zero biases.
template <std::size_t Out, class Init = init::he>
struct linear {
  static constexpr bool is_loom_layer = true;
  static constexpr const char* name = "linear";

  template <class In>
  static constexpr bool accepts = In::rank == 1;

  template <std::size_t Index, class In>
  static constexpr bool check() {
    static_assert(Out > 0,
                  "loom::linear<Out> needs Out > 0 (the layer index is in the loom::diagnostic:: name the compiler "
                  "prints)");
    if constexpr (Out == 0) {
      return detail::fail_with<diagnostic::linear_at_layer_has_zero_outputs<Index>>();
    } else {
      static_assert(In::rank == 1,
                    "loom::linear needs a 1-D input but gets a multi-dimensional one: add loom::flatten before it "
                    "(the layer index and the input shape are in the loom::diagnostic:: name the compiler prints)");
      if constexpr (In::rank != 1)
        return detail::fail_with<diagnostic::linear_at_layer_needs_a_1d_input_but_got<Index, In>>();
      return In::rank == 1;
    }
  }

  template <class In>
  using output_shape = shape<Out>;
  template <class In>
  static constexpr std::size_t parameter_count = In::size * Out + Out;
  /// Multiply-adds x 2 per sample, forward only.
  template <class In>
  static constexpr double flops = 2.0 * In::size * Out;

  /// As torch.nn.Linear(In, Out): weight (Out, In), bias (Out).
  template <class In>
  static void describe(layer_description& d) {
    d.set_text("linear", {Out});
    d.parameter("weight", {Out, In::size});
    d.parameter("bias", {Out});
  }
  /// Gemm(x, W, b) with W transposed.
  static std::string onnx(onnx_graph& g, const layer_description& d, const std::string& x) {
    return detail::linear_onnx(g, d, x);
  }
  // Memory: nothing besides its output; the output is plain (the footprint and layout defaults).

  template <class In, class T, class Backend>
  class impl {
    static constexpr std::size_t in_ = In::size;

   public:
    explicit impl(layer_site site) : site_(site) {}

    /// On a backend with its own linear forward: makes forward write relu(x W^T + b), the ReLU
    /// of the next layer fused into the product's epilogue (loom::sequence decides, as for
    /// conv2d). The relu's backward is unchanged: relu'(z) = relu'(relu(z)).
    void fuse_relu()
      requires detail::has_linear_forward<Backend>
    {
      relu_ = true;
    }

    void initialize(T* params, std::uint64_t seed) const {
      detail::fill_normal(params, Out * in_, Init::stddev(in_, Out), seed, site_.stream);
      std::fill_n(params + Out * in_, Out, T(0));
    }

    void forward(const run_context& ctx, const T* params, activation<const T, Backend> x, activation<T, Backend>& y,
                 std::size_t batch) {
      const T* w = params;  // (Out, In)
      const T* b = params + Out * in_;
      if constexpr (detail::has_linear_forward<Backend>) {
        Backend::linear_forward(batch, Out, in_, x.data, w, b, y.data, relu_, ctx.math);  // (batch, Out)
      } else {
        Backend::for_each(batch, kernels::broadcast_row<T, Out>{b, y.data});
        Backend::gemm(false, true, batch, Out, in_, T(1), x.data, in_, w, in_, T(1), y.data, Out, ctx.math);  // (batch, Out)
      }
      y.format = {};
    }

    void backward(const run_context& ctx, const T* params, activation<const T, Backend> x, activation<const T, Backend>,
                  const T* dy, T* dx, T* dparams, std::size_t batch) {
      const T* w = params;
      T* dw = dparams;
      T* db = dparams + Out * in_;
      Backend::gemm(true, false, Out, in_, batch, T(1), dy, Out, x.data, in_, ctx.accumulate ? T(1) : T(0), dw, in_,
                    ctx.math);
      Backend::for_each(Out, kernels::sum_rows<T>{dy, db, batch, Out, ctx.accumulate});
      if (dx) Backend::gemm(false, false, batch, in_, Out, T(1), dy, Out, w, in_, T(0), dx, in_, ctx.math);  // (batch, In)
    }

   private:
    layer_site site_;
    bool relu_ = false;  // a ReLU fused into forward (backends with has_linear_forward only)
  };
};

}  // namespace loom

#if defined(LOOM_DEFINITIONS_VISIBLE)
#include "loom/layers/impl/linear.ipp"
#endif
