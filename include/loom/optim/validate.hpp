// SPDX-License-Identifier: Apache-2.0
#pragma once
// Argument checks shared by the optimizers, schedules and clipping: each failure throws a
// loom::invalid_argument naming who complained, the argument, the expected range and the value
// found. Internal to loom/optim/.

#include <cmath>
#include <cstddef>
#include <string>

#include "loom/core/config.hpp"
#include "loom/core/error.hpp"

namespace loom::detail {

/// "1.5", "1e-08", "nan": a number as a message shows it.
LOOM_DECL std::string format_number(double v);

/// Throws "<who>: <what> must be <expected>, but is <found>".
[[noreturn]] LOOM_DECL void throw_out_of_range(const char* who, const char* what, const char* expected,
                                               const std::string& found);

/// Requires ok; otherwise throws naming `what`, the expected range and the value.
inline void require_in_range(bool ok, const char* who, const char* what, const char* expected, double found) {
  if (!ok) throw_out_of_range(who, what, expected, format_number(found));
}

/// True for a finite v > 0 (NaN fails).
inline bool positive_finite(double v) { return v > 0 && std::isfinite(v); }
/// True for a finite v >= 0 (NaN fails).
inline bool non_negative_finite(double v) { return v >= 0 && std::isfinite(v); }
/// True for v in [0, 1) (NaN fails).
inline bool unit_interval_open_right(double v) { return v >= 0 && v < 1; }

/// The step() precondition every optimizer state shares: the learning rate is finite and >= 0
/// (a schedule may reach 0) and the parameter count is the one the state was built for.
LOOM_DECL void check_step_arguments(const char* who, std::size_t n, std::size_t expected_n, float lr);

/// step_part's arguments: [offset, offset + n) within the state's expected_n values, lr finite
/// and >= 0.
LOOM_DECL void check_step_part(const char* who, std::size_t offset, std::size_t n, std::size_t expected_n, float lr);

}  // namespace loom::detail

#if defined(LOOM_DEFINITIONS_VISIBLE)
#include "loom/optim/impl/validate.ipp"
#endif
