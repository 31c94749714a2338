// SPDX-License-Identifier: Apache-2.0
#pragma once
// Shared by the pipeline tests over loom::local_comm (stages as threads of this process): the
// policies under test and a run of N ranks that gathers what every rank ends with.

#include <cstddef>
#include <vector>

#include "loom/comm/local.hpp"
#include "pipeline_common.hpp"

namespace loom_test {

template <std::size_t S, class... O>
using local_pipeline = loom::model_parallel<loom::pipeline<S, O...>, loom::local_comm>;
template <std::size_t S, class... O>
using local_hybrid = loom::hybrid<loom::data_parallel<loom::local_comm>, loom::pipeline<S, O...>>;

template <class Net, class Policy>
using pipeline_trainer = loom::trainer<Net, loom::softmax_cross_entropy, loom::sgd, Policy>;

/// What every rank of a run ends with.
struct run_output {
  std::vector<std::vector<float>> params;  // gathered, by world rank
  std::vector<loom::fit_result> results;   // by world rank
  std::vector<loom::eval_result> evals;    // by world rank (when asked)
};

template <class Net, class Policy, class Dataset>
run_output train_pipeline(int ranks, const Dataset& data, const loom::fit_options& opts, bool evaluate = false,
                          loom::math_mode math = loom::math_mode::fp32) {
  run_output out;
  out.params.resize(static_cast<std::size_t>(ranks));
  out.results.resize(static_cast<std::size_t>(ranks));
  out.evals.resize(static_cast<std::size_t>(ranks));
  loom::local_world(ranks).run([&](loom::local_comm& c) {
    pipeline_trainer<Net, Policy> t{c, pipeline_sgd, {.seed = 1, .threads = 1, .math = math}};
    const auto r = t.fit(data, opts);
    const auto i = static_cast<std::size_t>(c.rank());
    out.results[i] = r;
    out.params[i] = t.gather_parameters();
    if (evaluate) out.evals[i] = t.evaluate(data, 100);
  });
  for (int r = 1; r < ranks; ++r) {
    const bool gathered_alike = out.params[static_cast<std::size_t>(r)] == out.params[0];
    REQUIRE(gathered_alike);
  }
  return out;
}

}  // namespace loom_test
