// SPDX-License-Identifier: Apache-2.0
#pragma once
// loom::residual_with<loom::layers<Main...>, loom::shortcut<Skip...>>: y = Main(x) + Skip(x), a
// residual block whose skip branch is a layer list of its own — torchvision's `downsample` (a
// strided 1x1 convolution without bias and a batch norm) where the block changes the shape — or
// the identity when the shortcut is left out. Both branches must end in the same shape; a
// compile error names the block and both shapes otherwise. A loom::relu right after the block is
// fused into its sum (the ReLU of a ResNet block after the addition).

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

#include "loom/backend/kernels/elementwise.hpp"
#include "loom/core/config.hpp"
#include "loom/core/memory.hpp"
#include "loom/core/type_list.hpp"
#include "loom/layers/describe.hpp"
#include "loom/layers/layer.hpp"
#include "loom/layers/named.hpp"
#include "loom/nn/describe.hpp"
#include "loom/nn/sequence.hpp"

namespace loom {

/// The main branch of a loom::residual_with: its layers, in order. In the files they are the
/// block's own children ("layer1.0.conv1.weight" for named<"conv1", ...>, else by position).
template <class... Layers>
struct layers {};

/// The skip branch of a loom::residual_with: its layers, in order; none is the identity. In the
/// files it is the block's child "shortcut" ("<block>.shortcut.0.weight"), or the name it is given
/// with loom::named<"downsample", loom::shortcut<...>> (torchvision's).
template <class... Layers>
struct shortcut {};

namespace detail {
/// A residual_with's text and ONNX nodes (compiled once: impl/residual_with.ipp).
LOOM_DECL void residual_with_text(layer_description& d, std::size_t main_layers);
LOOM_DECL std::string residual_with_onnx(onnx_graph& g, const layer_description& d, const std::string& x,
                                         std::size_t main_layers);
/// A shortcut branch as one child of its block: its layers, one after another.
LOOM_DECL std::string sequential_onnx(onnx_graph& g, const layer_description& d, const std::string& x);
LOOM_DECL layer_description shortcut_description(const std::string& path, const std::vector<std::size_t>& in,
                                                 const std::vector<std::size_t>& out, std::vector<layer_description> inner);

/// What a residual_with option is: a shortcut (plain or named), with its layers and name.
template <class O>
struct shortcut_option : std::false_type {
  using list = type_list<>;
  static constexpr std::string_view name = "shortcut";
};
template <class... L>
struct shortcut_option<shortcut<L...>> : std::true_type {
  using list = type_list<L...>;
  static constexpr std::string_view name = "shortcut";
};
template <fixed_string N, class... L>
struct shortcut_option<named<N, shortcut<L...>>> : std::true_type {
  using list = type_list<L...>;
  static constexpr std::string_view name = N.view();
};

template <class Default, class... Options>
struct first_or {
  using type = Default;
};
template <class Default, class First, class... Rest>
struct first_or<Default, First, Rest...> {
  using type = First;
};

/// A branch of no layers: the identity.
template <class In>
struct identity_branch {
  static constexpr bool ok = true;
  using output_shape = In;
  static constexpr std::size_t parameter_count = 0, buffer_count = 0, layer_count = 0;
};
template <class In, class... L>
struct branch_of {
  using type = layer_chain<In, L...>;
};
template <class In>
struct branch_of<In> {
  using type = identity_branch<In>;
};

template <class Chain>
constexpr double flops_of_branch() {
  double s = 0;
  if constexpr (Chain::layer_count > 0)
    for (double f : Chain::flops) s += f;
  return s;
}

/// The block itself, given its option (the shortcut) and both branches' layers.
template <class Option, class MainList, class ShortcutList>
struct residual_with_layer;

template <class Option, class... M, class... S>
struct residual_with_layer<Option, type_list<M...>, type_list<S...>> {
  static constexpr bool is_loom_layer = true;
  static constexpr const char* name = "residual_with";
  static constexpr bool identity = sizeof...(S) == 0;
  static constexpr std::string_view shortcut_name = shortcut_option<Option>::name;

  template <class In>
  using main_branch = typename branch_of<In, M...>::type;
  template <class In>
  using shortcut_branch = typename branch_of<In, S...>::type;

  template <class In>
  static constexpr bool accepts = [] {
    if constexpr (sizeof...(M) == 0 || !main_branch<In>::ok || !shortcut_branch<In>::ok) return false;
    else return std::is_same_v<typename main_branch<In>::output_shape, typename shortcut_branch<In>::output_shape>;
  }();

  template <std::size_t Index, class In>
  static constexpr bool check() {
    static_assert(sizeof...(M) > 0,
                  "loom::residual_with<loom::layers<...>, ...> needs at least one layer in its main branch (the "
                  "block's index is in the loom::diagnostic:: name the compiler prints)");
    if constexpr (sizeof...(M) == 0) {
      return fail_with<diagnostic::residual_with_at_layer_has_no_main_branch_layers<Index>>();
    } else if constexpr (!main_branch<In>::ok || !shortcut_branch<In>::ok) {
      return false;  // a layer of a branch has already said why
    } else {
      using main_out = typename main_branch<In>::output_shape;
      using shortcut_out = typename shortcut_branch<In>::output_shape;
      static_assert(std::is_same_v<main_out, shortcut_out>,
                    "loom::residual_with's main branch and its shortcut end in different shapes, so they cannot be "
                    "added: make the shortcut bring its input to the main branch's output shape (a strided 1x1 "
                    "loom::conv2d and a loom::batch_norm where the block downsamples or widens) (the block's index, "
                    "its input shape and both branches' output shapes are in the loom::diagnostic:: name the "
                    "compiler prints)");
      if constexpr (!std::is_same_v<main_out, shortcut_out>)
        return fail_with<diagnostic::residual_with_at_layer_adds_branches_of_different_shapes<Index, In, main_out,
                                                                                               shortcut_out>>();
      return true;
    }
  }

  template <class In>
  using output_shape = typename main_branch<In>::output_shape;
  template <class In>
  static constexpr std::size_t parameter_count = main_branch<In>::parameter_count + shortcut_branch<In>::parameter_count;
  template <class In>
  static constexpr std::size_t buffer_count = main_branch<In>::buffer_count + shortcut_branch<In>::buffer_count;
  template <class In>
  static constexpr double flops =
      output_shape<In>::size + flops_of_branch<main_branch<In>>() + flops_of_branch<shortcut_branch<In>>();

  /// The main branch's layers as the block's children ("<block>.0", or their names), then the
  /// shortcut as one child named shortcut_name ("<block>.downsample.0", ...): the module
  /// torchvision's BasicBlock and Bottleneck are. Parameters and buffers: the main branch's,
  /// then the shortcut's.
  template <class In>
  static void describe(layer_description& d) {
    d.inner = describe_chain<main_branch<In>, M...>(d.path + ".");
    if constexpr (!identity) {
      const std::string at = d.path + "." + std::string(shortcut_name);
      std::vector<layer_description> skip = describe_chain<shortcut_branch<In>, S...>(at + ".");
      shift(skip, main_branch<In>::parameter_count, main_branch<In>::buffer_count);
      using out = typename shortcut_branch<In>::output_shape;
      d.inner.push_back(shortcut_description(at, {In::dims.begin(), In::dims.end()}, {out::dims.begin(), out::dims.end()},
                                             std::move(skip)));
    }
    residual_with_text(d, sizeof...(M));
  }
  /// Add(main(x), shortcut(x)).
  static std::string onnx(onnx_graph& g, const layer_description& d, const std::string& x) {
    return residual_with_onnx(g, d, x, sizeof...(M));
  }

  /// Both branches' sequences; a copy of the shortcut's output in the main branch's layout (and
  /// of the gradient the other way) when their layouts differ; the shortcut's input gradient,
  /// added to the main branch's, when the block's is asked for. Its output is in the main
  /// branch's layout.
  template <class In, class Backend>
  static constexpr sequence_elements footprint(const footprint_context& c) {
    sequence_elements e = elements_of_sequence<main_branch<In>, Backend>(c);
    const bool main_blocked = e.output_blocked;
    bool shortcut_blocked = c.input_blocked;
    if constexpr (!identity) {
      const sequence_elements s = elements_of_sequence<shortcut_branch<In>, Backend>(c);
      shortcut_blocked = s.output_blocked;
      e.add(s);
      if (c.needs_input_gradient) e.scratch += In::size;
    }
    if (main_blocked != shortcut_blocked) e.scratch += output_shape<In>::size;
    e.output_blocked = main_blocked;
    return e;
  }
  template <class In, class Backend>
  static constexpr layout_effect layout = [] {
    const bool from_plain = elements_of_sequence<main_branch<In>, Backend>({.input_blocked = false}).output_blocked;
    const bool from_blocked = elements_of_sequence<main_branch<In>, Backend>({.input_blocked = true}).output_blocked;
    if (from_plain && from_blocked) return layout_effect::blocks;
    if (!from_plain && !from_blocked) return layout_effect::plain;
    return layout_effect::keeps;
  }();

  template <class In, class T, class Backend>
  class impl {
    using space = typename Backend::memory_space;
    using out_shape = output_shape<In>;
    static constexpr std::size_t main_params = main_branch<In>::parameter_count;
    static constexpr std::size_t main_buffers = main_branch<In>::buffer_count;
    struct no_branch {
      no_branch(std::uint64_t, std::size_t, tensor_shard) {}
    };
    using shortcut_sequence = std::conditional_t<identity, no_branch, sequence<T, Backend, In, S...>>;

   public:
    // The shortcut's layers are numbered after the main branch's, so their random streams differ.
    explicit impl(layer_site site)
        : main_(site.stream, 0, tensor_shard{site.shard, site.shards}),
          shortcut_(site.stream, sizeof...(M), tensor_shard{site.shard, site.shards}) {}

    /// The network calls this when a loom::relu follows: the sum is written as relu(sum).
    void fuse_relu() { relu_ = true; }
    /// The network calls this when the block's input is a loom::relu's output whose backward it
    /// leaves out (detail::backward_fused_into_next): the block's input gradient, its branches'
    /// two added, is taken through that ReLU in the same pass.
    void apply_input_relu_gradient() { input_relu_ = true; }

    void initialize(T* params, std::uint64_t seed) const {
      main_.initialize(params, seed);
      if constexpr (!identity) shortcut_.initialize(params + main_params, seed);
    }
    void initialize_buffers(T* buffers) const {
      main_.initialize_buffers(buffers);
      if constexpr (!identity) shortcut_.initialize_buffers(buffers + main_buffers);
    }
    void bind_buffers(T* buffers) {
      main_.bind_buffers(buffers);
      if constexpr (!identity) shortcut_.bind_buffers(buffers + main_buffers);
    }

    void forward(const run_context& ctx, const T* params, activation<const T, Backend> x, activation<T, Backend>& y,
                 std::size_t batch) {
      const activation<T, Backend> f = main_.forward(ctx, params, x, batch);
      activation<const T, Backend> s = x;
      if constexpr (!identity) s = shortcut_.forward(ctx, params + main_params, x, batch);
      const T* sv = s.data;
      if (!(s.format == f.format)) {
        aligned_.reserve_discard(batch * out_shape::size);
        conv_.template convert<T, out_shape>(s.data, s.format, aligned_.data(), f.format, batch);
        sv = aligned_.data();
      }
      const std::size_t n = batch * out_shape::size;
      y.format = f.format;
      if constexpr (std::is_same_v<T, float> && detail::reads_bf16_copies<Backend>) {
        // Under bf16 math the sum's bf16 copy too, for the convolutions that read the block's
        // output (the next block's first and shortcut): written in this pass, it spares each of
        // them a pass converting the sum.
        if (ctx.math == math_mode::bf16) {
          bf16_.reserve_discard(n);
          if (relu_) Backend::for_each(n, kernels::add_with_bf16<true>{f.data, sv, y.data, bf16_.data()});
          else Backend::for_each(n, kernels::add_with_bf16<false>{f.data, sv, y.data, bf16_.data()});
          y.bf16 = bf16_.data();
          return;
        }
      }
      if (relu_) Backend::for_each(n, kernels::add_relu<T>{f.data, sv, y.data});
      else Backend::for_each(n, kernels::add<T>{f.data, sv, y.data});
    }

    void backward(const run_context& ctx, const T* params, activation<const T, Backend> x, activation<const T, Backend>,
                  const T* dy, T* dx, T* dparams, std::size_t batch) {
      // dy is in the main branch's output layout (the block's); with a fused ReLU the relu
      // layer's backward has already applied it.
      const auto main_format = main_.output().format;
      main_.backward(ctx, params, x, dy, dx, dparams);
      auto shortcut_format = x.format;
      if constexpr (!identity) shortcut_format = shortcut_.output().format;
      const T* ds = dy;
      if (!(shortcut_format == main_format)) {
        aligned_.reserve_discard(batch * out_shape::size);
        conv_.template convert<T, out_shape>(dy, main_format, aligned_.data(), shortcut_format, batch);
        ds = aligned_.data();
      }
      if constexpr (identity) {
        if (dx) add_input_gradients(x, ds, dx, batch);
      } else {
        T* dxs = nullptr;
        if (dx) {
          dx_shortcut_.reserve_discard(batch * In::size);
          dxs = dx_shortcut_.data();
        }
        shortcut_.backward(ctx, params + main_params, x, ds, dxs, dparams + main_params);
        if (dx) add_input_gradients(x, dxs, dx, batch);
      }
    }

   private:
    /// dx += the shortcut's input gradient, taken through the ReLU before the block when it
    /// applies that ReLU's gradient (x: the ReLU's output, in dx's layout).
    void add_input_gradients(activation<const T, Backend> x, const T* shortcut_dx, T* dx, std::size_t batch) {
      const std::size_t n = batch * In::size;
      if (input_relu_) Backend::for_each(n, kernels::add_relu_gradient<T>{dx, shortcut_dx, x.data, dx});
      else Backend::for_each(n, kernels::add<T>{dx, shortcut_dx, dx});
    }

    mutable sequence<T, Backend, In, M...> main_;
    mutable shortcut_sequence shortcut_;
    bool relu_ = false, input_relu_ = false;
    buffer<T, space> aligned_, dx_shortcut_;  // (batch, Out): a branch's output or gradient in the other's layout; (batch, In)
    buffer<std::uint16_t, space> bf16_;       // (batch, Out): the output's bf16 copy (bf16 math)
    typename Backend::layout_converter conv_;
  };
};
}  // namespace detail

/// A residual block y = Main(x) + Shortcut(x) (see the file comment): Main is loom::layers<...>,
/// the one option a loom::shortcut<...> (or named<"name", shortcut<...>>; none: the identity).
/// Parameters and buffers: the main branch's, then the shortcut's.
template <class Main, class... Options>
struct residual_with : detail::already_reported {
  static_assert(sizeof(Main) == 0,
                "loom::residual_with's first argument is its main branch as loom::layers<...>, e.g. "
                "loom::residual_with<loom::layers<loom::conv2d<64, 3, 1, 1>, loom::batch_norm>, loom::shortcut<...>>");
};
template <class... M, class... Options>
struct residual_with<layers<M...>, Options...>
    : detail::residual_with_layer<typename detail::first_or<shortcut<>, Options...>::type, type_list<M...>,
                                  typename detail::shortcut_option<typename detail::first_or<shortcut<>, Options...>::type>::list> {
  static_assert(sizeof...(Options) <= 1 && (detail::shortcut_option<Options>::value && ...),
                "loom::residual_with<loom::layers<...>, Shortcut>: the one option after the main branch is its "
                "shortcut, loom::shortcut<...> or loom::named<\"name\", loom::shortcut<...>> (none: the identity)");
};

}  // namespace loom

#if defined(LOOM_DEFINITIONS_VISIBLE)
#include "loom/nn/impl/residual_with.ipp"
#endif
