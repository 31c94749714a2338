// SPDX-License-Identifier: Apache-2.0
// trainer_options::label_smoothing through every engine (one process, data parallel and ZeRO, a
// pipeline's last stage, tensor-parallel slices; ranks as threads of a loom::local_world): one
// step and evaluate's loss agree with one process and differ from no smoothing; 0 is bitwise the
// default; out-of-range values and a loss other than softmax_cross_entropy are refused with a
// sentence naming the value; the value is in the job the ranks compare and in checkpoint.json.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <mutex>
#include <string>
#include <vector>

#include "loom/comm/local.hpp"
#include "loom/io/checkpoint.hpp"
#include "loom/loom.hpp"

namespace {

namespace fs = std::filesystem;

using mlp = loom::network<loom::input<784>, loom::linear<32>, loom::relu, loom::linear<16>, loom::relu, loom::linear<10>>;
using tp_mlp = loom::network<loom::input<784>, loom::column_parallel<loom::linear<32>>, loom::relu,
                             loom::row_parallel<loom::linear<16>>, loom::relu, loom::linear<10>>;

using dp = loom::data_parallel<loom::local_comm>;
using zero = loom::data_parallel<loom::local_comm, loom::shard_optimizer_state>;
using pipeline2 = loom::model_parallel<loom::pipeline<2, loom::micro_batches<2>>, loom::local_comm>;
using tp2 = loom::model_parallel<loom::tensor_parallel<2>, loom::local_comm>;

const loom::data::fashion_mnist_set& data() {
  static const auto s = loom::data::fashion_mnist(loom::data::split::train).first(256);
  return s;
}

loom::fit_options steps(std::size_t n) {
  loom::fit_options o;
  o.max_steps = n;
  o.batch = 64;
  o.progress = nullptr;
  return o;
}

struct outcome {
  std::vector<float> params;
  double eval_loss = 0;
};

template <class Net, class Policy>
outcome run(int ranks, float eps) {
  outcome out;
  std::mutex m;
  const loom::trainer_options to{.seed = 9, .threads = 1, .label_smoothing = eps};
  const loom::sgd::options opt{.lr = 0.1f, .momentum = 0.9f};
  auto one = [&](auto& t) {
    t.fit(data(), steps(3));
    const auto e = t.evaluate(data(), 64);
    auto p = t.gather_parameters();
    std::lock_guard<std::mutex> lock(m);
    if (t.rank() == 0) out.params = std::move(p), out.eval_loss = e.loss;
  };
  if constexpr (std::is_same_v<Policy, loom::single_process>) {
    loom::trainer<Net, loom::softmax_cross_entropy, loom::sgd> t{opt, to};
    one(t);
  } else {
    loom::local_world(ranks).run([&](loom::local_comm& c) {
      loom::trainer<Net, loom::softmax_cross_entropy, loom::sgd, Policy> t{c, opt, to};
      one(t);
    });
  }
  return out;
}

double max_difference(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(static_cast<double>(a[i]) - b[i]));
  return d;
}

/// Under Policy, label smoothing changes training and evaluate's loss as in one process.
template <class Net, class Policy>
void check_engine(int ranks) {
  const outcome one_plain = run<Net, loom::single_process>(1, 0.0f);
  const outcome one_smooth = run<Net, loom::single_process>(1, 0.2f);
  const outcome here = run<Net, Policy>(ranks, 0.2f);
  const double effect = max_difference(one_smooth.params, one_plain.params);
  CHECK(effect > 1e-4);
  CHECK(max_difference(here.params, one_smooth.params) < effect / 100);
  CHECK(here.eval_loss == Approx(one_smooth.eval_loss).epsilon(1e-5));
  CHECK(std::abs(one_smooth.eval_loss - one_plain.eval_loss) > 1e-3);
}

}  // namespace

TEST_CASE("loss label_smoothing 0 is bitwise the default trainer", "[loss][label_smoothing]") {
  loom::trainer<mlp, loom::softmax_cross_entropy, loom::sgd> a{{.lr = 0.1f}, {.seed = 9, .threads = 1}};
  loom::trainer<mlp, loom::softmax_cross_entropy, loom::sgd> b{{.lr = 0.1f},
                                                               {.seed = 9, .threads = 1, .label_smoothing = 0.0f}};
  const auto ra = a.fit(data(), steps(3));
  const auto rb = b.fit(data(), steps(3));
  CHECK(a.gather_parameters() == b.gather_parameters());
  CHECK(ra.train_loss == rb.train_loss);
}

TEST_CASE("loss label_smoothing: evaluate's loss is the smoothed loss of the model's logits", "[loss][label_smoothing]") {
  const float eps = 0.1f;
  loom::trainer<mlp, loom::softmax_cross_entropy, loom::sgd> t{{.lr = 0.1f}, {.seed = 9, .threads = 1, .label_smoothing = eps}};
  t.fit(data(), steps(2));
  const auto r = t.evaluate(data(), 256);
  // The same logits through the formula.
  const auto params = t.gather_parameters();
  loom::model<mlp, float> m(1);
  std::copy(params.begin(), params.end(), m.parameters().begin());
  const std::size_t n = data().size();
  std::vector<float> x(n * 784);
  std::vector<std::int32_t> labels(n);
  for (std::size_t i = 0; i < n; ++i) {
    loom::data::detail::write_pixels(data(), i, x.data() + i * 784);
    labels[i] = data().label(i);
  }
  const float* y = m.forward(loom::run_context{.training = false}, x.data(), n);
  double sum = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const float* z = y + i * 10;
    double mx = z[0], s = 0, all = 0;
    for (int j = 1; j < 10; ++j) mx = std::max<double>(mx, z[j]);
    for (int j = 0; j < 10; ++j) s += std::exp(z[j] - mx), all += z[j];
    const double lse = mx + std::log(s);
    const double e = eps;
    sum += (1 - e) * (lse - z[labels[i]]) + e / 10 * (10 * lse - all);
  }
  CHECK(r.loss == Approx(sum / n).epsilon(1e-5));
}

TEST_CASE("loss label_smoothing reaches every engine's loss", "[loss][label_smoothing]") {
  SECTION("data parallel") { check_engine<mlp, dp>(2); }
  SECTION("ZeRO") { check_engine<mlp, zero>(2); }
  SECTION("pipeline") { check_engine<mlp, pipeline2>(2); }
  SECTION("tensor parallel") { check_engine<tp_mlp, tp2>(2); }
}

TEST_CASE("loss label_smoothing out of range or on another loss is refused", "[loss][label_smoothing]") {
  using sce = loom::trainer<mlp, loom::softmax_cross_entropy, loom::sgd>;
  for (float bad : {1.0f, -0.1f, 1.5f, std::numeric_limits<float>::quiet_NaN()}) {
    CAPTURE(bad);
    CHECK_THROWS_AS((sce{{}, {.label_smoothing = bad}}), loom::invalid_argument);
  }
  CHECK_THROWS_WITH((sce{{}, {.label_smoothing = 1.0f}}),
                    Catch::Contains("trainer_options::label_smoothing = 1 is out of range: it must be in [0, 1)"));
  CHECK_THROWS_WITH((sce{{}, {.label_smoothing = -0.1f}}), Catch::Contains("label_smoothing = -0.1 is out of range"));
  using with_mse = loom::trainer<mlp, loom::mse, loom::sgd>;
  CHECK_THROWS_WITH((with_mse{{}, {.label_smoothing = 0.1f}}),
                    Catch::Contains("label_smoothing = 0.1 applies to loom::softmax_cross_entropy only") &&
                        Catch::Contains("loom::mse"));
  CHECK_NOTHROW(with_mse{{}, {.label_smoothing = 0.0f}});
  CHECK_NOTHROW(sce{{}, {.label_smoothing = 0.999f}});
}

TEST_CASE("loss label_smoothing is part of the job the ranks compare, and of checkpoint.json",
          "[loss][label_smoothing][checkpoint]") {
  // Ranks that smooth differently refuse to train together, naming the field.
  std::vector<std::string> caught(2);
  loom::local_world(2).run([&](loom::local_comm& c) {
    const float eps = c.rank() == 0 ? 0.1f : 0.2f;
    try {
      loom::trainer<mlp, loom::softmax_cross_entropy, loom::sgd, dp> t{c, {.lr = 0.1f}, {.label_smoothing = eps}};
      t.fit(data(), steps(1));
    } catch (const std::exception& e) {
      caught[static_cast<std::size_t>(c.rank())] = e.what();
    }
  });
  for (const auto& w : caught) CHECK_THAT(w, Catch::Contains("label_smoothing="));

  const fs::path dir = fs::temp_directory_path() / "loom_label_smoothing_checkpoint";
  fs::remove_all(dir);
  loom::trainer<mlp, loom::softmax_cross_entropy, loom::sgd> t{{.lr = 0.1f}, {.label_smoothing = 0.1f}};
  const fs::path saved = t.save(dir);
  std::ifstream in(saved / "checkpoint.json");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK_THAT(text, Catch::Contains("\"label_smoothing\": 0.1,"));
  const auto rec = loom::io::detail::parse_record(loom::io::json::parse(text), "checkpoint.json");
  CHECK(rec.label_smoothing == Approx(0.1));
  fs::remove_all(dir);
}
