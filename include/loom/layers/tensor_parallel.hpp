// SPDX-License-Identifier: Apache-2.0
#pragma once
// Megatron-style tensor-parallel linear layers: loom::column_parallel<loom::linear<N>> and
// loom::row_parallel<loom::linear<N>>, and the slices one rank of a group runs
// (column_parallel_shard, row_parallel_shard). In a network run whole (single_process,
// data_parallel) the two layers are loom::linear. The network of one rank
// (loom::tensor_parallel_network) and the layout of its slices are in
// loom/parallel/tensor/plan.hpp; the engine that runs a group, in
// loom/parallel/tensor/sync.hpp.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "loom/backend/kernels/elementwise.hpp"
#include "loom/core/config.hpp"
#include "loom/core/error.hpp"
#include "loom/core/memory.hpp"
#include "loom/core/random.hpp"
#include "loom/layers/describe.hpp"
#include "loom/layers/layer.hpp"
#include "loom/layers/linear.hpp"

namespace loom {

namespace diagnostic {
template <std::size_t LayerIndex, std::size_t Outputs, std::size_t Width>
struct column_parallel_at_layer_has_outputs_not_divisible_by_width;
template <std::size_t LayerIndex, std::size_t Inputs, std::size_t Width>
struct row_parallel_at_layer_has_inputs_not_divisible_by_width;
}  // namespace diagnostic

namespace detail {
template <class L>
inline constexpr bool is_linear_v = false;
template <std::size_t Out, class Init>
inline constexpr bool is_linear_v<linear<Out, Init>> = true;

/// w[i] = stddev * normal_at(seed, stream, first + i) for i in [0, n): the values the whole
/// layer's detail::fill_normal writes at flat indices [first, first + n), bit for bit.
template <class T>
void fill_normal_from(T* w, std::size_t n, std::size_t first, double stddev, std::uint64_t seed, std::uint64_t stream) {
  for (std::size_t i = 0; i < n; ++i) w[i] = static_cast<T>(stddev * normal_at(seed, stream, first + i));
}

/// y[n, j] += b[j] for a (batch, Width) y.
template <class T, std::size_t Width>
struct add_row {
  const T* b;
  T* y;
  LOOM_HD void operator()(std::size_t n) const {
    T* r = y + n * Width;
    for (std::size_t j = 0; j < Width; ++j) r[j] += b[j];
  }
};

/// Backend::gemm (row-major C = alpha op(A) op(B) + beta C) in the run's math mode where the
/// backend and run_context have one (mixed precision), as loom::linear runs it.
template <class Backend, class Ctx, class T>
void slice_gemm(const Ctx& ctx, bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k, T alpha, const T* a,
                std::size_t lda, const T* b, std::size_t ldb, T beta, T* c, std::size_t ldc) {
  if constexpr (requires { Backend::gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, ctx.math); })
    Backend::gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, ctx.math);
  else
    Backend::gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

/// The group a tensor-parallel layer communicates over. Requires: ctx.tensor set, of Width ranks.
template <std::size_t Width>
tensor_group& tensor_group_of(const run_context& ctx, const char* layer, std::size_t index) {
  if (!ctx.tensor)
    throw invalid_argument(std::string("loom::") + layer + " at layer " + std::to_string(index) + " is a slice of a " +
                           std::to_string(Width) + "-way tensor-parallel layer but run_context::tensor is null: run it "
                           "under loom::model_parallel<loom::tensor_parallel<" + std::to_string(Width) +
                           ">, Comm> (the trainer sets it), or set ctx.tensor to the group of its ranks");
  if (ctx.tensor->size() != static_cast<int>(Width))
    throw invalid_argument(std::string("loom::") + layer + " at layer " + std::to_string(index) + " is split " +
                           std::to_string(Width) + " ways but run_context::tensor has " +
                           std::to_string(ctx.tensor->size()) + " ranks");
  return *ctx.tensor;
}

/// Checks, when a shard is constructed, that the model was built for this width.
template <std::size_t Width>
void check_site(const layer_site& site, const char* layer) {
  if (site.shards != Width || site.shard >= Width)
    throw invalid_argument(std::string("loom::") + layer + " at layer " + std::to_string(site.index) + ": the model "
                           "holds slice " + std::to_string(site.shard) + " of " + std::to_string(site.shards) +
                           " but the network is split " + std::to_string(Width) + " ways: construct the model with "
                           "loom::tensor_shard{rank, " + std::to_string(Width) + "}");
}
}  // namespace detail

/// Marks a loom::linear<N, Init> whose weight W (N, In) is split by rows (output features) over
/// a tensor-parallel group: rank r of T holds rows [r N/T, (r+1) N/T) of W and that slice of b.
/// Run whole (single_process, data_parallel) it is loom::linear<N, Init>: the same parameters,
/// initialisation and results. Split (loom::tensor_parallel_network), a slice outputs N/T
/// features when a loom::row_parallel follows it (through point-wise activations only), and
/// otherwise the whole N, gathered over the group; its input gradient is summed over the group.
/// Weights files, checkpoints, ONNX and the fingerprint describe it as the linear it is whole
/// (it inherits linear's describe and onnx).
template <class Linear>
struct column_parallel : detail::already_reported {
  static_assert(detail::is_linear_v<Linear>,
                "loom::column_parallel<L>: L must be a loom::linear<N, Init>, e.g. "
                "loom::column_parallel<loom::linear<256>>");
};

template <std::size_t Out, class Init>
struct column_parallel<linear<Out, Init>> : linear<Out, Init> {
  static constexpr const char* name = "column_parallel";
  using whole_layer = linear<Out, Init>;
  static constexpr std::size_t outputs = Out;
};

/// Marks a loom::linear<N, Init> whose weight W (N, K) is split by columns (input features)
/// over a tensor-parallel group: rank r of T holds columns [r K/T, (r+1) K/T) of W and the
/// whole bias b. Run whole it is loom::linear<N, Init>. Split, a slice takes the K/T features
/// the loom::column_parallel before it produced (through point-wise activations only), or, with
/// no such layer, its own K/T of the whole input; its partial products are summed over the
/// group (one allreduce) and b is added once, after the sum. Described as the linear it is whole,
/// as column_parallel.
template <class Linear>
struct row_parallel : detail::already_reported {
  static_assert(detail::is_linear_v<Linear>,
                "loom::row_parallel<L>: L must be a loom::linear<N, Init>, e.g. loom::row_parallel<loom::linear<128>>");
};

template <std::size_t Out, class Init>
struct row_parallel<linear<Out, Init>> : linear<Out, Init> {
  static constexpr const char* name = "row_parallel";
  using whole_layer = linear<Out, Init>;
  static constexpr std::size_t outputs = Out;
};

template <class L>
inline constexpr bool is_column_parallel_v = false;
template <std::size_t Out, class Init>
inline constexpr bool is_column_parallel_v<column_parallel<linear<Out, Init>>> = true;
template <class L>
inline constexpr bool is_row_parallel_v = false;
template <std::size_t Out, class Init>
inline constexpr bool is_row_parallel_v<row_parallel<linear<Out, Init>>> = true;

/// One rank's slice of column_parallel<linear<Out, Init>> in a group of Width: rows
/// [r Out/Width, (r+1) Out/Width) of W (Out, In), then that slice of b. SplitOutput: the slice
/// outputs its Out/Width features (a row_parallel follows); otherwise the whole Out, gathered
/// by one allreduce of the zero-padded outputs. Backward sums the input gradient over the
/// group (one allreduce, skipped when the input gradient is not wanted — the network's first
/// layer — which every rank of the group knows alike).
template <class Linear, std::size_t Width, bool SplitOutput = true>
struct column_parallel_shard;

template <std::size_t Out, class Init, std::size_t Width, bool SplitOutput>
struct column_parallel_shard<linear<Out, Init>, Width, SplitOutput> {
  static_assert(Width >= 1, "loom::column_parallel_shard needs a width of at least 1");
  static constexpr bool is_loom_layer = true;
  static constexpr const char* name = "column_parallel";
  static constexpr std::size_t width = Width;
  /// Rows of W (output features) this slice holds.
  static constexpr std::size_t local_outputs = Out / Width;

  template <class In>
  static constexpr bool accepts = In::rank == 1 && Out % Width == 0;

  template <std::size_t Index, class In>
  static constexpr bool check() {
    if constexpr (In::rank != 1) {
      return linear<Out, Init>::template check<Index, In>();
    } else {
      static_assert(Out % Width == 0,
                    "loom::column_parallel: the tensor-parallel width does not divide the layer's outputs N, so the "
                    "ranks cannot hold equal slices of its weight rows: choose N or the width so that the width "
                    "divides N (the layer index, N and the width are in the loom::diagnostic:: name the compiler "
                    "prints)");
      if constexpr (Out % Width != 0)
        return detail::fail_with<
            diagnostic::column_parallel_at_layer_has_outputs_not_divisible_by_width<Index, Out, Width>>();
      return true;
    }
  }

  template <class In>
  using output_shape = shape<SplitOutput ? Out / Width : Out>;
  template <class In>
  static constexpr std::size_t parameter_count = local_outputs * In::size + local_outputs;
  template <class In>
  static constexpr double flops = 2.0 * In::size * local_outputs;

  /// bias_: the zero-padded bias of an output it gathers over the group. Its output is plain.
  template <class In, class Backend>
  static constexpr sequence_elements footprint(const footprint_context&) {
    return {.fixed_comm = !SplitOutput && Width > 1 ? Out : 0};
  }

  template <class In, class T, class Backend>
  class impl {
    static constexpr std::size_t in_ = In::size, rows_ = local_outputs;

   public:
    explicit impl(layer_site site) : site_(site) { detail::check_site<Width>(site, name); }

    void initialize(T* params, std::uint64_t seed) const {
      // Rows [r rows_, (r+1) rows_) of the whole W (Out, In) are one contiguous run of its flat
      // index; the standard deviation is the whole layer's.
      detail::fill_normal_from(params, rows_ * in_, site_.shard * rows_ * in_, Init::stddev(in_, Out), seed,
                               site_.stream);
      std::fill_n(params + rows_ * in_, rows_, T(0));
    }

    void forward(const run_context& ctx, const T* params, activation<const T, Backend> x, activation<T, Backend>& y,
                 std::size_t batch) {
      const T* w = params;  // (rows_, In)
      const T* b = params + rows_ * in_;
      if constexpr (SplitOutput || Width == 1) {
        Backend::for_each(batch, kernels::broadcast_row<T, rows_>{b, y.data});
        // (batch, Out/T)
        detail::slice_gemm<Backend>(ctx, false, true, batch, rows_, in_, T(1), x.data, in_, w, in_, T(1), y.data, rows_);
      } else {
        // Gathered: every rank writes its columns of a zeroed (batch, Out), the sum fills them all.
        const std::size_t first = site_.shard * rows_;
        bias_.reserve_discard(Out);
        Backend::zero(bias_.data(), Out);
        Backend::copy(bias_.data() + first, b, rows_);
        Backend::for_each(batch, kernels::broadcast_row<T, Out>{bias_.data(), y.data});
        detail::slice_gemm<Backend>(ctx, false, true, batch, rows_, in_, T(1), x.data, in_, w, in_, T(1), y.data + first,
                                    Out);
        detail::tensor_group_of<Width>(ctx, name, site_.index).allreduce_sum(y.data, batch * Out);  // (batch, Out)
      }
      y.format = {};
    }

    void backward(const run_context& ctx, const T* params, activation<const T, Backend> x, activation<const T, Backend>,
                  const T* dy, T* dx, T* dparams, std::size_t batch) {
      const T* w = params;
      T* dw = dparams;
      T* db = dparams + rows_ * in_;
      // dy: (batch, Out/T), or this rank's columns of the whole (batch, Out) when gathered.
      constexpr std::size_t ld = SplitOutput ? rows_ : Out;
      const T* g = SplitOutput ? dy : dy + site_.shard * rows_;
      detail::slice_gemm<Backend>(ctx, true, false, rows_, in_, batch, T(1), g, ld, x.data, in_,
                                  ctx.accumulate ? T(1) : T(0), dw, in_);
      Backend::for_each(rows_, kernels::sum_rows<T>{g, db, batch, ld, ctx.accumulate});
      if (dx) {
        // (batch, In): this slice's part of the input gradient
        detail::slice_gemm<Backend>(ctx, false, false, batch, in_, rows_, T(1), g, ld, w, in_, T(0), dx, in_);
        if constexpr (Width > 1) detail::tensor_group_of<Width>(ctx, name, site_.index).allreduce_sum(dx, batch * in_);
      }
    }

   private:
    layer_site site_;
    buffer<T, typename Backend::memory_space> bias_;  // (Out): this rank's b in place, zeros elsewhere
  };
};

/// One rank's slice of row_parallel<linear<Out, Init>> in a group of Width, K the layer's whole
/// input: columns [r K/Width, (r+1) K/Width) of W (Out, K), then the whole b. SplitInput: its
/// input is the K/Width features of a column_parallel slice; otherwise it reads its columns of
/// the whole input and sums the input gradient over the group. Forward: one allreduce of the
/// partial products, then b.
template <class Linear, std::size_t Width, bool SplitInput = true>
struct row_parallel_shard;

template <std::size_t Out, class Init, std::size_t Width, bool SplitInput>
struct row_parallel_shard<linear<Out, Init>, Width, SplitInput> {
  static_assert(Width >= 1, "loom::row_parallel_shard needs a width of at least 1");
  static constexpr bool is_loom_layer = true;
  static constexpr const char* name = "row_parallel";
  static constexpr std::size_t width = Width;

  /// The whole layer's input size K, and the columns of W this slice holds.
  template <class In>
  static constexpr std::size_t whole_inputs = SplitInput ? In::size * Width : In::size;
  template <class In>
  static constexpr std::size_t local_inputs = whole_inputs<In> / Width;

  template <class In>
  static constexpr bool accepts = In::rank == 1 && whole_inputs<In> % Width == 0;

  template <std::size_t Index, class In>
  static constexpr bool check() {
    if constexpr (In::rank != 1) {
      return linear<Out, Init>::template check<Index, In>();
    } else {
      static_assert(whole_inputs<In> % Width == 0,
                    "loom::row_parallel: the tensor-parallel width does not divide the layer's input size K, so the "
                    "ranks cannot hold equal slices of its weight columns: choose the input size or the width so "
                    "that the width divides K (the layer index, K and the width are in the loom::diagnostic:: name "
                    "the compiler prints)");
      if constexpr (whole_inputs<In> % Width != 0)
        return detail::fail_with<
            diagnostic::row_parallel_at_layer_has_inputs_not_divisible_by_width<Index, whole_inputs<In>, Width>>();
      return true;
    }
  }

  template <class In>
  using output_shape = shape<Out>;
  template <class In>
  static constexpr std::size_t parameter_count = Out * local_inputs<In> + Out;
  template <class In>
  static constexpr double flops = 2.0 * local_inputs<In> * Out;

  template <class In, class T, class Backend>
  class impl {
    static constexpr std::size_t whole_ = whole_inputs<In>, cols_ = local_inputs<In>;
    static constexpr std::size_t ldx_ = SplitInput ? cols_ : whole_;  // row stride of x and dx

   public:
    explicit impl(layer_site site) : site_(site) { detail::check_site<Width>(site, name); }

    void initialize(T* params, std::uint64_t seed) const {
      // Row i of the slice is W[i, r cols_ .. (r+1) cols_), flat index i K + r cols_ of the whole.
      const double stddev = Init::stddev(whole_, Out);
      for (std::size_t i = 0; i < Out; ++i)
        detail::fill_normal_from(params + i * cols_, cols_, i * whole_ + site_.shard * cols_, stddev, seed, site_.stream);
      std::fill_n(params + Out * cols_, Out, T(0));
    }

    void forward(const run_context& ctx, const T* params, activation<const T, Backend> x, activation<T, Backend>& y,
                 std::size_t batch) {
      const T* w = params;  // (Out, K/T)
      const T* b = params + Out * cols_;
      detail::slice_gemm<Backend>(ctx, false, true, batch, Out, cols_, T(1), x.data + first_column(), ldx_, w, cols_,
                                  T(0), y.data, Out);
      if constexpr (Width > 1) detail::tensor_group_of<Width>(ctx, name, site_.index).allreduce_sum(y.data, batch * Out);
      Backend::for_each(batch, detail::add_row<T, Out>{b, y.data});  // (batch, Out)
      y.format = {};
    }

    void backward(const run_context& ctx, const T* params, activation<const T, Backend> x, activation<const T, Backend>,
                  const T* dy, T* dx, T* dparams, std::size_t batch) {
      const T* w = params;
      T* dw = dparams;
      T* db = dparams + Out * cols_;
      detail::slice_gemm<Backend>(ctx, true, false, Out, cols_, batch, T(1), dy, Out, x.data + first_column(), ldx_,
                    ctx.accumulate ? T(1) : T(0), dw, cols_);
      Backend::for_each(Out, kernels::sum_rows<T>{dy, db, batch, Out, ctx.accumulate});
      if (!dx) return;
      if constexpr (SplitInput || Width == 1) {
        // (batch, K/T)
        detail::slice_gemm<Backend>(ctx, false, false, batch, cols_, Out, T(1), dy, Out, w, cols_, T(0), dx, cols_);
      } else {
        // This rank's columns of a zeroed (batch, K); the sum over the group fills them all.
        Backend::zero(dx, batch * whole_);
        detail::slice_gemm<Backend>(ctx, false, false, batch, cols_, Out, T(1), dy, Out, w, cols_, T(0),
                                    dx + first_column(), whole_);
        detail::tensor_group_of<Width>(ctx, name, site_.index).allreduce_sum(dx, batch * whole_);
      }
    }

   private:
    std::size_t first_column() const { return SplitInput ? 0 : site_.shard * cols_; }
    layer_site site_;
  };
};

}  // namespace loom
