// SPDX-License-Identifier: Apache-2.0
// The main job: train an MLP or a CNN on Fashion-MNIST (Debian's dataset-fashion-mnist) and
// print one machine-readable `result:` line. Run with --help for the flags. Built with MPI it
// trains data-parallel over every process `mpirun -np N` starts (one rank without mpirun);
// each rank reads only its own samples of every batch from the memory-mapped data set (or from
// its own tar shards, --data). How the trainer is built from the flags:
// examples/common/data_parallel.hpp, shared with examples/resnet.

#include "../common/data_parallel.hpp"

namespace {
constexpr const char* program = "fashion_mnist";
}  // namespace

int main(int argc, char** argv) {
#if LOOM_HAS_MPI
  loom::mpi::environment env{argc, argv};
#endif
  example::recipe_flags recipe;
  example::parser p(program, std::string("usage: fashion_mnist [flags]\n") + example::model_usage +
                                 example::common_usage + example::recipe_usage_text());
  const example::flags f = example::parse_data_parallel(p, recipe, argc, argv);
  using policy = example::data_parallel_policy;
  if (f.print_valid_world_sizes) {
    example::print_valid_world_sizes(f.model == "cnn"
                                         ? loom::world_size_rules<example::cnn, policy>::list(f.batch, f.deterministic_chunk)
                                         : loom::world_size_rules<example::mlp, policy>::list(f.batch, f.deterministic_chunk));
    return 0;
  }
  return example::guarded(program, [&] {
    return f.model == "cnn" ? example::train_data_parallel<example::cnn>(program, f, recipe)
                            : example::train_data_parallel<example::mlp>(program, f, recipe);
  });
}
