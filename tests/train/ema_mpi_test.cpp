// SPDX-License-Identifier: Apache-2.0
// The EMA of the weights (trainer_options::ema) under data_parallel<mpi_comm>, in processes
// mpirun starts: every rank keeps the whole model's, and in split-invariant mode
// (deterministic_chunk) it is bitwise the EMA of one process training alone (which every rank
// also runs, on its own); the replicas' EMAs are bitwise equal, and evaluate_ema agrees on every
// rank; a checkpoint written on these ranks resumes alone with the same EMA as the run that
// never stopped. Rank 0 prints "all checks passed".

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "loom/comm/mpi.hpp"
#include "loom/loom.hpp"
#include "mpi_check.hpp"

namespace {

namespace fs = std::filesystem;
using net = loom::network<loom::input<784>, loom::linear<32>, loom::relu, loom::linear<10>>;
using dp = loom::data_parallel<loom::mpi_comm>;
const loom::sgd::options sgd_opt{.lr = 0.05f, .momentum = 0.9f};
const loom::ema_options ema{.decay = 0.75, .every = 2};

loom::fit_options options(std::size_t max_steps, const std::string& dir = {}) {
  loom::fit_options o;
  o.epochs = 10;
  o.max_steps = max_steps;
  o.batch = 60;
  o.deterministic_chunk = 10;  // 6 chunks: 1, 2 or 3 ranks alike
  o.progress = nullptr;
  o.checkpoint.directory = dir;
  o.checkpoint.every_steps = dir.empty() ? 0 : max_steps;
  o.checkpoint.at_end = false;
  o.checkpoint.on_signal = false;
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  loom::mpi::environment env{argc, argv};
  auto comm = loom::mpi_comm::world();
  using loom_test::check;
  const auto data = loom::data::fashion_mnist(loom::data::split::train).first(480);
  const auto test = loom::data::fashion_mnist(loom::data::split::test).first(200);
  const loom::trainer_options topts{.seed = 5, .threads = 1, .ema = ema};
  constexpr std::size_t steps = 7, stop_at = 4;

  // One process alone (each rank runs it on its own).
  loom::trainer<net, loom::softmax_cross_entropy, loom::sgd> alone{sgd_opt, topts};
  alone.fit(data, options(steps));
  const std::vector<float> want = alone.ema_values();

  // The replicas, over every rank.
  loom::trainer<net, loom::softmax_cross_entropy, loom::sgd, dp> t{sgd_opt, topts};
  t.fit(data, options(steps));
  check(t.has_ema(), "the data-parallel trainer holds an EMA");
  check(t.ema_values() == want, "the EMA equals the single process's bitwise");
  std::vector<float> rank0 = t.ema_values();
  comm.broadcast(rank0.data(), rank0.size(), 0);
  check(t.ema_values() == rank0, "the EMA equals rank 0's bitwise");
  const loom::eval_result e = t.evaluate_ema(test);
  check(e.samples == 200, "evaluate_ema saw every sample once");
  check(std::abs(e.loss - alone.evaluate_ema(test).loss) < 1e-6, "evaluate_ema agrees with the single process's");
  check(e.loss != t.evaluate(test).loss, "evaluate_ema differs from evaluate");

  // A checkpoint at step 4 on these ranks, resumed alone.
  char dir_name[256] = {};
  if (comm.rank() == 0)
    std::snprintf(dir_name, sizeof dir_name, "%s/loom-ema-mpi-%d", fs::temp_directory_path().c_str(),
                  static_cast<int>(::getpid()));
  comm.broadcast(dir_name, sizeof dir_name, 0);
  {
    loom::trainer<net, loom::softmax_cross_entropy, loom::sgd, dp> first{sgd_opt, topts};
    first.fit(data, options(stop_at, dir_name));
  }
  if (comm.rank() == 0) {
    loom::trainer<net, loom::softmax_cross_entropy, loom::sgd> resumed{sgd_opt, topts};
    auto o = options(steps, dir_name);
    o.checkpoint.every_steps = 0;
    o.checkpoint.resume = true;
    resumed.fit(data, o);
    check(resumed.ema_values() == want, "a resume alone from the ranks' checkpoint ends with the same EMA");
    fs::remove_all(dir_name);
  }
  return loom_test::finish(comm);
}
