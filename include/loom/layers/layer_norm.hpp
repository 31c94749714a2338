// SPDX-License-Identifier: Apache-2.0
#pragma once
// loom::layer_norm: normalises each sample over all its features (as torch.nn.LayerNorm with
// normalized_shape = the sample's whole shape), with a learned gain and bias per feature.

#include <algorithm>
#include <cstddef>
#include <string>

#include "loom/backend/kernels/normalization.hpp"
#include "loom/core/config.hpp"
#include "loom/core/memory.hpp"
#include "loom/layers/describe.hpp"
#include "loom/layers/layer.hpp"

namespace loom {

/// Layer normalisation, eps = 1e-5. Any input shape; output the same shape. Parameters:
/// In::size gains (init 1), then In::size biases (init 0).
struct layer_norm {
  static constexpr bool is_loom_layer = true;
  static constexpr const char* name = "layer_norm";
  template <class In>
  static constexpr bool accepts = In::size > 1;
  template <std::size_t Index, class In>
  static constexpr bool check() {
    static_assert(In::size > 1,
                  "loom::layer_norm needs at least two features per sample: one feature always normalises to 0 "
                  "(the layer index and the input shape are in the loom::diagnostic:: name the compiler prints)");
    if constexpr (In::size <= 1) return detail::fail_with<diagnostic::layer_norm_at_layer_has_nothing_to_normalise<Index, In>>();
    return true;
  }
  template <class In>
  using output_shape = In;
  template <class In>
  static constexpr std::size_t parameter_count = 2 * In::size;
  template <class In>
  static constexpr double flops = 8.0 * In::size;

  /// As torch.nn.LayerNorm(sample shape): weight and bias of the sample's whole shape.
  template <class In>
  static void describe(layer_description& d) {
    d.set_text("layer_norm");
    d.parameter("weight", In::dims);
    d.parameter("bias", In::dims);
  }
  /// LayerNormalization from axis 1 on, over every dimension of a sample, as loom::layer_norm and
  /// nn.LayerNorm(sample shape) (compiled once: impl/layer_norm.ipp).
  LOOM_DECL static std::string onnx(onnx_graph& g, const layer_description& d, const std::string& x);
  /// The mean and 1/std of each sample; a blocked input is brought to plain (and so is its
  /// gradient, when asked for). The output is plain.
  template <class In, class Backend>
  static constexpr sequence_elements footprint(const footprint_context& c) {
    return {.saved = 2, .scratch = c.input_blocked ? In::size + (c.needs_input_gradient ? In::size : 0) : 0};
  }

  template <class In, class T, class Backend>
  class impl {
    static constexpr std::size_t w_ = In::size;

   public:
    explicit impl(layer_site) {}
    void initialize(T* params, std::uint64_t) const {
      for (std::size_t j = 0; j < w_; ++j) params[j] = T(1);
      std::fill_n(params + w_, w_, T(0));
    }
    void forward(const run_context&, const T* params, activation<const T, Backend> x, activation<T, Backend>& y,
                 std::size_t batch) {
      mean_.reserve_discard(batch);
      rstd_.reserve_discard(batch);
      const T* px = conv_.template to_plain<T, In>(x.data, x.format, batch);
      Backend::for_each(batch, kernels::layer_norm_forward_row<T>{px, params, params + w_, y.data, mean_.data(),
                                                                  rstd_.data(), w_, T(1e-5)});
      y.format = {};
    }
    void backward(const run_context& ctx, const T* params, activation<const T, Backend> x, activation<const T, Backend>,
                  const T* dy, T* dx, T* dparams, std::size_t batch) {
      const T* px = conv_.template to_plain<T, In>(x.data, x.format, batch);
      Backend::for_each(w_, kernels::layer_norm_param_grad<T>{px, dy, mean_.data(), rstd_.data(), dparams, dparams + w_,
                                                              batch, w_, ctx.accumulate});
      if (!dx) return;
      if (x.format.plain()) {
        Backend::for_each(batch, kernels::layer_norm_backward_row<T>{px, params, dy, mean_.data(), rstd_.data(), dx, w_});
      } else {
        dx_plain_.reserve_discard(batch * w_);
        Backend::for_each(batch, kernels::layer_norm_backward_row<T>{px, params, dy, mean_.data(), rstd_.data(),
                                                                     dx_plain_.data(), w_});
        conv_.template from_plain<T, In>(dx_plain_.data(), x.format, dx, batch);
      }
    }

   private:
    buffer<T, typename Backend::memory_space> mean_, rstd_, dx_plain_;
    typename Backend::layout_converter conv_;
  };
};

}  // namespace loom

#if defined(LOOM_DEFINITIONS_VISIBLE)
#include "loom/layers/impl/layer_norm.ipp"
#endif
