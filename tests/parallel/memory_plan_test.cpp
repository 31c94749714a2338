// SPDX-License-Identifier: Apache-2.0
// loom::memory_plan and loom::world_size_rules against the code they describe: the plan's
// figures by hand for the example's networks (compile time), against the sizes of the real
// objects (parameters, gradients, optimizer state, a pipeline stage's peak of saved
// activations), and against what loom's buffers hold at their peak during fit (host_memory(),
// counted in host_space: one process, or the sum over ranks run as threads). The world-size
// rules against the engines: every world of 1 to 4 ranks the rules accept trains a step, every
// one they refuse is refused by the trainer with loom::invalid_argument (or, for replicas
// without a sample, runs while training nothing: the one rule stricter than the code).

#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdlib>
#include <string>
#include <vector>

#include "common.hpp"
#include "loom/comm/local.hpp"
#include "loom/loom.hpp"  // loom::memory_plan, loom::world_size_rules

namespace {

using loom_test::cnn;
using loom_test::mlp;
using local_dp = loom::data_parallel<loom::local_comm>;
template <std::size_t S, class... O>
using local_pipeline = loom::model_parallel<loom::pipeline<S, O...>, loom::local_comm>;
template <std::size_t S, class... O>
using local_hybrid_pipeline = loom::hybrid<local_dp, loom::pipeline<S, O...>>;
template <std::size_t T>
using local_tensor = loom::model_parallel<loom::tensor_parallel<T>, loom::local_comm>;
template <std::size_t T>
using local_hybrid_tensor = loom::hybrid<local_dp, loom::tensor_parallel<T>>;

/// The example's mlp with its hidden layers split (examples/tensor_parallel).
using tp_mlp = loom::network<loom::input<784>, loom::column_parallel<loom::linear<256>>, loom::relu,
                             loom::row_parallel<loom::linear<128>>, loom::relu, loom::linear<10>>;
/// A column-parallel layer without a row partner gathers its output (a bias buffer of its own).
using tp_gathered = loom::network<loom::input<784>, loom::column_parallel<loom::linear<96>>, loom::relu, loom::linear<10>>;
/// Every kind of layer with buffers of its own: a fused ReLU, residuals around a convolution (on
/// a blocked layout) and a linear, layer_norm on a blocked and on a plain input, dropout,
/// pooling of both kinds, gelu and tanh (flatten of a blocked layout is the cnn's).
using zoo = loom::network<loom::input<1, 28, 28>, loom::conv2d<16, 3, 1, 1>, loom::relu,
                          loom::residual<loom::conv2d<16, 3, 1, 1>, loom::tanh>, loom::avg_pool2d<2>, loom::layer_norm,
                          loom::dropout, loom::max_pool2d<2>, loom::flatten, loom::linear<32>, loom::gelu,
                          loom::residual<loom::linear<32>, loom::relu>, loom::layer_norm, loom::linear<10>>;

constexpr std::size_t f32 = 4;

/// Batch norm on vectors (no convolution: nothing oneDNN chooses, so the plan is exact): its
/// running statistics (2C + 1 buffer values each), its batch statistics (2C), the ReLU fused
/// into the first (a mask of a byte per element) and not into the second.
using bn_mlp = loom::network<loom::input<784>, loom::linear<64>, loom::batch_norm, loom::relu, loom::linear<32>,
                             loom::batch_norm, loom::linear<10>>;
using bn_mlp_sgd = loom::memory_plan<bn_mlp, loom::sgd, loom::single_process, loom::with_momentum>;
static_assert(bn_mlp::buffer_count == 2 * 64 + 1 + 2 * 32 + 1);
static_assert(bn_mlp_sgd::buffer_bytes == f32 * bn_mlp::buffer_count);
static_assert(bn_mlp_sgd::workspace_bytes == f32 * (2 * 64 + 2 * 32));
// Outputs (the fused relu has none: 64 + 64 + 32 + 32 + 10) and the fused ReLU's mask (64 bytes).
static_assert(bn_mlp_sgd::activation_bytes_per_sample == f32 * (64 + 64 + 32 + 32 + 10) + 64);
static_assert(bn_mlp_sgd::bytes_per_rank(0) == 3 * f32 * bn_mlp::parameter_count + f32 * bn_mlp::buffer_count +
                                                   bn_mlp_sgd::workspace_bytes);
/// The same with convolutions (within tolerance): batch norm on oneDNN's blocked layouts.
using bn_cnn = loom::network<loom::input<1, 28, 28>, loom::conv2d<16, 3, 1, 1, loom::no_bias>, loom::batch_norm, loom::relu,
                             loom::max_pool2d<3, 2, 1>, loom::conv2d<32, 3, 2, 1, loom::no_bias>, loom::batch_norm,
                             loom::relu, loom::global_avg_pool2d, loom::linear<10>>;

// ---- The plans by hand (compile time) ------------------------------------------------------------

// The mlp: 235,146 parameters; no ReLU is fused into a linear on the CPU, so every layer keeps its
// output: 256 + 256 + 128 + 128 + 10 per sample. Backward's two input-gradient buffers: layer
// k >= 1 writes buffer k % 2, sized for its input (k = 1: 256, 2: 256, 3: 128, 4: 128): 256 + 256.
using mlp_sgd = loom::memory_plan<mlp, loom::sgd, loom::single_process, loom::with_momentum>;
constexpr std::size_t mlp_p = 235'146;
static_assert(mlp_sgd::ranks_per_replica == 1);
static_assert(mlp_sgd::parameter_bytes == f32 * mlp_p && mlp_sgd::gradient_bytes == f32 * mlp_p);
static_assert(mlp_sgd::optimizer_state_bytes == f32 * mlp_p);                               // the momentum buffer
static_assert(loom::memory_plan<mlp, loom::sgd>::optimizer_state_bytes == 0);                 // sgd's defaults: none
static_assert(loom::memory_plan<mlp, loom::adam>::optimizer_state_bytes == 2 * f32 * mlp_p);  // exp_avg, exp_avg_sq
// ZeRO stage 1: the state and the summed gradients of a shard of 1/R of the model (the mlp is
// one bucket, so the largest shard is exactly ceil(P / R)); parameters and gradients stay whole.
using mlp_zero = loom::memory_plan<mlp, loom::adam, loom::data_parallel<loom::local_comm, loom::shard_optimizer_state>>;
static_assert(mlp_zero::optimizer_state_bytes == 2 * f32 * mlp_p && mlp_zero::optimizer_state_bytes == 1'881'168);
static_assert(mlp_zero::optimizer_state_bytes_on(2) == 940'584 && mlp_zero::optimizer_state_bytes_on(3) == 2 * f32 * ((mlp_p + 2) / 3));
static_assert(mlp_zero::ranks[0].sharded_bytes(4) == 3 * f32 * ((mlp_p + 3) / 4));  // exp_avg, exp_avg_sq, summed gradients
static_assert(mlp_zero::bytes_per_rank(64, 4) ==
              loom::memory_plan<mlp, loom::adam, local_dp>::bytes_per_rank(64, 4) - 2 * f32 * mlp_p + 3 * f32 * ((mlp_p + 3) / 4));
static_assert(loom::memory_plan<mlp, loom::adamw, local_dp>::optimizer_state_bytes == 2 * f32 * mlp_p);
static_assert(mlp_sgd::activation_bytes_per_sample == f32 * (256 + 256 + 128 + 128 + 10));
// + the loss gradient (10), the loss workspace (a double and a byte per sample).
static_assert(mlp_sgd::workspace_bytes_per_sample == f32 * (256 + 256 + 10) + 8 + 1);
static_assert(mlp_sgd::input_bytes_per_sample == f32 * 784 + 4);  // the trainer's samples and labels
static_assert(mlp_sgd::communication_bytes == 0 && mlp_sgd::workspace_bytes == 0 &&
              mlp_sgd::communication_bytes_per_sample == 0);
static_assert(mlp_sgd::bytes_per_rank(64) == 3 * f32 * mlp_p + 64 * (f32 * (778 + 522 + 785) + 9));
static_assert(mlp_sgd::bytes_per_rank(0) == 3 * f32 * mlp_p);
// Data parallelism: a rank trains on its share, ceil(batch / replicas) at most, and the trainer
// keeps room for the global batch's samples and labels.
static_assert(loom::memory_plan<mlp, loom::sgd, local_dp, loom::with_momentum>::bytes_per_rank(64, 3) ==
              mlp_sgd::bytes_per_rank(22) + (64 - 22) * mlp_sgd::input_bytes_per_sample);
static_assert(loom::memory_plan<mlp, loom::sgd, local_dp>::largest_bucket_bytes == f32 * mlp_p);  // one bucket < 1 MiB

// The cnn: the ReLU after each convolution is fused into it (no output of its own).
using cnn_sgd = loom::memory_plan<cnn, loom::sgd, loom::single_process, loom::with_momentum>;
static_assert(cnn_sgd::parameter_bytes == f32 * cnn::parameter_count);
static_assert(cnn_sgd::activation_bytes_per_sample == f32 * (25'088 + 6'272 + 12'544 + 3'136 + 3'136 + 128 + 128 + 10));
// Gradient buffers: the largest odd-indexed input (layer 1, 32 x 28 x 28) and even (layer 2);
// flatten's input may be in oneDNN's blocked layout: a plain copy (3,136).
static_assert(cnn_sgd::workspace_bytes_per_sample == f32 * (25'088 + 25'088 + 3'136 + 10) + 9);
// Each convolution's weights reordered for forward and backward-data, and its weight gradient;
// the first has no input gradient to compute: 2 x 288 and 3 x 18,432.
static_assert(cnn_sgd::workspace_bytes == f32 * (2 * 288 + 3 * 18'432));

// Pipelines: 1F1B keeps min(S - s, M) micro-batches on stage s, GPipe all M.
using mlp_1f1b = loom::memory_plan<mlp, loom::sgd, local_pipeline<2, loom::micro_batches<4>, loom::one_f_one_b>>;
using mlp_gpipe = loom::memory_plan<mlp, loom::sgd, local_pipeline<2, loom::micro_batches<4>, loom::gpipe>>;
static_assert(mlp_1f1b::ranks_per_replica == 2);
static_assert(mlp_1f1b::for_rank(0).live_micro_batches == 2 && mlp_1f1b::for_rank(1).live_micro_batches == 1);
static_assert(mlp_gpipe::for_rank(0).live_micro_batches == 4 && mlp_gpipe::for_rank(1).live_micro_batches == 4);
static_assert(mlp_gpipe::for_rank(0).activation_bytes_per_sample == 2 * mlp_1f1b::for_rank(0).activation_bytes_per_sample);
static_assert(mlp_gpipe::for_rank(1).activation_bytes_per_sample == 4 * mlp_1f1b::for_rank(1).activation_bytes_per_sample);
// Same parameters, gradients and state: the schedule changes only what is live.
static_assert(mlp_gpipe::for_rank(0).fixed_bytes() == mlp_1f1b::for_rank(0).fixed_bytes());
// The stages hold the whole model between them, each only its own part.
static_assert(mlp_1f1b::for_rank(0).parameter_bytes + mlp_1f1b::for_rank(1).parameter_bytes == f32 * mlp_p);
static_assert(mlp_1f1b::parameter_bytes ==
              std::max(mlp_1f1b::for_rank(0).parameter_bytes, mlp_1f1b::for_rank(1).parameter_bytes));
// World rank r of a hybrid is stage r % S.
static_assert(loom::memory_plan<mlp, loom::sgd, local_hybrid_pipeline<2>>::for_rank(3) ==
              loom::memory_plan<mlp, loom::sgd, local_hybrid_pipeline<2>>::for_rank(1));
// ZeRO under the pipeline hybrid: each stage's, as data_parallel's over the stage's replicas;
// the mlp's stages are one bucket each, so a stage's largest shard is exactly ceil(P_s / R).
using zero_two_stages = loom::hybrid<loom::data_parallel<loom::local_comm, loom::shard_optimizer_state>,
                                     loom::pipeline<2, loom::micro_batches<4>, loom::one_f_one_b>>;
using mlp_zero_stages = loom::memory_plan<mlp, loom::adam, zero_two_stages>;
using mlp_plain_stages = loom::memory_plan<mlp, loom::adam, local_hybrid_pipeline<2, loom::micro_batches<4>, loom::one_f_one_b>>;
constexpr auto stage_p = loom::stage_partition<mlp, loom::pipeline<2, loom::micro_batches<4>, loom::one_f_one_b>>::parameter_counts;
static_assert(stage_p[0] + stage_p[1] == mlp_p && stage_p[0] > 0 && stage_p[1] > 0);
static_assert(mlp_zero_stages::for_rank(0).optimizer_state_bytes == 0 && mlp_zero_stages::for_rank(1).optimizer_state_bytes == 0);
static_assert(mlp_zero_stages::for_rank(0).shard_buckets == 1 && mlp_zero_stages::for_rank(1).shard_buckets == 1);
// One replica: the whole stage's state, as unsharded.
static_assert(mlp_zero_stages::for_rank(0).optimizer_state_bytes_on(1) == mlp_plain_stages::for_rank(0).optimizer_state_bytes &&
              mlp_zero_stages::for_rank(1).optimizer_state_bytes_on(1) == mlp_plain_stages::for_rank(1).optimizer_state_bytes);
static_assert(mlp_zero_stages::for_rank(0).optimizer_state_bytes_on(2) == 2 * f32 * ((stage_p[0] + 1) / 2) &&
              mlp_zero_stages::for_rank(1).optimizer_state_bytes_on(3) == 2 * f32 * ((stage_p[1] + 2) / 3));
static_assert(mlp_zero_stages::optimizer_state_bytes_on(2) ==
              2 * f32 * ((std::max(stage_p[0], stage_p[1]) + 1) / 2));
// exp_avg, exp_avg_sq and the summed gradients of the shard; parameters and gradients stay the stage's.
static_assert(mlp_zero_stages::for_rank(1).sharded_bytes(2) == 3 * f32 * ((stage_p[1] + 1) / 2));
static_assert(mlp_zero_stages::for_rank(0).parameter_bytes == mlp_plain_stages::for_rank(0).parameter_bytes &&
              mlp_zero_stages::for_rank(0).gradient_bytes == mlp_plain_stages::for_rank(0).gradient_bytes);
static_assert(mlp_zero_stages::for_rank(0).bytes(64, 2) ==
              mlp_plain_stages::for_rank(0).bytes(64, 2) - 2 * f32 * stage_p[0] + 3 * f32 * ((stage_p[0] + 1) / 2));
static_assert(mlp_zero_stages::for_rank(1).bytes(64, 3) ==
              mlp_plain_stages::for_rank(1).bytes(64, 3) - 2 * f32 * stage_p[1] + 3 * f32 * ((stage_p[1] + 2) / 3));
static_assert(mlp_zero_stages::for_rank(3) == mlp_zero_stages::for_rank(1));
// A run's options decide the state (SGD with momentum: one value per value of the shard).
static_assert(loom::rank_memory_for<mlp, loom::sgd, zero_two_stages>({.momentum = 0.9f}, 2).sharded_bytes(2) ==
              2 * f32 * ((stage_p[0] + 1) / 2));
// compress<bf16>: the stage's gradients' 16-bit copy, and the shard's reduced values' too.
static_assert(loom::memory_plan<mlp, loom::adam,
                                loom::hybrid<loom::data_parallel<loom::local_comm, loom::shard_optimizer_state,
                                                                 loom::compress<loom::bf16>>,
                                             loom::pipeline<2>>>::for_rank(1)
                  .sharded_bytes(2) == (3 * f32 + 2) * ((stage_p[1] + 1) / 2));
// The first stage reads the samples, the last the labels.
static_assert(mlp_1f1b::for_rank(0).input_bytes_per_sample == f32 * 784 &&
              mlp_1f1b::for_rank(1).input_bytes_per_sample == 4);
// A stage's per-sample bytes count a micro-batch: at batch 64 over 4 micro-batches, 16 samples.
static_assert(mlp_1f1b::for_rank(1).bytes(64) == mlp_1f1b::for_rank(1).fixed_bytes() +
                                                    16 * mlp_1f1b::for_rank(1).micro_batch_bytes_per_sample() + 64 * 4);
static_assert(mlp_1f1b::for_rank(1).bytes(63) == mlp_1f1b::for_rank(1).bytes(64) - 4);  // micro-batches of 16, 16, 16, 15

// Tensor parallelism: each slice holds half of the split layers (the row layer's bias whole).
using tp_plan = loom::memory_plan<tp_mlp, loom::sgd, local_tensor<2>, loom::with_momentum>;
static_assert(tp_plan::ranks_per_replica == 2);
static_assert(tp_plan::parameter_bytes == f32 * loom::tensor_parallel_network<tp_mlp, 2>::parameter_count);
static_assert(tp_plan::for_rank(0).activation_bytes_per_sample == f32 * (128 + 128 + 128 + 128 + 10));
static_assert(loom::memory_plan<tp_gathered, loom::sgd, local_tensor<2>>::communication_bytes == f32 * 96);

// A run's plan from its options, known at run time: the state follows them.
static_assert(loom::rank_memory_for<mlp, loom::sgd>({.lr = 0.1f, .momentum = 0.9f}, 0) == mlp_sgd::for_rank(0));
static_assert(loom::rank_memory_for<mlp, loom::sgd>({.lr = 0.1f}, 0) == loom::memory_plan<mlp, loom::sgd>::for_rank(0));
static_assert(loom::rank_memory_for<mlp, loom::sgd, local_pipeline<2>>({.momentum = 0.9f}, 1).optimizer_state_bytes ==
              loom::memory_plan<mlp, loom::sgd, local_pipeline<2>, loom::with_momentum>::for_rank(1).optimizer_state_bytes);

// A budget that holds compiles; largest_batch_within is the edge.
using fits = loom::memory_plan<mlp, loom::sgd, loom::single_process, loom::with_momentum,
                               loom::memory_budget<mlp_sgd::bytes_per_rank(256)>, loom::max_batch<256>>;
static_assert(fits::ok && fits::budget_bytes == mlp_sgd::bytes_per_rank(256) && fits::budget_batch == 256);
static_assert(mlp_sgd::largest_batch_within(mlp_sgd::bytes_per_rank(256)) == 256);
static_assert(mlp_sgd::largest_batch_within(mlp_sgd::bytes_per_rank(256) - 1) == 255);
static_assert(mlp_sgd::largest_batch_within(mlp_sgd::bytes_per_rank(0)) == 0);

// ---- World sizes (compile time) ------------------------------------------------------------------

template <std::size_t... W>
constexpr std::array<std::size_t, sizeof...(W)> sizes{W...};
static_assert(loom::valid_world_sizes<mlp, loom::single_process, 64> == sizes<1>);
static_assert(loom::valid_world_sizes<mlp, loom::single_process, 64, 16> == sizes<1>);
static_assert(loom::valid_world_sizes<mlp, local_dp, 5> == sizes<1, 2, 3, 4, 5>);
static_assert(loom::valid_world_sizes<mlp, local_dp, 64>.size() == 64);
static_assert(loom::valid_world_sizes<mlp, local_dp, 64, 16> == sizes<1, 2, 3, 4>);  // 4 chunks
static_assert(loom::valid_world_sizes<mlp, local_dp, 50, 16> == sizes<1, 2, 3, 4>);  // a short fourth chunk
static_assert(loom::valid_world_sizes<mlp, local_dp, 48, 16> == sizes<1, 2, 3>);
static_assert(loom::valid_world_sizes<mlp, local_pipeline<2, loom::micro_batches<8>>, 4> == sizes<2>);  // empty micro-batches run
static_assert(loom::valid_world_sizes<mlp, local_pipeline<2>, 64, 16>.empty());  // no split-invariant pipeline
static_assert(loom::valid_world_sizes<mlp, local_hybrid_pipeline<2>, 3> == sizes<2, 4, 6>);
static_assert(loom::valid_world_sizes<tp_mlp, local_tensor<2>, 64> == sizes<2>);
static_assert(loom::valid_world_sizes<tp_mlp, local_hybrid_tensor<2>, 2> == sizes<2, 4>);
static_assert(loom::world_size_rules<mlp, local_dp>::largest_up_to(7, 64, 16) == 4);
static_assert(loom::world_size_rules<mlp, local_hybrid_pipeline<4>>::largest_up_to(7, 64) == 4);
static_assert(loom::world_size_rules<mlp, local_hybrid_pipeline<4>>::largest_up_to(3, 64) == 0);
// The widths a network's split layers allow: the divisors of every split dimension.
static_assert(loom::tensor_parallel_widths<tp_mlp> == sizes<1, 2, 4, 8, 16, 32, 64, 128, 256>);
static_assert(loom::tensor_parallel_widths<loom::network<loom::input<10>, loom::column_parallel<loom::linear<96>>,
                                                         loom::relu, loom::row_parallel<loom::linear<10>>>> ==
              sizes<1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 96>);
static_assert(loom::tensor_parallel_widths<mlp> == sizes<1>);

// ---- Measuring -----------------------------------------------------------------------------------

/// Fashion-MNIST's first n training images (n a multiple of the batch: no short last batch,
/// whose other size would make oneDNN's convolutions cache a second set of primitives).
const loom::data::fashion_mnist_set& images(std::size_t n) {
  static const auto all = loom::data::fashion_mnist(loom::data::split::train).first(4096);
  static std::vector<std::pair<std::size_t, loom::data::fashion_mnist_set>> cut;
  for (auto& [k, s] : cut)
    if (k == n) return s;
  cut.emplace_back(n, all.first(n));
  return cut.back().second;
}

loom::fit_options one_epoch(std::size_t batch) {
  loom::fit_options o;
  o.epochs = 1;
  o.batch = batch;
  o.progress = nullptr;
  return o;
}

/// The plan's tolerance: 10% of the plan plus 256 KiB. The plan is exact for what loom's code
/// fixes; what oneDNN decides at run time (which layouts it computes in) is bounded, not known.
bool within_tolerance(std::size_t measured, std::size_t planned) {
  const double d = measured > planned ? double(measured - planned) : double(planned - measured);
  return d <= 0.10 * double(planned) + 256.0 * 1024;
}

/// The bytes loom's buffers gained at their peak while `run` built and trained (live before it
/// as the base; every rank in this process).
template <class F>
std::size_t measure_peak(F&& run) {
  const std::size_t base = loom::host_memory().live_bytes;
  loom::reset_host_memory_peak();
  run();
  return loom::host_memory().peak_bytes - base;
}

template <class Net, class Optimizer, class Plan>
void check_single_process(typename Optimizer::options opt, std::size_t batch, bool exact) {
  REQUIRE(Plan::counts_state_of(opt));
  const auto& data = images(4 * batch);
  const std::size_t measured = measure_peak([&] {
    loom::trainer<Net, loom::softmax_cross_entropy, Optimizer> t{opt, {.seed = 1, .threads = 2}};
    // The plan's fixed parts are the real objects' sizes.
    auto& m = t.model();
    CHECK(Plan::parameter_bytes == m.parameters().size() * sizeof(float));
    CHECK(Plan::gradient_bytes == m.gradients().size() * sizeof(float));
    CHECK(Plan::optimizer_state_bytes == t.engine().optimizer().buffers().size() * sizeof(float));
    t.fit(data, one_epoch(batch));
  });
  const std::size_t planned = Plan::bytes_per_rank(batch);
  INFO("batch " << batch << ": planned " << planned << " bytes, measured " << measured << " ("
                << (double(measured) - double(planned)) / double(planned) * 100 << "%)");
  CHECK(within_tolerance(measured, planned));
  if (exact) CHECK(measured == planned);
}

}  // namespace

TEST_CASE("host_memory counts loom's buffers, and a growing buffer never holds old and new at once", "[memory_plan]") {
  const auto before = loom::host_memory();
  {
    loom::buffer<float> a(1000);
    CHECK(loom::host_memory().live_bytes == before.live_bytes + 4000);
    loom::reset_host_memory_peak();
    a.reserve_discard(3000);  // frees the 4,000 bytes, then asks for 12,000
    CHECK(loom::host_memory().live_bytes == before.live_bytes + 12'000);
    CHECK(loom::host_memory().peak_bytes == before.live_bytes + 12'000);
    a.reserve_discard(10);  // never shrinks
    CHECK(a.size() == 3000);
  }
  CHECK(loom::host_memory().live_bytes == before.live_bytes);
}

TEST_CASE("The plan is the bytes loom's buffers hold at their peak in fit, on one process", "[memory_plan]") {
  // The mlp allocates nothing that depends on oneDNN's choices: exact.
  using mlp_plain_sgd = loom::memory_plan<mlp, loom::sgd>;
  using mlp_adam = loom::memory_plan<mlp, loom::adam>;
  check_single_process<mlp, loom::sgd, mlp_sgd>({.lr = 0.02f, .momentum = 0.9f}, 64, true);
  check_single_process<mlp, loom::sgd, mlp_plain_sgd>({.lr = 0.02f}, 100, true);
  check_single_process<mlp, loom::adam, mlp_adam>({.lr = 1e-3f}, 32, true);
  // The cnn and the zoo: within 10% + 256 KiB (their convolutions' scratch is oneDNN's choice).
  check_single_process<cnn, loom::sgd, cnn_sgd>({.lr = 0.02f, .momentum = 0.9f}, 64, false);
  check_single_process<cnn, loom::adam, loom::memory_plan<cnn, loom::adam>>({.lr = 1e-3f}, 128, false);
  check_single_process<zoo, loom::sgd, loom::memory_plan<zoo, loom::sgd, loom::single_process, loom::with_momentum>>(
      {.lr = 0.02f, .momentum = 0.9f}, 64, false);
}

TEST_CASE("The plan counts batch norm's buffers and statistics, exactly on vectors", "[memory_plan][batch_norm]") {
  check_single_process<bn_mlp, loom::sgd, bn_mlp_sgd>({.lr = 0.02f, .momentum = 0.9f}, 64, true);
  check_single_process<bn_cnn, loom::sgd, loom::memory_plan<bn_cnn, loom::sgd, loom::single_process, loom::with_momentum>>(
      {.lr = 0.02f, .momentum = 0.9f}, 32, false);
}

TEST_CASE("A plan that does not match the optimizer's options says so", "[memory_plan]") {
  CHECK(mlp_sgd::counts_state_of({.lr = 0.1f, .momentum = 0.9f}));
  CHECK_FALSE(mlp_sgd::counts_state_of({.lr = 0.1f}));
  CHECK(loom::memory_plan<mlp, loom::sgd>::counts_state_of({.lr = 0.1f}));
  CHECK(loom::memory_plan<mlp, loom::adam>::counts_state_of({}));
}

namespace {
/// Trains Net under Policy on `world` local ranks for one epoch of `steps` batches, checks each
/// rank's fixed parts against its objects (and, on a pipeline, its peak of saved activations
/// against the engine's own figure), and returns what every rank's buffers gained at their peak.
template <class Net, class Policy, class Plan>
std::size_t measure_local(int world, std::size_t batch, std::size_t steps = 4) {
  const auto& data = images(steps * batch);
  // What each rank found, checked on this thread afterwards: Catch2's macros are not
  // thread-safe (called from the ranks' threads they corrupted its heap now and then).
  struct rank_found {
    bool done = false, has_activations = false;
    std::size_t parameter_bytes = 0, gradient_bytes = 0, optimizer_state_bytes = 0;
    std::size_t peak_activation_bytes = 0, planned_activation_bytes = 0, live = 0, micro = 0;
  };
  std::vector<rank_found> found(static_cast<std::size_t>(world));
  const std::size_t measured = measure_peak([&] {
    loom::local_world(world).run([&](loom::local_comm& c) {
      loom::trainer<Net, loom::softmax_cross_entropy, loom::sgd, Policy> t{
          c, {.lr = 0.02f, .momentum = 0.9f}, {.seed = 1, .threads = 1}};
      const loom::rank_memory& plan = Plan::for_rank(static_cast<std::size_t>(c.rank()));
      auto& e = t.engine();
      rank_found& f = found[static_cast<std::size_t>(c.rank())];
      f.parameter_bytes = e.local_count() * sizeof(float);
      f.gradient_bytes = e.local_count() * sizeof(float);
      f.optimizer_state_bytes = e.optimizer().buffers().size() * sizeof(float);
      t.fit(data, one_epoch(batch));
      if constexpr (requires { e.peak_activation_bytes(); }) {
        const std::size_t per_replica = (batch + static_cast<std::size_t>(t.replicas()) - 1) / static_cast<std::size_t>(t.replicas());
        f.has_activations = true;
        f.micro = (per_replica + plan.micro_batches - 1) / plan.micro_batches;
        f.live = plan.live_micro_batches;
        f.peak_activation_bytes = e.peak_activation_bytes();
        f.planned_activation_bytes = plan.activation_bytes_per_sample * f.micro;
      }
      f.done = true;
    });
  });
  for (std::size_t r = 0; r < found.size(); ++r) {
    const rank_found& f = found[r];
    const loom::rank_memory& plan = Plan::for_rank(r);
    INFO("rank " << r << ": " << f.live << " live micro-batches of " << f.micro);
    CHECK(f.done);
    CHECK(plan.parameter_bytes == f.parameter_bytes);
    CHECK(plan.gradient_bytes == f.gradient_bytes);
    CHECK(plan.optimizer_state_bytes == f.optimizer_state_bytes);
    if (f.has_activations) CHECK(f.peak_activation_bytes == f.planned_activation_bytes);
  }
  return measured;
}

/// The sum of every world rank's plan at this global batch, each at its replica's share (the
/// loader gives replica i the samples [n i / R, n (i + 1) / R)).
template <class Plan>
std::size_t planned_world(int world, std::size_t batch) {
  const std::size_t g = Plan::ranks_per_replica, replicas = static_cast<std::size_t>(world) / g;
  std::size_t sum = 0;
  for (std::size_t r = 0; r < static_cast<std::size_t>(world); ++r) {
    const std::size_t i = r / g, share = batch * (i + 1) / replicas - batch * i / replicas;
    sum += Plan::for_rank(r).bytes_at(share, batch);
  }
  return sum;
}

template <class Net, class Policy, class Plan>
void check_local(int world, std::size_t batch, bool exact) {
  const std::size_t measured = measure_local<Net, Policy, Plan>(world, batch);
  const std::size_t planned = planned_world<Plan>(world, batch);
  INFO(world << " ranks, batch " << batch << ": planned " << planned << " bytes, measured " << measured);
  CHECK(within_tolerance(measured, planned));
  if (exact) CHECK(measured == planned);
}
}  // namespace

TEST_CASE("Data parallel: each rank's plan at its share of the batch", "[memory_plan]") {
  using plan = loom::memory_plan<mlp, loom::sgd, local_dp, loom::with_momentum>;
  check_local<mlp, local_dp, plan>(2, 64, true);
  check_local<mlp, local_dp, plan>(3, 64, true);  // shares of 21, 21 and 22
  check_local<cnn, local_dp, loom::memory_plan<cnn, loom::sgd, local_dp, loom::with_momentum>>(2, 64, false);
}

TEST_CASE("Pipelines: each stage's plan, 1F1B against GPipe", "[memory_plan]") {
  using mlp_1f1b_m = loom::memory_plan<mlp, loom::sgd, local_pipeline<2, loom::micro_batches<4>, loom::one_f_one_b>,
                                       loom::with_momentum>;
  using mlp_gpipe_m =
      loom::memory_plan<mlp, loom::sgd, local_pipeline<2, loom::micro_batches<4>, loom::gpipe>, loom::with_momentum>;
  check_local<mlp, local_pipeline<2, loom::micro_batches<4>, loom::one_f_one_b>, mlp_1f1b_m>(2, 64, true);
  check_local<mlp, local_pipeline<2, loom::micro_batches<4>, loom::gpipe>, mlp_gpipe_m>(2, 64, true);
  // 4 stages of the cnn, 8 micro-batches: 1F1B holds 4, 3, 2, 1 of them, GPipe 8 everywhere.
  using cnn4_1f1b = local_pipeline<4, loom::micro_batches<8>, loom::one_f_one_b>;
  using cnn4_gpipe = local_pipeline<4, loom::micro_batches<8>, loom::gpipe>;
  using p1 = loom::memory_plan<cnn, loom::sgd, cnn4_1f1b, loom::with_momentum>;
  using p2 = loom::memory_plan<cnn, loom::sgd, cnn4_gpipe, loom::with_momentum>;
  check_local<cnn, cnn4_1f1b, p1>(4, 64, false);
  check_local<cnn, cnn4_gpipe, p2>(4, 64, false);
  CHECK(p2::bytes_per_rank(64) > p1::bytes_per_rank(64));
  // Under hybrid, each replica's stages at half the batch.
  using hp = local_hybrid_pipeline<2, loom::micro_batches<2>>;
  check_local<mlp, hp, loom::memory_plan<mlp, loom::sgd, hp, loom::with_momentum>>(4, 64, true);
}

TEST_CASE("Batch norm's buffers on each rank: replicas, pipeline stages (accumulating), tensor slices",
          "[memory_plan][batch_norm]") {
  check_local<bn_mlp, local_dp, loom::memory_plan<bn_mlp, loom::sgd, local_dp, loom::with_momentum>>(2, 64, true);
  using bp = local_pipeline<2, loom::micro_batches<4>, loom::one_f_one_b>;
  using bn_pipe = loom::memory_plan<bn_mlp, loom::sgd, bp, loom::with_momentum>;
  static_assert(bn_pipe::for_rank(0).buffer_bytes + bn_pipe::for_rank(1).buffer_bytes == f32 * bn_mlp::buffer_count);
  check_local<bn_mlp, bp, bn_pipe>(2, 64, true);
  using bn_tp = loom::network<loom::input<784>, loom::column_parallel<loom::linear<64>>, loom::batch_norm, loom::relu,
                              loom::row_parallel<loom::linear<32>>, loom::batch_norm, loom::linear<10>>;
  check_local<bn_tp, local_tensor<2>, loom::memory_plan<bn_tp, loom::sgd, local_tensor<2>, loom::with_momentum>>(2, 64, true);
}

TEST_CASE("Tensor parallelism: each slice's plan", "[memory_plan]") {
  check_local<tp_mlp, local_tensor<2>, tp_plan>(2, 64, true);
  check_local<tp_gathered, local_tensor<2>, loom::memory_plan<tp_gathered, loom::sgd, local_tensor<2>, loom::with_momentum>>(
      2, 64, true);
  using ht = local_hybrid_tensor<2>;
  check_local<tp_mlp, ht, loom::memory_plan<tp_mlp, loom::sgd, ht, loom::with_momentum>>(4, 64, true);
}

namespace {
/// Whether a step of Net under Policy trains on `world` local ranks with this batch and
/// deterministic chunk; a refusal must be loom::invalid_argument, whose message is kept.
template <class Net, class Policy>
bool trains_on(int world, std::size_t batch, std::size_t chunk, std::string& refusal) {
  try {
    loom::local_world(world).run([&](loom::local_comm& c) {
      loom::trainer<Net, loom::softmax_cross_entropy, loom::sgd, Policy> t{c, {.lr = 0.02f}, {.seed = 1, .threads = 1}};
      auto o = one_epoch(batch);
      o.max_steps = 1;
      o.deterministic_chunk = chunk;
      t.fit(images(batch), o);
    });
    return true;
  } catch (const loom::invalid_argument& e) {
    refusal = e.what();
    return false;
  }
}

/// For worlds 1..4: the rules accept exactly what the trainer trains (and say why not).
template <class Net, class Policy>
void rules_agree_with_trainer(std::size_t batch, std::size_t chunk = 0) {
  using rules = loom::world_size_rules<Net, Policy>;
  for (int w = 1; w <= 4; ++w) {
    std::string refusal;
    const bool trained = trains_on<Net, Policy>(w, batch, chunk, refusal);
    const bool accepted = rules::accepts(static_cast<std::size_t>(w), batch, chunk);
    INFO(w << " ranks, batch " << batch << ", chunk " << chunk << ": the trainer " << (trained ? "trains" : "refuses: ")
           << refusal << "; the rules say: " << rules::why_not(static_cast<std::size_t>(w), batch, chunk));
    // The one rule stricter than the trainer: a replica without a sample of a full batch.
    const bool idle_replicas = static_cast<std::size_t>(w) / rules::group_size > batch;
    if (idle_replicas && trained) CHECK_FALSE(accepted);
    else CHECK(trained == accepted);
    CHECK(rules::why_not(static_cast<std::size_t>(w), batch, chunk).empty() == accepted);
  }
}
}  // namespace

TEST_CASE("The world-size rules are the trainer's", "[memory_plan][world_sizes]") {
  rules_agree_with_trainer<mlp, local_dp>(8);
  rules_agree_with_trainer<mlp, local_dp>(3);        // 4 ranks: one without a sample in every step
  rules_agree_with_trainer<mlp, local_dp>(48, 16);   // 3 chunks: 4 ranks refused
  rules_agree_with_trainer<mlp, local_dp>(50, 16);   // 4 chunks, the last short
  rules_agree_with_trainer<mlp, local_pipeline<2, loom::micro_batches<4>>>(3);  // an empty micro-batch runs
  rules_agree_with_trainer<mlp, local_pipeline<2>>(16, 8);                     // no split-invariant pipeline
  rules_agree_with_trainer<mlp, local_hybrid_pipeline<2>>(8);
  rules_agree_with_trainer<mlp, local_hybrid_pipeline<2>>(1);                   // 2 replicas, 1 sample
  rules_agree_with_trainer<tp_mlp, local_tensor<2>>(8);
  rules_agree_with_trainer<tp_mlp, local_hybrid_tensor<2>>(8);
}

TEST_CASE("world_size_rules: lists and reasons", "[world_sizes]") {
  using dp = loom::world_size_rules<mlp, local_dp>;
  CHECK(dp::list(48, 16) == std::vector<std::size_t>{1, 2, 3});
  CHECK(dp::why_not(4, 48, 16) ==
        "a full batch of 48 makes 3 chunks of 16 samples, fewer than the 4 replicas, which each need at least one "
        "(loom::chunk_plan)");
  CHECK(dp::why_not(5, 3) == "5 replicas for a batch of 3: 2 would get no sample of a full batch");
  CHECK(dp::why_not(2, 0) == "loom::trainer::fit refuses a batch of 0");
  using pipe = loom::world_size_rules<mlp, local_pipeline<2>>;
  CHECK(pipe::why_not(3, 64) ==
        "this policy splits the model over exactly 2 ranks, not 3 (for more, train replicas of it with "
        "loom::hybrid<loom::data_parallel<...>, ...>)");
  CHECK(pipe::why_not(2, 64, 8) ==
        "deterministic_chunk=8 needs loom::single_process or loom::data_parallel<Comm, ...>, not this policy");
  using hyb = loom::world_size_rules<mlp, local_hybrid_pipeline<2>>;
  CHECK(hyb::why_not(5, 64) == "5 ranks are not a whole number of model replicas of 2 ranks each");
  CHECK(hyb::list(2) == std::vector<std::size_t>{2, 4});
  CHECK(loom::world_size_rules<mlp, loom::single_process>::why_not(2, 64) == "loom::single_process trains on one rank, not 2");
}
