// SPDX-License-Identifier: Apache-2.0
#pragma once
// loom::flatten: any shape to the 1-D shape of the same size, in row-major order (as
// torch.flatten on NCHW). Converts a backend-chosen layout back to plain.

#include <cstddef>
#include <string>

#include "loom/core/config.hpp"
#include "loom/layers/describe.hpp"
#include "loom/layers/layer.hpp"

namespace loom {

/// Reshapes shape<D...> to shape<(D * ...)>. No parameters.
struct flatten {
  static constexpr bool is_loom_layer = true;
  static constexpr const char* name = "flatten";
  template <class In>
  static constexpr bool accepts = true;
  template <std::size_t Index, class In>
  static constexpr bool check() { return true; }
  template <class In>
  using output_shape = shape<In::size>;
  template <class In>
  static constexpr std::size_t parameter_count = 0;
  template <class In>
  static constexpr double flops = 0;

  template <class In>
  static void describe(layer_description& d) {
    d.set_text("flatten");
  }
  /// Flatten(axis=1) (compiled once: impl/flatten.ipp).
  LOOM_DECL static std::string onnx(onnx_graph& g, const layer_description& d, const std::string& x);
  /// A blocked input is brought to plain first (its layout converter's buffer); the output is plain.
  template <class In, class Backend>
  static constexpr sequence_elements footprint(const footprint_context& c) {
    return {.scratch = c.input_blocked ? In::size : 0};
  }

  template <class In, class T, class Backend>
  class impl {
   public:
    explicit impl(layer_site) {}
    void initialize(T*, std::uint64_t) const {}
    void forward(const run_context&, const T*, activation<const T, Backend> x, activation<T, Backend>& y,
                 std::size_t batch) {
      if (x.format.plain())
        Backend::copy(y.data, x.data, batch * In::size);
      else
        Backend::copy(y.data, conv_.template to_plain<T, In>(x.data, x.format, batch), batch * In::size);
      y.format = {};
    }
    void backward(const run_context&, const T*, activation<const T, Backend> x, activation<const T, Backend>, const T* dy,
                  T* dx, T*, std::size_t batch) {
      if (dx) conv_.template from_plain<T, In>(dy, x.format, dx, batch);
    }

   private:
    typename Backend::layout_converter conv_;
  };
};

}  // namespace loom

#if defined(LOOM_DEFINITIONS_VISIBLE)
#include "loom/layers/impl/flatten.ipp"
#endif
