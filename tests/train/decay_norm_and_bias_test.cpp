// SPDX-License-Identifier: Apache-2.0
// decay_norm_and_bias = false (sgd, adam, adamw, any_optimizer): one optimizer step with weight
// decay leaves the norm layers' parameters and every bias exactly as a step without weight decay
// does, and every other value exactly as a step with it — against two reference runs, under every
// engine (one process, data parallel, ZeRO's sharded step whose slices cut across layers, a
// pipeline's stages and its hybrid with ZeRO, tensor-parallel slices). Ranks are threads of a
// loom::local_world. Also: the table the trainer builds from the network's description, the
// options recorded in checkpoint.json, and a state stepped on its own without the table refused.

#include <catch2/catch.hpp>
#include <unistd.h>

#include <cstddef>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <string>
#include <vector>

#include "loom/comm/local.hpp"
#include "loom/io/checkpoint.hpp"
#include "loom/loom.hpp"

namespace {

namespace fs = std::filesystem;

// conv (bias) + batch_norm + linear (bias): the perception case.
using cnn = loom::network<loom::input<1, 28, 28>, loom::conv2d<4, 3, 2, 1>, loom::batch_norm, loom::relu, loom::flatten,
                          loom::linear<16>, loom::layer_norm, loom::relu, loom::linear<10>>;
// The same roles with tensor-parallel slices (a row-parallel weight is a column block).
using tp_net = loom::network<loom::input<784>, loom::column_parallel<loom::linear<32>>, loom::batch_norm, loom::relu,
                             loom::row_parallel<loom::linear<16>>, loom::layer_norm, loom::relu, loom::linear<10>>;

using dp = loom::data_parallel<loom::local_comm>;
using zero = loom::data_parallel<loom::local_comm, loom::shard_optimizer_state>;
using pipeline2 = loom::model_parallel<loom::pipeline<2, loom::micro_batches<2>>, loom::local_comm>;
using tp2 = loom::model_parallel<loom::tensor_parallel<2>, loom::local_comm>;
using hybrid_pipe_zero = loom::hybrid<zero, loom::pipeline<2, loom::micro_batches<2>>>;

const loom::data::fashion_mnist_set& data() {
  static const auto s = loom::data::fashion_mnist(loom::data::split::train).first(256);
  return s;
}

loom::fit_options one_step() {
  loom::fit_options o;
  o.max_steps = 1;
  o.batch = 64;
  o.progress = nullptr;
  return o;
}

/// A file of this process's that is removed when the process ends.
struct temporary_file {
  fs::path path;
  ~temporary_file() {
    std::error_code ec;
    fs::remove(path, ec);
  }
};

/// Weights to start from in which no bias is 0 and no norm weight 1 (as initialised: decay
/// would not move a zero bias), after two plain steps; one file per network and process (ctest
/// runs test cases as processes side by side), removed at exit.
template <class Net>
fs::path trained_weights() {
  static const temporary_file file = [] {
    const fs::path p = fs::temp_directory_path() / ("loom_decay_norm_and_bias_" + std::to_string(Net::parameter_count) +
                                                    "_" + std::to_string(::getpid()) + ".safetensors");
    loom::trainer<Net, loom::softmax_cross_entropy, loom::sgd> t{{.lr = 0.5f}, {.seed = 4, .threads = 1}};
    auto o = one_step();
    o.max_steps = 2;
    t.fit(data(), o);
    t.save_weights(p);
    return temporary_file{p};
  }();
  return file.path;
}

/// The whole model's parameters after one step of Optimizer with `opt` under Policy on `ranks`,
/// from trained_weights<Net>().
template <class Net, class Optimizer, class Policy>
std::vector<float> after_one_step(int ranks, const typename Optimizer::options& opt) {
  std::vector<float> out;
  std::mutex m;
  const loom::trainer_options to{.seed = 5, .threads = 1};
  const fs::path start = trained_weights<Net>();
  if constexpr (std::is_same_v<Policy, loom::single_process>) {
    loom::trainer<Net, loom::softmax_cross_entropy, Optimizer> t{opt, to};
    t.load_weights(start);
    t.fit(data(), one_step());
    out = t.gather_parameters();
  } else {
    loom::local_world(ranks).run([&](loom::local_comm& c) {
      loom::trainer<Net, loom::softmax_cross_entropy, Optimizer, Policy> t{c, opt, to};
      t.load_weights(start);
      t.fit(data(), one_step());
      auto p = t.gather_parameters();
      std::lock_guard<std::mutex> lock(m);
      if (t.rank() == 0) out = std::move(p);
    });
  }
  REQUIRE(out.size() == Net::parameter_count);
  return out;
}

std::vector<bool> exempt_mask(const std::vector<loom::index_range>& exempt, std::size_t n) {
  std::vector<bool> mask(n, false);
  for (const auto& r : exempt)
    for (std::size_t i = r.begin; i < r.end; ++i) mask[i] = true;
  return mask;
}

/// One step with weight decay and decay_norm_and_bias = false against the two references.
template <class Net, class Optimizer, class Policy>
void check_one_step(int ranks, typename Optimizer::options opt) {
  const auto& exempt = loom::detail::decay_exempt_of_network<Net>();
  const std::vector<bool> mask = exempt_mask(exempt, Net::parameter_count);
  REQUIRE(opt.weight_decay > 0);
  auto plain = opt;
  plain.weight_decay = 0;
  auto skipping = opt;
  skipping.decay_norm_and_bias = false;
  const std::vector<float> decayed = after_one_step<Net, Optimizer, Policy>(ranks, opt);
  const std::vector<float> undecayed = after_one_step<Net, Optimizer, Policy>(ranks, plain);
  const std::vector<float> got = after_one_step<Net, Optimizer, Policy>(ranks, skipping);
  std::size_t wrong_exempt = 0, wrong_decayed = 0, exempt_count = 0, differs = 0, exempt_differs = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (mask[i]) {
      ++exempt_count;
      wrong_exempt += got[i] != undecayed[i];
      exempt_differs += decayed[i] != undecayed[i];
    } else {
      wrong_decayed += got[i] != decayed[i];
      differs += decayed[i] != undecayed[i];
    }
  }
  CHECK(exempt_count > 0);
  // The decay shows on both kinds of values (the check means something): most exempt values,
  // and some in each run of them, would have moved with it (not all: where weight_decay * p is
  // below half an ulp of the gradient, float's sum is the gradient alone).
  CHECK(differs > 0);
  CHECK(2 * exempt_differs >= exempt_count);
  for (const auto& r : exempt) {
    std::size_t moved = 0;
    for (std::size_t i = r.begin; i < r.end; ++i) moved += decayed[i] != undecayed[i];
    CHECK(moved > 0);
  }
  CHECK(wrong_exempt == 0);
  CHECK(wrong_decayed == 0);
}

const loom::sgd::options sgd_opt{.lr = 0.1f, .momentum = 0.9f, .weight_decay = 0.05f};
const loom::adam::options adam_opt{.lr = 0.01f, .weight_decay = 0.05f};
const loom::adamw::options adamw_opt{.lr = 0.01f, .weight_decay = 0.05f};

}  // namespace

TEST_CASE("optim decay_norm_and_bias: the network's norm parameters and biases, from its description",
          "[optim][decay_norm_and_bias]") {
  // cnn: conv weight 4*1*3*3 = 36, bias 4; batch_norm weight 4, bias 4 (offset 40..48); linear
  // 16*784 weight, bias 16; layer_norm 16 + 16; linear 10*16 weight, bias 10.
  const auto& e = loom::detail::decay_exempt_of_network<cnn>();
  const std::size_t lin1 = 48, lin1_bias = lin1 + 16 * 784, ln = lin1_bias + 16, lin2 = ln + 32;
  const std::vector<loom::index_range> want{{36, 48}, {lin1_bias, lin1_bias + 16 + 32}, {lin2 + 160, lin2 + 170}};
  CHECK(e == want);
  CHECK(lin2 + 170 == cnn::parameter_count);

  // The single-process state holds the same (its layout is the network's).
  loom::trainer<cnn, loom::softmax_cross_entropy, loom::sgd> t{{.lr = 0.1f, .weight_decay = 0.01f,
                                                                .decay_norm_and_bias = false}};
  CHECK(t.optimizer().decay_exempt() == want);
  // With the default, nothing is given (and nothing asked).
  loom::trainer<cnn, loom::softmax_cross_entropy, loom::sgd> d{{.lr = 0.1f, .weight_decay = 0.01f}};
  CHECK(d.optimizer().decay_exempt().empty());
}

TEST_CASE("optim decay_norm_and_bias: one step in one process (sgd, adam, adamw, any_optimizer)",
          "[optim][decay_norm_and_bias]") {
  check_one_step<cnn, loom::sgd, loom::single_process>(1, sgd_opt);
  auto nesterov = sgd_opt;
  nesterov.nesterov = true;
  check_one_step<cnn, loom::sgd, loom::single_process>(1, nesterov);
  check_one_step<cnn, loom::adam, loom::single_process>(1, adam_opt);
  check_one_step<cnn, loom::adamw, loom::single_process>(1, adamw_opt);
  // any_optimizer carries the option of the optimizer it holds.
  const auto& exempt = loom::detail::decay_exempt_of_network<cnn>();
  const std::vector<bool> mask = exempt_mask(exempt, cnn::parameter_count);
  auto skipping = sgd_opt;
  skipping.decay_norm_and_bias = false;
  const auto named = after_one_step<cnn, loom::sgd, loom::single_process>(1, skipping);
  const auto any = after_one_step<cnn, loom::any_optimizer, loom::single_process>(1, loom::any_optimizer::options(skipping));
  CHECK(any == named);
  auto adam_skipping = adam_opt;
  adam_skipping.decay_norm_and_bias = false;
  CHECK(after_one_step<cnn, loom::any_optimizer, loom::single_process>(1, loom::any_optimizer::options(adam_skipping)) ==
        after_one_step<cnn, loom::adam, loom::single_process>(1, adam_skipping));
  CHECK(!mask.empty());
}

TEST_CASE("optim decay_norm_and_bias: one step under data parallelism and ZeRO's sharded step",
          "[optim][decay_norm_and_bias][zero]") {
  check_one_step<cnn, loom::sgd, dp>(2, sgd_opt);
  check_one_step<cnn, loom::sgd, zero>(2, sgd_opt);
  check_one_step<cnn, loom::adamw, zero>(3, adamw_opt);
}

TEST_CASE("optim decay_norm_and_bias: one step in a pipeline's stages, and its hybrid with ZeRO",
          "[optim][decay_norm_and_bias][zero]") {
  check_one_step<cnn, loom::sgd, pipeline2>(2, sgd_opt);
  check_one_step<cnn, loom::adam, hybrid_pipe_zero>(4, adam_opt);
}

TEST_CASE("optim decay_norm_and_bias: one step on tensor-parallel slices", "[optim][decay_norm_and_bias]") {
  check_one_step<tp_net, loom::sgd, tp2>(2, sgd_opt);
  check_one_step<tp_net, loom::adam, tp2>(2, adam_opt);
}

TEST_CASE("optim decay_norm_and_bias: recorded in checkpoint.json's optimizer_options", "[optim][checkpoint]") {
  const fs::path dir = fs::temp_directory_path() / "loom_decay_norm_and_bias_checkpoint";
  fs::remove_all(dir);
  loom::trainer<cnn, loom::softmax_cross_entropy, loom::sgd> t{{.lr = 0.1f, .weight_decay = 0.01f,
                                                                .decay_norm_and_bias = false}};
  const fs::path saved = t.save(dir);
  std::ifstream in(saved / "checkpoint.json");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto rec = loom::io::detail::parse_record(loom::io::json::parse(text), "checkpoint.json");
  CHECK(rec.optimizer_options == "lr=0.1,momentum=0,nesterov=0,weight_decay=0.01,decay_norm_and_bias=0");
  CHECK(loom::detail::options_text(loom::adamw::options{.decay_norm_and_bias = false}) ==
        "lr=0.001,beta1=0.9,beta2=0.999,eps=1e-08,weight_decay=0.01,decay_norm_and_bias=0");
  fs::remove_all(dir);
}

TEST_CASE("optim decay_norm_and_bias: a state stepped on its own without the table refuses", "[optim]") {
  std::vector<float> p(8, 1.0f), g(8, 0.5f);
  loom::sgd::state<float, loom::cpu> s({.lr = 0.1f, .weight_decay = 0.1f, .decay_norm_and_bias = false}, 8);
  CHECK_THROWS_AS(s.step(p.data(), g.data(), 8, 0.1f), loom::invalid_argument);
  CHECK_THROWS_WITH(s.step(p.data(), g.data(), 8, 0.1f), Catch::Contains("decay_norm_and_bias = false"));
  // Given the table, it steps: [2, 5) without decay.
  s.set_decay_exempt({{2, 5}});
  s.step(p.data(), g.data(), 8, 0.1f);
  for (std::size_t i = 0; i < 8; ++i) {
    const float want = (i >= 2 && i < 5) ? 1.0f - 0.1f * 0.5f : 1.0f - 0.1f * (0.5f + 0.1f * 1.0f);
    CHECK(p[i] == Approx(want).epsilon(1e-6));
  }
  // Without weight decay there is nothing to skip: no table needed.
  loom::adam::state<float, loom::cpu> a({.lr = 0.1f, .decay_norm_and_bias = false}, 8);
  CHECK_NOTHROW(a.step(p.data(), g.data(), 8, 0.1f));
}
