// SPDX-License-Identifier: Apache-2.0
// The EMA of the weights (trainer_options::ema, loom/train/ema_state.hpp): after k steps it is
// the average a host-side reference computes from the weights after each step (buffers and
// num_batches_tracked included, warm-up copies included); evaluate_ema evaluates it and leaves
// the weights as they were; save_ema_weights writes it under save_weights' names; a checkpoint
// holds it and a resume continues it bitwise, also on another world size; a checkpoint without
// one starts it from the weights with a warning; data-parallel replicas (threads of a
// loom::local_world) keep equal ones, bitwise the single process's in split-invariant mode;
// bad options are refused. (The same under mpirun: ema_mpi_test.cpp.)

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "loom/comm/local.hpp"
#include "checkpoint_runs.hpp"
#include "loom/loom.hpp"

namespace {

namespace fs = std::filesystem;

// Batch norm (running mean, var and num_batches_tracked) between two linear layers.
using bn_net = loom::network<loom::input<784>, loom::linear<32>, loom::batch_norm, loom::relu, loom::linear<10>>;
using plain_net = loom::network<loom::input<784>, loom::linear<32>, loom::relu, loom::linear<10>>;

using dp = loom::data_parallel<loom::local_comm>;
using zero = loom::data_parallel<loom::local_comm, loom::shard_optimizer_state>;

const loom::data::fashion_mnist_set& data() {
  static const auto s = loom::data::fashion_mnist(loom::data::split::train).first(400);
  return s;
}
const loom::data::fashion_mnist_set& held_out() {
  static const auto s = loom::data::fashion_mnist(loom::data::split::test).first(200);
  return s;
}

fs::path fresh_dir(const std::string& name) { return loom_test::fresh_dir("loom_ema_test_", name); }

loom::fit_options options(std::size_t max_steps, const fs::path& dir = {}, std::size_t every = 0) {
  return loom_test::checkpointed_fit(max_steps, 50, dir, every);
}

loom::trainer_options with_ema(loom::ema_options e) { return {.seed = 3, .threads = 1, .ema = e}; }

template <class Net, class Policy = loom::single_process>
using sgd_trainer = loom::trainer<Net, loom::softmax_cross_entropy, loom::sgd, Policy>;
const loom::sgd::options sgd_opt{.lr = 0.05f, .momentum = 0.9f};

/// The weights (parameters, then buffers) of a fresh single-process run after `steps` steps.
template <class Net>
std::vector<float> weights_after(std::size_t steps, std::size_t chunk = 0) {
  sgd_trainer<Net> t{sgd_opt, {.seed = 3, .threads = 1}};
  auto o = options(steps);
  o.deterministic_chunk = chunk;
  t.fit(data(), o);
  std::vector<float> w = t.gather_parameters();
  const std::vector<float> b = t.gather_buffers();
  w.insert(w.end(), b.begin(), b.end());
  return w;
}

/// The host-side reference: torchvision's update (the first copies; decay * ema + (1 - decay)
/// * w in float; an int64 count truncated) after steps 1, 1 + every, ..., up to `steps`.
template <class Net>
std::vector<float> reference(const loom::ema_options& e, std::size_t steps, const std::vector<std::size_t>& counts = {},
                             std::size_t chunk = 0) {
  std::vector<float> ema;
  std::size_t n = 0;
  const float d = static_cast<float>(e.decay), c = static_cast<float>(1.0 - e.decay);
  for (std::size_t s = 1; s <= steps; s += e.every) {
    const std::vector<float> w = weights_after<Net>(s, chunk);
    if (n == 0) {
      ema = w;
    } else {
      for (std::size_t i = 0; i < w.size(); ++i) {
        const float a = d * ema[i];
        const float b = c * w[i];
        ema[i] = a + b;
      }
      for (std::size_t i : counts) ema[i] = std::trunc(ema[i]);
    }
    ++n;
    if (s <= e.warmup_steps) n = 0;
  }
  return ema;
}

/// The first batch norm's num_batches_tracked, in the flat parameters-then-buffers layout.
std::vector<std::size_t> bn_counts() { return {bn_net::parameter_count + 2 * 32}; }

std::vector<float> file_weights(const fs::path& p) {
  const auto w = loom::io::load_weights_and_buffers<bn_net, float>(p);
  std::vector<float> v = w.parameters;
  v.insert(v.end(), w.buffers.begin(), w.buffers.end());
  return v;
}

}  // namespace

TEST_CASE("ema: after k steps it is the reference computed from the weights after each step, buffers included",
          "[ema]") {
  const loom::ema_options e{.decay = 0.8, .every = 2};
  constexpr std::size_t steps = 7;  // updates after steps 1 (a copy), 3, 5 and 7
  sgd_trainer<bn_net> t{sgd_opt, with_ema(e)};
  CHECK_FALSE(t.has_ema());
  t.fit(data(), options(steps));
  REQUIRE(t.has_ema());
  const std::vector<float> want = reference<bn_net>(e, steps, bn_counts());
  REQUIRE(t.ema_values().size() == bn_net::parameter_count + bn_net::buffer_count);
  CHECK(t.ema_values() == want);
  // The buffers are averaged: the running variance's EMA is neither the last running variance
  // nor the first copy's; the count is an integer.
  const std::vector<float> now = t.gather_buffers();
  const std::size_t var = bn_net::parameter_count + 32;
  CHECK(t.ema_values()[var] != now[32]);
  CHECK(t.ema_values()[var] != weights_after<bn_net>(1)[var]);
  CHECK(t.ema_values()[bn_counts()[0]] == std::trunc(t.ema_values()[bn_counts()[0]]));
  // save_ema_weights: save_weights' file, with the EMA in it.
  const fs::path dir = fresh_dir("save");
  fs::create_directories(dir);
  t.save_ema_weights(dir / "ema.safetensors");
  t.save_weights(dir / "weights.safetensors");
  CHECK(file_weights(dir / "ema.safetensors") == want);
  std::vector<float> w = t.gather_parameters();
  w.insert(w.end(), now.begin(), now.end());
  CHECK(file_weights(dir / "weights.safetensors") == w);
  fs::remove_all(dir);
}

TEST_CASE("ema: warm-up steps copy the weights, and the first update after them too", "[ema]") {
  const loom::ema_options e{.decay = 0.5, .every = 1, .warmup_steps = 3};
  sgd_trainer<bn_net> t{sgd_opt, with_ema(e)};
  t.fit(data(), options(3));
  CHECK(t.ema_values() == weights_after<bn_net>(3));
  sgd_trainer<bn_net> u{sgd_opt, with_ema(e)};
  u.fit(data(), options(4));
  CHECK(u.ema_values() == weights_after<bn_net>(4));  // the first update after the warm-up copies
  sgd_trainer<bn_net> v{sgd_opt, with_ema(e)};
  v.fit(data(), options(6));
  const std::vector<float> want = reference<bn_net>(e, 6, bn_counts());
  CHECK(v.ema_values() == want);
  CHECK(want != weights_after<bn_net>(6));
}

TEST_CASE("ema: evaluate_ema evaluates the EMA and leaves the weights as they were", "[ema]") {
  sgd_trainer<bn_net> t{sgd_opt, with_ema({.decay = 0.9})};
  CHECK_THROWS_WITH(t.evaluate_ema(held_out()), Catch::Contains("no EMA of the weights yet"));
  t.fit(data(), options(8));
  const std::vector<float> p = t.gather_parameters(), b = t.gather_buffers();
  const loom::eval_result plain = t.evaluate(held_out());
  const loom::eval_result ema = t.evaluate_ema(held_out());
  CHECK(ema.samples == plain.samples);
  CHECK(ema.loss != plain.loss);
  CHECK(t.gather_parameters() == p);
  CHECK(t.gather_buffers() == b);
  CHECK(t.evaluate(held_out()).loss == plain.loss);
  // Evaluating the EMA is evaluating its weights.
  const fs::path dir = fresh_dir("eval");
  fs::create_directories(dir);
  t.save_ema_weights(dir / "ema.safetensors");
  sgd_trainer<bn_net> u{sgd_opt, {.seed = 3, .threads = 1}};
  u.load_weights(dir / "ema.safetensors");
  CHECK(u.evaluate(held_out()).loss == ema.loss);
  fs::remove_all(dir);
}

TEST_CASE("ema: without it, has_ema is false and evaluate_ema and save_ema_weights refuse", "[ema]") {
  sgd_trainer<bn_net> t{sgd_opt, {.seed = 3, .threads = 1}};
  t.fit(data(), options(2));
  CHECK_FALSE(t.has_ema());
  CHECK(t.ema_values().empty());
  CHECK_THROWS_AS(t.evaluate_ema(held_out()), loom::invalid_argument);
  CHECK_THROWS_WITH(t.save_ema_weights(fresh_dir("none") / "x.safetensors"), Catch::Contains("keeps no EMA"));
}

TEST_CASE("ema: bad options are refused with a sentence", "[ema]") {
  using t = sgd_trainer<bn_net>;
  CHECK_THROWS_WITH(t(sgd_opt, with_ema({.decay = 1.0})), Catch::Contains("decay must be in [0, 1)"));
  CHECK_THROWS_WITH(t(sgd_opt, with_ema({.decay = -0.1})), Catch::Contains("decay must be in [0, 1)"));
  CHECK_THROWS_WITH(t(sgd_opt, with_ema({.decay = std::nan("")})), Catch::Contains("decay must be in [0, 1)"));
  CHECK_THROWS_WITH(t(sgd_opt, with_ema({.decay = 0.9, .every = 0})), Catch::Contains("every must be at least 1"));
  CHECK_THROWS_AS(t(sgd_opt, with_ema({.decay = 0, .every = 0})), loom::invalid_argument);
  CHECK_NOTHROW(t(sgd_opt, with_ema({.decay = 0.999, .every = 32})));
  // Pipelines and tensor parallelism: not yet.
  using pipe = loom::model_parallel<loom::pipeline<2, loom::micro_batches<2>>, loom::local_comm>;
  loom::local_world(2).run([&](loom::local_comm& c) {
    CHECK_THROWS_WITH((sgd_trainer<plain_net, pipe>{c, sgd_opt, with_ema({.decay = 0.9})}),
                      Catch::Contains("not yet under"));
  });
}

TEST_CASE("ema: ema_options::torchvision adjusts the decay as torchvision's train.py", "[ema]") {
  // --model-ema-decay 0.99998 --model-ema-steps 32, batch 32 on 8 GPUs, 600 epochs.
  const loom::ema_options e = loom::ema_options::torchvision(0.99998, 256, 32, 600);
  CHECK(e.every == 32);
  CHECK(e.decay == Approx(1.0 - (1.0 - 0.99998) * 256 * 32 / 600).epsilon(1e-12));
  CHECK(loom::ema_options::torchvision(0.9, 1024, 32, 1).decay == 0.0);  // alpha clipped to 1
  CHECK_THROWS_AS(loom::ema_options::torchvision(0.9, 1, 1, 0), loom::invalid_argument);
}

TEST_CASE("ema: a checkpoint holds it, and a resume continues it bitwise", "[ema][checkpoint]") {
  const loom::ema_options e{.decay = 0.7, .every = 3};  // updates after 1, 4, 7, 10
  constexpr std::size_t total = 11;
  sgd_trainer<bn_net> whole{sgd_opt, with_ema(e)};
  whole.fit(data(), options(total));
  // The checkpoint at an update's step (which must hold that update), and between two.
  for (const std::size_t stop_at : {4u, 5u}) {
    const fs::path dir = fresh_dir("resume_" + std::to_string(stop_at));
    {
      sgd_trainer<bn_net> first{sgd_opt, with_ema(e)};
      first.fit(data(), options(stop_at, dir, stop_at));
    }
    const fs::path step = dir / ("step-" + std::to_string(stop_at));
    CHECK(fs::exists(step / "ema.safetensors.index.json"));
    CHECK(fs::exists(step / "ema-00001-of-00001.safetensors"));
    sgd_trainer<bn_net> resumed{sgd_opt, with_ema(e)};
    auto o = options(total, dir, stop_at);
    std::ostringstream warnings;
    o.warnings = &warnings;
    o.checkpoint.resume = true;
    const loom::fit_result r = resumed.fit(data(), o);
    CHECK(r.resumed_from_step == stop_at);
    CHECK(warnings.str().empty());
    CHECK(resumed.ema_values() == whole.ema_values());
    CHECK(resumed.gather_parameters() == whole.gather_parameters());
    // trainer::load takes it too.
    sgd_trainer<bn_net> loaded{sgd_opt, with_ema(e)};
    loaded.load(step);
    REQUIRE(loaded.has_ema());
    sgd_trainer<bn_net> at_stop{sgd_opt, with_ema(e)};
    at_stop.fit(data(), options(stop_at));
    CHECK(loaded.ema_values() == at_stop.ema_values());
    // A trainer without an EMA loads the checkpoint and leaves its EMA unread.
    sgd_trainer<bn_net> plain{sgd_opt, {.seed = 3, .threads = 1}};
    plain.load(step);
    CHECK_FALSE(plain.has_ema());
    fs::remove_all(dir);
  }
}

TEST_CASE("ema: a checkpoint without one, resumed with it, starts it from the weights with a warning",
          "[ema][checkpoint]") {
  const fs::path dir = fresh_dir("no_ema");
  std::vector<float> w4;
  {
    sgd_trainer<bn_net> first{sgd_opt, {.seed = 3, .threads = 1}};
    first.fit(data(), options(4, dir, 4));
    w4 = first.gather_parameters();
    const auto b = first.gather_buffers();
    w4.insert(w4.end(), b.begin(), b.end());
    CHECK_FALSE(fs::exists(dir / "step-4" / "ema.safetensors.index.json"));
  }
  sgd_trainer<bn_net> t{sgd_opt, with_ema({.decay = 0.6, .every = 1})};
  auto o = options(5, dir);
  std::ostringstream warnings;
  o.warnings = &warnings;
  o.checkpoint.resume = true;
  t.fit(data(), o);
  CHECK_THAT(warnings.str(), Catch::Contains("holds no EMA of the weights") && Catch::Contains("starts from its weights"));
  std::vector<float> w5 = t.gather_parameters();
  const auto b5 = t.gather_buffers();
  w5.insert(w5.end(), b5.begin(), b5.end());
  std::vector<float> want(w4.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    const float a = 0.6f * w4[i];
    const float b = static_cast<float>(1.0 - 0.6) * w5[i];
    want[i] = a + b;
  }
  want[bn_counts()[0]] = std::trunc(want[bn_counts()[0]]);
  CHECK(t.ema_values() == want);
  fs::remove_all(dir);
}

namespace {
/// Every rank's EMA of a run of Policy on `ranks` threads.
template <class Policy>
std::vector<std::vector<float>> ema_on_ranks(int ranks, const loom::ema_options& e, const loom::fit_options& o) {
  std::vector<std::vector<float>> out(static_cast<std::size_t>(ranks));
  std::mutex m;
  loom::local_world(ranks).run([&](loom::local_comm& c) {
    sgd_trainer<plain_net, Policy> t{c, sgd_opt, with_ema(e)};
    t.fit(data(), o);
    std::lock_guard<std::mutex> lock(m);
    out[static_cast<std::size_t>(t.rank())] = t.ema_values();
  });
  return out;
}
}  // namespace

TEST_CASE("ema: data-parallel replicas keep equal ones, the single process's in split-invariant mode, and under ZeRO",
          "[ema][data_parallel]") {
  const loom::ema_options e{.decay = 0.75, .every = 2};
  constexpr std::size_t steps = 6;
  auto o = options(steps);
  o.deterministic_chunk = 25;
  sgd_trainer<plain_net> alone{sgd_opt, with_ema(e)};
  alone.fit(data(), o);
  CHECK(alone.ema_values() == reference<plain_net>(e, steps, {}, 25));
  for (const auto& v : ema_on_ranks<dp>(2, e, o)) CHECK(v == alone.ema_values());
  auto oz = o;
  oz.deterministic_chunk = 0;  // (ZeRO: the replicas alike, after its gathers)
  const auto z = ema_on_ranks<zero>(2, e, oz);
  CHECK(z[0] == z[1]);
}

TEST_CASE("ema: a checkpoint of 2 replicas resumes on 3 and on one process bitwise", "[ema][checkpoint][reshard]") {
  const loom::ema_options e{.decay = 0.7, .every = 3};
  constexpr std::size_t total = 10, stop_at = 5;
  auto o = options(total);
  o.deterministic_chunk = 10;
  sgd_trainer<plain_net> whole{sgd_opt, with_ema(e)};
  whole.fit(data(), o);
  const fs::path dir = fresh_dir("reshard");
  auto first = options(stop_at, dir, stop_at);
  first.deterministic_chunk = 10;
  ema_on_ranks<dp>(2, e, first);
  auto again = options(total, dir);
  again.deterministic_chunk = 10;
  again.checkpoint.resume = true;
  for (const auto& v : ema_on_ranks<dp>(3, e, again)) CHECK(v == whole.ema_values());
  sgd_trainer<plain_net> alone{sgd_opt, with_ema(e)};
  alone.fit(data(), again);
  CHECK(alone.ema_values() == whole.ema_values());
  fs::remove_all(dir);
}
