// SPDX-License-Identifier: Apache-2.0
#pragma once
// The random parameters, input and output gradient of one pass of a case (cases.hpp), as the
// reference tests draw them: the same seed gives the same pass on every backend.

#include <cstddef>
#include <cstdint>

#include "cases.hpp"
#include "gradient_check.hpp"

namespace loom::cuda_tests {

/// Parameters of scale 0.3 (at least 0.01 from zero), input and output gradient of scale 1,
/// from seeds seed, seed + 1 and seed + 2.
template <class Network>
pass_input random_pass_input(std::size_t batch, std::uint64_t seed, math_mode math = math_mode::fp32) {
  const auto floats = [](const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); };
  pass_input in;
  in.batch = batch;
  in.math = math;
  in.params = floats(loom::testing::random_values(Network::parameter_count, seed, 0.3, 0.01));
  in.x = floats(loom::testing::random_values(batch * Network::input_shape::size, seed + 1, 1.0, 0.0));
  in.dy = floats(loom::testing::random_values(batch * Network::output_shape::size, seed + 2, 1.0, 0.0));
  return in;
}

}  // namespace loom::cuda_tests
