// SPDX-License-Identifier: Apache-2.0
#pragma once
// Batched tensors: a compile-time per-sample shape, a run-time batch, a scalar type and a
// memory space. tensor owns its storage; tensor_view does not. Both are dense and row-major
// as (batch, Shape...).

#include <cassert>
#include <cstddef>
#include <span>

#include "loom/core/config.hpp"
#include "loom/core/error.hpp"
#include "loom/core/memory.hpp"
#include "loom/core/shape.hpp"

namespace loom {

/// A non-owning (batch, Shape...) window over memory in Space.
template <class T, shape_type Shape, class Space = host_space>
class tensor_view {
 public:
  using value_type = T;
  using sample_shape = Shape;
  using memory_space = Space;
  static constexpr std::size_t sample_size = Shape::size;

  constexpr tensor_view() = default;
  LOOM_HD constexpr tensor_view(T* data, std::size_t batch) : data_(data), batch_(batch) {}

  LOOM_HD constexpr T* data() const noexcept { return data_; }
  LOOM_HD constexpr std::size_t batch() const noexcept { return batch_; }
  LOOM_HD constexpr std::size_t size() const noexcept { return batch_ * Shape::size; }
  /// The n-th sample's first element.
  LOOM_HD constexpr T* sample(std::size_t n) const noexcept { return data_ + n * Shape::size; }
  LOOM_HD constexpr T& operator[](std::size_t i) const noexcept { return data_[i]; }
  /// Element (n, i0, i1, ...) — one index per extent of Shape.
  template <class... I>
  LOOM_HD constexpr T& operator()(std::size_t n, I... idx) const noexcept {
    static_assert(sizeof...(I) == Shape::rank, "loom::tensor_view: give one index per extent of the shape, after the batch index");
    std::size_t flat = n;
    std::size_t k = 0;
    ((flat = flat * Shape::dims[k++] + static_cast<std::size_t>(idx)), ...);
    return data_[flat];
  }
  /// The same memory seen as another shape of equal size.
  template <shape_type Other>
  constexpr tensor_view<T, Other, Space> reshape() const noexcept {
    static_assert(Other::size == Shape::size, "loom::tensor_view::reshape keeps the number of elements per sample");
    return {data_, batch_};
  }
  operator tensor_view<const T, Shape, Space>() const noexcept { return {data_, batch_}; }

 private:
  T* data_ = nullptr;
  std::size_t batch_ = 0;
};

/// An owning (batch, Shape...) tensor, zero-initialised.
template <class T, shape_type Shape, class Space = host_space>
class tensor {
 public:
  using value_type = T;
  using sample_shape = Shape;
  using memory_space = Space;

  tensor() = default;
  explicit tensor(std::size_t batch) : storage_(batch * Shape::size), batch_(batch) {}

  T* data() noexcept { return storage_.data(); }
  const T* data() const noexcept { return storage_.data(); }
  std::size_t batch() const noexcept { return batch_; }
  std::size_t size() const noexcept { return batch_ * Shape::size; }
  T& operator[](std::size_t i) noexcept { return storage_[i]; }
  const T& operator[](std::size_t i) const noexcept { return storage_[i]; }
  template <class... I>
  T& operator()(std::size_t n, I... idx) noexcept { return view()(n, idx...); }
  template <class... I>
  const T& operator()(std::size_t n, I... idx) const noexcept { return view()(n, idx...); }

  tensor_view<T, Shape, Space> view() noexcept { return {data(), batch_}; }
  tensor_view<const T, Shape, Space> view() const noexcept { return {data(), batch_}; }
  std::span<T> flat() noexcept { return {data(), size()}; }
  std::span<const T> flat() const noexcept { return {data(), size()}; }

 private:
  buffer<T, Space> storage_;
  std::size_t batch_ = 0;
};

}  // namespace loom
