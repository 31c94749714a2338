// SPDX-License-Identifier: Apache-2.0
#pragma once
// Relative comparisons of numbers and of whole spans for the tests, with a Catch2 matcher.
//
// The relative error of an actual value a against an expected value b is
//
//     rel(a, b) = |a - b| / max(|a| + |b|, floor)
//
// |a| + |b| makes it symmetric and keeps it in [0, 1] (1 when the signs differ); `floor` is the
// scale below which values count as "zero": two values both much smaller than floor are
// compared absolutely, |a - b| / floor, so noise around an exact zero does not show up as a
// relative error of 1. rel is 0 when a == b (also when both are 0 and floor is 0).
//
// A span comparison reports the largest rel over all elements and where it is; a size
// mismatch or a non-finite element (NaN, +-inf in either span) counts as error infinity.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <initializer_list>
#include <limits>
#include <ostream>
#include <span>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace loom::testing {

/// rel(a, b) = |a - b| / max(|a| + |b|, floor), see the top of this file.
inline double relative_error(double a, double b, double floor = 0.0) {
  if (!std::isfinite(a) || !std::isfinite(b)) return a == b ? 0.0 : std::numeric_limits<double>::infinity();
  const double d = std::abs(a - b);
  if (d == 0) return 0.0;
  return d / std::max(std::abs(a) + std::abs(b), floor);
}

/// The largest absolute value in a span (0 for an empty one).
template <class T>
double max_abs(std::span<const T> v) {
  double m = 0;
  for (T x : v) m = std::max(m, std::abs(static_cast<double>(x)));
  return m;
}

/// |actual - expected| / |expected| in the 2-norm: how far one result is from another as a
/// whole (infinity for different sizes, a zero or a non-finite expected). For reduced-precision
/// math (bf16), whose rounding errors scale with the terms of a sum rather than the sum, so
/// that element-wise bounds say little where sums cancel.
template <class A, class B>
double normwise_error(std::span<const A> actual, std::span<const B> expected) {
  if (actual.size() != expected.size()) return std::numeric_limits<double>::infinity();
  double d2 = 0, n2 = 0;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const double d = static_cast<double>(actual[i]) - static_cast<double>(expected[i]);
    d2 += d * d;
    n2 += static_cast<double>(expected[i]) * static_cast<double>(expected[i]);
  }
  return n2 > 0 && std::isfinite(d2) && std::isfinite(n2) ? std::sqrt(d2 / n2) : std::numeric_limits<double>::infinity();
}
template <class A, class B>
double normwise_error(const std::vector<A>& actual, const std::vector<B>& expected) {
  return normwise_error(std::span<const A>(actual), std::span<const B>(expected));
}

/// The outcome of comparing two spans element by element.
struct relative_comparison {
  double max_error = 0;        // the largest rel(actual[i], expected[i], floor)
  std::size_t worst = 0;       // the index where it occurs
  double actual_at_worst = 0;  // the two values there
  double expected_at_worst = 0;
  std::size_t actual_size = 0, expected_size = 0;
  double floor = 0;

  std::string str() const {
    std::ostringstream os;
    os.precision(17);
    if (actual_size != expected_size) {
      os << "sizes differ: " << actual_size << " actual vs " << expected_size << " expected";
      return os.str();
    }
    os << "max relative error " << max_error << " over " << actual_size << " values (floor " << floor << ")";
    if (actual_size) os << ", worst at [" << worst << "]: actual " << actual_at_worst << ", expected " << expected_at_worst;
    return os.str();
  }
};

/// Compares actual against expected element by element with rel(., ., floor).
template <class A, class B>
relative_comparison compare_relative(std::span<const A> actual, std::span<const B> expected, double floor = 0.0) {
  relative_comparison r;
  r.actual_size = actual.size();
  r.expected_size = expected.size();
  r.floor = floor;
  if (actual.size() != expected.size()) {
    r.max_error = std::numeric_limits<double>::infinity();
    return r;
  }
  for (std::size_t i = 0; i < actual.size(); ++i) {
    const double a = static_cast<double>(actual[i]), b = static_cast<double>(expected[i]);
    double e = relative_error(a, b, floor);
    if (std::isnan(e)) e = std::numeric_limits<double>::infinity();
    if (i == 0 || e > r.max_error) r.max_error = e, r.worst = i, r.actual_at_worst = a, r.expected_at_worst = b;
  }
  return r;
}
template <class A, class B>
relative_comparison compare_relative(const std::vector<A>& actual, const std::vector<B>& expected, double floor = 0.0) {
  return compare_relative(std::span<const A>(actual), std::span<const B>(expected), floor);
}

/// A span to hand to CHECK_THAT: it prints as its size and first values, never all of them.
template <class T>
struct values {
  std::span<const T> data;
  friend std::ostream& operator<<(std::ostream& os, const values& v) {
    os << "{" << v.data.size() << " values";
    const std::size_t shown = std::min<std::size_t>(v.data.size(), 4);
    for (std::size_t i = 0; i < shown; ++i) os << (i ? ", " : ": ") << v.data[i];
    if (shown < v.data.size()) os << ", ...";
    return os << "}";
  }
};
template <class T>
values<T> values_of(std::span<const T> s) {
  return {s};
}
template <class T>
values<T> values_of(std::span<T> s) {
  return {std::span<const T>(s)};
}
template <class T>
values<T> values_of(const std::vector<T>& v) {
  return {std::span<const T>(v)};
}
template <class T>
values<T> values_of(const T* p, std::size_t n) {
  return {std::span<const T>(p, n)};
}

/// Catch2 matcher: every element's rel(actual, expected, floor) is at most `tolerance`.
/// Its description names the worst element of the last match.
template <class T>
class relatively_equals_matcher : public Catch::MatcherBase<values<T>> {
 public:
  relatively_equals_matcher(std::vector<double> expected, double tolerance, double floor)
      : expected_(std::move(expected)), tolerance_(tolerance), floor_(floor) {}

  bool match(const values<T>& actual) const override {
    last_ = compare_relative(actual.data, std::span<const double>(expected_), floor_);
    return last_.max_error <= tolerance_;
  }
  std::string describe() const override {
    std::ostringstream os;
    os << "is within relative error " << tolerance_ << " of the expected values: " << last_.str();
    return os.str();
  }

 private:
  std::vector<double> expected_;
  double tolerance_, floor_;
  mutable relative_comparison last_;
};

/// CHECK_THAT(values_of(y), relatively_equals<float>(expected, 1e-6)): each element within
/// relative error `tolerance` of the expected one (see the top of this file for rel and floor).
template <class T, class E>
relatively_equals_matcher<T> relatively_equals(const std::vector<E>& expected, double tolerance, double floor = 0.0) {
  return {std::vector<double>(expected.begin(), expected.end()), tolerance, floor};
}
template <class T, class E>
relatively_equals_matcher<T> relatively_equals(std::span<const E> expected, double tolerance, double floor = 0.0) {
  return {std::vector<double>(expected.begin(), expected.end()), tolerance, floor};
}
template <class T>
relatively_equals_matcher<T> relatively_equals(std::initializer_list<double> expected, double tolerance, double floor = 0.0) {
  return {std::vector<double>(expected), tolerance, floor};
}

}  // namespace loom::testing
