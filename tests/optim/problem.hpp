// SPDX-License-Identifier: Apache-2.0
#pragma once
// The fixed problem the golden values were made on (see make_golden.py), extended to any
// length, and the relative comparison the optimizer tests use.

#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <string>
#include <type_traits>
#include <vector>

namespace loom_test {

/// Initial value of parameter i: 0.5 + 0.25 i (exact in float and double).
template <class T>
T initial_param(std::size_t i) {
  return static_cast<T>(0.5 + 0.25 * static_cast<double>(i));
}

/// Gradient of parameter i at step t: (((7 i + 3 t) mod 11) - 5.5) / 4 (exact, never 0).
template <class T>
T grad_at(std::size_t i, std::size_t t) {
  return static_cast<T>((static_cast<double>((7 * i + 3 * t) % 11) - 5.5) / 4.0);
}

template <class T>
std::vector<T> initial_params(std::size_t n) {
  std::vector<T> p(n);
  for (std::size_t i = 0; i < n; ++i) p[i] = initial_param<T>(i);
  return p;
}

template <class T>
std::vector<T> grads_at(std::size_t n, std::size_t t) {
  std::vector<T> g(n);
  for (std::size_t i = 0; i < n; ++i) g[i] = grad_at<T>(i, t);
  return g;
}

/// The relative tolerance a T computation is held to against double golden values.
template <class T>
constexpr double relative_tolerance() {
  return std::is_same_v<T, double> ? 1e-12 : 1e-6;
}

/// Checks |got[i] - want[i]| <= rel |want[i]| for every i, naming the first element that fails.
template <class T>
void check_close(const char* what, const T* got, const double* want, std::size_t n, double rel) {
  for (std::size_t i = 0; i < n; ++i) {
    const double g = static_cast<double>(got[i]);
    const double err = std::abs(g - want[i]);
    if (!(err <= rel * std::abs(want[i]))) {
      FAIL_CHECK(what << "[" << i << "] = " << g << " but want " << want[i] << " (relative error "
                      << err / std::abs(want[i]) << ", allowed " << rel << ")");
      return;
    }
  }
  SUCCEED();
}

}  // namespace loom_test
