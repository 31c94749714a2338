// SPDX-License-Identifier: Apache-2.0
// The main job: train an MLP or a CNN on Fashion-MNIST (Debian's dataset-fashion-mnist) and
// print one machine-readable `result:` line. Run with --help for the flags. Built with MPI it
// trains data-parallel over every process `mpirun -np N` starts (one rank without mpirun);
// each rank reads only its own samples of every batch from the memory-mapped data set.

#include "../common/example.hpp"
#include "../common/weights.hpp"

namespace {

constexpr const char* program = "fashion_mnist";

#if LOOM_HAS_MPI
using policy = loom::data_parallel<loom::mpi_comm>;
#else
using policy = loom::single_process;
#endif

template <class Net, class Optimizer>
int train(const example::flags& f, typename Optimizer::options opt) {
  auto train_set = example::load(f, loom::data::split::train);
  auto test_set = example::load(f, loom::data::split::test);
  loom::trainer<Net, loom::softmax_cross_entropy, Optimizer, policy> t{opt, {.seed = f.seed, .threads = f.threads}};
  const bool lead = t.rank() == 0;
  if (!f.quiet && lead)
    std::cerr << program << ": " << f.model << " (" << Net::parameter_count << " parameters), " << train_set.size()
              << " training and " << test_set.size() << " test images, " << t.ranks() << " rank(s) x "
              << loom::threads() << " thread(s)\n";
  example::load_weights(f, t);
  // --epochs 0 (with --load-weights): no training, only evaluation and the files asked for.
  const auto fit = [&] {
    if (f.epochs) return t.fit(train_set, example::fit_options_of(f));
    loom::fit_result none;
    none.ranks = t.ranks();
    return none;
  }();
  if (example::after_fit(program, f, t, fit)) return 0;
  const auto eval = t.evaluate(test_set);
  // After a recovery from a failed rank the lead may be another process: ask again.
  if (t.rank() != 0) return 0;
  if (!f.quiet && fit.ranks > 1) std::cerr << loom::figures_table(fit.figures);
  example::print_result(f, fit, eval, t.model().parameters_l2());
  example::write_onnx(f, t.model());
  return 0;
}

template <class Net>
int train_with(const example::flags& f) {
  if (f.optimizer == "adam") return train<Net, loom::adam>(f, {.lr = f.lr});
  return train<Net, loom::sgd>(f, {.lr = f.lr, .momentum = f.momentum});
}

}  // namespace

int main(int argc, char** argv) {
#if LOOM_HAS_MPI
  loom::mpi::environment env{argc, argv};
#endif
  const example::flags f =
      example::parser(program, std::string("usage: fashion_mnist [flags]\n") + example::common_usage)
          .with_weights_flags()
          .parse(argc, argv);
  if (f.print_valid_world_sizes) {
    example::print_valid_world_sizes(f.model == "cnn"
                                         ? loom::world_size_rules<example::cnn, policy>::list(f.batch, f.deterministic_chunk)
                                         : loom::world_size_rules<example::mlp, policy>::list(f.batch, f.deterministic_chunk));
    return 0;
  }
  return example::guarded(program, [&] { return f.model == "cnn" ? train_with<example::cnn>(f) : train_with<example::mlp>(f); });
}
