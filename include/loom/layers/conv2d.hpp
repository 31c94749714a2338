// SPDX-License-Identifier: Apache-2.0
#pragma once
// loom::conv2d<OutChannels, Kernel, Stride, Pad, Options...>: a 2-D convolution over (C, H, W)
// inputs with square windows and equal padding on every side. Weights are (OutChannels, C, K, K),
// then OutChannels biases (none with the option loom::no_bias). The backend runs it (oneDNN on
// the CPU, cuDNN on the GPU), in the run's math mode (ctx.math).

#include <algorithm>
#include <cstddef>
#include <concepts>
#include <cstdint>
#include <string>
#include <type_traits>

#include "loom/core/config.hpp"
#include "loom/core/geometry.hpp"
#include "loom/layers/describe.hpp"
#include "loom/layers/layer.hpp"

namespace loom {

namespace detail {
/// Whether Backend keeps activations in layouts of its own (oneDNN's nChw16c): its format holds
/// a layout; loom::cuda's is always plain.
template <class Backend>
constexpr bool layouts_can_block() {
  return !std::is_empty_v<typename Backend::format>;
}
/// The memory plan's model of oneDNN's choice: a convolution computes in a channel-blocked
/// layout (nChw8c, nChw16c) when its channels split into blocks of 8 without padding, and in
/// plain NCHW otherwise (loom refuses padded layouts, and oneDNN's kernels for few input
/// channels, an image's 1 or 3, read plain NCHW). Exact with oneDNN 2.6 on AVX-512; on AVX2 the
/// backward of a convolution of 1 input channel pads its input and weight gradient to 8
/// channels besides (docs/memory-plan.md).
template <class Backend>
constexpr bool blocks_channels(std::size_t channels) {
  return layouts_can_block<Backend>() && channels % 8 == 0;
}

/// conv2d's ONNX node (compiled once: impl/conv2d.ipp); without bias when bias is false.
LOOM_DECL std::string conv2d_onnx(onnx_graph& g, const layer_description& d, const std::string& x, std::int64_t kernel,
                                  std::int64_t stride, std::int64_t pad, bool bias = true);

/// An initialiser (init::he, init::xavier, one of your own): it has stddev(fan_in, fan_out).
template <class O>
concept initialiser = requires { { O::stddev(std::size_t{1}, std::size_t{1}) } -> std::convertible_to<double>; };

/// The initialiser among conv2d's Options (init::he when none is).
template <class... Options>
struct init_among {
  using type = init::he;
};
template <class First, class... Rest>
struct init_among<First, Rest...> {
  using type = std::conditional_t<initialiser<First>, First, typename init_among<Rest...>::type>;
};
}  // namespace detail

/// Option of loom::conv2d: no bias (its convolution is followed by a normalisation that has one,
/// as in ResNets). Its description then has no bias tensor (torch.nn.Conv2d(..., bias=False)).
struct no_bias {};

/// 2-D convolution. Input shape<C, H, W>; output shape<OutChannels, OH, OW> with
/// OH = (H + 2 Pad - Kernel) / Stride + 1 (likewise OW). Options, in any order: an initialiser
/// (init::he, the default, or init::xavier) and loom::no_bias. Init: He normal weights, zero
/// biases.
template <std::size_t OutChannels, std::size_t Kernel, std::size_t Stride = 1, std::size_t Pad = 0, class... Options>
struct conv2d {
  static constexpr bool is_loom_layer = true;
  static constexpr const char* name = "conv2d";
  /// Whether it adds a bias per output channel (not with loom::no_bias).
  static constexpr bool has_bias = !(std::is_same_v<Options, no_bias> || ...);
  using Init = typename detail::init_among<Options...>::type;
  static_assert(((std::is_same_v<Options, no_bias> || detail::initialiser<Options>) && ...),
                "loom::conv2d's options after Pad are an initialiser (loom::init::he, loom::init::xavier) and "
                "loom::no_bias");

  template <class In>
  static constexpr bool fits() {
    if constexpr (In::rank != 3) return false;
    else return Kernel <= In::dims[1] + 2 * Pad && Kernel <= In::dims[2] + 2 * Pad;
  }
  template <class In>
  static constexpr bool accepts = fits<In>();

  template <std::size_t Index, class In>
  static constexpr bool check() {
    static_assert(OutChannels > 0 && Kernel > 0 && Stride > 0,
                  "loom::conv2d needs OutChannels, Kernel and Stride > 0 (the layer index and the three values are "
                  "in the loom::diagnostic:: name the compiler prints)");
    if constexpr (OutChannels == 0 || Kernel == 0 || Stride == 0)
      return detail::fail_with<
          diagnostic::conv2d_at_layer_needs_positive_channels_kernel_and_stride<Index, OutChannels, Kernel, Stride>>();
    else return check_input<Index, In>();
  }
  /// The checks of the input shape, once the layer's own values are sound.
  template <std::size_t Index, class In>
  static constexpr bool check_input() {
    static_assert(In::rank == 3,
                  "loom::conv2d needs a 3-D input (channels, height, width): give loom::input<C, H, W> "
                  "(the layer index and the input shape are in the loom::diagnostic:: name the compiler prints)");
    if constexpr (In::rank != 3) {
      return detail::fail_with<diagnostic::conv2d_at_layer_needs_a_3d_input_but_got<Index, In>>();
    } else {
      static_assert(fits<In>(),
                    "loom::conv2d's window is larger than its padded input: use a smaller Kernel, more padding, "
                    "or fewer pooling layers before it (layer index, input shape, kernel and padding are in the "
                    "loom::diagnostic:: name the compiler prints)");
      if constexpr (!fits<In>())
        return detail::fail_with<diagnostic::conv2d_window_larger_than_padded_input_at_layer<Index, In, Kernel, Pad>>();
      return true;
    }
  }

  template <class In>
  static constexpr conv2d_geometry geometry{In::dims[0], In::dims[1], In::dims[2], OutChannels, Kernel, Stride, Pad,
                                            has_bias};
  template <class In>
  using output_shape = shape<OutChannels, geometry<In>.oh(), geometry<In>.ow()>;
  template <class In>
  static constexpr std::size_t parameter_count = OutChannels * In::dims[0] * Kernel * Kernel + (has_bias ? OutChannels : 0);
  template <class In>
  static constexpr double flops = 2.0 * OutChannels * geometry<In>.oh() * geometry<In>.ow() * In::dims[0] * Kernel * Kernel;

  /// As torch.nn.Conv2d(C, OutChannels, Kernel, Stride, Pad): weight (OutChannels, C, K, K), bias
  /// (OutChannels); with loom::no_bias (bias=False) no bias, and the text "conv2d_no_bias<...>".
  template <class In>
  static void describe(layer_description& d) {
    d.set_text(has_bias ? "conv2d" : "conv2d_no_bias", {OutChannels, Kernel, Stride, Pad});
    d.parameter("weight", {OutChannels, In::dims[0], Kernel, Kernel});
    if constexpr (has_bias) d.parameter("bias", {OutChannels});
  }
  /// Conv with square windows, the same padding on every side.
  static std::string onnx(onnx_graph& g, const layer_description& d, const std::string& x) {
    return detail::conv2d_onnx(g, d, x, Kernel, Stride, Pad, has_bias);
  }
  /// The backend's plan (cpu_conv2d_plan) holds the weights reordered for forward and for
  /// backward-data (only when dx is asked for) and the weight gradient in the primitive's layout,
  /// and when gradients accumulate, a plain copy of it and the bias gradient; a plain input with
  /// channels oneDNN blocks is reordered (for forward and backward-weights, one scratch), and so
  /// is its gradient, back to plain. Nothing on a backend whose layouts are always plain.
  template <class In, class Backend>
  static constexpr sequence_elements footprint(const footprint_context& c) {
    sequence_elements e;
    if constexpr (detail::layouts_can_block<Backend>()) {
      constexpr std::size_t w = OutChannels * In::dims[0] * Kernel * Kernel;
      e.fixed_scratch = w * (c.needs_input_gradient ? 3 : 2) + (c.accumulates ? w + (has_bias ? OutChannels : 0) : 0);
      if (!c.input_blocked && detail::blocks_channels<Backend>(In::dims[0]))
        e.scratch = In::size + (c.needs_input_gradient ? In::size : 0);
    }
    return e;
  }
  /// Its output comes in the layout the backend computes in.
  template <class In, class Backend>
  static constexpr layout_effect layout =
      detail::blocks_channels<Backend>(OutChannels) ? layout_effect::blocks : layout_effect::plain;

  template <class In, class T, class Backend>
  class impl {
    static constexpr conv2d_geometry g_ = geometry<In>;

   public:
    explicit impl(layer_site site) : site_(site), plan_(g_) {}

    /// The network calls this when a loom::relu follows: forward then writes the ReLU's output
    /// (one pass over the activation instead of two) and the relu layer passes it through.
    void fuse_relu() { plan_.fuse_relu(); }

    /// On the CPU a bf16 convolution reads its input's bf16 copy (activation::bf16) and its
    /// output gradient's (take_output_gradient_bf16, before backward) where the layers next to
    /// it wrote them, instead of converting.
    static constexpr bool reads_bf16_input = detail::reads_bf16_copies<Backend>;
    void take_output_gradient_bf16(const std::uint16_t* dy_bf16) { dy_bf16_ = dy_bf16; }

    /// Whether, under ctx's math on a batch in layout xf, forward given its input's bf16 copy
    /// and backward given its output gradient's read nothing else of them (the plan's
    /// reads_copies_only): the layers next to it may then write those copies alone.
    bool reads_input_copy_only(const run_context& ctx, const typename Backend::format& xf, std::size_t batch) {
      if constexpr (requires { plan_.reads_copies_only(batch, xf, ctx.math); })
        return plan_.reads_copies_only(batch, xf, ctx.math).input;
      else return false;
    }
    bool reads_output_gradient_copy_only(const run_context& ctx, const typename Backend::format& xf,
                                         std::size_t batch) {
      if constexpr (requires { plan_.reads_copies_only(batch, xf, ctx.math); })
        return plan_.reads_copies_only(batch, xf, ctx.math).output_gradient;
      else return false;
    }

    void initialize(T* params, std::uint64_t seed) const {
      const std::size_t fan_in = g_.c * Kernel * Kernel, fan_out = OutChannels * Kernel * Kernel;
      detail::fill_normal(params, g_.weight_count(), Init::stddev(fan_in, fan_out), seed, site_.stream);
      if constexpr (has_bias) std::fill_n(params + g_.weight_count(), OutChannels, T(0));
    }

    void forward(const run_context& ctx, const T* params, activation<const T, Backend> x, activation<T, Backend>& y,
                 std::size_t batch) {
      const T* b = has_bias ? params + g_.weight_count() : nullptr;
      if constexpr (detail::reads_bf16_copies<Backend>)
        y.format = plan_.forward(x.data, x.format, params, b, y.data, batch, ctx.math, x.bf16);
      else
        y.format = plan_.forward(x.data, x.format, params, b, y.data, batch, ctx.math);
    }

    void backward(const run_context& ctx, const T* params, activation<const T, Backend> x, activation<const T, Backend>,
                  const T* dy, T* dx, T* dparams, std::size_t batch) {
      T* db = has_bias ? dparams + g_.weight_count() : nullptr;
      const std::uint16_t* dy_bf16 = dy_bf16_;
      dy_bf16_ = nullptr;  // this backward's only
      if constexpr (detail::reads_bf16_copies<Backend>)
        plan_.backward(x.data, x.format, params, dy, dx, dparams, db, batch, ctx.accumulate, ctx.math, dy_bf16);
      else
        plan_.backward(x.data, x.format, params, dy, dx, dparams, db, batch, ctx.accumulate, ctx.math);
    }

   private:
    const std::uint16_t* dy_bf16_ = nullptr;
    layer_site site_;
    typename Backend::template conv2d_plan<T> plan_;
  };
};

}  // namespace loom

#if defined(LOOM_DEFINITIONS_VISIBLE)
#include "loom/layers/impl/conv2d.ipp"
#endif
