// SPDX-License-Identifier: Apache-2.0
// The main job: train an MLP or a CNN on Fashion-MNIST (Debian's dataset-fashion-mnist) and
// print one machine-readable `result:` line. Run with --help for the flags. Built with MPI it
// trains data-parallel over every process `mpirun -np N` starts (one rank without mpirun);
// each rank reads only its own samples of every batch from the memory-mapped data set.

#include "../common/example.hpp"
#include "../common/weights.hpp"
#if LOOM_HAS_IMAGES
#include "../common/shards.hpp"
#endif

namespace {

constexpr const char* program = "fashion_mnist";

#if LOOM_HAS_MPI
/// Data parallel over every rank mpirun starts. The wire format (--grad-compression) and ZeRO
/// (--zero) come from flags, so they are chosen at run time (loom::choose_at_run_time), as the
/// optimizer is (loom::any_optimizer): one trainer type per network serves every combination,
/// bitwise as the policy that names them would, and the example compiles the trainer twice
/// (mlp, cnn) rather than once per combination. A program with fixed choices names them:
/// loom::data_parallel<loom::mpi_comm, loom::compress<loom::bf16>>, loom::adam.
using policy = loom::data_parallel<loom::mpi_comm, loom::choose_at_run_time>;
#else
using policy = loom::single_process;
#endif

/// --grad-compression: none (default), bf16 or fp16.
std::string grad_compression = "none";
#if LOOM_HAS_IMAGES
/// --shard-streams, --shuffle-window, --on-bad-sample, --decode-threads (shards in --data).
example::shard_flags shard_flags;
#endif

/// Trains Net on train_set (IDX or shards) and evaluates it on test_set.
template <class Net, class TrainSet, class TestSet>
int train_on(const example::flags& f, const TrainSet& train_set, const TestSet& test_set) {
  const loom::any_optimizer::options opt =
      f.optimizer == "adam" ? loom::any_optimizer::options(loom::adam::options{.lr = f.lr})
                            : loom::any_optimizer::options(loom::sgd::options{.lr = f.lr, .momentum = f.momentum});
  const loom::trainer_options options{.seed = f.seed, .threads = f.threads};
#if LOOM_HAS_MPI
  const loom::data_parallel_choice choice{.wire = grad_compression == "bf16"   ? loom::gradient_wire::bf16
                                                  : grad_compression == "fp16" ? loom::gradient_wire::fp16
                                                                               : loom::gradient_wire::native,
                                          .shard_state = f.zero};
  loom::trainer<Net, loom::softmax_cross_entropy, loom::any_optimizer, policy> t{opt, options, choice};
#else
  if (f.zero) throw loom::invalid_argument("--zero needs the MPI build (data parallelism)");
  if (grad_compression != "none") throw loom::invalid_argument("--grad-compression needs the MPI build (data parallelism)");
  loom::trainer<Net, loom::softmax_cross_entropy, loom::any_optimizer, policy> t{opt, options};
#endif
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
#if LOOM_HAS_IMAGES
  // Every rank that left bad samples out says so (on_bad_sample::skip), --quiet or not.
  example::report_skipped(program, t.rank(), "training", train_set);
  example::report_skipped(program, t.rank(), "test", test_set);
#endif
  // After a recovery from a failed rank the lead may be another process: ask again.
  if (t.rank() != 0) return 0;
  if (!f.quiet && fit.ranks > 1) std::cerr << loom::figures_table(fit.figures);
  example::print_result(f, fit, eval, t.model().parameters_l2());
  example::write_onnx(f, t.model());
  return 0;
}

/// Fashion-MNIST from the shards in --data when it holds train-*.tar and test-*.tar, else from
/// its IDX files.
template <class Net>
int train(const example::flags& f) {
#if LOOM_HAS_IMAGES
  if (example::has_shards(f.data)) {
    const auto train_set = example::load_shards(f, loom::data::split::train, shard_flags.options);
    const auto test_set = example::load_shards(f, loom::data::split::test, shard_flags.options);
    return train_on<Net>(f, train_set, test_set);
  }
#endif
  const auto train_set = example::load(f, loom::data::split::train);
  const auto test_set = example::load(f, loom::data::split::test);
  return train_on<Net>(f, train_set, test_set);
}

}  // namespace

int main(int argc, char** argv) {
#if LOOM_HAS_MPI
  loom::mpi::environment env{argc, argv};
#endif
  example::parser p(program, std::string("usage: fashion_mnist [flags]\n") + example::common_usage +
                                  "  --grad-compression none|bf16|fp16  gradients sent in 16 bits, summed in float\n"
                                  "                         (loom::compress<>; data parallel; default none)\n"
#if LOOM_HAS_IMAGES
                                  + example::shards_usage
#endif
  );
  const example::flags f = p.with_weights_flags().with_zero_flag().parse(argc, argv, [&](std::string_view name, std::string_view value) {
#if LOOM_HAS_IMAGES
    if (shard_flags.take(p, name, value)) return true;
#endif
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
  return example::guarded(program, [&] { return f.model == "cnn" ? train<example::cnn>(f) : train<example::mlp>(f); });
}
