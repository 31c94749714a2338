// SPDX-License-Identifier: Apache-2.0
// Tensor (Megatron-style) model parallelism: the main example's mlp with its two hidden layers
// as a column-parallel then a row-parallel linear, each rank holding half of their weights
// (`mpirun -np 2`; with -np 4, 2 data-parallel replicas of 2 tensor-parallel ranks, and with
// --zero each slice's optimizer state sharded over its 2 replicas). Takes the main example's
// flags (the mlp only) and ends with the same `result:` line; with the same
// seed, batch and steps its params_l2 (over the whole model) equals the main example's
// one-rank mlp figure: split or not, the layers start from the same values.

#include "../common/example.hpp"

#if !LOOM_HAS_MPI
#error "examples/tensor_parallel needs MPI (configure with LOOM_WITH_MPI=ON)"
#endif

namespace {

constexpr const char* program = "tensor_parallel";

/// The main example's mlp: 784-256-128-10 with ReLU, the 256 and 128 layers split over 2 ranks.
using tp_mlp = loom::network<loom::input<784>,
                             loom::column_parallel<loom::linear<256>>, loom::relu,
                             loom::row_parallel<loom::linear<128>>, loom::relu,
                             loom::linear<10>>;

template <class Policy, class Optimizer>
int train(const example::flags& f, typename Optimizer::options opt) {
  auto train_set = example::load(f, loom::data::split::train);
  auto test_set = example::load(f, loom::data::split::test);
  loom::trainer<tp_mlp, loom::softmax_cross_entropy, Optimizer, Policy> t{opt, {.seed = f.seed, .threads = f.threads}};
  const bool lead = t.rank() == 0;
  if (!f.quiet && lead)
    std::cerr << program << ": mlp (" << tp_mlp::parameter_count << " parameters, 256- and 128-wide layers split over 2 "
              << "ranks), " << t.ranks() << " rank(s), " << train_set.size() << " training images, " << loom::threads()
              << " thread(s) per rank\n";
  example::load_weights(f, t);
  const auto fit = t.fit(train_set, example::fit_options_of(f));
  if (example::after_fit(program, f, t, fit)) return 0;
  const auto eval = t.evaluate(test_set);
  const double l2 = t.parameters_l2();  // collective
  // After a recovery (4 ranks: a replica lost a rank and left) the lead may be another process.
  if (t.rank() != 0) return 0;
  if (!f.quiet) std::cerr << loom::figures_table(fit.figures);
  example::print_result(f, fit, eval, l2, " tensor_parallel=2");
  return 0;
}

template <class Policy>
int with_optimizer(const example::flags& f) {
  if (f.optimizer == "adam") return train<Policy, loom::adam>(f, {.lr = f.lr});
  return train<Policy, loom::sgd>(f, {.lr = f.lr, .momentum = f.momentum});
}

}  // namespace

int main(int argc, char** argv) {
  loom::mpi::environment env{argc, argv};
  const example::flags f = example::parser(program, std::string("usage: mpirun -np 2|4 tensor_parallel [flags]\n") +
                                                        example::model_usage + example::common_usage)
                               .with_zero_flag()
                               .parse(argc, argv);
  if (f.print_valid_world_sizes) {
    // What this program builds: tensor_parallel<2> on 2 ranks, 2 replicas of it on 4 (--zero: 4 only).
    std::vector<std::size_t> sizes;
    if (!f.zero && loom::world_size_rules<tp_mlp, loom::model_parallel<loom::tensor_parallel<2>, loom::mpi_comm>>::accepts(
                       2, f.batch, f.deterministic_chunk))
      sizes.push_back(2);
    if (loom::world_size_rules<tp_mlp, loom::hybrid<loom::data_parallel<loom::mpi_comm>, loom::tensor_parallel<2>>>::accepts(
            4, f.batch, f.deterministic_chunk))
      sizes.push_back(4);
    example::print_valid_world_sizes(f.model == "mlp" ? sizes : std::vector<std::size_t>{});
    return 0;
  }
  return example::guarded(program, [&] {
    if (f.model != "mlp") throw loom::invalid_argument("only --model mlp is split by tensor parallelism");
    const int ranks = loom::mpi_comm::world().size();
    if (f.zero && ranks != 4)
      throw loom::invalid_argument("--zero shards the optimizer state over data-parallel replicas; "
                                   "on " + std::to_string(ranks) + " ranks there is one replica (run with mpirun -np 4)");
    if (ranks == 2) return with_optimizer<loom::model_parallel<loom::tensor_parallel<2>, loom::mpi_comm>>(f);
    if (ranks == 4 && f.zero)
      return with_optimizer<
          loom::hybrid<loom::data_parallel<loom::mpi_comm, loom::shard_optimizer_state>, loom::tensor_parallel<2>>>(f);
    if (ranks == 4)
      return with_optimizer<loom::hybrid<loom::data_parallel<loom::mpi_comm>, loom::tensor_parallel<2>>>(f);
    throw loom::invalid_argument("needs 2 ranks (tensor parallel) or 4 (2 replicas x 2), got " +
                                 std::to_string(ranks) + " (start it with mpirun -np 2)");
  });
}
