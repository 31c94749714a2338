// SPDX-License-Identifier: Apache-2.0
// Data-parallel training throughput of loom: samples per second of the example's mlp and cnn
// (examples/fashion_mnist) trained with loom::trainer under loom::data_parallel<loom::mpi_comm>
// on the real Fashion-MNIST (memory-mapped: each rank reads only its own samples), SGD lr 0.02
// momentum 0.9, for each (model, global batch) row. Run it under `mpirun -np 1` and `-np 2`:
// the same program, the same global batch, each rank training on its share.
//
// Each row: a fresh trainer (seed 1), warm-up fit() calls for --warmup seconds, then --repeats
// timed fit() calls of the same number of steps (sized from the warm-up to last about
// --seconds), and the median. Every decision that shapes the calls (how long to warm up, how
// many steps) is taken on rank 0 and broadcast, so that all ranks run the same collectives.
// One machine-readable `row:` line per row on stdout (rank 0), with the per-rank figures of
// fit_result::figures summed over the timed runs; `rank:` lines give them per rank, and the
// figures table of the last timed run goes to stderr. benchmarks/data_parallel/torch_ddp.py is
// PyTorch DistributedDataParallel on the same work; run.sh runs both and prints the table.
// --policy adds ZeRO (shard_optimizer_state) and hierarchical_comm (hosts of
// LOOM_HIER_HOST_SIZE consecutive ranks, else by shared memory): benchmarks/zero/policies.sh
// runs them on the multi-host harness.

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include "../common/bench.hpp"
#include "../../examples/common/networks.hpp"
#include "loom/comm/hierarchical.hpp"
#include "loom/comm/mpi.hpp"
#include "loom/data/mapped.hpp"
#include "loom/loom.hpp"

namespace {

using mlp = example::mlp;
using cnn = example::cnn;

// --policy: dp, zero, hier, hier-zero.
using dp = loom::data_parallel<loom::mpi_comm>;
using zero = loom::data_parallel<loom::mpi_comm, loom::shard_optimizer_state>;
using hier = loom::data_parallel<loom::hierarchical_comm>;
using hier_zero = loom::data_parallel<loom::hierarchical_comm, loom::shard_optimizer_state>;
constexpr const char* policy_names[] = {"dp", "zero", "hier", "hier-zero"};

using bench::clock_type;
using bench::cpu_snapshot;
using bench::median;
using bench::since;


struct flags {
  std::vector<std::string> models{"mlp", "cnn"};
  std::vector<std::size_t> batches{64, 128};
  std::vector<std::string> policies{"dp"};
  int threads = 1;
  double seconds = 2.0;
  double warmup = 0.5;
  std::size_t repeats = 5;
  std::size_t deterministic_chunk = 0;
  std::uint64_t seed = 1;
  std::string data = loom::data::default_fashion_mnist_dir;
};

constexpr const char* usage = R"(usage: mpirun -np N bench_data_parallel [flags]
  --model LIST       models, comma-separated: mlp,cnn (default both)
  --batch LIST       global batch sizes, comma-separated (default 64,128)
  --policy LIST      comma-separated: dp (data_parallel<mpi_comm>, the default), zero (with
                     shard_optimizer_state), hier (data_parallel<hierarchical_comm>; hosts of
                     LOOM_HIER_HOST_SIZE consecutive ranks, else by shared memory), hier-zero
  --threads N        compute threads per rank (default 1)
  --seconds X        length of one timed repeat in seconds (default 2)
  --warmup X         seconds of warm-up before the repeats (default 0.5)
  --repeats N        timed repeats per row; the median is reported (default 5)
  --seed N           initialisation and shuffling seed (default 1)
  --deterministic-chunk C
                     split-invariant mode (fit_options::deterministic_chunk): chunks of C samples
                     summed in a fixed tree, exchanged by send/recv (default 0: off)
  --data DIR         Fashion-MNIST IDX files (default /usr/share/datasets/fashion-mnist)
Prints per row on stdout (rank 0):
  row: impl=loom model=M batch=B ranks=N threads=T chunk=C samples_per_s=S (median, all ranks together)
       runs=S1,.. steps=K train_loss=L compute_s=.. comm_s=.. exposed_s=.. wait_s=.. data_s=..
       (rank 0's figures summed over the timed runs) others_cores=O env=.. policy=P
  rank: model=M batch=B rank=R compute_s=.. comm_s=.. exposed_s=.. wait_s=.. data_s=.. samples_per_s=.. policy=P
)";

[[noreturn]] void bad_flag(const std::string& msg) {
  std::cerr << "bench_data_parallel: " << msg << "\n\n" << usage;
  std::exit(2);
}

template <class N>
N number(std::string_view flag, std::string_view text) {
  N v{};
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc{} || p != text.data() + text.size())
    bad_flag("--" + std::string(flag) + " needs a number, got '" + std::string(text) + "'");
  return v;
}

std::vector<std::string> split_list(std::string_view text) {
  std::vector<std::string> out;
  while (!text.empty()) {
    const auto comma = text.find(',');
    if (comma != 0) out.emplace_back(text.substr(0, comma));
    text = comma == std::string_view::npos ? std::string_view{} : text.substr(comma + 1);
  }
  return out;
}

flags parse(int argc, char** argv) {
  flags f;
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a == "--help" || a == "-h") {
      std::cout << usage;
      std::exit(0);
    }
    if (a.substr(0, 2) != "--") bad_flag("unexpected argument '" + std::string(a) + "'");
    std::string_view name = a.substr(2), value;
    if (auto eq = name.find('='); eq != std::string_view::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    } else {
      if (i + 1 >= argc) bad_flag("--" + std::string(name) + " needs a value");
      value = argv[++i];
    }
    if (name == "model") {
      f.models = split_list(value);
      for (const auto& m : f.models)
        if (m != "mlp" && m != "cnn") bad_flag("--model takes mlp and/or cnn, got '" + m + "'");
      if (f.models.empty()) bad_flag("--model needs at least one model");
    } else if (name == "batch") {
      f.batches.clear();
      for (const auto& b : split_list(value)) f.batches.push_back(number<std::size_t>(name, b));
      if (f.batches.empty()) bad_flag("--batch needs at least one size");
      for (std::size_t b : f.batches)
        if (b == 0) bad_flag("--batch sizes must be at least 1");
    } else if (name == "policy") {
      f.policies = split_list(value);
      for (const auto& p : f.policies)
        if (std::find(std::begin(policy_names), std::end(policy_names), p) == std::end(policy_names))
          bad_flag("--policy takes dp, zero, hier and/or hier-zero, got '" + p + "'");
      if (f.policies.empty()) bad_flag("--policy needs at least one policy");
    } else if (name == "threads") f.threads = number<int>(name, value);
    else if (name == "seconds") f.seconds = std::strtod(std::string(value).c_str(), nullptr);
    else if (name == "warmup") f.warmup = std::strtod(std::string(value).c_str(), nullptr);
    else if (name == "repeats") f.repeats = number<std::size_t>(name, value);
    else if (name == "seed") f.seed = number<std::uint64_t>(name, value);
    else if (name == "deterministic-chunk") f.deterministic_chunk = number<std::size_t>(name, value);
    else if (name == "data") f.data = value;
    else bad_flag("unknown flag --" + std::string(name));
  }
  if (!(f.seconds > 0)) bad_flag("--seconds must be > 0");
  if (f.repeats == 0) bad_flag("--repeats must be at least 1");
  if (f.threads < 1) bad_flag("--threads must be at least 1");
  return f;
}

// Variables that tune other libraries' kernels or thread pools; run.sh starts this program
// without them. Their presence is printed, not obeyed.
std::string foreign_env() {
  std::string out;
  for (const char* v : {"OPENBLAS_CORETYPE", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                        "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "GOMP_SPINCOUNT", "OMP_WAIT_POLICY"})
    if (std::getenv(v)) {
      if (!out.empty()) out += ',';
      out += v;
    }
  return out.empty() ? "none" : out;
}

struct row_result {
  double median = 0;
  std::vector<double> runs;
  std::size_t steps = 0;
  double train_loss = 0;
  double others_cores = 0;
  std::vector<loom::rank_figures> figures;  // per rank, summed over the timed runs
  std::vector<loom::rank_figures> last;     // per rank, the last timed run
};

template <class Policy>
typename Policy::comm_type make_comm() {
  if constexpr (std::is_same_v<typename Policy::comm_type, loom::hierarchical_comm>)
    return loom::hierarchical_comm(loom::mpi_comm::world(), loom::hierarchical_options::from_environment());
  else
    return loom::mpi_comm::world();
}

template <class Net, class Policy, class Dataset>
row_result measure(const flags& f, const Dataset& train, std::size_t batch) {
  loom::trainer<Net, loom::softmax_cross_entropy, loom::sgd, Policy> t{
      make_comm<Policy>(), {.lr = 0.02f, .momentum = 0.9f}, {.seed = f.seed, .threads = f.threads}};
  auto& comm = t.engine().comm();
  loom::fit_options fo;
  fo.epochs = std::size_t(1) << 40;  // bounded by max_steps
  fo.batch = batch;
  fo.deterministic_chunk = f.deterministic_chunk;
  fo.progress = nullptr;
  row_result r;
  // Runs exactly n more steps on every rank; returns samples per second of all ranks together
  // over the whole fit() call (loader set-up and batch gathering included), on rank 0's clock.
  auto run_steps = [&](std::size_t n) {
    fo.max_steps = t.steps() + n;
    const auto t0 = clock_type::now();
    const loom::fit_result fr = t.fit(train, fo);
    const double s = since(t0);
    r.train_loss = fr.train_loss;
    r.last = fr.figures;
    return double(fr.samples) / s;
  };
  // Warm-up: chunks of steps, at least two (the first pays one-time set-up), until f.warmup
  // seconds have passed on rank 0; the last chunk's rate (rank 0's) sizes the timed repeats.
  double rate = 0;
  const auto w0 = clock_type::now();
  std::size_t chunk = 4;
  for (int chunks = 0;; ++chunks) {
    int more = chunks < 2 || since(w0) < f.warmup;
    comm.broadcast(&more, 1, 0);
    if (!more) break;
    rate = run_steps(chunk);
    chunk = std::min<std::size_t>(chunk * 2, 256);
  }
  std::uint64_t steps = std::max<std::uint64_t>(5, std::uint64_t(std::llround(f.seconds * rate / double(batch))));
  comm.broadcast(&steps, 1, 0);
  r.steps = steps;
  r.figures.assign(std::size_t(comm.size()), {});
  comm.barrier();
  const cpu_snapshot c0 = cpu_snapshot::now();
  for (std::size_t i = 0; i < f.repeats; ++i) {
    comm.barrier();
    r.runs.push_back(run_steps(r.steps));
    for (std::size_t k = 0; k < r.last.size(); ++k) r.figures[k] = r.figures[k] + r.last[k];
  }
  const cpu_snapshot c1 = cpu_snapshot::now();
  // Cores the rest of the machine kept busy: all CPU time less every rank's own (one host).
  double own = c1.own_s - c0.own_s;
  comm.allreduce(&own, 1, loom::reduce_op::sum);
  r.others_cores = cpu_snapshot::others_cores(c0, c1, own);
  r.median = median(r.runs);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  loom::mpi::environment env{argc, argv};
  const flags f = parse(argc, argv);
  try {
    const int rank = loom::mpi_comm::world().rank();
    if (rank == 0) {
      std::cerr << "bench_data_parallel: " << loom::mpi_comm::world().size() << " rank(s) x " << f.threads
                << " thread(s); foreign tuning variables in the environment: " << foreign_env() << "\n";
      bench::print_cpu_line();
    }
    const auto train = loom::data::mapped_fashion_mnist(f.data, loom::data::split::train);
    for (const auto& model : f.models) {
      for (std::size_t batch : f.batches)
      for (const auto& policy : f.policies) {
        auto run = [&]<class Net>() {
          if (policy == "zero") return measure<Net, zero>(f, train, batch);
          if (policy == "hier") return measure<Net, hier>(f, train, batch);
          if (policy == "hier-zero") return measure<Net, hier_zero>(f, train, batch);
          return measure<Net, dp>(f, train, batch);
        };
        const row_result r = model == "cnn" ? run.template operator()<cnn>() : run.template operator()<mlp>();
        if (rank != 0) continue;
        std::string runs;
        for (double v : r.runs) {
          if (!runs.empty()) runs += ',';
          runs += std::to_string(std::lround(v));
        }
        const loom::rank_figures& g = r.figures[0];
        std::printf("row: impl=loom model=%s batch=%zu ranks=%zu threads=%d chunk=%zu samples_per_s=%.0f runs=%s steps=%zu "
                    "train_loss=%.4f compute_s=%.3f comm_s=%.3f exposed_s=%.3f wait_s=%.3f data_s=%.3f fit_s=%.3f "
                    "others_cores=%.2f env=%s policy=%s\n",
                    model.c_str(), batch, r.figures.size(), f.threads, f.deterministic_chunk, r.median, runs.c_str(), r.steps,
                    r.train_loss,
                    g.compute_s, g.comm_s, g.comm_exposed_s, g.wait_s, g.data_s, g.seconds, r.others_cores,
                    foreign_env().c_str(), policy.c_str());
        for (std::size_t k = 0; k < r.figures.size(); ++k) {
          const loom::rank_figures& q = r.figures[k];
          std::printf("rank: model=%s batch=%zu ranks=%zu rank=%zu compute_s=%.3f comm_s=%.3f exposed_s=%.3f "
                      "wait_s=%.3f data_s=%.3f fit_s=%.3f sent_mb=%.1f samples_per_s=%.0f policy=%s\n",
                      model.c_str(), batch, r.figures.size(), k, q.compute_s, q.comm_s, q.comm_exposed_s, q.wait_s,
                      q.data_s, q.seconds, q.bytes_sent / 1e6, q.samples_per_s(), policy.c_str());
        }
        std::fflush(stdout);
        std::cerr << "bench_data_parallel: " << model << " batch " << batch << ", " << policy << ", "
                  << r.figures.size() << " rank(s), last timed run:\n"
                  << loom::figures_table(r.last);
        if (!std::isfinite(r.train_loss)) {
          std::cerr << "bench_data_parallel: training diverged (loss " << r.train_loss << ")\n";
          loom::mpi_comm::world().abort(1, "training diverged");
        }
      }
    }
  } catch (const loom::error& e) {
    loom::mpi::abort(1, std::string("bench_data_parallel: ") + e.what());
  }
  return 0;
}
