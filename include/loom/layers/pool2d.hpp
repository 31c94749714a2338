// SPDX-License-Identifier: Apache-2.0
#pragma once
// loom::max_pool2d<Kernel, Stride> and loom::avg_pool2d<Kernel, Stride>: pooling over square
// windows of a (C, H, W) input, without padding. No parameters.

#include <cstddef>
#include <cstdint>
#include <string>

#include "loom/core/config.hpp"
#include "loom/core/geometry.hpp"
#include "loom/layers/describe.hpp"
#include "loom/layers/layer.hpp"

namespace loom {

namespace detail {
/// The pooling layers' ONNX node (compiled once: impl/pool2d.ipp).
LOOM_DECL std::string pool2d_onnx(onnx_graph& g, const std::string& x, pool_kind kind, std::int64_t kernel,
                                  std::int64_t stride);

template <pool_kind Kind, std::size_t Kernel, std::size_t Stride>
struct pool2d_layer {
  static constexpr bool is_loom_layer = true;
  static constexpr const char* name = Kind == pool_kind::max ? "max_pool2d" : "avg_pool2d";

  template <class In>
  static constexpr bool fits() {
    if constexpr (In::rank != 3) return false;
    else return Kernel <= In::dims[1] && Kernel <= In::dims[2];
  }
  template <class In>
  static constexpr bool accepts = fits<In>();

  template <std::size_t Index, class In>
  static constexpr bool check() {
    static_assert(Kernel > 0 && Stride > 0,
                  "loom pooling needs Kernel and Stride > 0 (the layer index, kernel and stride are in the "
                  "loom::diagnostic:: name the compiler prints)");
    if constexpr (Kernel == 0 || Stride == 0)
      return fail_with<diagnostic::pool2d_at_layer_needs_positive_kernel_and_stride<Index, Kernel, Stride>>();
    else return check_input<Index, In>();
  }
  /// The checks of the input shape, once the layer's own values are sound.
  template <std::size_t Index, class In>
  static constexpr bool check_input() {
    static_assert(In::rank == 3,
                  "loom pooling (max_pool2d / avg_pool2d) needs a 3-D input (channels, height, width) "
                  "(the layer index and the input shape are in the loom::diagnostic:: name the compiler prints)");
    if constexpr (In::rank != 3) {
      return fail_with<diagnostic::pool2d_at_layer_needs_a_3d_input_but_got<Index, In>>();
    } else {
      static_assert(fits<In>(),
                    "loom pooling window is larger than its input: use a smaller Kernel or fewer pooling layers "
                    "before it (layer index, input shape and kernel are in the loom::diagnostic:: name the "
                    "compiler prints)");
      if constexpr (!fits<In>()) return fail_with<diagnostic::pool2d_window_larger_than_input_at_layer<Index, In, Kernel>>();
      return true;
    }
  }

  template <class In>
  static constexpr pool2d_geometry geometry{In::dims[0], In::dims[1], In::dims[2], Kernel, Stride};
  template <class In>
  using output_shape = shape<In::dims[0], geometry<In>.oh(), geometry<In>.ow()>;
  template <class In>
  static constexpr std::size_t parameter_count = 0;
  template <class In>
  static constexpr double flops = 1.0 * In::dims[0] * geometry<In>.oh() * geometry<In>.ow() * Kernel * Kernel;

  template <class In>
  static void describe(layer_description& d) {
    d.set_text(name, {Kernel, Stride});
  }
  /// MaxPool or AveragePool without padding.
  static std::string onnx(onnx_graph& g, const layer_description&, const std::string& x) {
    return pool2d_onnx(g, x, Kind, Kernel, Stride);
  }
  /// It pools in its input's layout.
  template <class In, class Backend>
  static constexpr layout_effect layout = layout_effect::keeps;

  template <class In, class T, class Backend>
  class impl {
   public:
    explicit impl(layer_site) : plan_(geometry<In>, Kind) {}
    void initialize(T*, std::uint64_t) const {}
    void forward(const run_context&, const T*, activation<const T, Backend> x, activation<T, Backend>& y,
                 std::size_t batch) {
      y.format = plan_.forward(x.data, x.format, y.data, batch);
    }
    void backward(const run_context&, const T*, activation<const T, Backend> x, activation<const T, Backend>, const T* dy,
                  T* dx, T*, std::size_t batch) {
      if (dx) plan_.backward(x.data, x.format, dy, dx, batch);
    }

   private:
    typename Backend::template pool2d_plan<T> plan_;
  };
};
}  // namespace detail

/// Max pooling over Kernel x Kernel windows moved by Stride (default: Kernel).
/// Input shape<C, H, W>; output shape<C, (H - Kernel) / Stride + 1, (W - Kernel) / Stride + 1>.
template <std::size_t Kernel, std::size_t Stride = Kernel>
struct max_pool2d : detail::pool2d_layer<pool_kind::max, Kernel, Stride> {};

/// Average pooling over Kernel x Kernel windows moved by Stride (default: Kernel); same shapes
/// as max_pool2d.
template <std::size_t Kernel, std::size_t Stride = Kernel>
struct avg_pool2d : detail::pool2d_layer<pool_kind::average, Kernel, Stride> {};

}  // namespace loom

#if defined(LOOM_DEFINITIONS_VISIBLE)
#include "loom/layers/impl/pool2d.ipp"
#endif
