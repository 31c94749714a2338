// SPDX-License-Identifier: Apache-2.0
#pragma once
// loom::model<Network, T, Backend>: a network's parameters and gradients as two flat buffers,
// and its forward and backward passes. The trainer drives one; tests use it directly.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>

#include "loom/backend/cpu.hpp"
#include "loom/core/memory.hpp"
#include "loom/nn/network.hpp"

namespace loom {

template <class Network, class T = float, class Backend = cpu>
class model {
  static_assert(is_network_v<Network>, "loom::model<Network, ...> needs a loom::network<loom::input<...>, layers...>");
  static_assert(std::is_floating_point_v<T>, "loom::model's scalar type must be float or double");
  using space = typename Backend::memory_space;
  using seq = typename Network::template sequence_type<T, Backend>;

 public:
  using network_type = Network;
  using value_type = T;
  using backend = Backend;
  using input_shape = typename Network::input_shape;
  using output_shape = typename Network::output_shape;
  static constexpr std::size_t parameter_count = Network::parameter_count;

  /// Allocates and initialises the parameters from seed (He / Xavier per layer, counter-based:
  /// the same seed gives the same parameters on every backend and thread count).
  explicit model(std::uint64_t seed = 1) : params_(parameter_count), grads_(parameter_count) {
    seq_.initialize(params_.data(), seed);
  }

  /// Forward on batch samples x (batch, input_shape), plain row-major. Returns the output,
  /// plain row-major (batch, output_shape), valid until the next forward.
  const T* forward(const run_context& ctx, const T* x, std::size_t batch) {
    auto y = seq_.forward(ctx, params_.data(), activation<const T, Backend>{x}, batch);
    out_format_ = y.format;
    input_ = x;
    return conv_.template to_plain<T, output_shape>(y.data, y.format, batch);
  }

  /// Backward from dy, the gradient of the plain output of the last forward. Fills gradients()
  /// (overwritten, or added to when ctx.accumulate). hook(i) runs once layer i is done.
  template <class Hook = no_backward_hook>
  void backward(const run_context& ctx, const T* dy, std::size_t batch, Hook&& hook = {}) {
    const T* d = dy;
    if (!out_format_.plain()) {
      dy_.reserve_discard(batch * output_shape::size);
      conv_.template from_plain<T, output_shape>(dy, out_format_, dy_.data(), batch);
      d = dy_.data();
    }
    seq_.backward(ctx, params_.data(), activation<const T, Backend>{input_}, d, nullptr, grads_.data(),
                  std::forward<Hook>(hook));
  }

  std::span<T> parameters() noexcept { return {params_.data(), parameter_count}; }
  std::span<const T> parameters() const noexcept { return {params_.data(), parameter_count}; }
  std::span<T> gradients() noexcept { return {grads_.data(), parameter_count}; }
  std::span<const T> gradients() const noexcept { return {grads_.data(), parameter_count}; }
  /// Layer I's parameters (a view into the flat buffer at its constexpr offset).
  template <std::size_t I>
  std::span<T> layer_parameters() noexcept {
    return {params_.data() + Network::parameter_offsets[I], Network::parameter_counts[I]};
  }
  template <std::size_t I>
  std::span<T> layer_gradients() noexcept {
    return {grads_.data() + Network::parameter_offsets[I], Network::parameter_counts[I]};
  }

  /// The L2 norm of all parameters, summed in double.
  double parameters_l2() const {
    const T* p = params_.data();
    return std::sqrt(Backend::sum(parameter_count, [=](std::size_t i) { return double(p[i]) * double(p[i]); }));
  }

 private:
  buffer<T, space> params_, grads_, dy_;
  seq seq_;
  typename Backend::format out_format_{};
  typename Backend::layout_converter conv_;
  const T* input_ = nullptr;
};

}  // namespace loom
