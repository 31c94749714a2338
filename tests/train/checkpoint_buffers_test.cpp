// SPDX-License-Identifier: Apache-2.0
// Buffers (batch norm's running statistics) through every engine, in one process (ranks as
// threads of a loom::local_world): a run that stops and resumes from a checkpoint ends with
// bitwise the parameters and running statistics of the run that never stopped; a checkpoint
// saved under one policy and world size loads under another with bitwise the same tensors;
// each data-parallel replica keeps running statistics of its own and a checkpoint (and
// save_weights) holds replica 0's; a pipeline's stages each hold their own; tensor slices hold
// them whole; num_batches_tracked is an int64 count in the files.

#include <catch2/catch.hpp>

#include <cstdint>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "loom/comm/local.hpp"
#include "loom/io/checkpoint.hpp"
#include "checkpoint_runs.hpp"
#include "loom/loom.hpp"

namespace {

namespace fs = std::filesystem;

// Batch norm in both stages of a 2-stage pipeline, after a column-parallel layer (whole on
// every slice), with its ReLU fused in.
using net = loom::network<loom::input<784>, loom::linear<64>, loom::batch_norm, loom::relu, loom::linear<32>,
                          loom::batch_norm, loom::relu, loom::linear<10>>;
using tp_net = loom::network<loom::input<784>, loom::column_parallel<loom::linear<64>>, loom::batch_norm, loom::relu,
                             loom::row_parallel<loom::linear<32>>, loom::batch_norm, loom::relu, loom::linear<10>>;

using dp = loom::data_parallel<loom::local_comm>;
using zero = loom::data_parallel<loom::local_comm, loom::shard_optimizer_state>;
using pipeline2 = loom::model_parallel<loom::pipeline<2, loom::micro_batches<2>>, loom::local_comm>;
using tp2 = loom::model_parallel<loom::tensor_parallel<2>, loom::local_comm>;
using hybrid_pipe = loom::hybrid<dp, loom::pipeline<2, loom::micro_batches<2>>>;

const loom::data::fashion_mnist_set& data() {
  static const auto s = loom::data::fashion_mnist(loom::data::split::train).first(600);
  return s;
}

fs::path fresh_dir(const std::string& name) { return loom_test::fresh_dir("loom_checkpoint_buffers_test_", name); }

loom::fit_options options(std::size_t max_steps, const fs::path& dir = {}, std::size_t every = 0) {
  return loom_test::checkpointed_fit(max_steps, 50, dir, every);
}

/// What a run ends with: the whole model's parameters and buffers (rank 0's gathers), and
/// every rank's own buffers.
struct ending {
  std::vector<float> params, buffers;
  std::vector<std::vector<float>> rank_buffers;
};

template <class Net, class Policy, class Body>
ending on_ranks(int ranks, Body&& body) {
  ending out;
  out.rank_buffers.resize(static_cast<std::size_t>(ranks));
  std::mutex m;
  auto one = [&](auto& t) {
    body(t);
    auto p = t.gather_parameters();
    auto b = t.gather_buffers();
    std::vector<float> own(t.engine().local_buffer_count());
    std::copy_n(t.engine().local_buffers(), own.size(), own.begin());
    std::lock_guard<std::mutex> lock(m);
    out.rank_buffers[static_cast<std::size_t>(t.rank())] = std::move(own);
    if (t.rank() == 0) out.params = std::move(p), out.buffers = std::move(b);
  };
  if constexpr (std::is_same_v<Policy, loom::single_process>) {
    loom::trainer<Net, loom::softmax_cross_entropy, loom::sgd> t{{.lr = 0.05f, .momentum = 0.9f}, {.seed = 3, .threads = 1}};
    one(t);
  } else {
    loom::local_world(ranks).run([&](loom::local_comm& c) {
      loom::trainer<Net, loom::softmax_cross_entropy, loom::sgd, Policy> t{c, {.lr = 0.05f, .momentum = 0.9f},
                                                                           {.seed = 3, .threads = 1}};
      one(t);
    });
  }
  return out;
}

/// counts_per_step: the batches a batch norm counts per step (a pipeline's micro-batches).
template <class Net, class Policy>
void check_exact_resume(int ranks, const std::string& name, float counts_per_step = 1) {
  constexpr std::size_t total = 20, stop_at = 13, every = 5;
  const ending whole = on_ranks<Net, Policy>(ranks, [&](auto& t) { t.fit(data(), options(total)); });
  const fs::path dir = fresh_dir(name);
  on_ranks<Net, Policy>(ranks, [&](auto& t) { t.fit(data(), options(stop_at, dir, every)); });
  const ending resumed = on_ranks<Net, Policy>(ranks, [&](auto& t) {
    auto o = options(total, dir, every);
    o.checkpoint.resume = true;
    t.fit(data(), o);
  });
  REQUIRE(whole.buffers.size() == Net::buffer_count);
  CHECK(whole.buffers[2 * 64] == 20.0f * counts_per_step);  // the first batch norm's num_batches_tracked
  CHECK(resumed.params == whole.params);
  CHECK(resumed.buffers == whole.buffers);
  // Replica 0 resumes its own statistics exactly; under data parallelism the others restart
  // from replica 0's (a checkpoint holds one replica's).
  CHECK(resumed.rank_buffers[0] == whole.rank_buffers[0]);
  fs::remove_all(dir);
}

/// Every tensor of a checkpoint's model files, by name, as stored (int64 counts as their bytes).
std::map<std::string, std::vector<float>> contents(const fs::path& step_dir, std::map<std::string, std::string>* dtypes = nullptr) {
  std::map<std::string, std::vector<float>> out;
  for (const auto& e : fs::directory_iterator(step_dir)) {
    if (e.path().extension() != ".safetensors") continue;
    const loom::io::safetensors_file f(e.path());
    for (const auto& t : f.tensors()) {
      std::vector<float> v((t.end - t.begin) / 4);
      f.read(t, v.data());
      out[t.name] = std::move(v);
      if (dtypes) (*dtypes)[t.name] = t.dtype;
    }
  }
  return out;
}

template <class FromNet, class From, class ToNet, class To>
void check_reshard(int from, int to, const std::string& name) {
  const fs::path a = fresh_dir(name + "_a"), b = fresh_dir(name + "_b");
  on_ranks<FromNet, From>(from, [&](auto& t) {
    auto o = options(7, a);
    o.checkpoint.at_end = true;
    t.fit(data(), o);
  });
  on_ranks<ToNet, To>(to, [&](auto& t) {
    t.load(a);
    t.save(b);
  });
  const auto saved_a = loom::io::list_checkpoints(a), saved_b = loom::io::list_checkpoints(b);
  REQUIRE(saved_a.size() == 1);
  REQUIRE(saved_b.size() == 1);
  std::map<std::string, std::string> dtypes;
  const auto ca = contents(saved_a[0].path, &dtypes), cb = contents(saved_b[0].path);
  CHECK(ca.count("1.running_var") == 1);
  CHECK(dtypes["4.num_batches_tracked"] == "I64");
  CHECK(dtypes["1.running_mean"] == "F32");
  const bool same = ca == cb;
  CHECK(same);
  fs::remove_all(a);
  fs::remove_all(b);
}

}  // namespace

TEST_CASE("buffers: exact resume with batch norm, single process and data_parallel", "[checkpoint][batch_norm]") {
  check_exact_resume<net, loom::single_process>(1, "single");
  check_exact_resume<net, dp>(2, "dp");
  check_exact_resume<net, zero>(2, "zero");
}

TEST_CASE("buffers: exact resume with batch norm, pipeline, tensor parallel and hybrid", "[checkpoint][batch_norm]") {
  check_exact_resume<net, pipeline2>(2, "pipe", 2);  // every micro-batch counts
  check_exact_resume<tp_net, tp2>(2, "tp");
  check_exact_resume<net, hybrid_pipe>(4, "hybrid_pipe", 2);
}

TEST_CASE("buffers: each data-parallel replica keeps its own running statistics; files hold replica 0's",
          "[checkpoint][batch_norm]") {
  const fs::path dir = fresh_dir("replicas");
  fs::create_directories(dir);
  const ending e = on_ranks<net, dp>(2, [&](auto& t) {
    t.fit(data(), options(3));
    t.save(dir);
    t.save_weights(dir / "w.safetensors");
  });
  // Different samples, different statistics (unsynchronized batch norm).
  CHECK(e.rank_buffers[0] != e.rank_buffers[1]);
  CHECK(e.buffers == e.rank_buffers[0]);
  const auto w = loom::load_weights_and_buffers<net>(dir / "w.safetensors");
  CHECK(w.buffers == e.rank_buffers[0]);
  CHECK(w.parameters == e.params);
  fs::remove_all(dir);
}

TEST_CASE("buffers: a pipeline's stages hold their own, and save_weights gathers them", "[checkpoint][batch_norm]") {
  const fs::path dir = fresh_dir("stages");
  fs::create_directories(dir);
  const ending e = on_ranks<net, pipeline2>(2, [&](auto& t) {
    t.fit(data(), options(3));
    t.save_weights(dir / "w.safetensors");
  });
  using p = loom::stage_partition<net, loom::pipeline<2, loom::micro_batches<2>>>;
  REQUIRE(e.rank_buffers[0].size() == p::buffer_counts[0]);
  REQUIRE(e.rank_buffers[1].size() == p::buffer_counts[1]);
  CHECK(p::buffer_counts[0] + p::buffer_counts[1] == net::buffer_count);
  std::vector<float> joined = e.rank_buffers[0];
  joined.insert(joined.end(), e.rank_buffers[1].begin(), e.rank_buffers[1].end());
  CHECK(e.buffers == joined);
  const auto w = loom::load_weights_and_buffers<net>(dir / "w.safetensors");
  CHECK(w.buffers == joined);
  // Two micro-batches a step: each moves the running statistics and counts as a batch.
  CHECK(w.buffers[2 * 64] == 6.0f);
  fs::remove_all(dir);
}

TEST_CASE("buffers: resharding data_parallel -> one process, pipeline -> data_parallel, one process -> tensor parallel",
          "[checkpoint][reshard][batch_norm]") {
  check_reshard<net, dp, net, loom::single_process>(2, 1, "dp2_single");
  check_reshard<net, pipeline2, net, dp>(2, 2, "pipe2_dp2");
  check_reshard<net, loom::single_process, tp_net, tp2>(1, 2, "single_tp2");
  check_reshard<tp_net, tp2, net, pipeline2>(2, 2, "tp2_pipe2");
}
