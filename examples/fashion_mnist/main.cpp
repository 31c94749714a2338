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
/// --grad-compression bf16|fp16: the gradients sent in 16 bits (loom::compress<>). Built for SGD
/// only, which is what it is measured with, to keep the example's compile time.
template <class H>
using compressed_policy = loom::data_parallel<loom::mpi_comm, loom::compress<H>>;
/// --zero: the optimizer state sharded over the ranks (ZeRO stage 1).
using zero_policy = loom::data_parallel<loom::mpi_comm, loom::shard_optimizer_state>;
#else
using policy = loom::single_process;
#endif

/// --grad-compression: none (default), bf16 or fp16.
std::string grad_compression = "none";

template <class Net, class Optimizer, class Policy = policy>
int train(const example::flags& f, typename Optimizer::options opt) {
  auto train_set = example::load(f, loom::data::split::train);
  auto test_set = example::load(f, loom::data::split::test);
  loom::trainer<Net, loom::softmax_cross_entropy, Optimizer, Policy> t{opt, {.seed = f.seed, .threads = f.threads}};
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
  if (f.zero) {
#if LOOM_HAS_MPI
    if (grad_compression != "none")
      throw loom::invalid_argument("--zero is built without --grad-compression (the library has both: "
                                   "loom::data_parallel<Comm, loom::shard_optimizer_state, loom::compress<H>>)");
    if (f.optimizer == "adam") return train<Net, loom::adam, zero_policy>(f, {.lr = f.lr});
    return train<Net, loom::sgd, zero_policy>(f, {.lr = f.lr, .momentum = f.momentum});
#else
    throw loom::invalid_argument("--zero needs the MPI build (data parallelism)");
#endif
  }
  if (grad_compression != "none") {
#if LOOM_HAS_MPI
    if (f.optimizer != "sgd")
      throw loom::invalid_argument("--grad-compression " + grad_compression + " is built with --optimizer sgd only");
    const loom::sgd::options o{.lr = f.lr, .momentum = f.momentum};
    if (grad_compression == "bf16") return train<Net, loom::sgd, compressed_policy<loom::bf16>>(f, o);
    return train<Net, loom::sgd, compressed_policy<loom::fp16>>(f, o);
#else
    throw loom::invalid_argument("--grad-compression needs the MPI build (data parallelism)");
#endif
  }
  if (f.optimizer == "adam") return train<Net, loom::adam>(f, {.lr = f.lr});
  return train<Net, loom::sgd>(f, {.lr = f.lr, .momentum = f.momentum});
}

}  // namespace

int main(int argc, char** argv) {
#if LOOM_HAS_MPI
  loom::mpi::environment env{argc, argv};
#endif
  example::parser p(program, std::string("usage: fashion_mnist [flags]\n") + example::common_usage +
                                  "  --grad-compression none|bf16|fp16  gradients sent in 16 bits, summed in float\n"
                                  "                         (loom::compress<>; data parallel, SGD; default none)\n");
  const example::flags f = p.with_weights_flags().with_zero_flag().parse(argc, argv, [&](std::string_view name, std::string_view value) {
    if (name != "grad-compression") return false;
    grad_compression = value;
    if (grad_compression != "none" && grad_compression != "bf16" && grad_compression != "fp16")
      p.fail("--grad-compression must be none, bf16 or fp16, got '" + grad_compression + "'");
    return true;
  });
  if (f.print_valid_world_sizes) {
    example::print_valid_world_sizes(f.model == "cnn"
                                         ? loom::world_size_rules<example::cnn, policy>::list(f.batch, f.deterministic_chunk)
                                         : loom::world_size_rules<example::mlp, policy>::list(f.batch, f.deterministic_chunk));
    return 0;
  }
  return example::guarded(program, [&] { return f.model == "cnn" ? train_with<example::cnn>(f) : train_with<example::mlp>(f); });
}
