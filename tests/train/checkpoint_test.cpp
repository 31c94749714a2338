// SPDX-License-Identifier: Apache-2.0
// Checkpoints in one process (ranks as threads of a loom::local_world): exact resume for every
// policy — a run that stops between two checkpoints and resumes from the last one ends with
// bitwise the parameters of the run that never stopped, in the middle of an epoch, with
// dropout, gradient accumulation, an lr schedule, SGD and Adam — and resharding: a checkpoint
// saved under one policy and world size loads under another with bitwise the same parameters
// and optimizer state. The multi-process versions (mpirun, kill -9, signals) are in
// tests/examples/checkpoint_*.

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "loom/io/checkpoint.hpp"
#include "loom/comm/local.hpp"
#include "loom/loom.hpp"

namespace {

namespace fs = std::filesystem;

// The same layers whole and split for tensor parallelism (the same checkpoint text), with dropout.
using net = loom::network<loom::input<784>, loom::linear<64>, loom::relu, loom::linear<32>, loom::relu,
                          loom::dropout_rate<20>, loom::linear<10>>;
using tp_net = loom::network<loom::input<784>, loom::column_parallel<loom::linear<64>>, loom::relu,
                             loom::row_parallel<loom::linear<32>>, loom::relu, loom::dropout_rate<20>, loom::linear<10>>;

using dp = loom::data_parallel<loom::local_comm>;
using pipeline2 = loom::model_parallel<loom::pipeline<2, loom::micro_batches<2>>, loom::local_comm>;
using pipeline4 = loom::model_parallel<loom::pipeline<4, loom::micro_batches<2>>, loom::local_comm>;
using tp2 = loom::model_parallel<loom::tensor_parallel<2>, loom::local_comm>;
using hybrid_tp = loom::hybrid<dp, loom::tensor_parallel<2>>;
using hybrid_pipe = loom::hybrid<dp, loom::pipeline<2, loom::micro_batches<2>>>;

const loom::data::fashion_mnist_set& data() {
  // 1,000 images: 16 steps of 64 per epoch (the last one short), so runs cross epochs.
  static const auto s = loom::data::fashion_mnist(loom::data::split::train).first(1000);
  return s;
}

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("loom_checkpoint_test_" + name);
  fs::remove_all(d);
  return d;
}

loom::fit_options options(std::size_t max_steps, const fs::path& dir = {}, std::size_t every = 0) {
  loom::fit_options o;
  o.epochs = 10;
  o.max_steps = max_steps;
  o.batch = 64;
  o.accumulation = 2;
  o.schedule = loom::step_lr{.step_size = 5, .gamma = 0.7f};
  o.progress = nullptr;
  o.checkpoint.directory = dir.string();
  o.checkpoint.every_steps = every;
  o.checkpoint.at_end = false;  // as if killed after the last periodic checkpoint
  o.checkpoint.on_signal = false;
  return o;
}

template <class Optimizer>
typename Optimizer::options optimizer_options() {
  if constexpr (std::is_same_v<Optimizer, loom::adam>) return {.lr = 2e-3f};
  else return {.lr = 0.05f, .momentum = 0.9f};
}

/// Trains Net under Policy on `ranks` ranks (threads), calling body(trainer) on every rank;
/// returns the whole model's parameters (rank 0's gather).
template <class Net, class Policy, class Optimizer, class Body>
std::vector<float> on_ranks(int ranks, Body&& body) {
  std::vector<float> params;
  std::mutex m;
  auto one = [&](auto& t) {
    body(t);
    auto p = t.gather_parameters();
    std::lock_guard<std::mutex> lock(m);
    if (t.rank() == 0) params = std::move(p);
  };
  if constexpr (std::is_same_v<Policy, loom::single_process>) {
    loom::trainer<Net, loom::softmax_cross_entropy, Optimizer> t{optimizer_options<Optimizer>(), {.seed = 3, .threads = 1}};
    one(t);
  } else {
    loom::local_world(ranks).run([&](loom::local_comm& c) {
      loom::trainer<Net, loom::softmax_cross_entropy, Optimizer, Policy> t{c, optimizer_options<Optimizer>(),
                                                                           {.seed = 3, .threads = 1}};
      one(t);
    });
  }
  return params;
}

/// The uninterrupted run of `total` steps against: `stop_at` steps with a checkpoint every
/// `every` (the last one at or before stop_at survives), then a new trainer resuming to total.
template <class Net, class Policy, class Optimizer>
void check_exact_resume(int ranks, const std::string& name) {
  // 8 steps an epoch (16 batches, 2 per step): the last checkpoint before the stop is step 12,
  // in the middle of the second epoch; the run goes on into the fourth.
  constexpr std::size_t total = 27, stop_at = 17, every = 6;
  const auto whole = on_ranks<Net, Policy, Optimizer>(ranks, [&](auto& t) { t.fit(data(), options(total)); });
  const fs::path dir = fresh_dir(name);
  on_ranks<Net, Policy, Optimizer>(ranks, [&](auto& t) { t.fit(data(), options(stop_at, dir, every)); });
  const auto saved = loom::io::list_checkpoints(dir);
  REQUIRE(!saved.empty());
  CHECK(saved.front().step == 12);  // steps 13..17 are lost, as after a kill -9
  std::size_t resumed_from = 0;
  const auto resumed = on_ranks<Net, Policy, Optimizer>(ranks, [&](auto& t) {
    auto o = options(total, dir, every);
    o.checkpoint.resume = true;
    const auto r = t.fit(data(), o);
    if (t.rank() == 0) resumed_from = r.resumed_from_step;
  });
  CHECK(resumed_from == 12);
  REQUIRE(resumed.size() == net::parameter_count);
  const bool bitwise_equal = resumed == whole;
  CHECK(bitwise_equal);
  fs::remove_all(dir);
}

}  // namespace

TEST_CASE("checkpoint: exact resume, single process", "[checkpoint]") {
  check_exact_resume<net, loom::single_process, loom::sgd>(1, "single_sgd");
  check_exact_resume<net, loom::single_process, loom::adam>(1, "single_adam");
}

TEST_CASE("checkpoint: exact resume, data_parallel", "[checkpoint]") {
  check_exact_resume<net, dp, loom::sgd>(2, "dp_sgd");
  check_exact_resume<net, dp, loom::adam>(3, "dp_adam");
}

TEST_CASE("checkpoint: exact resume, pipeline", "[checkpoint]") {
  check_exact_resume<net, pipeline2, loom::sgd>(2, "pipe_sgd");
  check_exact_resume<net, pipeline2, loom::adam>(2, "pipe_adam");
}

TEST_CASE("checkpoint: exact resume, tensor parallel", "[checkpoint]") {
  check_exact_resume<tp_net, tp2, loom::sgd>(2, "tp_sgd");
  check_exact_resume<tp_net, tp2, loom::adam>(2, "tp_adam");
}

TEST_CASE("checkpoint: exact resume, both hybrids", "[checkpoint]") {
  check_exact_resume<tp_net, hybrid_tp, loom::adam>(4, "hybrid_tp");
  check_exact_resume<net, hybrid_pipe, loom::sgd>(4, "hybrid_pipe");
}

namespace {

/// Every tensor of a checkpoint (weights and optimizer state), by name, as stored.
std::map<std::string, std::vector<float>> contents(const fs::path& step_dir) {
  std::map<std::string, std::vector<float>> out;
  for (const auto& e : fs::directory_iterator(step_dir)) {
    if (e.path().extension() != ".safetensors") continue;
    const loom::io::safetensors_file f(e.path());
    for (const auto& t : f.tensors()) {
      std::vector<float> v((t.end - t.begin) / 4);
      f.read(t, v.data());
      out[t.name] = std::move(v);
    }
  }
  return out;
}

/// Saves Net under From on `from` ranks after 11 steps (mid-epoch), loads it under To on `to`
/// ranks and saves again: the two checkpoints hold bitwise the same tensors and state.
template <class FromNet, class From, class ToNet, class To, class Optimizer>
void check_reshard(int from, int to, const std::string& name) {
  const fs::path a = fresh_dir(name + "_a"), b = fresh_dir(name + "_b");
  on_ranks<FromNet, From, Optimizer>(from, [&](auto& t) {
    auto o = options(11, a);
    o.checkpoint.at_end = true;
    t.fit(data(), o);
  });
  const auto saved_a = loom::io::list_checkpoints(a);
  REQUIRE(saved_a.size() == 1);
  std::size_t steps = 0;
  on_ranks<ToNet, To, Optimizer>(to, [&](auto& t) {
    t.load(a);
    steps = t.steps();
    t.save(b);
  });
  CHECK(steps == 11);
  const auto saved_b = loom::io::list_checkpoints(b);
  REQUIRE(saved_b.size() == 1);
  const auto ca = contents(saved_a[0].path), cb = contents(saved_b[0].path);
  CHECK(ca.size() == cb.size());
  CHECK(ca.count("0.weight") == 1);
  bool same = ca == cb;
  CHECK(same);
  fs::remove_all(a);
  fs::remove_all(b);
}

}  // namespace

TEST_CASE("checkpoint: resharding data_parallel 4 -> 2 -> 1", "[checkpoint][reshard]") {
  check_reshard<net, dp, net, dp, loom::adam>(4, 2, "dp4_dp2");
  check_reshard<net, dp, net, loom::single_process, loom::adam>(2, 1, "dp2_single");
}

TEST_CASE("checkpoint: resharding pipeline 2 stages -> data_parallel 2", "[checkpoint][reshard]") {
  check_reshard<net, pipeline2, net, dp, loom::sgd>(2, 2, "pipe2_dp2");
}

TEST_CASE("checkpoint: resharding tensor_parallel 2 -> one process", "[checkpoint][reshard]") {
  check_reshard<tp_net, tp2, net, loom::single_process, loom::adam>(2, 1, "tp2_single");
}

TEST_CASE("checkpoint: resharding one process -> pipeline 4 stages", "[checkpoint][reshard]") {
  check_reshard<net, loom::single_process, net, pipeline4, loom::sgd>(1, 4, "single_pipe4");
}

TEST_CASE("checkpoint: resharding hybrids -> one process", "[checkpoint][reshard]") {
  check_reshard<tp_net, hybrid_tp, net, loom::single_process, loom::adam>(4, 1, "hybrid_tp_single");
  check_reshard<net, hybrid_pipe, net, loom::single_process, loom::sgd>(4, 1, "hybrid_pipe_single");
  check_reshard<net, loom::single_process, tp_net, hybrid_tp, loom::adam>(1, 4, "single_hybrid_tp");
}

TEST_CASE("checkpoint: the files are Hugging Face's sharded safetensors with PyTorch's names", "[checkpoint]") {
  const fs::path dir = fresh_dir("layout");
  on_ranks<net, dp, loom::adam>(2, [&](auto& t) {
    auto o = options(4, dir);
    o.checkpoint.at_end = true;
    t.fit(data(), o);
  });
  const fs::path s = dir / "step-4";
  REQUIRE(fs::is_directory(s));
  CHECK(fs::exists(s / "checkpoint.json"));
  CHECK(fs::exists(s / "model.safetensors.index.json"));
  CHECK(fs::exists(s / "optimizer.safetensors.index.json"));
  CHECK(fs::exists(s / "model-00001-of-00002.safetensors"));
  CHECK(fs::exists(s / "model-00002-of-00002.safetensors"));
  const auto c = contents(s);
  // Sequential's indexes count every entry after input: 0 linear, 1 relu, 2 linear, 3 relu,
  // 4 dropout, 5 linear.
  for (const char* n : {"0.weight", "0.bias", "2.weight", "2.bias", "5.weight", "5.bias", "0.weight.exp_avg",
                        "5.bias.exp_avg_sq"})
    CHECK(c.count(n) == 1);
  CHECK(c.size() == 18);
  // No leftovers of the commit.
  for (const auto& e : fs::directory_iterator(dir)) CHECK(e.path().filename().string().rfind(".step-", 0) != 0);
  for (const auto& e : fs::directory_iterator(s)) CHECK(e.path().filename().string().rfind("rank-", 0) != 0);
  fs::remove_all(dir);
}

TEST_CASE("checkpoint: keep K deletes older ones only after a newer one is committed", "[checkpoint]") {
  const fs::path dir = fresh_dir("keep");
  on_ranks<net, loom::single_process, loom::sgd>(1, [&](auto& t) {
    auto o = options(10, dir, 2);
    o.checkpoint.keep = 2;
    t.fit(data(), o);
  });
  const auto all = loom::io::list_checkpoints(dir);
  REQUIRE(all.size() == 2);
  CHECK(all[0].step == 10);
  CHECK(all[1].step == 8);
  fs::remove_all(dir);
}

TEST_CASE("checkpoint: a completed checkpoint's writing time is known, and the same on every rank", "[checkpoint]") {
  // fit's checkpoint deadline is derived from it (docs/fault-tolerance.md, "The protocol"): 0
  // until a checkpoint completed, then the longest rank's time from its writer's start to its
  // files written (rank 0: to the commit).
  const fs::path dir = fresh_dir("seconds");
  const std::vector<loom::io::tensor_description> tensors{{.name = "w", .shape = {64, 256}, .offset = 0, .count = 16384},
                                                          {.name = "b", .shape = {64}, .offset = 16384, .count = 64}};
  static const loom::shard_piece whole{.whole_offset = 0, .local_offset = 0, .count = 16448};
  std::vector<float> values(16448, 0.5f);
  std::mutex m;
  std::vector<double> before_wait, after_async, after_sync;
  loom::local_world(2).run([&](loom::local_comm& comm) {
    loom::comm_collectives<loom::local_comm> c(comm);
    auto snapshot = [&] {
      loom::io::rank_snapshot s;
      s.map = {.replica = comm.rank(), .replicas = 2, .whole_count = 16448, .local_count = 16448,
               .pieces = std::span<const loom::shard_piece>(&whole, 1)};
      s.params = values;
      return s;
    };
    auto record = [&](std::size_t step) {
      loom::io::trainer_record r;
      r.step = step;
      r.network = "test";
      r.ranks = 2;
      r.replicas = 2;
      r.parameter_count = 16448;
      return r;
    };
    loom::io::checkpointer w;
    w.start(c, dir, tensors, snapshot(), record(1), {}, /*async=*/true, 0, 60);
    const double a = w.last_seconds();
    w.wait(c);
    const double b = w.last_seconds();
    w.start(c, dir, tensors, snapshot(), record(2), {}, /*async=*/false, 0, 60);
    const double s = w.last_seconds();
    std::lock_guard<std::mutex> lock(m);
    before_wait.push_back(a);
    after_async.push_back(b);
    after_sync.push_back(s);
  });
  REQUIRE(before_wait.size() == 2);
  CHECK(before_wait[0] == 0);  // started, not completed
  CHECK(before_wait[1] == 0);
  CHECK(after_async[0] > 0);
  CHECK(after_async[0] == after_async[1]);
  CHECK(after_sync[0] > 0);  // a synchronous checkpoint completes in start
  CHECK(after_sync[0] == after_sync[1]);
  CHECK(fs::is_directory(dir / "step-1"));
  CHECK(fs::is_directory(dir / "step-2"));
  fs::remove_all(dir);
}

TEST_CASE("checkpoint: a resumed fit's rate counts only the samples it trained; checkpoint.json has every optimizer option",
          "[checkpoint]") {
  // 8 steps an epoch of 1,000 samples (16 batches, 2 per step, the last batch 40 samples).
  const fs::path dir = fresh_dir("resumed_rate");
  std::size_t all = 0, first = 0, resumed = 0, resumed_epoch_samples = 0;
  double resumed_rate = 0, resumed_seconds = 0;
  on_ranks<net, loom::single_process, loom::sgd>(1, [&](auto& t) { all = t.fit(data(), options(12)).trained_samples; });
  on_ranks<net, loom::single_process, loom::sgd>(1, [&](auto& t) {
    first = t.fit(data(), options(6, dir, 6)).trained_samples;
  });
  on_ranks<net, loom::single_process, loom::sgd>(1, [&](auto& t) {
    auto o = options(12, dir, 6);
    o.checkpoint.resume = true;
    const auto r = t.fit(data(), o);
    resumed = r.trained_samples;
    resumed_epoch_samples = r.samples;
    resumed_rate = r.samples_per_s();
    resumed_seconds = r.seconds;
  });
  CHECK(all == 12 * 2 * 64 - 24);  // the first epoch's last batch holds 40 samples, not 64
  CHECK(first == 6 * 2 * 64);
  CHECK(resumed == all - first);  // steps 7..12 only
  CHECK(resumed_epoch_samples == 1000 + 4 * 2 * 64);  // the epochs' samples, the resumed part included
  REQUIRE(resumed_seconds > 0);
  CHECK(resumed_rate == Approx(static_cast<double>(resumed) / resumed_seconds));

  const auto saved = loom::io::list_checkpoints(dir);
  REQUIRE(!saved.empty());
  const auto file = saved.front().path / "checkpoint.json";
  std::ifstream in(file);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto rec = loom::io::detail::parse_record(loom::io::json::parse(text), file.string());
  CHECK(rec.optimizer_options == "lr=0.05,momentum=0.9,nesterov=0,weight_decay=0,decay_norm_and_bias=1");
  fs::remove_all(dir);
}
