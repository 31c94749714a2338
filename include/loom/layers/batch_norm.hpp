// SPDX-License-Identifier: Apache-2.0
#pragma once
// loom::batch_norm: batch normalisation as torch.nn.BatchNorm2d (an image's channels, over the
// batch and the image) and BatchNorm1d (a vector's features, over the batch), momentum 0.1,
// eps 1e-5, with a learned weight and bias per channel. Its running statistics are buffers: part
// of the model (saved, checkpointed, exported) but not trained. The backend runs it (oneDNN on
// the CPU, with the ReLU after it fused in; cuDNN on the GPU).

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "loom/backend/kernels/activation.hpp"
#include "loom/backend/kernels/normalization.hpp"
#include "loom/core/config.hpp"
#include "loom/core/error.hpp"
#include "loom/core/geometry.hpp"
#include "loom/core/memory.hpp"
#include "loom/layers/describe.hpp"
#include "loom/layers/layer.hpp"

namespace loom {

namespace detail {
/// batch_norm's ONNX node (compiled once: impl/batch_norm.ipp).
LOOM_DECL std::string batch_norm_onnx(onnx_graph& g, const layer_description& d, const std::string& x);
/// "loom::batch_norm at layer i: expected more than 1 value per channel when training, ..." (as
/// PyTorch refuses it: a channel of one value normalises to nothing).
[[noreturn]] LOOM_DECL void batch_norm_single_value(std::size_t layer, std::size_t batch, std::size_t channels,
                                                    std::size_t spatial);
/// A backend's batch norm plan that can say whether its next backward applies the gradient of
/// a fused ReLU itself (cpu_batch_norm_plan: oneDNN's backward does). A concept of its own, as
/// nvcc 13 fails to evaluate a requires-expression in place.
template <class Plan>
concept plan_applies_fused_relu = requires(const Plan& p) {
  { p.backward_applies_fused_relu() } -> std::convertible_to<bool>;
};
}  // namespace detail

/// Batch normalisation, per channel of a (C, H, W) input or per feature of a (C) one.
///
/// Training normalises each channel with the batch's mean and (biased) variance, and moves the
/// running statistics toward them: running_mean = 0.9 running_mean + 0.1 mean, running_var =
/// 0.9 running_var + 0.1 var n / (n - 1) (unbiased), n the channel's values in the batch; it
/// counts the batches (num_batches_tracked). Evaluation normalises with the running statistics.
/// y = (x - mean) / sqrt(var + 1e-5) * weight + bias.
///
/// Parameters: weight (C, init 1), then bias (C, init 0). Buffers (loom::tensor_kind::buffer):
/// running_mean (C, init 0), running_var (C, init 1), num_batches_tracked (a count: int64 in the
/// files, as PyTorch has it). Statistics and parameters stay float in bf16 math.
///
/// Throws (forward, training): loom::invalid_argument when a channel has one value in the batch
/// (a batch of 1 on a (C) input, or of 1 on a (C, 1, 1) one), as PyTorch does.
struct batch_norm {
  static constexpr bool is_loom_layer = true;
  static constexpr const char* name = "batch_norm";
  /// PyTorch's defaults.
  static constexpr double momentum = 0.1;
  static constexpr double eps = 1e-5;

  template <class In>
  static constexpr bool accepts = In::rank == 1 || In::rank == 3;
  template <std::size_t Index, class In>
  static constexpr bool check() {
    static_assert(In::rank == 1 || In::rank == 3,
                  "loom::batch_norm needs a 1-D input (features) or a 3-D one (channels, height, width) (the layer "
                  "index and the input shape are in the loom::diagnostic:: name the compiler prints)");
    if constexpr (In::rank != 1 && In::rank != 3)
      return detail::fail_with<diagnostic::batch_norm_at_layer_needs_a_1d_or_3d_input_but_got<Index, In>>();
    return true;
  }
  template <class In>
  static constexpr std::size_t channels = In::dims[0];
  template <class In>
  using output_shape = In;
  template <class In>
  static constexpr std::size_t parameter_count = 2 * channels<In>;
  /// running_mean, running_var, num_batches_tracked.
  template <class In>
  static constexpr std::size_t buffer_count = 2 * channels<In> + 1;
  template <class In>
  static constexpr double flops = 4.0 * In::size;

  template <class In>
  static constexpr batch_norm_geometry geometry = [] {
    if constexpr (In::rank == 3) return batch_norm_geometry{In::dims[0], In::dims[1], In::dims[2], 3, eps};
    else return batch_norm_geometry{In::dims[0], 1, 1, 1, eps};
  }();

  /// As torch.nn.BatchNorm2d(C) (BatchNorm1d(C) on a vector): weight and bias (C); buffers
  /// running_mean, running_var (C) and num_batches_tracked (a scalar, int64).
  template <class In>
  static void describe(layer_description& d) {
    d.set_text("batch_norm");
    d.parameter("weight", {channels<In>});
    d.parameter("bias", {channels<In>});
    d.buffer("running_mean", {channels<In>});
    d.buffer("running_var", {channels<In>});
    d.buffer("num_batches_tracked", {}, tensor_element::int64);
  }
  /// BatchNormalization (inference: the running statistics), epsilon 1e-5.
  static std::string onnx(onnx_graph& g, const layer_description& d, const std::string& x) {
    return detail::batch_norm_onnx(g, d, x);
  }
  /// The CPU's plan (cpu_batch_norm_plan) keeps the batch's mean and variance (C each), the
  /// fused ReLU's mask (one byte per element, in floats), the input gradient when none is asked
  /// for (a first layer), and when gradients accumulate, its parameter gradients before they are
  /// added; on an image, what its own passes take when they run (channels-last, or synchronized:
  /// rows_scratch_per_channel floats per channel). It keeps its input's layout. Nothing counted on
  /// other backends.
  template <class In, class Backend>
  static constexpr sequence_elements footprint(const footprint_context& c) {
    sequence_elements e;
    if constexpr (!std::is_empty_v<typename Backend::format>) {  // loom::cpu: its format holds a layout
      e.fixed_scratch = 2 * channels<In> + (c.accumulates ? 2 * channels<In> : 0) +
                        (In::rank == 3 ? rows_scratch_per_channel * channels<In> + 2 : 0);
      e.saved = c.relu_fused_after ? (In::size + sizeof(float) - 1) / sizeof(float) : 0;
      e.scratch = c.needs_input_gradient ? 0 : In::size;
    }
    return e;
  }
  /// The CPU's own passes' scratch per channel, in floats: each of at most 32 shares' two
  /// partial sums (double: 128), the forward's and backward's sums (double: 4 + 4; 2 more floats
  /// for the count), 1 / std, backward's three coefficients and forward's scale and shift (6).
  /// detail::batch_norm_rows_partials agrees (a test checks).
  static constexpr std::size_t rows_scratch_per_channel = 128 + 8 + 6;
  template <class In, class Backend>
  static constexpr layout_effect layout = layout_effect::keeps;

  template <class In, class T, class Backend>
  class impl {
    static constexpr batch_norm_geometry g_ = geometry<In>;
    static constexpr std::size_t c_ = g_.c;
    using plan_type = typename Backend::template batch_norm_plan<T>;
    // Its plan writes bf16 copies (loom::cpu's float one).
    static constexpr bool copies = std::is_same_v<T, float> && detail::reads_bf16_copies<Backend>;

   public:
    explicit impl(layer_site site) : index_(site.index), plan_(g_) {}

    /// The network calls this when a loom::relu follows: forward then writes the ReLU's output.
    void fuse_relu() {
      plan_.fuse_relu();
      relu_ = true;
    }
    /// With a fused ReLU, backward takes the gradient of the ReLU's output and applies the
    /// ReLU's gradient itself (oneDNN's backward does, from its mask, and loom's own passes, from
    /// x and forward's scale and shift; otherwise one pass here, from y): the network runs no
    /// backward of the ReLU (detail::backward_fused_into_previous).
    static constexpr bool applies_fused_relu_gradient = true;

    /// The network calls these when a convolution that reads bf16 copies comes after it (past
    /// a fused ReLU), and right before it: under bf16 math its own passes run on channels-last
    /// (loom's rows, cpu_batch_norm_plan::own_rows) and write y's bf16 copy (activation::bf16),
    /// and dx's (input_gradient_bf16), as they go.
    void write_bf16_output() { bf16_output_ = true; }
    void write_bf16_input_gradient() { bf16_gradient_ = true; }
    /// The network calls these right before a forward (a backward) when that convolution reads
    /// the copy and nothing else of y (of dx; conv2d's reads_input_copy_only,
    /// reads_output_gradient_copy_only): where the copy is written, y's (dx's) float values
    /// then are not. For that pass only.
    void write_output_copy_only() { output_copy_only_ = true; }
    void write_input_gradient_copy_only() { gradient_copy_only_ = true; }
    /// The last backward's dx in bf16, or null.
    const std::uint16_t* input_gradient_bf16() const {
      if constexpr (copies) return plan_.input_gradient_bf16();
      else return nullptr;
    }

    void initialize(T* params, std::uint64_t) const {
      std::fill_n(params, c_, T(1));
      std::fill_n(params + c_, c_, T(0));
    }
    void initialize_buffers(T* buffers) const {
      std::fill_n(buffers, c_, T(0));
      std::fill_n(buffers + c_, c_, T(1));
      buffers[2 * c_] = T(0);
    }
    void bind_buffers(T* buffers) { running_ = buffers; }

    void forward(const run_context& ctx, const T* params, activation<const T, Backend> x, activation<T, Backend>& y,
                 std::size_t batch) {
      if (!running_)
        throw error("loom::batch_norm at layer " + std::to_string(index_) +
                    ": its running statistics are not bound (a loom::sequence run without a loom::model must be given "
                    "bind_buffers() first)");
      [[maybe_unused]] const bool copy_only = std::exchange(output_copy_only_, false);
      if (!ctx.training) {
        y.format = plan_.forward_inference(x.data, x.format, params, params + c_, running_, running_ + c_, y.data, batch);
        return;
      }
      if (batch * g_.spatial() <= 1 && !(ctx.replicas && ctx.replicas->size() > 1))
        detail::batch_norm_single_value(index_, batch, c_, g_.spatial());
      if constexpr (copies) {
        y.format = plan_.forward_training(x.data, x.format, params, params + c_, y.data, running_, running_ + c_,
                                          momentum, batch, ctx.replicas, bf16_output_ && ctx.math == math_mode::bf16,
                                          bf16_gradient_ && ctx.math == math_mode::bf16,
                                          copy_only);
        y.bf16 = plan_.output_bf16();
      } else {
        y.format = plan_.forward_training(x.data, x.format, params, params + c_, y.data, running_, running_ + c_,
                                          momentum, batch, ctx.replicas);
      }
      Backend::for_each(1, kernels::batch_norm_count<T>{running_ + 2 * c_});
    }

    void backward(const run_context& ctx, const T* params, activation<const T, Backend> x, activation<const T, Backend> y,
                  const T* dy, T* dx, T* dparams, std::size_t batch) {
      [[maybe_unused]] const bool copy_only = std::exchange(gradient_copy_only_, false);
      const T* g = dy;
      if (relu_ && !plan_applies_relu()) {  // relu'(pre) = relu'(relu(pre)): the mask from y
        masked_.reserve_discard(batch * In::size);
        Backend::for_each(batch * In::size, kernels::pointwise_backward<kernels::relu_op, T>{y.data, y.data, dy,
                                                                                             masked_.data()});
        g = masked_.data();
      }
      if constexpr (copies)
        plan_.backward(x.data, x.format, params, params + c_, g, dx, dparams, dparams + c_, batch, ctx.accumulate,
                       ctx.replicas, y.data, bf16_gradient_ && ctx.math == math_mode::bf16,
                       copy_only);
      else if constexpr (detail::plan_applies_fused_relu<plan_type>)
        plan_.backward(x.data, x.format, params, params + c_, g, dx, dparams, dparams + c_, batch, ctx.accumulate,
                       ctx.replicas, y.data);
      else
        plan_.backward(x.data, x.format, params, params + c_, g, dx, dparams, dparams + c_, batch, ctx.accumulate,
                       ctx.replicas);
    }

   private:
    bool plan_applies_relu() const {
      if constexpr (detail::plan_applies_fused_relu<plan_type>) return plan_.backward_applies_fused_relu();
      else return false;
    }

    std::size_t index_;
    plan_type plan_;
    bool relu_ = false;
    bool bf16_output_ = false, bf16_gradient_ = false;
    bool output_copy_only_ = false, gradient_copy_only_ = false;  // the next forward's, backward's
    T* running_ = nullptr;  // (2C + 1): running_mean, running_var, num_batches_tracked
    // dy with the fused ReLU's gradient applied, where the plan's backward does not apply it
    // (its kernel bodies: double, a rank without samples, a backward after evaluation, the GPU).
    buffer<T, typename Backend::memory_space> masked_;
  };
};

}  // namespace loom

#if defined(LOOM_DEFINITIONS_VISIBLE)
#include "loom/layers/impl/batch_norm.ipp"
#endif
