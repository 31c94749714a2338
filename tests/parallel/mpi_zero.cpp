// SPDX-License-Identifier: Apache-2.0
// ZeRO stage 1 (loom::shard_optimizer_state) over loom::mpi_comm, run by CTest under
// `mpirun -np N` (N = 2, 3, 4):
// - the slices: every parameter is owned by exactly one rank, each rank's optimizer state holds
//   about 1/N of the values (at most one more per bucket);
// - 50 steps of the mlp and the (smooth) cnn, SGD with momentum and Adam, against unsharded
//   data parallelism on the same ranks: within 1e-6 relative; with gradient clipping, the mlp
//   over 20 steps on more than 2 ranks and its smooth twin over 50 (see main);
// - the split-invariant mode (deterministic_chunk): bitwise equal to unsharded training, with
//   clipping too;
// - compress<bf16> with ZeRO: half the reduce-scatter's bytes, close to compressed unsharded;
// - checkpoints: a ZeRO run's checkpoint resumes exactly (bitwise) on the same ranks, and loads
//   — resharded — on fewer ranks with ZeRO, with unsharded data parallelism and on one
//   process, each holding bitwise the same optimizer state;
// - the parameters' allgathers overlapped with the next forward: in flight after the optimizer
//   step, completed by the forward and by whatever reads the parameters; one bucket per layer
//   trains as unsharded training does.
// Exit status is non-zero on any rank's failure.

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "common.hpp"
#include "loom/comm/mpi.hpp"
#include "mpi_check.hpp"

using namespace loom_test;
using plain_dp = loom::data_parallel<loom::mpi_comm>;
using zero_dp = loom::data_parallel<loom::mpi_comm, loom::shard_optimizer_state>;

static_assert(zero_dp::shards_state && !plain_dp::shards_state);
static_assert(loom::data_parallel<loom::mpi_comm, loom::bucket_bytes<4096>, loom::shard_optimizer_state>::bucket_cap_bytes == 4096);

namespace {

const loom::sgd::options momentum{.lr = 0.02f, .momentum = 0.9f};
const loom::adam::options adam_opts{.lr = 1e-3f};

/// The whole optimizer state (buffer after buffer, each in the whole layout) of trainer t, on
/// every rank: each rank's pieces put in place, summed over comm (one rank holds each value,
/// the others contribute zeros — exact).
template <class Trainer>
std::vector<float> whole_state(Trainer& t, loom::mpi_comm& comm, std::size_t parameters) {
  const loom::shard_map m = t.engine().state_shard();
  const auto bufs = t.optimizer().buffers();
  const std::size_t k = m.local_count ? bufs.size() / m.local_count : 0;
  std::size_t nbuf = k;
  comm.allreduce(&nbuf, 1, loom::reduce_op::max);
  std::vector<float> whole(nbuf * parameters, 0.0f);
  for (std::size_t b = 0; b < k; ++b)
    loom::copy_to_whole(m, bufs.data() + b * m.local_count, whole.data() + b * parameters);
  comm.allreduce(whole.data(), whole.size(), loom::reduce_op::sum);
  return whole;
}

template <class Trainer>
std::vector<float> params_of(Trainer& t) {
  auto p = t.model().parameters();
  return {p.begin(), p.end()};
}

/// The slices cover every parameter once, and each rank's share is about 1/N.
template <class Net>
void slices(loom::mpi_comm& comm) {
  loom::trainer<Net, loom::softmax_cross_entropy, loom::adam, zero_dp> t{adam_opts, {.seed = 1, .threads = 1}};
  const auto& z = t.engine().sync().zero();
  const std::size_t n = Net::parameter_count, ranks = static_cast<std::size_t>(comm.size());
  const std::size_t buckets = z.shard_at.size();
  std::vector<int> owners(n, 0);
  for (const auto& p : z.pieces)
    for (std::size_t i = 0; i < p.count; ++i) owners[p.whole_offset + i] += 1;
  comm.allreduce(owners.data(), owners.size(), loom::reduce_op::sum);
  std::size_t wrong = 0;
  for (int o : owners) wrong += o != 1;
  check(wrong == 0, std::to_string(wrong) + " of " + std::to_string(n) + " parameters are not owned by exactly one rank");
  check(z.shard_count <= n / ranks + buckets, "rank " + std::to_string(comm.rank()) + " holds " + std::to_string(z.shard_count) +
                                                  " values of the state's " + std::to_string(n) + ", more than 1/" +
                                                  std::to_string(ranks) + " + one per bucket");
  check(t.optimizer().buffers().size() == 2 * z.shard_count,
        "Adam's state holds " + std::to_string(t.optimizer().buffers().size()) + " values, expected 2 x " +
            std::to_string(z.shard_count));
  if (comm.rank() == 0)
    std::printf("slices: %zu parameters, %zu buckets, %d ranks: rank 0's optimizer state %zu values (%.4f of unsharded), "
                "largest shard %zu\n",
                n, buckets, comm.size(), t.optimizer().buffers().size(),
                double(t.optimizer().buffers().size()) / double(2 * n), z.largest_shard);
}

/// 50 steps with ZeRO against 50 without, on the same ranks.
template <class Net, class Optimizer>
void against_unsharded(const char* name, const typename Optimizer::options& opt, loom::mpi_comm& comm, double clip = 0,
                       std::size_t n = 50, bool asserted = true) {
  auto o = steps(n, 64);
  o.clip_grad_norm = clip;
  loom::trainer<Net, loom::softmax_cross_entropy, Optimizer, plain_dp> plain{opt, {.seed = 1, .threads = 1}};
  plain.fit(train_set(), o);
  loom::trainer<Net, loom::softmax_cross_entropy, Optimizer, zero_dp> zero{opt, {.seed = 1, .threads = 1}};
  const auto r = zero.fit(train_set(), o);
  const auto a = params_of(zero), b = params_of(plain);
  const double d = relative_distance(a, b);
  if (asserted || comm.size() == 2) check(comm.size() == 2 ? a == b : d <= 1e-6, std::string(name) + ": ZeRO's parameters are " + std::to_string(d) + " relative from unsharded training's (> 1e-6, or not bitwise on 2 ranks)");
  const auto sa = whole_state(zero, comm, Net::parameter_count);
  auto pb = plain.optimizer().buffers();
  const std::vector<float> sb(pb.begin(), pb.end());
  const double ds = relative_distance(sa, sb);
  if (asserted) check(ds <= 1e-5, std::string(name) + ": ZeRO's optimizer state is " + std::to_string(ds) + " relative from unsharded (> 1e-5)");
  if (comm.rank() == 0)
    std::printf("%s: %d ranks, %zu steps of 64%s: parameters %.3g relative from unsharded, state %.3g; rank 0 sent %.0f bytes\n",
                name, comm.size(), n, clip > 0 ? ", clipped" : "", d, ds, r.figures[0].bytes_sent);
}

/// The split-invariant mode: ZeRO is bitwise unsharded training.
template <class Net, class Optimizer>
void bitwise(const char* name, const typename Optimizer::options& opt, loom::mpi_comm& comm, double clip) {
  auto o = steps(30, 64);
  o.deterministic_chunk = 16;
  o.clip_grad_norm = clip;
  loom::trainer<Net, loom::softmax_cross_entropy, Optimizer, plain_dp> plain{opt, {.seed = 1, .threads = 1}};
  plain.fit(train_set(), o);
  loom::trainer<Net, loom::softmax_cross_entropy, Optimizer, zero_dp> zero{opt, {.seed = 1, .threads = 1}};
  zero.fit(train_set(), o);
  const auto a = params_of(zero), b = params_of(plain);
  check(a == b, std::string(name) + ": deterministic mode: ZeRO is not bitwise unsharded training (relative distance " +
                    std::to_string(relative_distance(a, b)) + ")");
  const auto sa = whole_state(zero, comm, Net::parameter_count);
  auto pb = plain.optimizer().buffers();
  check(sa == std::vector<float>(pb.begin(), pb.end()), std::string(name) + ": deterministic mode: optimizer state differs");
  if (comm.rank() == 0)
    std::printf("%s: deterministic_chunk 16, %d ranks, 30 steps%s: bitwise equal to unsharded%s\n", name, comm.size(),
                clip > 0 ? ", clipped" : "", a == b ? "" : " -- NOT");
}

/// compress<bf16> with ZeRO: half the reduce-scatter's bytes; close to compressed unsharded.
void compressed(loom::mpi_comm& comm) {
  using zbf = loom::data_parallel<loom::mpi_comm, loom::shard_optimizer_state, loom::compress<loom::bf16>>;
  using pbf = loom::data_parallel<loom::mpi_comm, loom::compress<loom::bf16>>;
  const auto o = steps(30, 64);
  loom::trainer<mlp, loom::softmax_cross_entropy, loom::sgd, pbf> plain{momentum, {.seed = 1, .threads = 1}};
  plain.fit(train_set(), o);
  loom::trainer<mlp, loom::softmax_cross_entropy, loom::sgd, zbf> zero{momentum, {.seed = 1, .threads = 1}};
  const auto r = zero.fit(train_set(), o);
  loom::trainer<mlp, loom::softmax_cross_entropy, loom::sgd, zero_dp> full{momentum, {.seed = 1, .threads = 1}};
  const auto rf = full.fit(train_set(), o);
  loom::trainer<mlp, loom::softmax_cross_entropy, loom::sgd, plain_dp> plain32{momentum, {.seed = 1, .threads = 1}};
  plain32.fit(train_set(), o);
  // On 2 ranks the reduce-scatter adds the same two values as the allreduce: bitwise equal. On
  // more, each sum is rounded to bf16 after every addition, in another order: ZeRO's compressed
  // run must then stay as close to fp32 training as compressed unsharded training does.
  const double d = relative_distance(params_of(zero), params_of(plain));
  const double dz = relative_distance(params_of(zero), params_of(full));
  const double dp = relative_distance(params_of(plain), params_of(plain32));
  if (comm.size() == 2) check(params_of(zero) == params_of(plain), "compress<bf16> with ZeRO on 2 ranks: not bitwise compressed unsharded");
  check(dz <= 2 * dp + 1e-6, "compress<bf16> with ZeRO is " + std::to_string(dz) + " relative from fp32 ZeRO, compressed unsharded " +
                                 std::to_string(dp) + " from fp32: ZeRO's compression costs more than twice as much");
  // Per step: a reduce-scatter in 16 bits and an allgather in 32, against both in 32.
  const double n = comm.size(), p = mlp::parameter_count;
  const double want = 30 * (n - 1) / n * p * (2 + 4), want_full = 30 * (n - 1) / n * p * (4 + 4);
  const double got = r.figures[0].bus_bytes, got_full = rf.figures[0].bus_bytes;
  check(std::abs(got - want) <= 1e-9 * want, "compress<bf16> with ZeRO: bus bytes " + std::to_string(got) + ", expected " +
                                                 std::to_string(want));
  check(std::abs(got_full - want_full) <= 1e-9 * want_full,
        "ZeRO: bus bytes " + std::to_string(got_full) + ", expected " + std::to_string(want_full));
  if (comm.rank() == 0)
    std::printf("compress<bf16> with ZeRO: %.3g relative from compressed unsharded, %.3g from fp32 ZeRO (compressed "
                "unsharded: %.3g from fp32); rank 0's bus bytes %.0f (fp32 ZeRO %.0f)\n",
                d, dz, dp, got, got_full);
}

/// Checkpoints: exact resume on the same ranks; the state loads resharded on fewer ranks (ZeRO),
/// with unsharded data parallelism and on one process, bitwise the same everywhere.
void checkpoints(loom::mpi_comm& comm) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("loom-zero-test-" + std::to_string(comm.size()));
  if (comm.rank() == 0) std::filesystem::remove_all(dir);
  comm.barrier();
  using trainer_z = loom::trainer<mlp, loom::softmax_cross_entropy, loom::adam, zero_dp>;
  trainer_z whole{adam_opts, {.seed = 1, .threads = 1}};
  whole.fit(train_set(), steps(40, 64));
  const auto params40 = params_of(whole);
  auto with_checkpoints = [&](std::size_t n) {
    auto o = steps(n, 64);
    o.checkpoint.directory = dir.string();
    o.checkpoint.every_steps = 20;
    o.checkpoint.at_end = false;  // as if killed after step 20's checkpoint
    o.checkpoint.on_signal = false;
    o.checkpoint.async = false;
    return o;
  };
  trainer_z a{adam_opts, {.seed = 1, .threads = 1}};
  a.fit(train_set(), with_checkpoints(25));
  const auto saved = dir / "step-20";

  // The reference: the state as one process loads it (rank 0), on every rank.
  std::vector<float> state20(2 * mlp::parameter_count), params20(mlp::parameter_count);
  if (comm.rank() == 0) {
    loom::trainer<mlp, loom::softmax_cross_entropy, loom::adam> alone{adam_opts, {.seed = 7, .threads = 1}};
    alone.load(saved);
    auto s = alone.optimizer().buffers();
    state20.assign(s.begin(), s.end());
    params20 = params_of(alone);
  }
  comm.broadcast(state20.data(), state20.size(), 0);
  comm.broadcast(params20.data(), params20.size(), 0);

  trainer_z b{adam_opts, {.seed = 1, .threads = 1}};
  b.load(saved);
  check(b.steps() == 20, "resumed at step " + std::to_string(b.steps()) + ", expected 20");
  check(whole_state(b, comm, mlp::parameter_count) == state20, "the optimizer state ZeRO loads is not the one a process loads");
  check(params_of(b) == params20, "the loaded parameters are not the saved ones");
  trainer_z resumed{adam_opts, {.seed = 1, .threads = 1}};
  auto o = with_checkpoints(40);
  o.checkpoint.resume = true;
  const auto r = resumed.fit(train_set(), o);
  check(r.resumed_from_step == 20, "resumed from step " + std::to_string(r.resumed_from_step) + ", expected 20");
  check(params_of(resumed) == params40, "resumed from step 20, the run does not end bitwise where the uninterrupted one did");

  // Unsharded data parallelism on the same ranks loads the same state (all of it on every rank).
  loom::trainer<mlp, loom::softmax_cross_entropy, loom::adam, plain_dp> c{adam_opts, {.seed = 7, .threads = 1}};
  c.load(saved);
  auto cs = c.optimizer().buffers();
  check(std::vector<float>(cs.begin(), cs.end()) == state20, "unsharded data parallelism loads another optimizer state");

  // Fewer ranks: the first N - 1 load it with ZeRO, resharded.
  auto part = comm.split(comm.rank() + 1 < comm.size() ? 0 : 1, comm.rank());
  if (comm.rank() + 1 < comm.size()) {
    trainer_z d{part, adam_opts, {.seed = 7, .threads = 1}};
    d.load(saved);
    check(whole_state(d, part, mlp::parameter_count) == state20,
          "on " + std::to_string(part.size()) + " ranks with ZeRO, the resharded optimizer state is not the saved one");
    check(params_of(d) == params20, "on fewer ranks the loaded parameters are not the saved ones");
  }
  if (comm.rank() == 0)
    std::printf("checkpoints: %d ranks with ZeRO saved step 20 and resumed bitwise; the same state loaded by "
                "unsharded data parallelism, by %d rank%s with ZeRO and by one process\n",
                comm.size(), comm.size() - 1, comm.size() == 2 ? "" : "s");
  comm.barrier();
  if (comm.rank() == 0) std::filesystem::remove_all(dir);
}

/// The parameters' allgathers overlap the next forward: the optimizer step leaves them in
/// flight, the forward completes them bucket by bucket (its first layers' first), and anything
/// that reads the parameters waits for them first. Buckets of 4 KiB: one per layer.
void overlapped_gather(loom::mpi_comm& comm) {
  using small_zero = loom::data_parallel<loom::mpi_comm, loom::bucket_bytes<4096>, loom::shard_optimizer_state>;
  using small_plain = loom::data_parallel<loom::mpi_comm, loom::bucket_bytes<4096>>;
  static_assert(loom::gradient_allreduce<mlp, float, small_zero>::buckets().size() == 3);
  // The gather units: one per bucket here (each layer above the 4 KiB cap is a bucket of its
  // own, and under the 1 MiB cap a unit), the first layer's first.
  {
    loom::trainer<mlp, loom::softmax_cross_entropy, loom::adam, small_zero> t{adam_opts, {.seed = 1, .threads = 1}};
    const loom::zero_layout& z = t.engine().sync().zero();
    check(z.units.size() == 3 && z.units[0].offset == 0 && z.units[0].count == 784 * 256 + 256,
          "ZeRO's gather units of the mlp with 4 KiB buckets: expected 3, the first layer's first");
  }
  const int ranks = comm.size(), rank = comm.rank();

  // Through fit: the same parameters as unsharded training with these buckets (bitwise on 2
  // ranks), and nothing left in flight when fit returns.
  {
    loom::trainer<mlp, loom::softmax_cross_entropy, loom::adam, small_plain> plain{adam_opts, {.seed = 1, .threads = 1}};
    plain.fit(train_set(), steps(30, 64));
    loom::trainer<mlp, loom::softmax_cross_entropy, loom::adam, small_zero> zero{adam_opts, {.seed = 1, .threads = 1}};
    zero.fit(train_set(), steps(30, 64));
    check(!zero.engine().sync().gathering(), "fit returned with the parameters' allgathers still in flight");
    const auto a = params_of(zero), b = params_of(plain);
    const double d = relative_distance(a, b);
    check(ranks == 2 ? a == b : d <= 1e-6, "ZeRO with one bucket per layer, overlapped gathers: " + std::to_string(d) +
                                               " relative from unsharded training (> 1e-6, or not bitwise on 2 ranks)");
    // LOOM_ZERO_GATHER=blocking: the same collectives, waited for in the step: bitwise the same.
    loom::trainer<mlp, loom::softmax_cross_entropy, loom::adam, small_zero> blocking{adam_opts, {.seed = 1, .threads = 1}};
    blocking.engine().sync().set_gather_overlapped(false);
    blocking.fit(train_set(), steps(30, 64));
    check(params_of(blocking) == a, "ZeRO with the gathers waited for in the step ends elsewhere than with them overlapped");
  }

  // Step by step on the engine.
  loom::trainer<mlp, loom::softmax_cross_entropy, loom::adam, small_zero> t{adam_opts, {.seed = 1, .threads = 1}};
  auto& e = t.engine();
  e.sync().set_gather_overlapped(true);  // whatever LOOM_ZERO_GATHER says
  constexpr std::size_t n = 16;
  std::vector<float> x(n * 784);
  std::vector<std::int32_t> labels(n);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = float((i * 7919 + std::size_t(rank) * 104729) % 1000) / 1000.0f;
  for (std::size_t i = 0; i < n; ++i) labels[i] = std::int32_t((i + std::size_t(rank)) % 10);
  const loom::batch_view<float> b{x.data(), labels.data(), n, n * std::size_t(ranks), n * std::size_t(rank)};
  e.prepare_fit(n * std::size_t(ranks), 0);
  e.micro_step(b, 0, 1, 1, 0);
  e.optimizer_step(1e-3f, 0);
  check(ranks == 1 || e.sync().gathering(), "after the optimizer step no allgather is in flight (expected one per bucket)");
  const double exposed_before = e.figures().comm_exposed_s;
  e.micro_step(b, 0, 1, 1, 1);  // its forward completes them
  check(!e.sync().gathering(), "the forward left allgathers in flight");
  check(ranks == 1 || e.figures().comm_exposed_s > exposed_before, "the forward's waits for the gathers were not accounted");
  e.optimizer_step(1e-3f, 0);
  // Reading the parameters waits for them: every rank then holds the same whole model.
  const float* p = e.local_parameters();
  check(!e.sync().gathering(), "local_parameters() returned with allgathers in flight");
  std::vector<float> hi(p, p + mlp::parameter_count), lo(hi.size());  // lo: the largest of -p, i.e. -min
  for (std::size_t i = 0; i < hi.size(); ++i) lo[i] = -hi[i];
  comm.allreduce(lo.data(), lo.size(), loom::reduce_op::max);
  comm.allreduce(hi.data(), hi.size(), loom::reduce_op::max);
  for (auto& v : lo) v = -v;
  check(lo == hi, "after the gathers completed, the ranks' parameters differ");
  e.sync().set_gather_overlapped(false);
  e.micro_step(b, 0, 1, 1, 2);
  e.optimizer_step(1e-3f, 0);
  check(!e.sync().gathering(), "with the gathers not overlapped, the optimizer step returned with some in flight");
  if (rank == 0)
    std::printf("overlapped gathers: 3 buckets, %d ranks: in flight after the step, completed by the forward and by "
                "local_parameters(); 30 steps %s unsharded training\n",
                ranks, ranks == 2 ? "bitwise equal to" : "within 1e-6 of");
}

}  // namespace

int main(int argc, char** argv) {
  loom::mpi::environment env{argc, argv};
  auto comm = loom::mpi_comm::world();
  try {
    slices<mlp>(comm);
    slices<cnn>(comm);
    against_unsharded<mlp, loom::sgd>("mlp, SGD with momentum", momentum, comm);
    against_unsharded<mlp, loom::adam>("mlp, Adam", adam_opts, comm);
    // On 3 ranks the reduce-scatter sums in another order than the allreduce (~1e-9 relative
    // a step); in the ReLU/max-pool cnn that flips a kink now and then, which training then
    // amplifies (common.hpp): its tanh/average-pool twin over 50 steps, the cnn itself over 20.
    against_unsharded<smooth_cnn, loom::sgd>("smooth cnn, SGD with momentum", momentum, comm);
    against_unsharded<smooth_cnn, loom::adam>("smooth cnn, Adam", adam_opts, comm);
    // The cnn itself: bitwise on 2 ranks (a + b is b + a: the same sums as the allreduce's);
    // on more, its distance is printed, not asserted.
    against_unsharded<cnn, loom::sgd>("cnn, SGD with momentum", momentum, comm, 0, 50, comm.size() == 2);
    against_unsharded<cnn, loom::adam>("cnn, Adam", adam_opts, comm, 0, 50, comm.size() == 2);
    // Clipped, the ReLU mlp meets the same chaos on more ranks: under ONEDNN_MAX_CPU_ISA=AVX2 on
    // 4 ranks it was 5.5e-8 from unsharded after 33 steps and 6.8e-6 after 34 (a kink flipped;
    // 2.2e-4 after 50), natively 7.4e-8 after 50. So, as for the cnn: bitwise on 2 ranks over 50
    // steps, within 1e-6 over 20 on more (its distance after 50 printed), and its tanh twin
    // within 1e-6 over 50.
    against_unsharded<mlp, loom::adam>("mlp, Adam", adam_opts, comm, /*clip=*/0.5, comm.size() == 2 ? 50 : 20);
    if (comm.size() > 2) against_unsharded<mlp, loom::adam>("mlp, Adam", adam_opts, comm, /*clip=*/0.5, 50, /*asserted=*/false);
    against_unsharded<smooth_mlp, loom::adam>("smooth mlp, Adam", adam_opts, comm, /*clip=*/0.5);
    bitwise<mlp, loom::adam>("mlp, Adam", adam_opts, comm, 0);
    bitwise<mlp, loom::adam>("mlp, Adam", adam_opts, comm, 0.5);
    bitwise<cnn, loom::sgd>("cnn, SGD with momentum", momentum, comm, 0);
    compressed(comm);
    checkpoints(comm);
    overlapped_gather(comm);
  } catch (const loom::error& e) {
    check(false, e.what());
  }
  return finish(comm);
}
