// SPDX-License-Identifier: Apache-2.0
// Shared by the pipeline tests (local_comm and mpirun): the single-process reference with any
// fit options, and the policies under test.

#include <string>
#include <vector>

#include "common.hpp"

namespace loom_test {

inline const loom::sgd::options pipeline_sgd{.lr = 0.02f, .momentum = 0.9f};

/// The parameters (and the fit result) after training Net alone with opts on data.
template <class Net, class Dataset>
std::vector<float> reference_with(const Dataset& data, const loom::fit_options& opts, loom::fit_result* result = nullptr,
                                  loom::eval_result* eval = nullptr, loom::math_mode math = loom::math_mode::fp32) {
  loom::trainer<Net, loom::softmax_cross_entropy, loom::sgd> t{pipeline_sgd, {.seed = 1, .threads = 1, .math = math}};
  const auto r = t.fit(data, opts);
  if (result) *result = r;
  if (eval) *eval = t.evaluate(data, 100);
  auto p = t.model().parameters();
  return {p.begin(), p.end()};
}

/// The whole model a freshly built single-process trainer starts from.
template <class Net>
std::vector<float> initial_parameters() {
  loom::model<Net> m(1);
  auto p = m.parameters();
  return {p.begin(), p.end()};
}

}  // namespace loom_test
