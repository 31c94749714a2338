// SPDX-License-Identifier: Apache-2.0
// The compile-time plans of pipeline parallelism: stage partitions of the example's networks
// (automatic and with cut_at), each stage's parameters, the GPipe and 1F1B schedule tables,
// and the check that a schedule's sends and receives pair up. Everything here is a
// static_assert; the Catch cases restate the main facts with STATIC_REQUIRE.

#include <catch2/catch.hpp>

#include <array>
#include <cstddef>
#include <type_traits>
#include <utility>

#include "../../examples/common/networks.hpp"
#include "loom/layers/activation.hpp"
#include "loom/layers/conv2d.hpp"
#include "loom/layers/flatten.hpp"
#include "loom/layers/linear.hpp"
#include "loom/layers/pool2d.hpp"
#include "loom/parallel/model_parallel.hpp"
#include "loom/parallel/pipeline/partition.hpp"
#include "loom/parallel/pipeline/policy.hpp"
#include "loom/parallel/pipeline/schedule.hpp"
#include "loom/parallel/pipeline/verify.hpp"

namespace pipeline_test {

// The example's networks (examples/common/networks.hpp).
using mlp = example::mlp;
using cnn = example::cnn;

/// The plan types leave Comm unconstrained; any type stands for it here.
struct no_comm {};

constexpr auto F = loom::forward_of;
constexpr auto B = loom::backward_of;

// ---- Partition facts that hold for every partition --------------------------------------------

/// Every stage, run as an ordinary network, has exactly its layers' parameters, laid out as in
/// the whole network less the stage's offset; its input is the previous stage's output; the
/// stages tile the layers and the parameter buffer; and the last stage ends with the network.
template <class Network, class Partition, std::size_t... S>
constexpr bool consistent(std::index_sequence<S...>) {
  bool ok = Partition::bounds[0] == 0 && Partition::bounds[Partition::stages] == Network::layer_count;
  std::size_t total = 0;
  auto stage = [&]<std::size_t s>(std::integral_constant<std::size_t, s>) {
    using net = typename Partition::template stage_network<s>;
    const std::size_t first = Partition::bounds[s], last = Partition::bounds[s + 1];
    ok = ok && first < last && net::layer_count == last - first;
    std::size_t sum = 0;
    for (std::size_t i = first; i < last; ++i) sum += Network::parameter_counts[i];
    ok = ok && net::parameter_count == sum && Partition::parameter_counts[s] == sum;
    ok = ok && Partition::parameter_offsets[s] == total;
    for (std::size_t i = 0; i < net::layer_count; ++i) {
      ok = ok && net::parameter_counts[i] == Network::parameter_counts[first + i];
      ok = ok && net::parameter_offsets[i] == Network::parameter_offsets[first + i] - Partition::parameter_offsets[s];
      ok = ok && net::layer_flops[i] == Network::layer_flops[first + i];
      ok = ok && Partition::stage_of_layer(first + i) == s;
    }
    ok = ok && net::output_shape::size == Partition::output_sizes[s];
    if constexpr (s > 0)
      ok = ok && std::is_same_v<typename net::input_shape,
                                typename Partition::template stage_network<s - 1>::output_shape>;
    else
      ok = ok && std::is_same_v<typename net::input_shape, typename Network::input_shape>;
    if constexpr (s + 1 == Partition::stages)
      ok = ok && std::is_same_v<typename net::output_shape, typename Network::output_shape>;
    total += sum;
  };
  (stage(std::integral_constant<std::size_t, S>{}), ...);
  return ok && total == Network::parameter_count;
}

template <class Network, class Pipeline>
constexpr bool consistent() {
  using partition = loom::stage_partition<Network, Pipeline>;
  return partition::ok && consistent<Network, partition>(std::make_index_sequence<partition::stages>{});
}

/// No placement of the cuts has a cheaper slowest stage than the balanced partition's
/// (exhaustive search over all placements).
template <class Network, std::size_t Stages>
constexpr bool optimal() {
  using partition = loom::stage_partition<Network, loom::pipeline<Stages>>;
  constexpr std::size_t L = Network::layer_count;
  std::array<std::size_t, Stages + 1> b{};
  b[Stages] = L;
  double best = -1;
  auto search = [&](auto& self, std::size_t s) -> void {
    if (s == Stages) {
      double worst = 0;
      for (std::size_t k = 0; k < Stages; ++k) {
        double c = 0;
        for (std::size_t i = b[k]; i < b[k + 1]; ++i) c += partition::layer_costs[i];
        worst = c > worst ? c : worst;
      }
      if (best < 0 || worst < best) best = worst;
      return;
    }
    for (std::size_t cut = b[s - 1] + 1; cut + (Stages - s) <= L; ++cut) {
      b[s] = cut;
      self(self, s + 1);
    }
  };
  if constexpr (Stages == 1) {
    best = 0;
    for (double c : partition::layer_costs) best += c;
  } else {
    search(search, 1);
  }
  return partition::bottleneck_cost == best;
}

// ---- mlp ----------------------------------------------------------------------------------------
// Layer costs: 401,408 (784 x 256), 256, 65,536 (256 x 128), 128, 2,560 (128 x 10).
using mlp2 = loom::stage_partition<mlp, loom::pipeline<2>>;
static_assert(mlp2::layer_costs == std::array<double, 5>{401408, 256, 65536, 128, 2560});
static_assert(mlp2::bounds == std::array<std::size_t, 3>{0, 1, 5});
static_assert(mlp2::parameter_counts == std::array<std::size_t, 2>{200960, 34186});
static_assert(mlp2::parameter_offsets == std::array<std::size_t, 2>{0, 200960});
static_assert(mlp2::costs == std::array<double, 2>{401408, 68480});
static_assert(mlp2::output_sizes == std::array<std::size_t, 2>{256, 10});
static_assert(std::is_same_v<mlp2::stage_network<0>, loom::network<loom::input<784>, loom::linear<256>>>);
static_assert(std::is_same_v<mlp2::stage_network<1>, loom::network<loom::input<256>, loom::relu, loom::linear<128>,
                                                                   loom::relu, loom::linear<10>>>);
// 4 stages: linear<256> alone sets the pace; the rest is spread as evenly as the layers allow.
using mlp4 = loom::stage_partition<mlp, loom::pipeline<4>>;
static_assert(mlp4::bounds == std::array<std::size_t, 5>{0, 1, 2, 3, 5});
static_assert(mlp4::parameter_counts == std::array<std::size_t, 4>{200960, 0, 32896, 1290});
// By hand: linear<256> + relu, then the rest.
using mlp_cut = loom::stage_partition<mlp, loom::pipeline<2, loom::cut_at<2>>>;
static_assert(mlp_cut::bounds == std::array<std::size_t, 3>{0, 2, 5});
static_assert(mlp_cut::parameter_counts == std::array<std::size_t, 2>{200960, 32896 + 1290});
using mlp_cut4 = loom::stage_partition<mlp, loom::pipeline<4, loom::cut_at<1, 2, 4>>>;
static_assert(mlp_cut4::bounds == std::array<std::size_t, 5>{0, 1, 2, 4, 5});
static_assert(consistent<mlp, loom::pipeline<1>>());
static_assert(consistent<mlp, loom::pipeline<2>>());
static_assert(consistent<mlp, loom::pipeline<3>>());
static_assert(consistent<mlp, loom::pipeline<4>>());
static_assert(consistent<mlp, loom::pipeline<5>>());
static_assert(consistent<mlp, loom::pipeline<2, loom::cut_at<2>>>());
static_assert(consistent<mlp, loom::pipeline<4, loom::cut_at<1, 2, 4>>>());
static_assert(optimal<mlp, 1>() && optimal<mlp, 2>() && optimal<mlp, 3>() && optimal<mlp, 4>() && optimal<mlp, 5>());

// ---- cnn ----------------------------------------------------------------------------------------
// Layer costs: conv 451,584; relu 25,088; pool 25,088; conv 7,225,344; relu 12,544; pool 12,544;
// flatten 3,136 (no FLOPs, but it reads its 3,136 elements); linear 802,816; relu 128; linear 2,560.
using cnn2 = loom::stage_partition<cnn, loom::pipeline<2>>;
static_assert(cnn2::layer_costs ==
              std::array<double, 10>{451584, 25088, 25088, 7225344, 12544, 12544, 3136, 802816, 128, 2560});
static_assert(cnn2::flops[0] + cnn2::flops[1] == cnn::flops_per_sample);
static_assert(cnn2::bounds == std::array<std::size_t, 3>{0, 4, 10});
static_assert(cnn2::parameter_counts == std::array<std::size_t, 2>{320 + 18496, 401536 + 1290});
static_assert(cnn2::costs == std::array<double, 2>{7727104, 833728});
static_assert(std::is_same_v<cnn2::stage_network<1>::input_shape, loom::shape<64, 14, 14>>);
// 4 stages: the second convolution alone; flatten goes with the pooling before it, as that
// leaves the most even other stages.
using cnn4 = loom::stage_partition<cnn, loom::pipeline<4>>;
static_assert(cnn4::bounds == std::array<std::size_t, 5>{0, 3, 4, 7, 10});
static_assert(cnn4::parameter_counts == std::array<std::size_t, 4>{320, 18496, 0, 401536 + 1290});
static_assert(cnn4::bottleneck_cost == 7225344);
static_assert(cnn4::output_sizes == std::array<std::size_t, 4>{32 * 14 * 14, 64 * 14 * 14, 64 * 7 * 7, 10});
static_assert(std::is_same_v<cnn4::stage_network<2>,
                             loom::network<loom::input<64, 14, 14>, loom::relu, loom::max_pool2d<2>, loom::flatten>>);
static_assert(cnn4::stage_of_layer(0) == 0 && cnn4::stage_of_layer(3) == 1 && cnn4::stage_of_layer(6) == 2 &&
              cnn4::stage_of_layer(9) == 3);
using cnn_cut = loom::stage_partition<cnn, loom::pipeline<4, loom::cut_at<3, 6, 8>>>;
static_assert(cnn_cut::bounds == std::array<std::size_t, 5>{0, 3, 6, 8, 10});
static_assert(cnn_cut::parameter_counts == std::array<std::size_t, 4>{320, 18496, 401536, 1290});
static_assert(cnn_cut::parameter_offsets == std::array<std::size_t, 4>{0, 320, 320 + 18496, 320 + 18496 + 401536});
static_assert(std::is_same_v<cnn_cut::stage_network<2>, loom::network<loom::input<64, 7, 7>, loom::flatten, loom::linear<128>>>);
static_assert(consistent<cnn, loom::pipeline<2>>());
static_assert(consistent<cnn, loom::pipeline<3>>());
static_assert(consistent<cnn, loom::pipeline<4>>());
static_assert(consistent<cnn, loom::pipeline<10>>());
static_assert(consistent<cnn, loom::pipeline<2, loom::cut_at<7>>>());
static_assert(consistent<cnn, loom::pipeline<4, loom::cut_at<3, 6, 8>>>());
static_assert(optimal<cnn, 2>() && optimal<cnn, 3>() && optimal<cnn, 4>() && optimal<cnn, 5>());

// ---- The policy types ----------------------------------------------------------------------------
using p_default = loom::pipeline<2>;
static_assert(p_default::ok && p_default::micro_batch_count == 1 && p_default::balanced);
static_assert(std::is_same_v<p_default::schedule_policy, loom::one_f_one_b>);
// Options in any order.
using p1 = loom::pipeline<4, loom::micro_batches<8>, loom::gpipe, loom::cut_at<3, 6, 8>>;
using p2 = loom::pipeline<4, loom::cut_at<3, 6, 8>, loom::gpipe, loom::micro_batches<8>>;
static_assert(p1::ok && p2::ok && p1::micro_batch_count == 8 && p2::micro_batch_count == 8);
static_assert(std::is_same_v<p1::schedule, p2::schedule>);
static_assert(std::is_same_v<p1::schedule, loom::schedule_table<loom::gpipe, 4, 8>>);
static_assert(!p1::balanced && p1::cut_points == p2::cut_points);
using mp = loom::model_parallel<loom::pipeline<4, loom::micro_batches<8>>, no_comm>;
static_assert(mp::stages == 4 && mp::micro_batch_count == 8);
static_assert(std::is_same_v<mp::comm_type, no_comm>);
static_assert(std::is_same_v<mp::schedule, loom::schedule_table<loom::one_f_one_b, 4, 8>>);
static_assert(std::is_same_v<mp::partition<cnn>, loom::stage_partition<cnn, loom::pipeline<4, loom::micro_batches<8>>>>);
static_assert(mp::partition<cnn>::bounds == cnn4::bounds);
static_assert(loom::is_model_parallel_v<mp> && loom::is_pipeline_v<mp::parallelism>);

// ---- 1F1B, S = 4, M = 8 ------------------------------------------------------------------------
using f1b = loom::schedule_table<loom::one_f_one_b, 4, 8>;
// Stage s: S - s - 1 warm-up forwards, then one forward and one backward in turn, then the
// backwards left.
static_assert(f1b::actions_of<0> == std::array{F(0), F(1), F(2),                          // warm-up
                                               F(3), B(0), F(4), B(1), F(5), B(2), F(6), B(3), F(7), B(4),
                                               B(5), B(6), B(7)});                        // cool-down
static_assert(f1b::actions_of<1> == std::array{F(0), F(1),
                                               F(2), B(0), F(3), B(1), F(4), B(2), F(5), B(3), F(6), B(4), F(7), B(5),
                                               B(6), B(7)});
static_assert(f1b::actions_of<2> == std::array{F(0),
                                               F(1), B(0), F(2), B(1), F(3), B(2), F(4), B(3), F(5), B(4), F(6), B(5),
                                               F(7), B(6),
                                               B(7)});
static_assert(f1b::actions_of<3> == std::array{F(0), B(0), F(1), B(1), F(2), B(2), F(3), B(3), F(4), B(4), F(5), B(5),
                                               F(6), B(6), F(7), B(7)});
static_assert(f1b::peak_live_activations(0) == 4 && f1b::peak_live_activations(1) == 3 &&
              f1b::peak_live_activations(2) == 2 && f1b::peak_live_activations(3) == 1);
static_assert(loom::pairs_up<f1b>());
// The idealised timeline (forward 1, backward 2): 3 (M + S - 1) = 33, the bubble (S - 1) / (M + S - 1).
static_assert(f1b::makespan == 33);
static_assert(f1b::bubble_fraction > 3.0 / 11 - 1e-12 && f1b::bubble_fraction < 3.0 / 11 + 1e-12);

// ---- GPipe, S = 4, M = 8 -----------------------------------------------------------------------
using gp = loom::schedule_table<loom::gpipe, 4, 8>;
static_assert(gp::actions_of<0> == std::array{F(0), F(1), F(2), F(3), F(4), F(5), F(6), F(7),
                                              B(7), B(6), B(5), B(4), B(3), B(2), B(1), B(0)});
static_assert(gp::actions_of<3> == gp::actions_of<0>);
static_assert(gp::peak_live_activations(0) == 8 && gp::peak_live_activations(3) == 8);
static_assert(loom::pairs_up<gp>() && gp::makespan == 33);

// ---- Operations: 1F1B, S = 2, M = 2 --------------------------------------------------------------
constexpr loom::pipeline_op op(loom::pipeline_op_kind k, std::size_t m, std::size_t action, bool with_next = false) {
  return {k, m, action, with_next};
}
using enum loom::pipeline_op_kind;
// Stage 0 sends the activation of micro-batch 1 and receives the gradient of micro-batch 0 at
// once; stage 1 sends that gradient and receives that activation at once.
static_assert(loom::schedule_table<loom::one_f_one_b, 2, 2>::ops_of<0> ==
              std::array{op(forward, 0, 0), op(send_activation, 0, 0), op(forward, 1, 1), op(send_activation, 1, 1, true),
                         op(recv_gradient, 0, 2), op(backward, 0, 2), op(recv_gradient, 1, 3), op(backward, 1, 3)});
static_assert(loom::schedule_table<loom::one_f_one_b, 2, 2>::ops_of<1> ==
              std::array{op(recv_activation, 0, 0), op(forward, 0, 0), op(backward, 0, 1), op(send_gradient, 0, 1, true),
                         op(recv_activation, 1, 2), op(forward, 1, 2), op(backward, 1, 3), op(send_gradient, 1, 3)});

// ---- Every built-in schedule pairs up, S in {1, 2, 3, 4}, M in {1, 2, 4, 8} -----------------------
template <class Schedule, std::size_t S, std::size_t M>
constexpr bool sound() {
  using t = loom::schedule_table<Schedule, S, M>;
  bool ok = loom::pairs_up<t>() && t::makespan == 3 * (M + S - 1);
  for (std::size_t s = 0; s < S; ++s) {
    const std::size_t expected = std::is_same_v<Schedule, loom::gpipe> ? M : (S - s < M ? S - s : M);
    ok = ok && t::peak_live_activations(s) == expected && t::peak_live_activations(s) <= (std::is_same_v<Schedule, loom::gpipe> ? M : S);
  }
  return ok;
}
template <class Schedule, std::size_t S>
constexpr bool sound_for_all_m() {
  return sound<Schedule, S, 1>() && sound<Schedule, S, 2>() && sound<Schedule, S, 4>() && sound<Schedule, S, 8>();
}
template <class Schedule>
constexpr bool sound_for_all() {
  return sound_for_all_m<Schedule, 1>() && sound_for_all_m<Schedule, 2>() && sound_for_all_m<Schedule, 3>() &&
         sound_for_all_m<Schedule, 4>();
}
static_assert(sound_for_all<loom::gpipe>());
static_assert(sound_for_all<loom::one_f_one_b>());
// Through the pipeline type, whose own check would stop the build.
static_assert(loom::pipeline<4, loom::micro_batches<8>, loom::gpipe>::ok);
static_assert(loom::pipeline<3, loom::micro_batches<5>, loom::one_f_one_b>::ok);

// ---- Hand-written schedules --------------------------------------------------------------------
// 1F1B for S = 2, M = 2, written out: it pairs up, and a pipeline accepts it.
using hand_1f1b = loom::custom_schedule<loom::stage_actions<F(0), F(1), B(0), B(1)>,
                                        loom::stage_actions<F(0), B(0), F(1), B(1)>>;
static_assert(loom::pairs_up<loom::schedule_table<hand_1f1b, 2, 2>>());
static_assert(loom::schedule_table<hand_1f1b, 2, 2>::actions == loom::schedule_table<loom::one_f_one_b, 2, 2>::actions);
static_assert(loom::pipeline<2, loom::micro_batches<2>, hand_1f1b>::ok);
// GPipe with the backwards in forward order also pairs up.
using fifo_gpipe = loom::custom_schedule<loom::stage_actions<F(0), F(1), B(0), B(1)>,
                                         loom::stage_actions<F(0), F(1), B(0), B(1)>>;
static_assert(loom::pairs_up<loom::schedule_table<fifo_gpipe, 2, 2>>());

// Stage 1 takes micro-batch 1 first while stage 0 sends micro-batch 0 first.
using crossed = loom::custom_schedule<loom::stage_actions<F(0), F(1), B(1), B(0)>,
                                      loom::stage_actions<F(1), F(0), B(1), B(0)>>;
constexpr loom::schedule_verdict crossed_verdict = loom::verify_schedule<loom::schedule_table<crossed, 2, 2>>();
static_assert(!loom::pairs_up<loom::schedule_table<crossed, 2, 2>>());
static_assert(crossed_verdict.problem == loom::schedule_problem::send_receive_mismatch);
static_assert(crossed_verdict.stage == 0 && crossed_verdict.index == 0 && crossed_verdict.op == send_activation &&
              crossed_verdict.micro_batch == 0 && crossed_verdict.peer == 1 && crossed_verdict.peer_micro_batch == 1);

// Stage 0 waits for the gradient of micro-batch 0 before it sends micro-batch 1; stage 1 waits
// for micro-batch 1 before it runs any backward: each waits for the other.
using stuck = loom::custom_schedule<loom::stage_actions<F(0), B(0), F(1), B(1)>,
                                    loom::stage_actions<F(0), F(1), B(0), B(1)>>;
constexpr loom::schedule_verdict stuck_verdict = loom::verify_schedule<loom::schedule_table<stuck, 2, 2>>();
static_assert(!loom::pairs_up<loom::schedule_table<stuck, 2, 2>>());
static_assert(stuck_verdict.problem == loom::schedule_problem::deadlock);
static_assert(stuck_verdict.stage == 0 && stuck_verdict.index == 1 && stuck_verdict.op == recv_gradient &&
              stuck_verdict.micro_batch == 0);

// Tables that are wrong before any message is sent.
template <class Schedule, std::size_t S, std::size_t M>
constexpr loom::schedule_problem problem_of = loom::verify_schedule<loom::schedule_table<Schedule, S, M>>().problem;
using one_stage_short = loom::custom_schedule<loom::stage_actions<F(0), B(0)>>;
static_assert(problem_of<one_stage_short, 1, 1> == loom::schedule_problem::none);
static_assert(problem_of<one_stage_short, 2, 1> == loom::schedule_problem::wrong_stage_count);
static_assert(problem_of<one_stage_short, 1, 2> == loom::schedule_problem::pass_missing);
static_assert(problem_of<loom::custom_schedule<loom::stage_actions<F(0), F(0), B(0)>>, 1, 1> ==
              loom::schedule_problem::pass_repeated);
static_assert(problem_of<loom::custom_schedule<loom::stage_actions<B(0), F(0)>>, 1, 1> ==
              loom::schedule_problem::backward_before_forward);
static_assert(problem_of<loom::custom_schedule<loom::stage_actions<F(0), B(0), F(1), B(1)>>, 1, 1> ==
              loom::schedule_problem::micro_batch_out_of_range);

}  // namespace pipeline_test

using namespace pipeline_test;

TEST_CASE("The example's networks are cut into balanced stages at compile time", "[parallel][pipeline]") {
  STATIC_REQUIRE(mlp2::bounds == std::array<std::size_t, 3>{0, 1, 5});
  STATIC_REQUIRE(cnn2::bounds == std::array<std::size_t, 3>{0, 4, 10});
  STATIC_REQUIRE(cnn4::bounds == std::array<std::size_t, 5>{0, 3, 4, 7, 10});
  STATIC_REQUIRE(optimal<cnn, 4>());
}

TEST_CASE("Cut points given by hand are the stages' first layers", "[parallel][pipeline]") {
  STATIC_REQUIRE(mlp_cut::bounds == std::array<std::size_t, 3>{0, 2, 5});
  STATIC_REQUIRE(cnn_cut::bounds == std::array<std::size_t, 5>{0, 3, 6, 8, 10});
}

TEST_CASE("Each stage's parameter count is the sum of its layers', and the stages sum to the network",
          "[parallel][pipeline]") {
  STATIC_REQUIRE(cnn4::stage_network<3>::parameter_count == cnn4::parameter_counts[3]);
  STATIC_REQUIRE(cnn4::parameter_counts[0] + cnn4::parameter_counts[1] + cnn4::parameter_counts[2] +
                     cnn4::parameter_counts[3] ==
                 cnn::parameter_count);
  STATIC_REQUIRE(consistent<cnn, loom::pipeline<4>>());
  STATIC_REQUIRE(consistent<mlp, loom::pipeline<2, loom::cut_at<2>>>());
}

TEST_CASE("1F1B with 4 stages and 8 micro-batches keeps at most S - s micro-batches alive on stage s",
          "[parallel][pipeline]") {
  STATIC_REQUIRE(f1b::actions_of<3> == std::array{F(0), B(0), F(1), B(1), F(2), B(2), F(3), B(3), F(4), B(4), F(5), B(5),
                                                  F(6), B(6), F(7), B(7)});
  STATIC_REQUIRE(f1b::peak_live_activations(0) == 4);
  STATIC_REQUIRE(f1b::peak_live_activations(3) == 1);
  STATIC_REQUIRE(gp::peak_live_activations(0) == 8);
}

TEST_CASE("The built-in schedules pair up for 1 to 4 stages and 1 to 8 micro-batches", "[parallel][pipeline]") {
  STATIC_REQUIRE(sound_for_all<loom::gpipe>());
  STATIC_REQUIRE(sound_for_all<loom::one_f_one_b>());
}

TEST_CASE("A hand-written schedule is checked like the built-in ones", "[parallel][pipeline]") {
  STATIC_REQUIRE(loom::pairs_up<loom::schedule_table<hand_1f1b, 2, 2>>());
  STATIC_REQUIRE(!loom::pairs_up<loom::schedule_table<crossed, 2, 2>>());
  STATIC_REQUIRE(!loom::pairs_up<loom::schedule_table<stuck, 2, 2>>());
}
