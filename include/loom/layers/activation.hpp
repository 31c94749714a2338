// SPDX-License-Identifier: Apache-2.0
#pragma once
// The point-wise activations: relu, leaky_relu, tanh, sigmoid, gelu. Any input shape, output
// the same shape, no parameters. They work on the activation's physical layout as it is.

#include <cstddef>
#include <string>
#include <type_traits>

#include "loom/backend/kernels/activation.hpp"
#include "loom/core/config.hpp"
#include "loom/layers/describe.hpp"
#include "loom/layers/layer.hpp"

namespace loom {

namespace detail {
template <class Op, const char* Name>
struct pointwise_layer {
  static constexpr bool is_loom_layer = true;
  static constexpr const char* name = Name;
  template <class In>
  static constexpr bool accepts = true;
  template <std::size_t Index, class In>
  static constexpr bool check() { return true; }
  template <class In>
  using output_shape = In;
  template <class In>
  static constexpr std::size_t parameter_count = 0;
  template <class In>
  static constexpr double flops = 1.0 * In::size;

  /// Its name; each activation gives its ONNX node (onnx()) itself, its body compiled once in
  /// impl/activation.ipp.
  template <class In>
  static void describe(layer_description& d) {
    d.set_text(Name);
  }
  /// It works on its input's layout as it is.
  template <class In, class Backend>
  static constexpr layout_effect layout = layout_effect::keeps;

  template <class In, class T, class Backend>
  class impl {
   public:
    explicit impl(layer_site) {}
    void initialize(T*, std::uint64_t) const {}
    void forward(const run_context&, const T*, activation<const T, Backend> x, activation<T, Backend>& y,
                 std::size_t batch) {
      Backend::for_each(batch * In::size, kernels::pointwise_forward<Op, T>{x.data, y.data});
      y.format = x.format;
    }
    void backward(const run_context&, const T*, activation<const T, Backend> x, activation<const T, Backend> y,
                  const T* dy, T* dx, T*, std::size_t batch) {
      if (dx) Backend::for_each(batch * In::size, kernels::pointwise_backward<Op, T>{x.data, y.data, dy, dx});
    }
  };
};
inline constexpr char relu_name[] = "relu";
inline constexpr char leaky_relu_name[] = "leaky_relu";
inline constexpr char tanh_name[] = "tanh";
inline constexpr char sigmoid_name[] = "sigmoid";
inline constexpr char gelu_name[] = "gelu";

/// LeakyRelu with the slope as loom computes it, float(millis) / float(1000) (compiled once, as
/// the other activations' ONNX nodes: impl/activation.ipp).
LOOM_DECL std::string leaky_relu_onnx(onnx_graph& g, const std::string& x, int slope_millis);
}  // namespace detail

/// max(x, 0).
struct relu : detail::pointwise_layer<kernels::relu_op, detail::relu_name> {
  LOOM_DECL static std::string onnx(onnx_graph& g, const layer_description& d, const std::string& x);
};
/// x for x > 0, SlopeMillis / 1000 * x otherwise.
template <int SlopeMillis>
struct leaky_relu_slope : detail::pointwise_layer<kernels::leaky_relu_op<SlopeMillis>, detail::leaky_relu_name> {
  template <class In>
  static void describe(layer_description& d) {
    d.set_text("leaky_relu_slope", {SlopeMillis});
  }
  static std::string onnx(onnx_graph& g, const layer_description&, const std::string& x) {
    return detail::leaky_relu_onnx(g, x, SlopeMillis);
  }
};
/// Leaky ReLU with slope 0.01 (PyTorch's default).
struct leaky_relu : leaky_relu_slope<10> {};
/// Hyperbolic tangent.
struct tanh : detail::pointwise_layer<kernels::tanh_op, detail::tanh_name> {
  LOOM_DECL static std::string onnx(onnx_graph& g, const layer_description& d, const std::string& x);
};
/// Logistic sigmoid 1 / (1 + e^-x), computed stably on both tails.
struct sigmoid : detail::pointwise_layer<kernels::sigmoid_op, detail::sigmoid_name> {
  LOOM_DECL static std::string onnx(onnx_graph& g, const layer_description& d, const std::string& x);
};
/// GELU, exact: x Phi(x).
struct gelu : detail::pointwise_layer<kernels::gelu_op, detail::gelu_name> {
  /// loom's exact GELU, 0.5 x (1 + erf(x * (1 / sqrt 2))), in that order of operations (opset 17
  /// has no Gelu operator).
  LOOM_DECL static std::string onnx(onnx_graph& g, const layer_description& d, const std::string& x);
};

// ---- ReLU fusion: the one rule ------------------------------------------------------------

namespace detail {
/// A layer implementation that can write the ReLU of the layer after it itself (conv2d, and
/// linear on backends with a fused epilogue): it has fuse_relu(). A concept of its own rather
/// than a requires-expression in place: nvcc 13 fails to evaluate the latter there.
template <class Impl>
concept can_fuse_relu = requires(Impl& i) { i.fuse_relu(); };

/// Whether layer Next, right after a layer whose implementation is PrevImpl, runs inside that
/// layer: Next is loom::relu and PrevImpl writes relu(.) of its output itself, so Next keeps no
/// output buffer of its own (its output is the previous layer's) and its forward does nothing;
/// its backward is unchanged, as relu'(x) = relu'(relu(x)) (unless PrevImpl applies it:
/// backward_fused_into_previous). loom::sequence fuses by this rule (it calls
/// PrevImpl::fuse_relu()), and what a pipeline stage keeps per sample is counted by it.
template <class PrevImpl, class Next>
inline constexpr bool fuses_into_previous = std::is_same_v<Next, relu> && can_fuse_relu<PrevImpl>;

/// A layer implementation whose backward applies the gradient of the ReLU fused into it (its
/// mask) itself, whatever path it runs: it says so with a static applies_fused_relu_gradient
/// (batch_norm, whose oneDNN backward takes the mask anyway).
template <class Impl>
concept applies_fused_relu_gradient = Impl::applies_fused_relu_gradient;

/// Whether the ReLU Next, fused into the layer before (PrevImpl), needs no backward of its own:
/// that layer's backward takes dy as it comes and applies the ReLU's gradient itself, so
/// loom::sequence leaves the ReLU's backward out — a pass over the activation fewer.
template <class PrevImpl, class Next>
inline constexpr bool backward_fused_into_previous = fuses_into_previous<PrevImpl, Next> &&
                                                     applies_fused_relu_gradient<PrevImpl>;

/// A layer implementation that can apply, in its backward, the gradient of a loom::relu right
/// before it: its input x is that ReLU's output and relu'(.) is x > 0 there, so it writes its
/// input gradient already taken through the ReLU, in the pass that writes it anyway. It has
/// apply_input_relu_gradient(), which loom::sequence calls once, at construction, where it leaves
/// that ReLU's backward out (residual_with: its two branches' input gradients added and masked
/// in one pass). A concept of its own for nvcc's sake, as can_fuse_relu.
template <class Impl>
concept can_apply_input_relu_gradient = requires(Impl& i) { i.apply_input_relu_gradient(); };

/// Whether Relu (a layer between PrevImpl and NextImpl) needs no backward of its own because
/// NextImpl applies its gradient (can_apply_input_relu_gradient), where PrevImpl does not
/// already (backward_fused_into_previous). Its gradient is the same bits either way: relu's
/// backward multiplies by relu'(.) of its output, NextImpl by the same of its input, one buffer.
template <class PrevImpl, class Relu, class NextImpl>
inline constexpr bool backward_fused_into_next = std::is_same_v<Relu, relu> &&
                                                 !backward_fused_into_previous<PrevImpl, Relu> &&
                                                 can_apply_input_relu_gradient<NextImpl>;
}  // namespace detail

}  // namespace loom

#if defined(LOOM_DEFINITIONS_VISIBLE)
#include "loom/layers/impl/activation.ipp"
#endif
