// SPDX-License-Identifier: Apache-2.0
// The run-time choices (loom::data_parallel<Comm, loom::choose_at_run_time> with a
// loom::data_parallel_choice, and loom::any_optimizer), run by CTest under `mpirun -np N`
// (N = 2, 3):
// - every wire format with and without ZeRO, with SGD (momentum) and Adam: 25 steps of the mlp
//   end bitwise where the trainer of the policy and optimizer that name the same choices ends,
//   parameters and (whole) optimizer state, with the same bytes on the wire;
// - a checkpoint of the named policy and optimizer loads into the run-time one (resharded
//   under ZeRO) with bitwise the same state, and a run resumed there ends bitwise as the
//   uninterrupted named run: both describe themselves alike;
// - ranks that choose differently stop, every one of them, with a message that names the
//   policy each chose; a choice the library cannot run is refused with what to do.
// Exit status is non-zero on any rank's failure.

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "common.hpp"
#include "loom/comm/mpi.hpp"
#include "mpi_check.hpp"

using namespace loom_test;
using run_time_dp = loom::data_parallel<loom::mpi_comm, loom::choose_at_run_time>;
using chosen_trainer = loom::trainer<mlp, loom::softmax_cross_entropy, loom::any_optimizer, run_time_dp>;

namespace {

const loom::sgd::options momentum{.lr = 0.02f, .momentum = 0.9f};
const loom::adam::options adam_opts{.lr = 1e-3f};

template <class Trainer>
std::vector<float> params_of(Trainer& t) {
  auto p = t.model().parameters();
  return {p.begin(), p.end()};
}

/// The whole optimizer state on every rank (ZeRO's pieces put in place and summed; exact).
template <class Trainer>
std::vector<float> whole_state(Trainer& t, loom::mpi_comm& comm) {
  constexpr std::size_t parameters = mlp::parameter_count;
  const auto bufs = t.optimizer().buffers();
  if (!t.engine().shards_state()) return {bufs.begin(), bufs.end()};
  const loom::shard_map m = t.engine().state_shard();
  const std::size_t k = m.local_count ? bufs.size() / m.local_count : 0;
  std::size_t nbuf = k;
  comm.allreduce(&nbuf, 1, loom::reduce_op::max);
  std::vector<float> whole(nbuf * parameters, 0.0f);
  for (std::size_t b = 0; b < k; ++b) loom::copy_to_whole(m, bufs.data() + b * m.local_count, whole.data() + b * parameters);
  comm.allreduce(whole.data(), whole.size(), loom::reduce_op::sum);
  return whole;
}

template <class Policy, class Optimizer>
void same_as_named(const char* name, loom::data_parallel_choice choice, const typename Optimizer::options& opt,
                   loom::mpi_comm& comm) {
  const auto o = steps(25, 64);
  loom::trainer<mlp, loom::softmax_cross_entropy, Optimizer, Policy> named{opt, {.seed = 3, .threads = 1}};
  const auto rn = named.fit(train_set(), o);
  chosen_trainer chosen{opt, {.seed = 3, .threads = 1}, choice};
  const auto rc = chosen.fit(train_set(), o);
  check(chosen.engine().shards_state() == choice.shard_state, std::string(name) + ": the run-time trainer does not shard as chosen");
  check(params_of(chosen) == params_of(named),
        std::string(name) + ": the run-time choice's parameters are not bitwise the named policy's (relative distance " +
            std::to_string(relative_distance(params_of(chosen), params_of(named))) + ")");
  check(whole_state(chosen, comm) == whole_state(named, comm),
        std::string(name) + ": the run-time choice's optimizer state is not bitwise the named policy's");
  check(rc.figures[0].bus_bytes == rn.figures[0].bus_bytes,
        std::string(name) + ": bus bytes " + std::to_string(rc.figures[0].bus_bytes) + ", the named policy's " +
            std::to_string(rn.figures[0].bus_bytes));
  if (comm.rank() == 0)
    std::printf("%s: %d ranks, 25 steps: bitwise the named policy's parameters and state, %.0f bus bytes\n", name,
                comm.size(), rc.figures[0].bus_bytes);
}

void checkpoint_crosses(loom::mpi_comm& comm) {
  using zero_dp = loom::data_parallel<loom::mpi_comm, loom::shard_optimizer_state>;
  using named_t = loom::trainer<mlp, loom::softmax_cross_entropy, loom::adam, zero_dp>;
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("loom-choice-test-" + std::to_string(comm.size()));
  if (comm.rank() == 0) std::filesystem::remove_all(dir);
  comm.barrier();
  named_t whole{adam_opts, {.seed = 1, .threads = 1}};
  whole.fit(train_set(), steps(30, 64));
  auto with_checkpoints = [&](std::size_t n) {
    auto o = steps(n, 64);
    o.checkpoint.directory = dir.string();
    o.checkpoint.every_steps = 15;
    o.checkpoint.at_end = false;
    o.checkpoint.on_signal = false;
    o.checkpoint.async = false;
    return o;
  };
  named_t a{adam_opts, {.seed = 1, .threads = 1}};
  a.fit(train_set(), with_checkpoints(20));
  named_t loaded{adam_opts, {.seed = 9, .threads = 1}};
  loaded.load(dir / "step-15");
  chosen_trainer b{adam_opts, {.seed = 9, .threads = 1}, {.shard_state = true}};
  b.load(dir / "step-15");
  check(b.steps() == 15, "the run-time trainer resumed at step " + std::to_string(b.steps()) + ", expected 15");
  check(params_of(b) == params_of(loaded), "the run-time trainer loads other parameters than the named one");
  check(whole_state(b, comm) == whole_state(loaded, comm), "the run-time trainer loads another optimizer state");
  chosen_trainer resumed{adam_opts, {.seed = 1, .threads = 1}, {.shard_state = true}};
  auto o = with_checkpoints(30);
  o.checkpoint.resume = true;
  const auto r = resumed.fit(train_set(), o);
  check(r.resumed_from_step == 15, "resumed from step " + std::to_string(r.resumed_from_step) + ", expected 15");
  check(params_of(resumed) == params_of(whole), "resumed by the run-time trainer, the run does not end bitwise where the "
                                                "uninterrupted named run did");
  if (comm.rank() == 0)
    std::printf("checkpoints: a named ZeRO + Adam run's step 15 loads into the run-time trainer bitwise, and the run "
                "resumed there ends bitwise\n");
  comm.barrier();
  if (comm.rank() == 0) std::filesystem::remove_all(dir);
}

void refusals(loom::mpi_comm& comm) {
  // Ranks that choose differently: every rank stops, naming the policies.
  std::string caught;
  try {
    const loom::data_parallel_choice mine{.wire = comm.rank() == 1 ? loom::gradient_wire::bf16 : loom::gradient_wire::native};
    chosen_trainer t{momentum, {.seed = 1, .threads = 1}, mine};
  } catch (const loom::communication_error& e) {
    caught = e.what();
  }
  check(caught.find("rank 1 differs from rank 0") != std::string::npos &&
            caught.find("loom::compress<loom::bf16>") != std::string::npos,
        "different choices on the ranks: expected every rank to throw naming rank 1's policy, got '" + caught + "'");
  // Different optimizers, too.
  caught.clear();
  try {
    const loom::any_optimizer::options opt =
        comm.rank() == 1 ? loom::any_optimizer::options(adam_opts) : loom::any_optimizer::options(momentum);
    chosen_trainer t{opt, {.seed = 1, .threads = 1}, {}};
  } catch (const loom::communication_error& e) {
    caught = e.what();
  }
  check(caught.find("rank 1 differs from rank 0") != std::string::npos && caught.find("adam") != std::string::npos,
        "different optimizers on the ranks: expected every rank to throw naming adam, got '" + caught + "'");
  // A wire format that is none.
  caught.clear();
  try {
    chosen_trainer t{momentum, {.seed = 1, .threads = 1}, {.wire = static_cast<loom::gradient_wire>(7)}};
  } catch (const loom::invalid_argument& e) {
    caught = e.what();
  }
  check(caught.find("data_parallel_choice::wire is not one of loom::gradient_wire's values (found 7)") != std::string::npos,
        "an unknown wire format: got '" + caught + "'");
  if (comm.rank() == 0) std::printf("refusals: different choices and optimizers stop every rank; a bad wire is refused\n");
}

}  // namespace

int main(int argc, char** argv) {
  loom::mpi::environment env{argc, argv};
  auto comm = loom::mpi_comm::world();
  using W = loom::gradient_wire;
  using bf = loom::compress<loom::bf16>;
  using fp = loom::compress<loom::fp16>;
  using zero = loom::shard_optimizer_state;
  try {
    same_as_named<loom::data_parallel<loom::mpi_comm>, loom::sgd>("float, SGD", {}, momentum, comm);
    same_as_named<loom::data_parallel<loom::mpi_comm>, loom::adam>("float, Adam", {}, adam_opts, comm);
    same_as_named<loom::data_parallel<loom::mpi_comm, bf>, loom::sgd>("bf16, SGD", {.wire = W::bf16}, momentum, comm);
    same_as_named<loom::data_parallel<loom::mpi_comm, fp>, loom::adam>("fp16, Adam", {.wire = W::fp16}, adam_opts, comm);
    same_as_named<loom::data_parallel<loom::mpi_comm, zero>, loom::adam>("ZeRO, Adam", {.shard_state = true}, adam_opts,
                                                                         comm);
    same_as_named<loom::data_parallel<loom::mpi_comm, zero, bf>, loom::sgd>(
        "ZeRO + bf16, SGD", {.wire = W::bf16, .shard_state = true}, momentum, comm);
    checkpoint_crosses(comm);
    refusals(comm);
  } catch (const std::exception& e) {
    check(false, std::string("unexpected exception: ") + e.what());
  }
  return finish(comm);
}
