// SPDX-License-Identifier: Apache-2.0
#pragma once
// loom::residual<Layers...>: y = x + F(x), where F is the sub-stack Layers... and must keep the
// shape of its input. F's parameters sit inside the residual's span of the flat buffer.

#include <cstddef>
#include <string>

#include "loom/backend/kernels/elementwise.hpp"
#include "loom/core/config.hpp"
#include "loom/core/memory.hpp"
#include "loom/layers/describe.hpp"
#include "loom/layers/layer.hpp"
#include "loom/nn/describe.hpp"
#include "loom/nn/sequence.hpp"

namespace loom {

namespace detail {
/// A residual's text, "residual<inner texts>", and its ONNX nodes (compiled once: impl/residual.ipp).
LOOM_DECL void residual_text(layer_description& d);
LOOM_DECL std::string residual_onnx(onnx_graph& g, const layer_description& d, const std::string& x);
}  // namespace detail

/// A skip connection around Layers...: output = input + Layers...(input). The inner stack's
/// output shape must equal its input shape (a compile error names both otherwise).
template <class... Layers>
struct residual {
  static constexpr bool is_loom_layer = true;
  static constexpr const char* name = "residual";

  template <class In>
  using inner = layer_chain<In, Layers...>;

  template <class In>
  static constexpr bool accepts = inner<In>::ok && std::is_same_v<typename inner<In>::output_shape, In>;

  template <std::size_t Index, class In>
  static constexpr bool check() {
    static_assert(sizeof...(Layers) > 0,
                  "loom::residual<...> needs at least one layer inside (the residual's index is in the "
                  "loom::diagnostic:: name the compiler prints)");
    if constexpr (sizeof...(Layers) == 0) {
      return detail::fail_with<diagnostic::residual_at_layer_has_no_inner_layers<Index>>();
    } else if constexpr (!inner<In>::ok) {
      return false;  // the inner layer has already said why
    } else {
      using out = typename inner<In>::output_shape;
      static_assert(std::is_same_v<out, In>,
                    "loom::residual's inner layers change the shape of their input, so it cannot be added back: "
                    "make the inner stack end with the shape it starts with (the residual's index, its input "
                    "shape and the inner output shape are in the loom::diagnostic:: name the compiler prints)");
      if constexpr (!std::is_same_v<out, In>)
        return detail::fail_with<diagnostic::residual_at_layer_changes_the_shape<Index, In, out>>();
      return true;
    }
  }

  template <class In>
  using output_shape = In;
  template <class In>
  static constexpr std::size_t parameter_count = inner<In>::parameter_count;
  template <class In>
  static constexpr std::size_t buffer_count = inner<In>::buffer_count;
  template <class In>
  static constexpr double flops = [] {
    double s = In::size;
    for (double f : inner<In>::flops) s += f;
    return s;
  }();

  /// Its inner layers, named as the torch.nn.Sequential inside it ("3.0", "3.1", ...).
  template <class In>
  static void describe(layer_description& d) {
    d.inner = detail::describe_chain<inner<In>, Layers...>(d.path + ".");
    detail::residual_text(d);
  }
  /// Add(x, F(x)).
  static std::string onnx(onnx_graph& g, const layer_description& d, const std::string& x) {
    return detail::residual_onnx(g, d, x);
  }
  /// Its inner sequence's buffers; aligned_ when F(x) (and dy) come in the other layout than x's,
  /// and dx_inner_ when its input gradient is asked for. Its output is in x's layout.
  template <class In, class Backend>
  static constexpr sequence_elements footprint(const footprint_context& c) {
    sequence_elements e = detail::elements_of_sequence<inner<In>, Backend>(c);
    if (c.input_blocked != e.output_blocked) e.scratch += In::size;
    if (c.needs_input_gradient) e.scratch += In::size;
    e.output_blocked = false;  // the sequence around it tracks its output's (x's)
    return e;
  }
  template <class In, class Backend>
  static constexpr layout_effect layout = layout_effect::keeps;

  template <class In, class T, class Backend>
  class impl {
    using space = typename Backend::memory_space;

   public:
    explicit impl(layer_site site) : inner_(site.stream, 0, tensor_shard{site.shard, site.shards}) {}

    void initialize(T* params, std::uint64_t seed) const { inner_.initialize(params, seed); }
    void initialize_buffers(T* buffers) const { inner_.initialize_buffers(buffers); }
    void bind_buffers(T* buffers) { inner_.bind_buffers(buffers); }

    void forward(const run_context& ctx, const T* params, activation<const T, Backend> x, activation<T, Backend>& y,
                 std::size_t batch) {
      auto f = inner_.forward(ctx, params, x, batch);
      const T* fx = f.data;
      if (!(f.format == x.format)) {
        aligned_.reserve_discard(batch * In::size);
        conv_.template convert<T, In>(f.data, f.format, aligned_.data(), x.format, batch);
        fx = aligned_.data();
      }
      Backend::for_each(batch * In::size, kernels::add<T>{x.data, fx, y.data});
      y.format = x.format;
    }

    void backward(const run_context& ctx, const T* params, activation<const T, Backend> x, activation<const T, Backend>,
                  const T* dy, T* dx, T* dparams, std::size_t batch) {
      // dy is in x's layout; the inner stack wants its gradient in its output's layout.
      auto f = inner_.output();
      const T* dinner = dy;
      if (!(f.format == x.format)) {
        aligned_.reserve_discard(batch * In::size);
        conv_.template convert<T, In>(dy, x.format, aligned_.data(), f.format, batch);
        dinner = aligned_.data();
      }
      T* dxin = nullptr;
      if (dx) {
        dx_inner_.reserve_discard(batch * In::size);
        dxin = dx_inner_.data();
      }
      inner_.backward(ctx, params, x, dinner, dxin, dparams);
      if (dx) Backend::for_each(batch * In::size, kernels::add<T>{dy, dxin, dx});
    }

   private:
    mutable sequence<T, Backend, In, Layers...> inner_;
    buffer<T, space> aligned_, dx_inner_;
    typename Backend::layout_converter conv_;
  };
};

}  // namespace loom

#if defined(LOOM_DEFINITIONS_VISIBLE)
#include "loom/nn/impl/residual.ipp"
#endif
