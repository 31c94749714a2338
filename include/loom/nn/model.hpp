// SPDX-License-Identifier: Apache-2.0
#pragma once
// loom::model<Network, T, Backend>: a network's parameters and gradients as two flat buffers
// (and its buffers — running statistics — as a third), and its forward and backward passes.
// The trainer drives one; tests use it directly. The buffers live in the backend's memory space
// (the GPU's for loom::cuda); copy_* moves values between it and the host.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "loom/backend/default_backend.hpp"
#include "loom/backend/kernels/optim.hpp"
#include "loom/core/error.hpp"
#include "loom/core/memory.hpp"
#include "loom/nn/network.hpp"

namespace loom {

template <class Network, class T = float, class Backend = cpu>
class model {
  static_assert(is_network_v<Network>, "loom::model<Network, ...> needs a loom::network<loom::input<...>, layers...>");
  static_assert(std::is_floating_point_v<T>, "loom::model's scalar type must be float or double");
  using space = typename Backend::memory_space;
  using seq = typename Network::template sequence_type<T, Backend>;

 public:
  using network_type = Network;
  using value_type = T;
  using backend = Backend;
  using input_shape = typename Network::input_shape;
  using output_shape = typename Network::output_shape;
  static constexpr std::size_t parameter_count = Network::parameter_count;
  /// Values of the buffers (batch norm's running statistics: part of the model, not trained).
  static constexpr std::size_t buffer_count = Network::buffer_count;

  /// Allocates and initialises the parameters from seed (He / Xavier per layer, counter-based:
  /// the same seed gives the same parameters on every backend and thread count).
  /// Layers initialise on the host; for a backend whose memory the host cannot reach the
  /// values are staged in host memory and copied over once.
  /// first_layer: the index in the whole model of Network's first layer (a pipeline stage's
  /// network starts at its first layer's index and so initialises as that part of the whole
  /// model); shard: the slice of tensor-parallel layers this model holds.
  explicit model(std::uint64_t seed = 1, std::size_t first_layer = 0, tensor_shard shard = {})
      : params_(parameter_count), grads_(parameter_count), buffers_(buffer_count), seq_(0, first_layer, shard) {
    if constexpr (space::host_accessible) {
      seq_.initialize(params_.data(), seed);
      seq_.initialize_buffers(buffers_.data());
    } else {
      buffer<T> staging(parameter_count);
      seq_.initialize(staging.data(), seed);
      space::copy_from_host(params_.data(), staging.data(), parameter_count * sizeof(T));
      if constexpr (buffer_count > 0) {
        buffer<T> b(buffer_count);
        seq_.initialize_buffers(b.data());
        space::copy_from_host(buffers_.data(), b.data(), buffer_count * sizeof(T));
      }
    }
    seq_.bind_buffers(buffers_.data());
  }

  /// Forward on batch samples x (batch, input_shape), plain row-major, in the backend's memory
  /// space. Returns the output, plain row-major (batch, output_shape), in that space, valid
  /// until the next forward.
  /// before(i) runs just before layer i reads its parameters (loom::no_layer_hook: nothing).
  template <class Before = no_layer_hook>
  const T* forward(const run_context& ctx, const T* x, std::size_t batch, Before&& before = {}) {
    auto y = seq_.forward(ctx, params_.data(), activation<const T, Backend>{x}, batch, std::forward<Before>(before));
    out_format_ = y.format;
    input_ = x;
    return conv_.template to_plain<T, output_shape>(y.data, y.format, batch);
  }

  /// Backward from dy, the gradient of the plain output of the last forward. Fills gradients()
  /// (overwritten, or added to when ctx.accumulate). hook(i) runs once layer i is done.
  template <class Hook = no_backward_hook>
  void backward(const run_context& ctx, const T* dy, std::size_t batch, Hook&& hook = {}) {
    const T* d = dy;
    if (!out_format_.plain()) {
      dy_.reserve_discard(batch * output_shape::size);
      conv_.template from_plain<T, output_shape>(dy, out_format_, dy_.data(), batch);
      d = dy_.data();
    }
    seq_.backward(ctx, params_.data(), activation<const T, Backend>{input_}, d, nullptr, grads_.data(),
                  std::forward<Hook>(hook));
  }

  /// The flat parameter and gradient buffers, in the backend's memory space.
  std::span<T> parameters() noexcept { return {params_.data(), parameter_count}; }
  std::span<const T> parameters() const noexcept { return {params_.data(), parameter_count}; }
  std::span<T> gradients() noexcept { return {grads_.data(), parameter_count}; }
  std::span<const T> gradients() const noexcept { return {grads_.data(), parameter_count}; }
  /// The flat buffer of buffers (running statistics), in the backend's memory space: layer I's
  /// start at Network::buffer_offsets[I]. Forward in training updates them; evaluation reads them.
  std::span<T> buffers() noexcept { return {buffers_.data(), buffer_count}; }
  std::span<const T> buffers() const noexcept { return {buffers_.data(), buffer_count}; }
  /// Layer I's parameters (a view into the flat buffer at its constexpr offset).
  template <std::size_t I>
  std::span<T> layer_parameters() noexcept {
    return {params_.data() + Network::parameter_offsets[I], Network::parameter_counts[I]};
  }
  template <std::size_t I>
  std::span<T> layer_gradients() noexcept {
    return {grads_.data() + Network::parameter_offsets[I], Network::parameter_counts[I]};
  }

  /// Replaces the gradient buffer by a new, zeroed one, abandoning the old without freeing it:
  /// after a recovery, operations of the failed communicator may still write into it.
  void renew_gradients() {
    grads_.abandon();
    grads_ = buffer<T, space>(parameter_count);
  }

  /// The L2 norm of all parameters, summed in double.
  double parameters_l2() const {
    return std::sqrt(Backend::sum(parameter_count, detail::squared_term<T>{params_.data()}));
  }

  /// Copies n values at src, memory of the backend's space (parameters(), gradients(), an
  /// output of forward), to host memory dst; waits for the work that writes them.
  static void copy_to_host(const T* src, std::size_t n, T* dst) {
    if constexpr (space::host_accessible) {
      if (n && dst != src) std::memcpy(dst, src, n * sizeof(T));
    } else {
      space::copy_to_host(dst, src, n * sizeof(T));
    }
  }
  /// Copies n values from host memory src to dst, memory of the backend's space (an input of
  /// forward, parameters()).
  static void copy_from_host(const T* src, std::size_t n, T* dst) {
    if constexpr (space::host_accessible) {
      if (n && dst != src) std::memcpy(dst, src, n * sizeof(T));
    } else {
      space::copy_from_host(dst, src, n * sizeof(T));
    }
  }
  /// The parameters (or gradients) as a host vector.
  std::vector<T> copy_parameters_to_host() const { return to_host(params_.data()); }
  std::vector<T> copy_gradients_to_host() const { return to_host(grads_.data()); }
  /// The buffers as a host vector.
  std::vector<T> copy_buffers_to_host() const {
    std::vector<T> out(buffer_count);
    copy_to_host(buffers_.data(), buffer_count, out.data());
    return out;
  }
  /// Sets every buffer from host values.
  /// Throws: loom::invalid_argument when values does not hold buffer_count values.
  void copy_buffers_from_host(std::span<const T> values) {
    if (values.size() != buffer_count)
      throw invalid_argument("loom::model::copy_buffers_from_host: expected " + std::to_string(buffer_count) +
                             " values, got " + std::to_string(values.size()));
    copy_from_host(values.data(), buffer_count, buffers_.data());
  }
  /// Sets every parameter from host values.
  /// Throws: loom::invalid_argument when values does not hold parameter_count values.
  void copy_parameters_from_host(std::span<const T> values) {
    if (values.size() != parameter_count)
      throw invalid_argument("loom::model::copy_parameters_from_host: expected " + std::to_string(parameter_count) +
                             " values, got " + std::to_string(values.size()));
    copy_from_host(values.data(), parameter_count, params_.data());
  }

 private:
  static std::vector<T> to_host(const T* p) {
    std::vector<T> out(parameter_count);
    copy_to_host(p, parameter_count, out.data());
    return out;
  }

  buffer<T, space> params_, grads_, buffers_, dy_;
  seq seq_;
  typename Backend::format out_format_{};
  typename Backend::layout_converter conv_;
  const T* input_ = nullptr;
};

}  // namespace loom
