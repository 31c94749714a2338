// SPDX-License-Identifier: Apache-2.0
#pragma once
// loom::dropout: inverted dropout, active in training and the identity in evaluation. Its
// mask is a pure function of (seed, step, layer, element), so runs repeat exactly and backward
// recomputes the mask instead of storing it.

#include <cstddef>
#include <string>

#include "loom/backend/kernels/elementwise.hpp"
#include "loom/layers/describe.hpp"
#include "loom/layers/layer.hpp"

namespace loom {

/// Dropout that zeroes each element with probability Percent / 100 in training and scales the
/// rest by 1 / (1 - Percent / 100). Any shape; no parameters.
template <unsigned Percent>
struct dropout_rate {
  static constexpr bool is_loom_layer = true;
  static constexpr const char* name = "dropout";
  static constexpr double rate = Percent / 100.0;
  template <class In>
  static constexpr bool accepts = true;
  template <std::size_t Index, class In>
  static constexpr bool check() {
    static_assert(Percent < 100,
                  "loom::dropout_rate<Percent> needs Percent in [0, 100) (the layer index and Percent are in the "
                  "loom::diagnostic:: name the compiler prints)");
    if constexpr (Percent >= 100) return detail::fail_with<diagnostic::dropout_at_layer_needs_a_rate_below_100_percent<Index, Percent>>();
    return true;
  }
  template <class In>
  using output_shape = In;
  template <class In>
  static constexpr std::size_t parameter_count = 0;
  template <class In>
  static constexpr double flops = 1.0 * In::size;

  template <class In>
  static void describe(layer_description& d) {
    d.set_text("dropout_rate", {Percent});
  }
  /// The identity at inference: no node.
  static std::string onnx(onnx_graph&, const layer_description&, const std::string& x) { return x; }
  /// It keeps its input's layout.
  template <class In, class Backend>
  static constexpr layout_effect layout = layout_effect::keeps;

  template <class In, class T, class Backend>
  class impl {
   public:
    explicit impl(layer_site site) : site_(site) {}
    void initialize(T*, std::uint64_t) const {}
    void forward(const run_context& ctx, const T*, activation<const T, Backend> x, activation<T, Backend>& y,
                 std::size_t batch) {
      y.format = x.format;
      if (!ctx.training || Percent == 0) return Backend::copy(y.data, x.data, batch * In::size);
      Backend::for_each(batch * In::size, kernels::dropout_apply<T>{x.data, y.data, mask_seed(ctx), site_.stream, rate, ctx.sample_offset * In::size});
    }
    void backward(const run_context& ctx, const T*, activation<const T, Backend>, activation<const T, Backend>, const T* dy,
                  T* dx, T*, std::size_t batch) {
      if (!dx) return;
      if (!ctx.training || Percent == 0) return Backend::copy(dx, dy, batch * In::size);
      Backend::for_each(batch * In::size, kernels::dropout_apply<T>{dy, dx, mask_seed(ctx), site_.stream, rate, ctx.sample_offset * In::size});
    }

   private:
    static std::uint64_t mask_seed(const run_context& ctx) { return counter_hash(ctx.seed, 0x64726f70ULL, ctx.step); }
    layer_site site_;
  };
};

/// Dropout with rate 0.5.
struct dropout : dropout_rate<50> {};

}  // namespace loom
