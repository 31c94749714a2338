// SPDX-License-Identifier: Apache-2.0
#pragma once
// The point-wise activations: relu, leaky_relu, tanh, sigmoid, gelu. Any input shape, output
// the same shape, no parameters. They work on the activation's physical layout as it is.

#include <cstddef>

#include "loom/backend/kernels/activation.hpp"
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
}  // namespace detail

/// max(x, 0).
struct relu : detail::pointwise_layer<kernels::relu_op, detail::relu_name> {};
/// x for x > 0, SlopeMillis / 1000 * x otherwise.
template <int SlopeMillis>
struct leaky_relu_slope : detail::pointwise_layer<kernels::leaky_relu_op<SlopeMillis>, detail::leaky_relu_name> {};
/// Leaky ReLU with slope 0.01 (PyTorch's default).
struct leaky_relu : leaky_relu_slope<10> {};
/// Hyperbolic tangent.
struct tanh : detail::pointwise_layer<kernels::tanh_op, detail::tanh_name> {};
/// Logistic sigmoid 1 / (1 + e^-x), computed stably on both tails.
struct sigmoid : detail::pointwise_layer<kernels::sigmoid_op, detail::sigmoid_name> {};
/// GELU, exact: x Phi(x).
struct gelu : detail::pointwise_layer<kernels::gelu_op, detail::gelu_name> {};

}  // namespace loom
