// SPDX-License-Identifier: Apache-2.0
#pragma once
// The definitions of validate.hpp's checks: included at the end of the header (header-only), or
// compiled once in src/loom.cpp (loom::compiled, LOOM_SEPARATE_COMPILATION; loom/core/config.hpp).

#include <sstream>

#include "loom/optim/validate.hpp"

namespace loom::detail {

LOOM_DECL std::string format_number(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

[[noreturn]] LOOM_DECL void throw_out_of_range(const char* who, const char* what, const char* expected,
                                               const std::string& found) {
  throw invalid_argument(std::string(who) + ": " + what + " must be " + expected + ", but is " + found);
}

LOOM_DECL void check_step_arguments(const char* who, std::size_t n, std::size_t expected_n, float lr) {
  if (n != expected_n)
    throw invalid_argument(std::string(who) + ": step() was given " + std::to_string(n) +
                           " parameters, but the state was built for " + std::to_string(expected_n));
  require_in_range(non_negative_finite(lr), who, "the learning rate passed to step()", "finite and >= 0", lr);
}

LOOM_DECL void check_step_part(const char* who, std::size_t offset, std::size_t n, std::size_t expected_n, float lr) {
  if (offset > expected_n || n > expected_n - offset)
    throw invalid_argument(std::string(who) + ": step_part() was given values [" + std::to_string(offset) + ", " +
                           std::to_string(offset + n) + "), but the state holds " + std::to_string(expected_n));
  require_in_range(non_negative_finite(lr), who, "the learning rate passed to step_part()", "finite and >= 0", lr);
}

}  // namespace loom::detail
