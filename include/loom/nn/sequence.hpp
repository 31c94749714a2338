// SPDX-License-Identifier: Apache-2.0
#pragma once
// The run-time side of a layer chain: the layers' implementation objects, one output buffer
// per layer (kept for backward), and the forward and backward passes over flat parameter and
// gradient buffers. A network is one sequence; a residual holds another inside.

#include <array>
#include <cstddef>
#include <cstdint>
#include <tuple>
#include <type_traits>
#include <utility>

#include "loom/core/memory.hpp"
#include "loom/core/random.hpp"
#include "loom/layers/activation.hpp"
#include "loom/nn/chain.hpp"

namespace loom {

/// Called after each layer's backward with the layer's index; the default does nothing.
struct no_backward_hook {
  void operator()(std::size_t) const noexcept {}
};

template <class T, class Backend, shape_type In, class... Layers>
class sequence {
 public:
  using chain = layer_chain<In, Layers...>;
  static constexpr std::size_t layer_count = chain::layer_count;
  using output_shape = typename chain::output_shape;
  static constexpr std::size_t parameter_count = chain::parameter_count;

 private:
  template <std::size_t I>
  using impl_at = typename at<I, type_list<Layers...>>::template impl<typename chain::template input_of<I>, T, Backend>;
  // A chain that fails its checks has already said why in a static_assert; it gets no layer
  // implementations (and its passes do nothing), so the compiler adds no errors of its own.
  template <std::size_t... I>
  static auto impls_type(std::index_sequence<I...>) {
    if constexpr (chain::ok) return std::type_identity<std::tuple<impl_at<I>...>>{};
    else return std::type_identity<std::tuple<>>{};
  }
  using impls = typename decltype(impls_type(std::index_sequence_for<Layers...>{}))::type;
  using space = typename Backend::memory_space;

  /// Layer K runs inside the layer before it (detail::fuses_into_previous: a loom::relu after
  /// a layer that writes the ReLU's output itself): decided at compile time from the layer list.
  template <std::size_t K>
  static constexpr bool relu_fused() {
    if constexpr (K == 0 || !chain::ok) {
      return false;
    } else {
      return detail::fuses_into_previous<impl_at<K - 1>, at<K, type_list<Layers...>>>;
    }
  }

 public:
  /// stream: the random stream of this sequence (0 for a whole network); layer i gets its own
  /// stream derived from it and from first_index + i, its index in the whole model (a pipeline
  /// stage starts at its first layer's index, so it initialises as that part of the whole
  /// model). shard: the slice of tensor-parallel layers this rank holds.
  explicit sequence(std::uint64_t stream = 0, std::size_t first_index = 0, tensor_shard shard = {})
      : impls_(make(stream, first_index, shard, std::index_sequence_for<Layers...>{})) {
    if constexpr (chain::ok) each([&](auto i) {
      constexpr std::size_t k = i;
      if constexpr (sequence::template relu_fused<(k + 1 < layer_count ? k + 1 : 0)>()) std::get<k>(impls_).fuse_relu();
    });
  }

  /// Initialises the parameters params[0, parameter_count) from seed.
  void initialize(T* params, std::uint64_t seed) const {
    if constexpr (chain::ok) each([&](auto i) { std::get<i>(impls_).initialize(params + chain::parameter_offsets[i], seed); });
  }

  /// Runs every layer on x (batch samples) and returns the last output (kept until the next
  /// forward). In training mode everything backward needs is kept.
  activation<T, Backend> forward(const run_context& ctx, const T* params, activation<const T, Backend> x, std::size_t batch) {
    batch_ = batch;
    if constexpr (chain::ok) each([&](auto i) {
      constexpr std::size_t k = i;
      if constexpr (sequence::template relu_fused<k>()) {
        out_[k] = out_[k - 1];  // the layer before already wrote relu(.)
        formats_[k] = formats_[k - 1];
      } else {
        outputs_[k].reserve_discard(batch * chain::template output_of<k>::size);
        activation<T, Backend> y{outputs_[k].data(), {}};
        std::get<k>(impls_).forward(ctx, params + chain::parameter_offsets[k], input(k, x), y, batch);
        out_[k] = outputs_[k].data();
        formats_[k] = y.format;
      }
    });
    return {out_[layer_count - 1], formats_[layer_count - 1]};
  }

  /// The output of the last forward.
  activation<T, Backend> output() { return {out_[layer_count - 1], formats_[layer_count - 1]}; }

  /// Backward through every layer, last first. dy is the gradient of the output (in the
  /// output's layout); writes the parameter gradients into dparams (overwritten, or added to
  /// when ctx.accumulate) and, when dx is non-null, the input gradient in x's layout.
  /// hook(i) runs as soon as layer i's gradients are complete.
  template <class Hook = no_backward_hook>
  void backward(const run_context& ctx, const T* params, activation<const T, Backend> x, const T* dy, T* dx, T* dparams,
                Hook&& hook = {}) {
    const std::size_t batch = batch_;
    const T* grad = dy;
    if constexpr (chain::ok) each_reverse([&](auto i) {
      constexpr std::size_t k = i;
      T* out = nullptr;
      if constexpr (k == 0) {
        out = dx;
      } else {
        auto& g = grads_[k % 2];
        g.reserve_discard(batch * chain::template input_of<k>::size);
        out = g.data();
      }
      // A fused relu's input is the fused output itself; relu'(x) = relu'(relu(x)), so its
      // backward is unchanged.
      activation<const T, Backend> y{out_[k], formats_[k]};
      std::get<k>(impls_).backward(ctx, params + chain::parameter_offsets[k], input(k, x), y, grad, out,
                                   dparams + chain::parameter_offsets[k], batch);
      hook(k);
      grad = out;
    });
  }

 private:
  template <std::size_t... I>
  static impls make(std::uint64_t stream, std::size_t first, tensor_shard shard, std::index_sequence<I...>) {
    if constexpr (!chain::ok) return impls{};
    else
      return impls{impl_at<I>(
          layer_site{first + I, counter_hash(0x6c6f6f6dULL, stream, first + I), shard.rank, shard.count})...};
  }
  template <class F>
  void each(F&& f) const {
    [&]<std::size_t... I>(std::index_sequence<I...>) { (f(std::integral_constant<std::size_t, I>{}), ...); }
    (std::index_sequence_for<Layers...>{});
  }
  template <class F>
  void each_reverse(F&& f) const {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (f(std::integral_constant<std::size_t, layer_count - 1 - I>{}), ...);
    }
    (std::index_sequence_for<Layers...>{});
  }
  activation<const T, Backend> input(std::size_t k, activation<const T, Backend> x) const {
    if (k == 0) return x;
    return {out_[k - 1], formats_[k - 1]};
  }

  mutable impls impls_;
  std::array<buffer<T, space>, layer_count> outputs_;
  std::array<T*, layer_count> out_{};  // where each layer's output is: its buffer, or the one before for a fused relu
  std::array<typename Backend::format, layer_count> formats_{};
  std::array<buffer<T, space>, 2> grads_;
  std::size_t batch_ = 0;
};

}  // namespace loom
