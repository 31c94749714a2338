// SPDX-License-Identifier: Apache-2.0
#pragma once
// The message of the exception a piece of test code throws, for matching its wording.

#include <string>

namespace loom::testing {

/// What the Error that f() throws says, or "(no <what>)" when f returns normally (so that a
/// Contains(...) on it fails and shows why).
template <class Error, class F>
std::string error_message(F&& f, const char* what = "expected exception") {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return std::string("(no ") + what + ")";
}

}  // namespace loom::testing
