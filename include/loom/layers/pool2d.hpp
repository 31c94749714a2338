// SPDX-License-Identifier: Apache-2.0
#pragma once
// loom::max_pool2d<Kernel, Stride, Pad> and loom::avg_pool2d<Kernel, Stride, Pad>: pooling over
// square windows of a (C, H, W) input, padded by Pad on every side (padding is never the
// maximum; an average counts it, as PyTorch's count_include_pad); and loom::global_avg_pool2d,
// the mean of each channel (torch.nn.AdaptiveAvgPool2d(1) and a flatten). No parameters.

#include <cstddef>
#include <cstdint>
#include <string>

#include "loom/backend/kernels/pool.hpp"
#include "loom/core/config.hpp"
#include "loom/core/geometry.hpp"
#include "loom/layers/describe.hpp"
#include "loom/layers/layer.hpp"

namespace loom {

namespace detail {
/// The pooling layers' ONNX node (compiled once: impl/pool2d.ipp).
LOOM_DECL std::string pool2d_onnx(onnx_graph& g, const std::string& x, pool_kind kind, std::int64_t kernel,
                                  std::int64_t stride, std::int64_t pad);
/// global_avg_pool2d's: GlobalAveragePool and Flatten (compiled once: impl/pool2d.ipp).
LOOM_DECL std::string global_avg_pool2d_onnx(onnx_graph& g, const std::string& x);

template <pool_kind Kind, std::size_t Kernel, std::size_t Stride, std::size_t Pad>
struct pool2d_layer {
  static constexpr bool is_loom_layer = true;
  static constexpr const char* name = Kind == pool_kind::max ? "max_pool2d" : "avg_pool2d";

  template <class In>
  static constexpr bool fits() {
    if constexpr (In::rank != 3) return false;
    else return Kernel <= In::dims[1] + 2 * Pad && Kernel <= In::dims[2] + 2 * Pad;
  }
  template <class In>
  static constexpr bool accepts = fits<In>();

  template <std::size_t Index, class In>
  static constexpr bool check() {
    static_assert(Kernel > 0 && Stride > 0,
                  "loom pooling needs Kernel and Stride > 0 (the layer index, kernel and stride are in the "
                  "loom::diagnostic:: name the compiler prints)");
    static_assert(2 * Pad <= Kernel,
                  "loom pooling's padding must be at most half its window, so that every window holds part of the "
                  "input (as PyTorch requires; the layer index, kernel and padding are in the loom::diagnostic:: name "
                  "the compiler prints)");
    if constexpr (Kernel == 0 || Stride == 0)
      return fail_with<diagnostic::pool2d_at_layer_needs_positive_kernel_and_stride<Index, Kernel, Stride>>();
    else if constexpr (2 * Pad > Kernel)
      return fail_with<diagnostic::pool2d_padding_larger_than_half_the_window_at_layer<Index, Kernel, Pad>>();
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
                    "loom pooling window is larger than its input (with its padding): use a smaller Kernel or fewer "
                    "pooling layers before it (layer index, input shape and kernel are in the loom::diagnostic:: name "
                    "the compiler prints)");
      if constexpr (!fits<In>()) return fail_with<diagnostic::pool2d_window_larger_than_input_at_layer<Index, In, Kernel>>();
      return true;
    }
  }

  template <class In>
  static constexpr pool2d_geometry geometry{In::dims[0], In::dims[1], In::dims[2], Kernel, Stride, Pad};
  template <class In>
  using output_shape = shape<In::dims[0], geometry<In>.oh(), geometry<In>.ow()>;
  template <class In>
  static constexpr std::size_t parameter_count = 0;
  template <class In>
  static constexpr double flops = 1.0 * In::dims[0] * geometry<In>.oh() * geometry<In>.ow() * Kernel * Kernel;

  /// "max_pool2d<3,2>"; with padding "max_pool2d<3,2,1>".
  template <class In>
  static void describe(layer_description& d) {
    if constexpr (Pad == 0) d.set_text(name, {Kernel, Stride});
    else d.set_text(name, {Kernel, Stride, Pad});
  }
  /// MaxPool or AveragePool (count_include_pad with padding).
  static std::string onnx(onnx_graph& g, const layer_description&, const std::string& x) {
    return pool2d_onnx(g, x, Kind, Kernel, Stride, Pad);
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

/// Max pooling over Kernel x Kernel windows moved by Stride (default: Kernel), the input padded
/// by Pad (at most Kernel / 2) on every side, as torch.nn.MaxPool2d(Kernel, Stride, Pad).
/// Input shape<C, H, W>; output shape<C, (H + 2 Pad - Kernel) / Stride + 1, likewise W>.
template <std::size_t Kernel, std::size_t Stride = Kernel, std::size_t Pad = 0>
struct max_pool2d : detail::pool2d_layer<pool_kind::max, Kernel, Stride, Pad> {};

/// Average pooling over Kernel x Kernel windows moved by Stride (default: Kernel); same shapes
/// as max_pool2d. With padding it divides by Kernel^2 (torch.nn.AvgPool2d's count_include_pad).
template <std::size_t Kernel, std::size_t Stride = Kernel, std::size_t Pad = 0>
struct avg_pool2d : detail::pool2d_layer<pool_kind::average, Kernel, Stride, Pad> {};

/// Global average pooling: the mean of each channel over the image, (C, H, W) -> (C), as
/// torch.nn.AdaptiveAvgPool2d(1) followed by a flatten (what a ResNet does before its fc). It
/// reads its input in the layout it comes in (plain, channel-blocked or channels-last) and
/// writes plain.
struct global_avg_pool2d {
  static constexpr bool is_loom_layer = true;
  static constexpr const char* name = "global_avg_pool2d";
  template <class In>
  static constexpr bool accepts = In::rank == 3;
  template <std::size_t Index, class In>
  static constexpr bool check() {
    static_assert(In::rank == 3,
                  "loom::global_avg_pool2d needs a 3-D input (channels, height, width) (the layer index and the input "
                  "shape are in the loom::diagnostic:: name the compiler prints)");
    if constexpr (In::rank != 3)
      return detail::fail_with<diagnostic::global_avg_pool2d_at_layer_needs_a_3d_input_but_got<Index, In>>();
    return true;
  }
  template <class In>
  using output_shape = shape<In::dims[0]>;
  template <class In>
  static constexpr std::size_t parameter_count = 0;
  template <class In>
  static constexpr double flops = 1.0 * In::size;

  template <class In>
  static void describe(layer_description& d) {
    d.set_text(name);
  }
  /// GlobalAveragePool, then Flatten from axis 1: (N, C, H, W) -> (N, C).
  static std::string onnx(onnx_graph& g, const layer_description&, const std::string& x) {
    return detail::global_avg_pool2d_onnx(g, x);
  }
  // Its output is plain (layout_effect's default); it holds nothing but its output.

  template <class In, class T, class Backend>
  class impl {
    static constexpr std::size_t c_ = In::dims[0], spatial_ = In::dims[1] * In::dims[2];

   public:
    explicit impl(layer_site) {}
    void initialize(T*, std::uint64_t) const {}
    void forward(const run_context&, const T*, activation<const T, Backend> x, activation<T, Backend>& y,
                 std::size_t batch) {
      dispatch(block(x, batch), [&]<std::size_t B>() {
        Backend::for_each(batch * c_ / B, kernels::global_avg_pool_forward<T, B>{x.data, y.data, c_, spatial_});
      });
      y.format = {};
    }
    void backward(const run_context&, const T*, activation<const T, Backend> x, activation<const T, Backend>, const T* dy,
                  T* dx, T*, std::size_t batch) {
      if (!dx) return;
      dispatch(block(x, batch), [&]<std::size_t B>() {
        Backend::for_each(batch * c_ / B, kernels::global_avg_pool_backward<T, B>{dy, dx, c_, spatial_});
      });
    }

   private:
    static std::size_t block(activation<const T, Backend> x, std::size_t batch) {
      return Backend::channel_block(x.format, batch, c_, In::dims[1], In::dims[2]);
    }
    /// Blocks of 16 or 8 channels; c_ for channels-last (a bf16 convolution's output on the
    /// CPU), whose one block of every channel is read with the same loops; 1 plain.
    template <class F>
    static void dispatch(std::size_t block, F&& f) {
      if (block == 16) f.template operator()<16>();
      else if (block == 8) f.template operator()<8>();
      else if (block == c_) f.template operator()<c_>();
      else f.template operator()<1>();
    }
  };
};

}  // namespace loom

#if defined(LOOM_DEFINITIONS_VISIBLE)
#include "loom/layers/impl/pool2d.ipp"
#endif
