// SPDX-License-Identifier: Apache-2.0
// The main job: train an MLP or a CNN on Fashion-MNIST (Debian's dataset-fashion-mnist) and
// print one machine-readable `result:` line. Run with --help for the flags. Built with MPI it
// trains data-parallel over every process `mpirun -np N` starts (one rank without mpirun);
// each rank reads only its own samples of every batch from the memory-mapped data set.

#include <charconv>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <string_view>

#include "loom/loom.hpp"
#if LOOM_HAS_MPI
#include "loom/comm/mpi.hpp"
#include "loom/data/mapped.hpp"
#endif

namespace {

using mlp = loom::network<loom::input<784>,
                          loom::linear<256>, loom::relu,
                          loom::linear<128>, loom::relu,
                          loom::linear<10>>;

using cnn = loom::network<loom::input<1, 28, 28>,
                          loom::conv2d<32, 3, 1, 1>, loom::relu, loom::max_pool2d<2>,
                          loom::conv2d<64, 3, 1, 1>, loom::relu, loom::max_pool2d<2>,
                          loom::flatten,
                          loom::linear<128>, loom::relu,
                          loom::linear<10>>;

struct flags {
  std::string model = "mlp";
  std::size_t epochs = 5;
  std::size_t batch = 64;
  float lr = 0.02f;
  float momentum = 0.9f;
  std::string optimizer = "sgd";
  std::uint64_t seed = 1;
  int threads = 0;
  std::size_t max_steps = 0;
  std::size_t train_samples = 0;
  std::size_t test_samples = 0;
  std::string data = loom::data::default_fashion_mnist_dir;
  bool quiet = false;
};

constexpr const char* usage = R"(usage: fashion_mnist [flags]
  --model mlp|cnn        network to train (default mlp: 784-256-128-10 with ReLU;
                         cnn: two 3x3 conv + max-pool blocks, then 128 and 10)
  --epochs N             passes over the training set (default 5)
  --batch N              samples per step, over all ranks (default 64)
  --lr X                 learning rate (default 0.02)
  --momentum X           SGD momentum (default 0.9)
  --optimizer sgd|adam   (default sgd)
  --seed N               seed of initialisation and shuffling (default 1)
  --threads N            compute threads per rank, 0 = cores / ranks on this host (default 0)
  --max-steps N          stop after N steps in all (default: no limit)
  --train-samples N      use only the first N training images (default: all 60000)
  --test-samples N       evaluate on the first N test images (default: all 10000)
  --data DIR             directory with the IDX files (default /usr/share/datasets/fashion-mnist)
  --quiet                no progress output
)";

[[noreturn]] void bad_flag(const std::string& msg) {
  std::cerr << "fashion_mnist: " << msg << "\n\n" << usage;
  std::exit(2);
}

template <class N>
N number(std::string_view flag, std::string_view text) {
  N v{};
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc{} || p != text.data() + text.size())
    bad_flag("--" + std::string(flag) + " needs a number, got '" + std::string(text) + "'");
  return v;
}

flags parse(int argc, char** argv) {
  flags f;
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a == "--help" || a == "-h") {
      std::cout << usage;
      std::exit(0);
    }
    if (a == "--quiet") {
      f.quiet = true;
      continue;
    }
    if (a.substr(0, 2) != "--") bad_flag("unexpected argument '" + std::string(a) + "'");
    std::string_view name = a.substr(2), value;
    if (auto eq = name.find('='); eq != std::string_view::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    } else {
      if (i + 1 >= argc) bad_flag("--" + std::string(name) + " needs a value");
      value = argv[++i];
    }
    if (name == "model") f.model = value;
    else if (name == "epochs") f.epochs = number<std::size_t>(name, value);
    else if (name == "batch") f.batch = number<std::size_t>(name, value);
    else if (name == "lr") f.lr = number<float>(name, value);
    else if (name == "momentum") f.momentum = number<float>(name, value);
    else if (name == "optimizer") f.optimizer = value;
    else if (name == "seed") f.seed = number<std::uint64_t>(name, value);
    else if (name == "threads") f.threads = number<int>(name, value);
    else if (name == "max-steps") f.max_steps = number<std::size_t>(name, value);
    else if (name == "train-samples") f.train_samples = number<std::size_t>(name, value);
    else if (name == "test-samples") f.test_samples = number<std::size_t>(name, value);
    else if (name == "data") f.data = value;
    else bad_flag("unknown flag --" + std::string(name));
  }
  if (f.model != "mlp" && f.model != "cnn") bad_flag("--model must be mlp or cnn, got '" + f.model + "'");
  if (f.optimizer != "sgd" && f.optimizer != "adam") bad_flag("--optimizer must be sgd or adam, got '" + f.optimizer + "'");
  if (f.batch == 0) bad_flag("--batch must be at least 1");
  if (f.epochs == 0) bad_flag("--epochs must be at least 1");
  return f;
}

#if LOOM_HAS_MPI
using policy = loom::data_parallel<loom::mpi_comm>;
#else
using policy = loom::single_process;
#endif

template <class Set>
Set subset(Set set, std::size_t n) {
  return n ? set.first(n) : std::move(set);
}

template <class Net, class Optimizer>
int train(const flags& f, typename Optimizer::options opt) {
#if LOOM_HAS_MPI
  // Memory-mapped: a rank touches only the pages of its own samples.
  auto train_set = subset(loom::data::mapped_fashion_mnist(f.data, loom::data::split::train), f.train_samples);
  auto test_set = subset(loom::data::mapped_fashion_mnist(f.data, loom::data::split::test), f.test_samples);
#else
  auto train_set = subset(loom::data::fashion_mnist(f.data, loom::data::split::train), f.train_samples);
  auto test_set = subset(loom::data::fashion_mnist(f.data, loom::data::split::test), f.test_samples);
#endif

  loom::trainer<Net, loom::softmax_cross_entropy, Optimizer, policy> t{opt, {.seed = f.seed, .threads = f.threads}};
  const bool lead = t.rank() == 0;
  if (!f.quiet && lead)
    std::cerr << "fashion_mnist: " << f.model << " (" << Net::parameter_count << " parameters), " << train_set.size()
              << " training and " << test_set.size() << " test images, " << t.ranks() << " rank(s) x "
              << loom::threads() << " thread(s)\n";
  loom::fit_options fo;
  fo.epochs = f.epochs;
  fo.batch = f.batch;
  fo.max_steps = f.max_steps;
  fo.progress = f.quiet ? nullptr : &std::cerr;
  const auto fit = t.fit(train_set, fo);
  const auto eval = t.evaluate(test_set);
  if (!lead) return 0;
  if (!f.quiet && fit.ranks > 1) std::cerr << loom::figures_table(fit.figures);
  std::printf("result: model=%s epochs=%zu batch=%zu test_accuracy=%.4f train_loss=%.4f samples_per_s=%.0f "
              "params_l2=%.6f ranks=%d comm_exposed_s=%.3f\n",
              f.model.c_str(), fit.epochs, f.batch, eval.accuracy, fit.train_loss, fit.samples_per_s(),
              t.model().parameters_l2(), fit.ranks, fit.figures.empty() ? 0.0 : fit.figures[0].comm_exposed_s);
  return 0;
}

template <class Net>
int train_with(const flags& f) {
  if (f.optimizer == "adam") return train<Net, loom::adam>(f, {.lr = f.lr});
  return train<Net, loom::sgd>(f, {.lr = f.lr, .momentum = f.momentum});
}

}  // namespace

int main(int argc, char** argv) {
#if LOOM_HAS_MPI
  loom::mpi::environment env{argc, argv};
#endif
  const flags f = parse(argc, argv);
  try {
    return f.model == "cnn" ? train_with<cnn>(f) : train_with<mlp>(f);
  } catch (const loom::error& e) {
#if LOOM_HAS_MPI
    // Peers may be waiting in a collective for this rank: end the whole job, not just this rank.
    if (loom::mpi_comm::world().size() > 1) loom::mpi_comm::world().abort(1, std::string("fashion_mnist: ") + e.what());
#endif
    std::cerr << "fashion_mnist: " << e.what() << "\n";
    return 1;
  }
}
