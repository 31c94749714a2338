// SPDX-License-Identifier: Apache-2.0
#pragma once
// The run-time side of a layer chain: the layers' implementation objects, one output buffer
// per layer (kept for backward), and the forward and backward passes over flat parameter and
// gradient buffers. A network is one sequence; a residual holds another inside.

#include <array>
#include <cstddef>
#include <cstdint>
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
/// Called before each layer's forward with the layer's index; the default does nothing.
struct no_layer_hook {
  void operator()(std::size_t) const noexcept {}
};

namespace detail {
/// Layer I's implementation object, one base of layer_impls.
template <std::size_t I, class Impl>
struct impl_slot {
  Impl impl;
};
/// The layers' implementation objects side by side: one flat class whatever the layer count
/// (std::tuple nests one level per element, and its get<I> and constraints cost O(N) each, so
/// O(N^2) for a whole network). Layer I's is impl_of<I>(impls).
template <class Indices, class... Impls>
struct layer_impls;
template <std::size_t... I, class... Impls>
struct layer_impls<std::index_sequence<I...>, Impls...> : impl_slot<I, Impls>... {
  /// Builds layer i's implementation in place from site(i), its layer_site.
  template <class Site>
    requires std::is_invocable_v<Site&, std::size_t>
  explicit layer_impls(Site&& site) : impl_slot<I, Impls>{Impls(site(I))}... {}
};
template <std::size_t I, class Impl>
Impl& impl_of(impl_slot<I, Impl>& s) noexcept {
  return s.impl;
}
}  // namespace detail

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
  // Each layer's implementation for its input shape: the layers and their inputs expanded side
  // by side. A chain that fails its checks has already said why in a static_assert; it gets no
  // layer implementations (and its passes do nothing), so the compiler adds no errors of its own.
  template <class... Inputs>
  static auto impls_type(type_list<Inputs...>) {
    if constexpr (chain::ok)
      return std::type_identity<detail::layer_impls<std::index_sequence_for<Layers...>,
                                                    typename Layers::template impl<Inputs, T, Backend>...>>{};
    else
      return std::type_identity<detail::layer_impls<std::index_sequence<>>>{};
  }
  using impls = typename decltype(impls_type(typename chain::inputs{}))::type;
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
  /// ...and its backward too (detail::backward_fused_into_previous), or layer K is a ReLU whose
  /// gradient the layer after it applies (detail::backward_fused_into_next): backward leaves it
  /// out.
  template <std::size_t K>
  static constexpr bool backward_skipped() {
    if constexpr (K == 0 || !chain::ok) {
      return false;
    } else if constexpr (detail::backward_fused_into_previous<impl_at<K - 1>, at<K, type_list<Layers...>>>) {
      return true;
    } else {
      return relu_gradient_applied_by_next<K>();
    }
  }
  /// Whether layer K (>= 1) is a ReLU whose gradient layer K + 1 applies in its backward.
  template <std::size_t K>
  static constexpr bool relu_gradient_applied_by_next() {
    if constexpr (K == 0 || K + 1 >= layer_count || !chain::ok) {
      return false;
    } else {
      return detail::backward_fused_into_next<impl_at<K - 1>, at<K, type_list<Layers...>>, impl_at<K + 1>>;
    }
  }
  /// The layer that reads layer K's output: the next, or past a ReLU fused into layer K the one
  /// after it (layer_count where there is none).
  template <std::size_t K>
  static constexpr std::size_t reader_of_output() {
    if constexpr (K + 1 < layer_count && relu_fused<(K + 1 < layer_count ? K + 1 : 0)>()) return K + 2;
    else return K + 1;
  }
  /// The gradient buffer layer K >= 1 writes its input gradient into: the layers that run a
  /// backward alternate between the two, so none writes where it reads
  /// (detail::gradient_buffers in nn/chain.hpp, which the memory plan counts by too).
  template <std::size_t K>
  static constexpr std::size_t gradient_buffer() {
    std::array<bool, sizeof...(Layers)> skipped{};
    [&]<std::size_t... I>(std::index_sequence<I...>) { ((skipped[I] = backward_skipped<I>()), ...); }
    (std::index_sequence_for<Layers...>{});
    return detail::gradient_buffers(skipped)[K];
  }

 public:
  /// stream: the random stream of this sequence (0 for a whole network); layer i gets its own
  /// stream derived from it and from first_index + i, its index in the whole model (a pipeline
  /// stage starts at its first layer's index, so it initialises as that part of the whole
  /// model). shard: the slice of tensor-parallel layers this rank holds.
  explicit sequence(std::uint64_t stream = 0, std::size_t first_index = 0, tensor_shard shard = {})
      : impls_([&](std::size_t i) {
          const std::size_t index = first_index + i;
          return layer_site{index, counter_hash(0x6c6f6f6dULL, stream, index), shard.rank, shard.count};
        }) {
    if constexpr (chain::ok) each([&](auto i) {
      constexpr std::size_t k = i;
      if constexpr (sequence::template relu_fused<(k + 1 < layer_count ? k + 1 : 0)>()) detail::impl_of<k>(impls_).fuse_relu();
      if constexpr (k >= 1 && sequence::template relu_gradient_applied_by_next<(k >= 1 ? k - 1 : 0)>())
        detail::impl_of<k>(impls_).apply_input_relu_gradient();
    });
    // A layer whose output (past a fused ReLU) a convolution reads that takes bf16 copies writes
    // one as it goes under bf16 math; so does a layer whose input gradient such a convolution
    // right before it reads (activation::bf16; backward below hands it on).
    if constexpr (chain::ok) each([&](auto i) {
      constexpr std::size_t k = i;
      auto& impl = detail::impl_of<k>(impls_);
      constexpr std::size_t after = sequence::template reader_of_output<k>();
      if constexpr (after < layer_count && requires { impl.write_bf16_output(); })
        if constexpr (detail::reads_bf16_input<impl_at<(after < layer_count ? after : 0)>>) impl.write_bf16_output();
      if constexpr (k > 0 && requires { impl.write_bf16_input_gradient(); })
        if constexpr (detail::reads_bf16_input<impl_at<(k > 0 ? k - 1 : 0)>>) impl.write_bf16_input_gradient();
    });
  }

  /// Initialises the parameters params[0, parameter_count) from seed.
  void initialize(T* params, std::uint64_t seed) const {
    if constexpr (chain::ok) each([&](auto i) { detail::impl_of<i>(impls_).initialize(params + chain::parameter_offsets[i], seed); });
  }

  /// Values of the layers' buffers (running statistics), the size of the flat buffer of buffers.
  static constexpr std::size_t buffer_count = chain::buffer_count;

  /// Writes the layers' initial buffers into buffers[0, buffer_count) (host memory).
  void initialize_buffers(T* buffers) const {
    if constexpr (chain::ok && chain::buffer_count > 0) each([&](auto i) {
      if constexpr (chain::buffer_counts[i] > 0) detail::impl_of<i>(impls_).initialize_buffers(buffers + chain::buffer_offsets[i]);
    });
  }
  /// Tells the layers where their buffers live: buffers[0, buffer_count), the backend's memory
  /// (a loom::model's buffers(); a pipeline slot's sequence is bound to its stage model's). A
  /// sequence with buffers runs only once bound.
  void bind_buffers(T* buffers) {
    if constexpr (chain::ok && chain::buffer_count > 0) each([&](auto i) {
      if constexpr (chain::buffer_counts[i] > 0) detail::impl_of<i>(impls_).bind_buffers(buffers + chain::buffer_offsets[i]);
    });
  }

  /// Runs every layer on x (batch samples) and returns the last output (kept until the next
  /// forward). In training mode everything backward needs is kept. before(i) runs just before
  /// layer i reads its parameters.
  template <class Before = no_layer_hook>
  activation<T, Backend> forward(const run_context& ctx, const T* params, activation<const T, Backend> x, std::size_t batch,
                                 Before&& before = {}) {
    batch_ = batch;
    if constexpr (chain::ok) each([&](auto i) {
      constexpr std::size_t k = i;
      before(k);
      if constexpr (sequence::template relu_fused<k>()) {
        out_[k] = out_[k - 1];  // the layer before already wrote relu(.)
        formats_[k] = formats_[k - 1];
        bf16_[k] = bf16_[k - 1];
      } else {
        outputs_[k].reserve_discard(batch * chain::template output_of<k>::size);
        activation<T, Backend> y{outputs_[k].data(), {}};
        write_copy_only_where_read_alone<k>(ctx, x, batch);
        detail::impl_of<k>(impls_).forward(ctx, params + chain::parameter_offsets[k], input(k, x), y, batch);
        out_[k] = outputs_[k].data();
        formats_[k] = y.format;
        bf16_[k] = y.bf16;
      }
    });
    return output();
  }

  /// The output of the last forward.
  activation<T, Backend> output() {
    return {out_[layer_count - 1], formats_[layer_count - 1], bf16_[layer_count - 1]};
  }

  /// Backward through every layer, last first. dy is the gradient of the output (in the
  /// output's layout); writes the parameter gradients into dparams (overwritten, or added to
  /// when ctx.accumulate) and, when dx is non-null, the input gradient in x's layout.
  /// hook(i) runs as soon as layer i's gradients are complete.
  template <class Hook = no_backward_hook>
  void backward(const run_context& ctx, const T* params, activation<const T, Backend> x, const T* dy, T* dx, T* dparams,
                Hook&& hook = {}) {
    const std::size_t batch = batch_;
    const T* grad = dy;
    const std::uint16_t* grad16 = nullptr;  // grad's bf16 copy, when the layer after wrote one
    if constexpr (chain::ok) each_reverse([&](auto i) {
      constexpr std::size_t k = i;
      auto& impl = detail::impl_of<k>(impls_);
      if constexpr (sequence::template backward_skipped<k>()) {
        // The layer before or after applies this ReLU's gradient: dy goes on as it is.
        hook(k);
        grad16 = nullptr;
        return;
      }
      T* out = nullptr;
      if constexpr (k == 0) {
        out = dx;
      } else {
        constexpr std::size_t into = gradient_buffer<k>();
        auto& g = grads_[into];
        g.reserve_discard(batch * chain::template input_of<k>::size);
        out = g.data();
      }
      // A fused relu's input is the fused output itself; relu'(x) = relu'(relu(x)), so its
      // backward is unchanged.
      activation<const T, Backend> y{out_[k], formats_[k], bf16_[k]};
      if constexpr (requires { impl.take_output_gradient_bf16(grad16); }) impl.take_output_gradient_bf16(grad16);
      if constexpr (k > 0 && requires { impl.write_input_gradient_copy_only(); }) {
        constexpr std::size_t before = k > 0 ? k - 1 : 0;
        auto& reader = detail::impl_of<before>(impls_);
        if constexpr (requires { reader.reads_output_gradient_copy_only(ctx, formats_[0], batch); })
          if (reader.reads_output_gradient_copy_only(ctx, input(before, x).format, batch))
            impl.write_input_gradient_copy_only();
      }
      impl.backward(ctx, params + chain::parameter_offsets[k], input(k, x), y, grad, out,
                    dparams + chain::parameter_offsets[k], batch);
      hook(k);
      grad = out;
      if constexpr (requires { impl.input_gradient_bf16(); }) grad16 = impl.input_gradient_bf16();
      else grad16 = nullptr;
    });
  }

 private:
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
  /// Before layer K's forward: a layer that can write its output's bf16 copy alone (batch norm,
  /// whose output is in its input's layout) does so when the convolution reading that output
  /// reads nothing else of it (conv2d's reads_input_copy_only); backward does the same for the
  /// input gradient a convolution right before reads. No other layer reads these values: the
  /// fused ReLU between them runs neither pass of its own.
  template <std::size_t K>
  void write_copy_only_where_read_alone(const run_context& ctx, activation<const T, Backend> x, std::size_t batch) {
    auto& impl = detail::impl_of<K>(impls_);
    constexpr std::size_t after = reader_of_output<K>();
    if constexpr (after < layer_count && requires { impl.write_output_copy_only(); }) {
      auto& reader = detail::impl_of<(after < layer_count ? after : 0)>(impls_);
      if constexpr (requires { reader.reads_input_copy_only(ctx, formats_[0], batch); })
        if (ctx.training && reader.reads_input_copy_only(ctx, input(K, x).format, batch)) impl.write_output_copy_only();
    }
  }

  activation<const T, Backend> input(std::size_t k, activation<const T, Backend> x) const {
    if (k == 0) return x;
    return {out_[k - 1], formats_[k - 1], bf16_[k - 1]};
  }

  mutable impls impls_;
  std::array<buffer<T, space>, layer_count> outputs_;
  std::array<T*, layer_count> out_{};  // where each layer's output is: its buffer, or the one before for a fused relu
  std::array<typename Backend::format, layer_count> formats_{};
  std::array<const std::uint16_t*, layer_count> bf16_{};  // each output's bf16 copy, where its layer wrote one
  std::array<buffer<T, space>, 2> grads_;
  std::size_t batch_ = 0;
};

}  // namespace loom
