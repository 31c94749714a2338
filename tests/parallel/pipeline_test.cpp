// SPDX-License-Identifier: Apache-2.0
// The pipeline trainer over loom::local_comm (stages as threads of this process): equivalence
// with single-process training for both schedules, 2 and 4 stages, 1 and several
// micro-batches, uneven micro-batches and accumulation, hybrid data x pipeline; initialisation
// independent of the split; the activation memory 1F1B saves; the start-up checks; the staged
// path of GPU backends, through a CPU stand-in.

#include <catch2/catch.hpp>

#include <atomic>
#include <cstring>
#include <mutex>
#include <string>
#include <variant>

#include "error_message.hpp"
#include "loom/comm/local.hpp"
#include "pipeline_local.hpp"
#include "rank_results.hpp"

using namespace loom_test;

namespace {

/// Each stage's model has exactly the parameters of its layers in the whole network.
template <class Net, class Policy, std::size_t... S>
constexpr bool stage_parameters_are_their_layers(std::index_sequence<S...>) {
  using P = typename Policy::template partition<Net>;
  std::size_t total = 0;
  bool ok = true;
  auto one = [&]<std::size_t s>(std::integral_constant<std::size_t, s>) {
    std::size_t layers = 0;
    for (std::size_t i = P::bounds[s]; i < P::bounds[s + 1]; ++i) layers += Net::parameter_counts[i];
    ok = ok && loom::model<typename P::template stage_network<s>>::parameter_count == layers;
    ok = ok && P::parameter_offsets[s] == total;
    total += layers;
  };
  (one(std::integral_constant<std::size_t, S>{}), ...);
  return ok && total == Net::parameter_count;
}

}  // namespace

static_assert(stage_parameters_are_their_layers<mlp, local_pipeline<2>>(std::make_index_sequence<2>{}));
static_assert(stage_parameters_are_their_layers<mlp, local_pipeline<4>>(std::make_index_sequence<4>{}));
static_assert(stage_parameters_are_their_layers<cnn, local_pipeline<2>>(std::make_index_sequence<2>{}));
static_assert(stage_parameters_are_their_layers<cnn, local_pipeline<4>>(std::make_index_sequence<4>{}));

TEST_CASE("Each pipeline stage's parameters are exactly its layers' parameters", "[parallel][pipeline]") {
  STATIC_REQUIRE(stage_parameters_are_their_layers<mlp, local_pipeline<4>>(std::make_index_sequence<4>{}));
  STATIC_REQUIRE(stage_parameters_are_their_layers<cnn, local_pipeline<2>>(std::make_index_sequence<2>{}));
}

TEST_CASE("Before training, the gathered stages are bitwise the single-process model", "[parallel][pipeline]") {
  const auto mlp0 = initial_parameters<mlp>();
  const auto cnn0 = initial_parameters<cnn>();
  auto check = [](auto policy_tag, int ranks, const std::vector<float>& whole) {
    using Policy = typename decltype(policy_tag)::type;
    using Net = std::conditional_t<std::is_same_v<typename decltype(policy_tag)::net, cnn>, cnn, mlp>;
    std::mutex m;
    std::vector<std::vector<float>> got;
    std::vector<double> l2;
    loom::local_world(ranks).run([&](loom::local_comm& c) {
      pipeline_trainer<Net, Policy> t{c, pipeline_sgd, {.seed = 1, .threads = 1}};
      auto p = t.gather_parameters();
      const double norm = t.parameters_l2();
      std::lock_guard lock(m);
      got.push_back(std::move(p));
      l2.push_back(norm);
    });
    double sq = 0;
    for (float v : whole) sq += double(v) * v;
    for (std::size_t r = 0; r < got.size(); ++r) {
      REQUIRE(got[r].size() == whole.size());
      CHECK(std::memcmp(got[r].data(), whole.data(), whole.size() * sizeof(float)) == 0);
      CHECK(l2[r] == Approx(std::sqrt(sq)).epsilon(1e-9));
    }
  };
  struct mlp2 { using type = local_pipeline<2>; using net = mlp; };
  struct mlp4 { using type = local_pipeline<4>; using net = mlp; };
  struct cnn2 { using type = local_pipeline<2>; using net = cnn; };
  struct cnn4 { using type = local_pipeline<4, loom::cut_at<3, 6, 8>>; using net = cnn; };
  check(mlp2{}, 2, mlp0);
  check(mlp4{}, 4, mlp0);
  check(cnn2{}, 2, cnn0);
  check(cnn4{}, 4, cnn0);
}

TEST_CASE("The mlp on a pipeline ends where one process does after 20 steps", "[parallel][pipeline]") {
  const auto opts = steps(20, 64);
  const auto ref = reference_with<mlp>(train_set(), opts);
  auto run = [&](auto policy_tag, int ranks, const char* what) {
    using Policy = typename decltype(policy_tag)::type;
    const auto out = train_pipeline<mlp, Policy>(ranks, train_set(), opts);
    const double d = relative_distance(out.params[0], ref);
    INFO(what << ": relative distance " << d);
    CHECK(d <= 1e-5);
  };
  struct s2m1g { using type = local_pipeline<2, loom::micro_batches<1>, loom::gpipe>; };
  struct s2m4g { using type = local_pipeline<2, loom::micro_batches<4>, loom::gpipe>; };
  struct s2m1f { using type = local_pipeline<2, loom::micro_batches<1>, loom::one_f_one_b>; };
  struct s2m4f { using type = local_pipeline<2, loom::micro_batches<4>, loom::one_f_one_b>; };
  struct s4m1g { using type = local_pipeline<4, loom::micro_batches<1>, loom::gpipe>; };
  struct s4m4g { using type = local_pipeline<4, loom::micro_batches<4>, loom::gpipe>; };
  struct s4m1f { using type = local_pipeline<4, loom::micro_batches<1>, loom::one_f_one_b>; };
  struct s4m4f { using type = local_pipeline<4, loom::micro_batches<4>, loom::one_f_one_b>; };
  run(s2m1g{}, 2, "S=2 M=1 gpipe");
  run(s2m4g{}, 2, "S=2 M=4 gpipe");
  run(s2m1f{}, 2, "S=2 M=1 1F1B");
  run(s2m4f{}, 2, "S=2 M=4 1F1B");
  run(s4m1g{}, 4, "S=4 M=1 gpipe");
  run(s4m4g{}, 4, "S=4 M=4 gpipe");
  run(s4m1f{}, 4, "S=4 M=1 1F1B");
  run(s4m4f{}, 4, "S=4 M=4 1F1B");
}

TEST_CASE("The example's cnn on a 2-stage pipeline ends where one process does after 20 steps", "[parallel][pipeline]") {
  // 20 steps: see common.hpp (past ~25 steps a ReLU kink flip decides, not the arithmetic).
  const auto opts = steps(20, 64);
  const auto ref = reference_with<cnn>(train_set(), opts);
  {
    const auto out = train_pipeline<cnn, local_pipeline<2, loom::micro_batches<4>, loom::gpipe>>(2, train_set(), opts);
    const double d = relative_distance(out.params[0], ref);
    INFO("gpipe, relative distance " << d);
    CHECK(d <= 1e-5);
  }
  {
    const auto out = train_pipeline<cnn, local_pipeline<2, loom::micro_batches<4>, loom::one_f_one_b>>(2, train_set(), opts);
    const double d = relative_distance(out.params[0], ref);
    INFO("1F1B, relative distance " << d);
    CHECK(d <= 1e-5);
  }
}

TEST_CASE("Uneven micro-batches, short epoch tails, accumulation and clipping match one process",
          "[parallel][pipeline]") {
  // 250 samples in batches of 60: every epoch ends with a batch of 10, cut into 8 micro-batches
  // of 1 or 2; 60 itself is cut into 7s and 8s. 20 steps cross four epochs.
  const auto data = loom::data::fashion_mnist(loom::data::split::train).first(250);
  auto opts = steps(20, 60);
  const auto ref = reference_with<smooth_mlp>(data, opts);
  using P = local_pipeline<3, loom::micro_batches<8>, loom::one_f_one_b>;
  CHECK(relative_distance(train_pipeline<smooth_mlp, P>(3, data, opts).params[0], ref) <= 1e-5);
  // A batch of 3 on 8 micro-batches: most are empty.
  const auto opts3 = steps(10, 3);
  CHECK(relative_distance(train_pipeline<mlp, P>(3, data, opts3).params[0], reference_with<mlp>(data, opts3)) <= 1e-5);
  // Accumulation of 2 batches per step and the global norm clipped.
  auto acc = steps(10, 32, 2);
  acc.clip_grad_norm = 0.5;
  const auto ref_acc = reference_with<mlp>(train_set(), acc);
  using G = local_pipeline<2, loom::micro_batches<4>, loom::gpipe>;
  const auto out = train_pipeline<mlp, G>(2, train_set(), acc);
  CHECK(relative_distance(out.params[0], ref_acc) <= 1e-5);
  // Without clipping the result differs: clipping took effect.
  acc.clip_grad_norm = 0;
  CHECK(relative_distance(out.params[0], reference_with<mlp>(train_set(), acc)) > 1e-4);
}

TEST_CASE("Every rank reports the same loss and accuracy, those of one process", "[parallel][pipeline]") {
  const auto data = loom::data::fashion_mnist(loom::data::split::train).first(640);
  auto opts = steps(20, 64);
  opts.epochs = 2;
  loom::fit_result ref;
  loom::eval_result ref_eval;
  reference_with<mlp>(data, opts, &ref, &ref_eval);
  const auto out = train_pipeline<mlp, local_pipeline<4, loom::micro_batches<4>>>(4, data, opts, true);
  for (std::size_t r = 0; r < 4; ++r) {
    INFO("rank " << r);
    CHECK(out.results[r].train_loss == out.results[0].train_loss);
    CHECK(out.results[r].train_accuracy == out.results[0].train_accuracy);
    CHECK(out.results[r].samples == 1280);  // 2 epochs
    CHECK(out.results[r].steps == 20);
    CHECK(out.evals[r].loss == out.evals[0].loss);
    CHECK(out.evals[r].accuracy == out.evals[0].accuracy);
    CHECK(out.evals[r].samples == 640);
  }
  CHECK(out.results[0].train_loss == Approx(ref.train_loss).epsilon(1e-5));
  CHECK(out.results[0].train_accuracy == Approx(ref.train_accuracy).epsilon(1e-9));
  CHECK(out.evals[0].loss == Approx(ref_eval.loss).epsilon(1e-5));
  CHECK(out.evals[0].accuracy == Approx(ref_eval.accuracy).epsilon(1e-9));
}

TEST_CASE("Two replicas of a 2-stage pipeline end where one process does", "[parallel][pipeline][hybrid]") {
  const auto opts = steps(20, 64);
  const auto ref = reference_with<mlp>(train_set(), opts);
  const auto out = train_pipeline<mlp, local_hybrid<2, loom::micro_batches<4>, loom::one_f_one_b>>(4, train_set(), opts);
  CHECK(relative_distance(out.params[0], ref) <= 1e-5);
  CHECK(out.results[0].samples == 20 * 64);
  // Ranks 0, 1 are replica 0 (stages 0, 1); ranks 2, 3 replica 1.
  const auto& f = out.results[3].figures;
  REQUIRE(f.size() == 4);
  CHECK(f[2].stage == 0);
  CHECK(f[2].replica == 1);
  CHECK(f[3].stage == 1);
  CHECK(f[1].samples == 20 * 32);
  CHECK(f[1].bytes_sent > 0);
  // One replica of 4 stages (stage 1 is a lone relu: no parameters to average).
  static_assert(local_pipeline<4>::partition<mlp>::parameter_counts[1] == 0);
  CHECK(relative_distance(train_pipeline<mlp, local_hybrid<4, loom::micro_batches<2>>>(4, train_set(), steps(10, 64)).params[0],
                          reference_with<mlp>(train_set(), steps(10, 64))) <= 1e-5);
  // Accumulation: the allreduce runs once per optimizer step, after the second batch.
  const auto acc = steps(10, 32, 2);
  CHECK(relative_distance(train_pipeline<mlp, local_hybrid<2, loom::micro_batches<2>, loom::gpipe>>(4, train_set(), acc).params[0],
                          reference_with<mlp>(train_set(), acc)) <= 1e-5);
  // An uneven tail over the replicas: 250 samples in batches of 60 end with 10, 5 per replica.
  const auto data = loom::data::fashion_mnist(loom::data::split::train).first(250);
  const auto tail = steps(12, 60);
  loom::eval_result ref_eval;
  const auto ref_tail = reference_with<mlp>(data, tail, nullptr, &ref_eval);
  const auto hy = train_pipeline<mlp, local_hybrid<2, loom::micro_batches<4>, loom::gpipe>>(4, data, tail, true);
  CHECK(relative_distance(hy.params[0], ref_tail) <= 1e-5);
  for (const auto& e : hy.evals) {  // every rank, both replicas' shares summed
    CHECK(e.samples == 250);
    CHECK(e.loss == Approx(ref_eval.loss).epsilon(1e-5));
    CHECK(e.accuracy == Approx(ref_eval.accuracy).epsilon(1e-9));
  }
}

TEST_CASE("1F1B holds at most S/M of GPipe's activation memory (S=2, M=8)", "[parallel][pipeline]") {
  using G = local_pipeline<2, loom::micro_batches<8>, loom::gpipe>;
  using F = local_pipeline<2, loom::micro_batches<8>, loom::one_f_one_b>;
  static_assert(G::schedule::peak_live_activations(0) == 8 && F::schedule::peak_live_activations(0) == 2);
  const auto opts = steps(3, 64);
  const auto g = train_pipeline<mlp, G>(2, train_set(), opts).results[0].figures;
  const auto f = train_pipeline<mlp, F>(2, train_set(), opts).results[0].figures;
  REQUIRE(g.size() == 2);
  REQUIRE(f.size() == 2);
  for (std::size_t s = 0; s < 2; ++s) {
    INFO("stage " << s << ": 1F1B " << f[s].peak_activation_bytes << " bytes, GPipe " << g[s].peak_activation_bytes);
    CHECK(f[s].peak_activation_bytes > 0);
    CHECK(f[s].peak_activation_bytes * 8 <= 2 * g[s].peak_activation_bytes);
  }
  // Stage 0 is linear<256> alone (256 floats a sample kept), GPipe: 8 micro-batches of 8 samples.
  static_assert(G::partition<mlp>::bounds[1] == 1);
  CHECK(g[0].peak_activation_bytes == 8 * 8 * 256 * 4.0);
  CHECK(f[0].peak_activation_bytes == 2 * 8 * 256 * 4.0);
  // Parameters held: each stage its own.
  using P = G::partition<mlp>;
  CHECK(g[0].parameter_bytes == P::parameter_counts[0] * 4.0);
  CHECK(g[1].parameter_bytes == P::parameter_counts[1] * 4.0);
  CHECK(g[1].compute_s > 0);
  CHECK(g[0].bubble_s >= 0);
  const std::string table = loom::stage_figures_table(g);
  CHECK_THAT(table, Catch::Contains("stage") && Catch::Contains("bubble_s"));
}

TEST_CASE("A world whose size is not the stage count is refused on every rank", "[parallel][pipeline]") {
  std::atomic<int> caught{0};
  loom::local_world(3).run([&](loom::local_comm& c) {
    try {
      pipeline_trainer<mlp, local_pipeline<2>> t{c, pipeline_sgd, {.seed = 1, .threads = 1}};
    } catch (const loom::invalid_argument& e) {
      const std::string what = e.what();
      if (what.find("2 stages") != std::string::npos && what.find("3 ranks") != std::string::npos) ++caught;
    }
  });
  CHECK(caught == 3);
  caught = 0;
  loom::local_world(3).run([&](loom::local_comm& c) {
    try {
      pipeline_trainer<mlp, local_hybrid<2>> t{c, pipeline_sgd, {.seed = 1, .threads = 1}};
    } catch (const loom::invalid_argument& e) {
      if (std::string(e.what()).find("3 ranks, expected a multiple of the 2 stages") != std::string::npos) ++caught;
    }
  });
  CHECK(caught == 3);
}

TEST_CASE("Stages built with different seeds or fit options all stop, naming the difference", "[parallel][pipeline]") {
  std::atomic<int> caught{0};
  loom::local_world(2).run([&](loom::local_comm& c) {
    try {
      pipeline_trainer<mlp, local_pipeline<2>> t{c, pipeline_sgd, {.seed = static_cast<std::uint64_t>(1 + c.rank()), .threads = 1}};
    } catch (const loom::communication_error& e) {
      const std::string what = e.what();
      if (what.find("loom::pipeline: the ranks do not run the same job") != std::string::npos &&
          what.find("[seed=2] where rank 0 has [seed=1]") != std::string::npos)
        ++caught;
    }
  });
  CHECK(caught == 2);
  // Another pipeline on rank 1: told before anything splits or waits on the other.
  caught = 0;
  loom::local_world(2).run([&](loom::local_comm& c) {
    try {
      if (c.rank() == 0)
        pipeline_trainer<mlp, local_pipeline<2>> t{c, pipeline_sgd, {.seed = 1, .threads = 1}};
      else
        pipeline_trainer<mlp, local_hybrid<1>> t{c, pipeline_sgd, {.seed = 1, .threads = 1}};
    } catch (const loom::communication_error& e) {
      const std::string what = e.what();
      if (what.find("[replicated=yes] where rank 0 has [replicated=no]") != std::string::npos &&
          what.find("[stages=1] where rank 0 has [stages=2]") != std::string::npos)
        ++caught;
    }
  });
  CHECK(caught == 2);
  caught = 0;
  loom::local_world(2).run([&](loom::local_comm& c) {
    pipeline_trainer<mlp, local_pipeline<2>> t{c, pipeline_sgd, {.seed = 1, .threads = 1}};
    try {
      t.fit(train_set(), steps(2, c.rank() == 0 ? 64 : 32));
    } catch (const loom::communication_error& e) {
      if (std::string(e.what()).find("[batch=32] where rank 0 has [batch=64]") != std::string::npos) ++caught;
    }
  });
  CHECK(caught == 2);
}

TEST_CASE("stage_model<S>() gives this rank's stage model and refuses another stage", "[parallel][pipeline]") {
  struct rank_stage {
    int stage = -1;
    std::size_t model_index = 0, stage_parameters = 0;
    std::string other_stage_error;  // rank 0, asking for stage 1's model
  };
  const auto found = loom::testing::on_local_ranks(2, [&](loom::local_comm& c) {
    pipeline_trainer<mlp, local_pipeline<2>> t{c, pipeline_sgd, {.seed = 1, .threads = 1}};
    rank_stage s;
    s.stage = t.stage();
    s.model_index = t.model().index();
    if (c.rank() == 0) {
      s.stage_parameters = t.stage_model<0>().parameters().size();
      s.other_stage_error = loom::testing::error_message<std::exception>([&] { (void)t.stage_model<1>(); });
    } else {
      s.stage_parameters = t.stage_model<1>().parameters().size();
    }
    return s;
  });
  using P = local_pipeline<2>::partition<mlp>;
  for (std::size_t r = 0; r < found.size(); ++r) {
    INFO("rank " << r);
    CHECK(found[r].stage == static_cast<int>(r));
    CHECK(found[r].model_index == r);
    CHECK(found[r].stage_parameters == P::parameter_counts[r]);
  }
  CHECK_THAT(found[0].other_stage_error, Catch::Contains("runs stage 0, not 1"));
}

namespace {
/// The training set, except that reading label `bad` fails: only the last stage reads labels.
struct failing_labels {
  using sample_shape = loom::data::fashion_mnist_set::sample_shape;
  static constexpr std::size_t classes = 10;
  const loom::data::fashion_mnist_set* data;
  std::size_t bad;
  std::size_t size() const { return data->size(); }
  const std::uint8_t* pixels(std::size_t i) const { return data->pixels(i); }
  std::int32_t label(std::size_t i) const {
    if (i == bad) throw loom::data_error("loom_test: label 1234 is unreadable");
    return static_cast<std::int32_t>(data->label(i));
  }
};
}  // namespace

TEST_CASE("A stage that fails mid-step stops the other stages instead of leaving them waiting",
          "[parallel][pipeline]") {
  const failing_labels data{&train_set(), 1234};  // the message names 1234
  std::mutex m;
  std::vector<std::string> messages(2);
  loom::local_world(2).run([&](loom::local_comm& c) {
    pipeline_trainer<mlp, local_pipeline<2, loom::micro_batches<4>>> t{c, pipeline_sgd, {.seed = 1, .threads = 1}};
    try {
      t.fit(data, steps(100, 64));  // one epoch visits every sample: label 1234 is read
    } catch (const loom::communication_error& e) {
      std::lock_guard lock(m);
      messages[static_cast<std::size_t>(c.rank())] = std::string("communication_error: ") + e.what();
    } catch (const loom::error& e) {
      std::lock_guard lock(m);
      messages[static_cast<std::size_t>(c.rank())] = e.what();
    }
  });
  CHECK_THAT(messages[1], Catch::Contains("label 1234 is unreadable"));  // the last stage read it
  // Stage 0 waits for stage 1's gradient; it learns that rank 1 stopped ("rank 1 failed: ..."
  // while rank 1 unwinds, "... which returned without sending it" once it has caught).
  CHECK_THAT(messages[0], Catch::StartsWith("communication_error: ") && Catch::Contains("rank 1"));
}

TEST_CASE("Dropout masks do not depend on how the batch is cut into micro-batches and replicas",
          "[parallel][pipeline]") {
  // Each micro-batch's samples keep their position in the global batch (sample_offset), so every
  // sample draws the mask it draws in one process.
  using dropout_mlp = loom::network<loom::input<784>, loom::linear<256>, loom::relu, loom::dropout_rate<20>,
                                    loom::linear<128>, loom::relu, loom::dropout_rate<20>, loom::linear<10>>;
  const auto opts = steps(10, 64);
  const auto ref = reference_with<dropout_mlp>(train_set(), opts);
  using P = local_pipeline<2, loom::micro_batches<4>, loom::cut_at<3>>;  // the first dropout on stage 0
  CHECK(relative_distance(train_pipeline<dropout_mlp, P>(2, train_set(), opts).params[0], ref) <= 1e-5);
  using H = local_hybrid<2, loom::micro_batches<4>, loom::cut_at<3>>;
  CHECK(relative_distance(train_pipeline<dropout_mlp, H>(4, train_set(), opts).params[0], ref) <= 1e-5);
}

TEST_CASE("A one-stage pipeline and a hand-written schedule match one process too", "[parallel][pipeline]") {
  const auto opts = steps(10, 64);
  const auto ref = reference_with<mlp>(train_set(), opts);
  // One stage: the micro-batches are gradient accumulation within the step.
  CHECK(relative_distance(train_pipeline<mlp, local_pipeline<1, loom::micro_batches<4>>>(1, train_set(), opts).params[0],
                          ref) <= 1e-5);
  // GPipe with the backwards in forward order (loom::custom_schedule).
  constexpr auto F = loom::forward_of;
  constexpr auto B = loom::backward_of;
  using fifo_gpipe = loom::custom_schedule<loom::stage_actions<F(0), F(1), B(0), B(1)>,
                                           loom::stage_actions<F(0), F(1), B(0), B(1)>>;
  CHECK(relative_distance(
            train_pipeline<mlp, local_pipeline<2, loom::micro_batches<2>, fifo_gpipe>>(2, train_set(), opts).params[0],
            ref) <= 1e-5);
}

namespace {

/// Host memory that claims the host may not write it: a CPU stand-in for GPU memory, so that
/// the trainer takes the path of loom::cuda (batches filled in staging memory and copied over,
/// results read through copies) on any machine.
struct unreachable_memory : loom::host_space {
  static constexpr bool host_accessible = false;
  static void copy_to_host(void* dst, const void* src, std::size_t bytes) {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  static void copy_from_host(void* dst, const void* src, std::size_t bytes) {
    if (bytes) std::memcpy(dst, src, bytes);
  }
};
struct staged_cpu : loom::cpu {
  using memory_space = unreachable_memory;
  using staging_space = loom::host_space;
  static void synchronize() {}
};

/// local_comm saying it moves the stand-in's memory, as nccl_comm moves GPU memory.
class moving_local_comm : public loom::local_comm {
 public:
  static constexpr bool moves_device_memory = true;
  explicit moving_local_comm(const loom::local_comm& c) : loom::local_comm(c) {}
  moving_local_comm split(int colour, int key) { return moving_local_comm(loom::local_comm::split(colour, key)); }
};

template <class Net, class Policy, class Dataset>
std::vector<float> train_staged(int ranks, const Dataset& data, const loom::fit_options& opts) {
  std::vector<std::vector<float>> params(static_cast<std::size_t>(ranks));
  loom::local_world(ranks).run([&](loom::local_comm& c) {
    loom::trainer<Net, loom::softmax_cross_entropy, loom::sgd, Policy, staged_cpu> t{moving_local_comm(c), pipeline_sgd,
                                                                                    {.seed = 1, .threads = 1}};
    t.fit(data, opts);
    params[static_cast<std::size_t>(c.rank())] = t.gather_parameters();
  });
  for (int r = 1; r < ranks; ++r) {
    const bool gathered_alike = params[static_cast<std::size_t>(r)] == params[0];
    REQUIRE(gathered_alike);
  }
  return params[0];
}

}  // namespace

TEST_CASE("On a backend whose memory the host cannot write, the pipeline stages its batches and matches one process",
          "[parallel][pipeline][staged]") {
  static_assert(!staged_cpu::memory_space::host_accessible);
  const auto opts = steps(10, 64);
  const auto ref = reference_with<mlp>(train_set(), opts);
  using P = loom::model_parallel<loom::pipeline<2, loom::micro_batches<4>>, moving_local_comm>;
  CHECK(relative_distance(train_staged<mlp, P>(2, train_set(), opts), ref) <= 1e-5);
  // A batch of 3 on 8 micro-batches: the empty ones' messages go through host memory.
  const auto data = loom::data::fashion_mnist(loom::data::split::train).first(250);
  const auto opts3 = steps(10, 3);
  using P8 = loom::model_parallel<loom::pipeline<3, loom::micro_batches<8>>, moving_local_comm>;
  CHECK(relative_distance(train_staged<mlp, P8>(3, data, opts3), reference_with<mlp>(data, opts3)) <= 1e-5);
  // Two replicas.
  using H = loom::hybrid<loom::data_parallel<moving_local_comm>, loom::pipeline<2, loom::micro_batches<4>>>;
  CHECK(relative_distance(train_staged<mlp, H>(4, train_set(), opts), ref) <= 1e-5);
}
