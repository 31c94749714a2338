// SPDX-License-Identifier: Apache-2.0
#pragma once
// What every layer is: a descriptor type (loom::linear<128>) that, bound to an input shape,
// states its output shape and parameter count as compile-time facts, checks its input with
// readable static_asserts, and names the implementation that runs forward and backward on a
// backend. The layers themselves live beside this file.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "loom/core/config.hpp"
#include "loom/core/math_mode.hpp"
#include "loom/core/process_group.hpp"
#include "loom/core/random.hpp"
#include "loom/core/shape.hpp"

namespace loom {

/// A batch of activations on a backend: the data and its physical layout.
template <class T, class Backend>
struct activation {
  T* data = nullptr;
  typename Backend::format format{};
  /// The same values rounded to bf16 (their 16 bits, to nearest even, in the same layout), when
  /// the layer that wrote them wrote this copy as it went (a residual block's sum, under
  /// math_mode::bf16 on a backend whose convolutions read it: detail::reads_bf16_copies): a bf16
  /// convolution reads it instead of converting the data again. Null otherwise; valid as long
  /// as data is (until its writer's next forward).
  const std::uint16_t* bf16 = nullptr;

  activation() = default;
  activation(T* d, typename Backend::format f = {}, const std::uint16_t* b = nullptr)
      : data(d), format(std::move(f)), bf16(b) {}
  /// A mutable activation is readable as a const one.
  template <class U>
    requires(std::is_same_v<const U, T> && !std::is_same_v<U, T>)
  activation(const activation<U, Backend>& o) : data(o.data), format(o.format), bf16(o.bf16) {}
};

namespace detail {
/// Whether Backend's convolutions read an activation's bf16 copy (Backend::reads_bf16_copies), so
/// that a layer writing float activations for them writes that copy too under math_mode::bf16.
template <class Backend>
inline constexpr bool reads_bf16_copies = [] {
  if constexpr (requires { Backend::reads_bf16_copies; }) return static_cast<bool>(Backend::reads_bf16_copies);
  else return false;
}();
/// Whether a layer implementation reads bf16 copies of its input and of its output gradient
/// (Impl::reads_bf16_input: a convolution on such a backend). A sequence tells the layers next
/// to it to write them (write_bf16_output, write_bf16_input_gradient, where they have them).
template <class Impl>
inline constexpr bool reads_bf16_input = [] {
  if constexpr (requires { Impl::reads_bf16_input; }) return static_cast<bool>(Impl::reads_bf16_input);
  else return false;
}();
}  // namespace detail

/// The ranks that share a tensor-parallel layer's weights (loom::column_parallel,
/// loom::row_parallel): they see the same samples and each holds a slice of the weights. The
/// engine that runs tensor parallelism implements it over its communicator.
struct tensor_group : process_group {};

/// What a forward or backward call needs to know besides the data.
struct run_context {
  /// Training (dropout active, saving for backward) or evaluation.
  bool training = true;
  /// Add parameter gradients to the gradient buffer instead of overwriting it.
  bool accumulate = false;
  /// Seed of the run; with `step` it makes dropout masks reproducible.
  std::uint64_t seed = 0;
  /// Index of the training step (micro-step) being run.
  std::uint64_t step = 0;
  /// Index of this batch's first sample within the global batch (non-zero on data-parallel
  /// ranks after the first), so per-sample randomness is the same however the batch is split.
  std::size_t sample_offset = 0;
  /// The tensor-parallel group of this rank (null when the model is not split by tensor
  /// parallelism; a column/row-parallel layer then holds its whole weight).
  tensor_group* tensor = nullptr;
  /// The data-parallel replicas of this rank, for layers whose statistics span the global batch
  /// (loom::batch_norm sums its per-channel sums over them when set: synchronized batch norm).
  /// Null: each replica's statistics are its own (no engine sets it yet; docs/perception.md).
  process_group* replicas = nullptr;
  /// The precision of matrix products and convolutions (trainer_options::math): fp32, or bf16
  /// operands with float accumulation. Parameters, gradients and activations stay float.
  math_mode math = math_mode::fp32;
};

/// Parameter initialisation schemes for layers with weights.
namespace init {
/// He (Kaiming) normal: N(0, 2 / fan_in). For layers followed by ReLU-like activations.
struct he {
  static constexpr double stddev(std::size_t fan_in, std::size_t) { return sqrt_(2.0 / static_cast<double>(fan_in)); }
  static constexpr double sqrt_(double v) {
    double x = v > 1 ? v : 1.0;
    for (int i = 0; i < 64; ++i) x = 0.5 * (x + v / x);
    return x;
  }
};
/// Xavier (Glorot) normal: N(0, 2 / (fan_in + fan_out)). For tanh / sigmoid networks.
struct xavier {
  static constexpr double stddev(std::size_t fan_in, std::size_t fan_out) {
    return he::sqrt_(2.0 / static_cast<double>(fan_in + fan_out));
  }
};
}  // namespace init

/// Where a layer sits: its index in the network (nested layers use their index in the inner
/// stack, offset by the residual's stream) and the random stream of its parameters. The stream
/// depends only on the layer's position in the model, never on how the model is run or split.
struct layer_site {
  std::size_t index = 0;
  std::uint64_t stream = 0;
  /// This rank's slice of tensor-parallel layers: slice `shard` of `shards` (0 of 1 when the
  /// model is not split). Layers that are not tensor-parallel ignore it.
  std::size_t shard = 0;
  std::size_t shards = 1;
};

/// Which slice of the tensor-parallel layers a model holds.
struct tensor_shard {
  std::size_t rank = 0;
  std::size_t count = 1;
};

namespace detail {
/// Fills w[0, n) with N(0, stddev^2) values drawn by counter from (seed, stream).
template <class T>
void fill_normal(T* w, std::size_t n, double stddev, std::uint64_t seed, std::uint64_t stream) {
  for (std::size_t i = 0; i < n; ++i) w[i] = static_cast<T>(stddev * normal_at(seed, stream, i));
}
}  // namespace detail

/// A layer descriptor L accepts input shape In. Every layer has:
///   template <class In> static constexpr bool accepts;         — whether In is a valid input
///   template <std::size_t Index, class In> static constexpr bool check();  — the same, with
///         static_asserts that say why not (Index is the layer's position for the message)
///   template <class In> using output_shape;                     — valid only when accepts<In>
///   template <class In> static constexpr std::size_t parameter_count;
///   template <class In> static constexpr double flops;         — forward, per sample
///   template <class In> static constexpr std::size_t buffer_count;  — optional: values it holds
///         that are not trained (running statistics; detail::buffer_count_of)
///   template <class In, class T, class Backend> class impl;     — forward / backward
/// impl::initialize(params, seed) writes the layer's initial parameters to host memory (the
/// model copies them to the backend's memory space); forward and backward work on memory of
/// the backend's space. Beside those it describes itself (loom/layers/describe.hpp: describe
/// and onnx for the file formats, footprint and layout for the memory plan; or a
/// loom::layer_traits specialisation); docs/layers.md lists them all.
template <class L, class In>
concept layer_for = shape_type<In> && requires {
  { L::template accepts<In> } -> std::convertible_to<bool>;
  { L::template parameter_count<In> } -> std::convertible_to<std::size_t>;
  typename L::template output_shape<In>;
};

/// Marker templates: never defined. When a composition is wrong, loom names one of these in a
/// failing expression so the compiler prints the layer index and the shapes involved — search
/// the compiler output for "loom::diagnostic::".
namespace diagnostic {
template <std::size_t LayerIndex, class InputShape>
struct linear_at_layer_needs_a_1d_input_but_got;
template <std::size_t LayerIndex, class InputShape>
struct conv2d_at_layer_needs_a_3d_input_but_got;
template <std::size_t LayerIndex, class InputShape, std::size_t Kernel, std::size_t Padding>
struct conv2d_window_larger_than_padded_input_at_layer;
template <std::size_t LayerIndex, class InputShape>
struct pool2d_at_layer_needs_a_3d_input_but_got;
template <std::size_t LayerIndex, class InputShape, std::size_t Kernel>
struct pool2d_window_larger_than_input_at_layer;
template <std::size_t LayerIndex, class InputShape, class InnerOutputShape>
struct residual_at_layer_changes_the_shape;
template <std::size_t LayerIndex, class Layer>
struct not_a_loom_layer_at_layer;
template <class NetworkOutputShape, std::size_t Classes>
struct loss_width_does_not_match_classes;
template <class NetworkInputShape, class SampleShape>
struct network_input_does_not_match_samples;
template <std::size_t LayerIndex, class InputShape>
struct layer_norm_at_layer_has_nothing_to_normalise;
template <std::size_t LayerIndex>
struct linear_at_layer_has_zero_outputs;
template <std::size_t LayerIndex, std::size_t OutChannels, std::size_t Kernel, std::size_t Stride>
struct conv2d_at_layer_needs_positive_channels_kernel_and_stride;
template <std::size_t LayerIndex, std::size_t Kernel, std::size_t Stride>
struct pool2d_at_layer_needs_positive_kernel_and_stride;
template <std::size_t LayerIndex, unsigned Percent>
struct dropout_at_layer_needs_a_rate_below_100_percent;
template <std::size_t LayerIndex>
struct residual_at_layer_has_no_inner_layers;
template <std::size_t LayerIndex, class InputShape>
struct batch_norm_at_layer_needs_a_1d_or_3d_input_but_got;
template <std::size_t LayerIndex, class InputShape>
struct global_avg_pool2d_at_layer_needs_a_3d_input_but_got;
template <std::size_t LayerIndex, std::size_t Kernel, std::size_t Padding>
struct pool2d_padding_larger_than_half_the_window_at_layer;
template <std::size_t LayerIndex, class InputShape, class MainBranchOutputShape, class ShortcutOutputShape>
struct residual_with_at_layer_adds_branches_of_different_shapes;
template <std::size_t LayerIndex>
struct residual_with_at_layer_has_no_main_branch_layers;
}  // namespace diagnostic

namespace detail {
template <class L, class In>
concept declares_buffers = requires { { L::template buffer_count<In> } -> std::convertible_to<std::size_t>; };

/// The buffers layer L holds on input In: values that are part of the model but not trained
/// (loom::batch_norm's running statistics), in the network's flat buffer of buffers beside the
/// parameters. Its `template <class In> static constexpr std::size_t buffer_count`, or none. A
/// layer with buffers gives its impl initialize_buffers(T*) (host memory) and bind_buffers(T*)
/// (where they live, the backend's memory), and describes them (layer_description::buffer).
template <class L, class In>
constexpr std::size_t buffer_count_of() {
  if constexpr (declares_buffers<L, In>) return L::template buffer_count<In>;
  else return 0;
}

/// A layer (or a network's layers) already reported as wrong: accepts nothing and says nothing,
/// so that code using it adds no errors to the report.
struct already_reported {
  static constexpr bool is_loom_layer = true;
  template <class In>
  static constexpr bool accepts = false;
  template <std::size_t Index, class In>
  static constexpr bool check() {
    return false;
  }
  template <class In>
  using output_shape = In;
  template <class In>
  static constexpr std::size_t parameter_count = 0;
  template <class In>
  static constexpr double flops = 0;
};

/// Calling this fails with the marker's name (and values) in the message. consteval: the call
/// is evaluated (so the error is reported) where it is written, even in a run-time function.
/// The error is a declaration, not the returned value, so the call still gives a constant
/// (false) and GCC and Clang report nothing more about the code that asked.
template <class Marker>
consteval bool fail_with() {
  using marker_is_never_defined [[maybe_unused]] = typename Marker::loom_diagnostic;
  return false;
}
}  // namespace detail

}  // namespace loom
