// SPDX-License-Identifier: Apache-2.0
// The perception example: a ResNet with batch norm — the CIFAR-style ResNet-20 or ResNet-56
// (He et al., 2016, option B shortcuts) or torchvision's ResNet-18 — trained on Fashion-MNIST
// (Debian's dataset-fashion-mnist, or its tar shards in --data), data-parallel over every
// process `mpirun -np N` starts, with the main example's flags and the recipe's (--sync-bn ...).
// Prints the main example's `result:` line. Run with --help for the flags; docs/perception.md.

#include "../common/data_parallel.hpp"
#include "loom/models/resnet.hpp"

namespace {

constexpr const char* program = "resnet";

/// The presets on Fashion-MNIST's 1 x 28 x 28 images and 10 classes.
using resnet20 = loom::models::resnet_cifar<20, 10, loom::input<1, 28, 28>>;
using resnet56 = loom::models::resnet_cifar<56, 10, loom::input<1, 28, 28>>;
using resnet18 = loom::models::resnet<18, 10, loom::input<1, 28, 28>>;

constexpr const char* model_usage = R"(  --model resnet20|resnet56|resnet18  network to train (default resnet20: the CIFAR ResNet-20;
                         resnet56: its 56-layer twin; resnet18: torchvision's ResNet-18;
                         one input channel and 10 classes each)
)";

template <class Policy>
std::vector<std::size_t> world_sizes(const example::flags& f) {
  if (f.model == "resnet56") return loom::world_size_rules<resnet56, Policy>::list(f.batch, f.deterministic_chunk);
  if (f.model == "resnet18") return loom::world_size_rules<resnet18, Policy>::list(f.batch, f.deterministic_chunk);
  return loom::world_size_rules<resnet20, Policy>::list(f.batch, f.deterministic_chunk);
}

}  // namespace

int main(int argc, char** argv) {
#if LOOM_HAS_MPI
  loom::mpi::environment env{argc, argv};
#endif
  example::recipe_flags recipe;
  example::parser p(program, std::string("usage: [mpirun -np N] resnet [flags]\n") + model_usage +
                                 example::common_usage + example::recipe_usage_text());
  const example::flags f = example::parse_data_parallel(p.with_models({"resnet20", "resnet56", "resnet18"}), recipe, argc, argv);
  if (f.print_valid_world_sizes) {
    example::print_valid_world_sizes(world_sizes<example::data_parallel_policy>(f));
    return 0;
  }
  return example::guarded(program, [&] {
    if (f.model == "resnet56") return example::train_data_parallel<resnet56>(program, f, recipe);
    if (f.model == "resnet18") return example::train_data_parallel<resnet18>(program, f, recipe);
    return example::train_data_parallel<resnet20>(program, f, recipe);
  });
}
