// SPDX-License-Identifier: Apache-2.0
// data_parallel over loom::hierarchical_comm, under `mpirun -np N`: the mlp trained with
// data_parallel<hierarchical_comm> (slice and leader variants, compressed to bf16, and with
// ZeRO's shard_optimizer_state; ZeRO with the smooth cnn too) ends
// where data_parallel<mpi_comm> does, within float tolerance (the sums are added in another
// order), and every replica is identical. usage: test_parallel_hierarchical [RANKS_PER_HOST
// [--hosts-are-netns]] (default 2: hosts of 2 consecutive ranks; 0: hosts by shared memory).
// --hosts-are-netns (the multi-host harness): also checks that the hosts are the network
// namespaces the ranks run in. Prints "all checks passed".

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include "common.hpp"
#include "loom/comm/hierarchical.hpp"
#include "mpi_check.hpp"

using namespace loom_test;

namespace {

template <class Net, class Comm, class... Options>
std::vector<float> train_net(Comm comm, std::size_t n, std::size_t batch) {
  using policy = loom::data_parallel<Comm, Options...>;
  loom::trainer<Net, loom::softmax_cross_entropy, loom::sgd, policy> t{
      std::move(comm), {.lr = 0.02f, .momentum = 0.9f}, {.seed = 1, .threads = 1}};
  t.fit(train_set(), steps(n, batch));
  auto p = t.model().parameters();
  return {p.begin(), p.end()};
}

template <class Comm, class... Options>
std::vector<float> train(Comm comm, std::size_t n, std::size_t batch) {
  return train_net<mlp, Comm, Options...>(std::move(comm), n, batch);
}

void same_on_every_rank(loom::mpi_comm& world, const std::vector<float>& mine, const std::string& what) {
  std::vector<float> root = mine;
  world.broadcast(root.data(), root.size(), 0);
  check(root == mine, what + ": replica differs from rank 0's");
}

/// Whether h's hosts are the ranks' network namespaces: every pair of ranks shares one exactly
/// when it shares a host (hosts of h.local_size() consecutive ranks here).
void hosts_are_network_namespaces(loom::mpi_comm& world, const loom::hierarchical_comm& h) {
  char mine[64] = {};
  const std::string ns = std::filesystem::read_symlink("/proc/self/ns/net").string();
  std::strncpy(mine, ns.c_str(), sizeof mine - 1);
  std::vector<char> all(sizeof mine * static_cast<std::size_t>(world.size()));
  world.allgather(mine, all.data(), sizeof mine);
  const int me = world.rank(), per = h.local_size();
  for (int r = 0; r < world.size(); ++r) {
    const bool same_ns = std::strcmp(all.data() + sizeof mine * static_cast<std::size_t>(r), mine) == 0;
    const bool same_host = r / per == me / per;
    check(same_ns == same_host, "rank " + std::to_string(r) + (same_ns ? " shares " : " does not share ") +
                                    "this rank's network namespace " + ns + " but is " + (same_host ? "" : "not ") +
                                    "on its host");
  }
  if (me == 0) std::printf("hosts are the network namespaces (%s on rank 0)\n", ns.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  loom::mpi::environment env{argc, argv};
  auto world = loom::mpi_comm::world();
  const int per_host = argc > 1 ? std::atoi(argv[1]) : 2;
  try {
    if (argc > 2 && std::string(argv[2]) == "--hosts-are-netns")
      hosts_are_network_namespaces(world, loom::hierarchical_comm(world, {.ranks_per_host = per_host}));
    const std::size_t steps_n = 50, batch = 64;
    const auto flat = train<loom::mpi_comm>(world, steps_n, batch);
    for (const auto v : {loom::hierarchical_variant::slice, loom::hierarchical_variant::leader}) {
      loom::hierarchical_comm h(world, {.variant = v, .ranks_per_host = per_host});
      const std::string name = std::string("data_parallel<hierarchical_comm> (") + loom::to_string(h.mode()) + ", " +
                               std::to_string(h.hosts()) + " hosts)";
      check(h.mode() == (v == loom::hierarchical_variant::slice ? loom::hierarchical_mode::slice
                                                                : loom::hierarchical_mode::leader) ||
                world.size() % 2 != 0,
            name + ": not hierarchical, " + std::to_string(h.hosts()) + " hosts of " + std::to_string(h.local_size()));
      const auto mine = train<loom::hierarchical_comm>(h, steps_n, batch);
      same_on_every_rank(world, mine, name);
      const double d = relative_distance(mine, flat);
      check(d <= 1e-5, name + ": relative distance to data_parallel<mpi_comm> " + std::to_string(d) + " > 1e-5");
      if (world.rank() == 0)
        std::printf("%s: %d ranks, %zu steps of %zu: relative distance to data_parallel<mpi_comm> %.3g\n", name.c_str(),
                    world.size(), steps_n, batch, d);
    }
    // ZeRO stage 1: its reduce-scatter and allgather of blocks, hierarchical in the slice mode.
    {
      const auto flat_zero = train<loom::mpi_comm, loom::shard_optimizer_state>(world, steps_n, batch);
      loom::hierarchical_comm h(world, {.ranks_per_host = per_host});
      const auto mine = train<loom::hierarchical_comm, loom::shard_optimizer_state>(h, steps_n, batch);
      const std::string name = std::string("data_parallel<hierarchical_comm, shard_optimizer_state> (") +
                               loom::to_string(h.mode()) + ")";
      same_on_every_rank(world, mine, name);
      const double d = relative_distance(mine, flat_zero);
      check(d <= 1e-5, name + ": relative distance to data_parallel<mpi_comm, shard_optimizer_state> " +
                           std::to_string(d) + " > 1e-5");
      if (world.rank() == 0)
        std::printf("%s: %zu steps of %zu: relative distance to the flat ZeRO %.3g\n", name.c_str(), steps_n, batch, d);
    }
    // ZeRO with the (smooth) cnn: its parameters' allgather in units, the convolutions' first
    // and inside rank 0's slice alone (the other ranks send none of it), linear<128> across all.
    {
      const auto flat_zero = train_net<smooth_cnn, loom::mpi_comm, loom::shard_optimizer_state>(world, 20, batch);
      loom::hierarchical_comm h(world, {.ranks_per_host = per_host});
      const auto mine = train_net<smooth_cnn, loom::hierarchical_comm, loom::shard_optimizer_state>(h, 20, batch);
      const std::string name = "smooth cnn, data_parallel<hierarchical_comm, shard_optimizer_state>";
      same_on_every_rank(world, mine, name);
      const double d = relative_distance(mine, flat_zero);
      check(d <= 1e-5, name + ": relative distance to the flat ZeRO " + std::to_string(d) + " > 1e-5");
      if (world.rank() == 0) std::printf("%s: 20 steps of %zu: relative distance to the flat ZeRO %.3g\n", name.c_str(), batch, d);
    }
    // Gradients in bf16 on the wire, summed in float at each step: the order of the sums
    // differs, so a looser bound.
    const auto flat16 = train<loom::mpi_comm, loom::compress<loom::bf16>>(world, 20, batch);
    loom::hierarchical_comm h(world, {.ranks_per_host = per_host});
    const auto mine16 = train<loom::hierarchical_comm, loom::compress<loom::bf16>>(h, 20, batch);
    same_on_every_rank(world, mine16, "compress<bf16> over hierarchical_comm");
    const double d16 = relative_distance(mine16, flat16);
    check(d16 <= 1e-2, "compress<bf16>: relative distance to the flat one " + std::to_string(d16) + " > 1e-2");
    if (world.rank() == 0)
      std::printf("data_parallel<hierarchical_comm, compress<bf16>> (%s): 20 steps: relative distance to flat %.3g\n",
                  loom::to_string(h.mode()), d16);
  } catch (const loom::error& e) {
    check(false, e.what());
  }
  return finish(world);
}
