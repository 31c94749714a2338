// SPDX-License-Identifier: Apache-2.0
// Training throughput of loom on the real Fashion-MNIST: samples per second of the example's
// mlp and cnn (the same networks as examples/fashion_mnist) trained with SGD (lr 0.02, momentum
// 0.9) through loom::trainer::fit, for each (model, batch, threads, math) row — math: fp32, or
// bf16 (trainer_options::math: bf16 products, fp32 accumulation and master weights). Each row: a warm-up,
// then `--repeats` timed runs of a fixed number of steps (sized to last about `--seconds`),
// and the median. The same run measures the ceilings on the same thread count: for the mlp
// oneDNN's sgemm (256 x 784 x 256), for the cnn oneDNN's own rate on the cnn's convolutions
// (forward, backward data and weights, in the layouts oneDNN prefers) at the row's batch. One
// machine-readable `row:` line per row on stdout, one `ceiling:` line per ceiling, and a `cpu:`
// line first; notes go to stderr. benchmarks/train_throughput/torch_peer.py is the PyTorch
// side with the same rows and method; run.sh runs both and prints the table.

#include <dnnl.hpp>  // the ceilings run oneDNN directly (loom's headers do not bring it)
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../common/fit_rate.hpp"
#include "../../examples/common/networks.hpp"
#include "loom/loom.hpp"

namespace {

using mlp = example::mlp;
using cnn = example::cnn;

// FLOP of one training step per sample, counting the matrix products and convolutions only
// (2 per multiply-add): forward, the weight gradient (as much again) and the input gradient
// (as much again, except for the first layer, whose input needs none).
template <class Net, std::size_t First, std::size_t... Rest>
constexpr double train_flops_per_sample() {
  const double first = Net::layer_flops[First];
  const double rest = (0.0 + ... + Net::layer_flops[Rest]);
  return 3 * (first + rest) - first;
}
constexpr double mlp_flops = train_flops_per_sample<mlp, 0, 2, 4>();     // linear layers
constexpr double cnn_flops = train_flops_per_sample<cnn, 0, 3, 7, 9>();  // conv, conv, linear, linear
static_assert(mlp_flops > 1.00e6 && mlp_flops < 1.01e6, "mlp: 1.007 MFLOP per sample and step");
static_assert(cnn_flops > 24.9e6 && cnn_flops < 25.1e6, "cnn: 25.0 MFLOP per sample and step");

using bench::clock_type;
using bench::cpu_snapshot;
using bench::median;
using bench::since;


struct flags {
  std::vector<std::string> models{"mlp", "cnn"};
  std::vector<std::size_t> batches{64, 256};
  std::vector<int> threads{1, 2};
  std::vector<loom::math_mode> maths{loom::math_mode::fp32};
  double seconds = 2.0;  // per timed repeat
  double warmup = 0.5;   // seconds of warm-up steps per row
  std::size_t repeats = 3;
  std::uint64_t seed = 1;
  bool ceiling = true;
  bool ceiling_only = false;
  std::string data = loom::data::default_fashion_mnist_dir;
};

constexpr const char* usage = R"(usage: bench_train_throughput [flags]
  --model LIST       models, comma-separated: mlp,cnn (default both)
  --batch LIST       batch sizes, comma-separated (default 64,256)
  --threads LIST     thread counts, comma-separated (default 1,2)
  --math LIST        precision of products and convolutions: fp32 and/or bf16 (default fp32)
  --seconds X        length of one timed repeat in seconds (default 2)
  --warmup X         seconds of warm-up steps before the repeats (default 0.5)
  --repeats N        timed repeats per row; the median is reported (default 3)
  --seed N           initialisation and shuffling seed (default 1)
  --no-ceiling       do not measure the ceilings (oneDNN sgemm, and convolutions for the cnn)
  --ceiling-only     only measure the ceilings for each thread count (and batch, for the cnn)
  --data DIR         Fashion-MNIST IDX files (default /usr/share/datasets/fashion-mnist)
Prints per row on stdout:
  row: impl=loom model=M batch=B threads=T math=fp32|bf16 samples_per_s=S (median) runs=S1,S2,.. steps=N
       mflop_per_sample=F gflops=G ceiling_gflops=C ceiling_what=oneDNN_sgemm|oneDNN_conv
       ceiling_fraction=G/C cpu_ceiling_fraction=(the same per second of this process's CPU time)
       nominal_fraction=G/(160*T)
       train_loss=L others_cores=O (CPU cores other processes used during the timed runs)
per thread count `ceiling: threads=T gflops=C cpu_gflops=C' shape=256x784x256 what=oneDNN_sgemm`,
per thread count and batch with the cnn `ceiling: ... shape=cnn_convs_batchB what=oneDNN_conv`,
and first `cpu: impl=loom <model>; <vector ISA>; oneDNN <ISA>; bf16 math yes|no`.
)";

[[noreturn]] void bad_flag(const std::string& msg) {
  std::cerr << "bench_train_throughput: " << msg << "\n\n" << usage;
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

template <class N>
std::vector<N> number_list(std::string_view flag, std::string_view text) {
  std::vector<N> out;
  while (!text.empty()) {
    const auto comma = text.find(',');
    out.push_back(number<N>(flag, text.substr(0, comma)));
    text = comma == std::string_view::npos ? std::string_view{} : text.substr(comma + 1);
  }
  if (out.empty()) bad_flag("--" + std::string(flag) + " needs at least one value");
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
    if (a == "--no-ceiling") {
      f.ceiling = false;
      continue;
    }
    if (a == "--ceiling-only") {
      f.ceiling_only = true;
      continue;
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
      f.models.clear();
      std::string_view t = value;
      while (!t.empty()) {
        const auto comma = t.find(',');
        std::string m(t.substr(0, comma));
        if (m != "mlp" && m != "cnn") bad_flag("--model takes mlp and/or cnn, got '" + m + "'");
        f.models.push_back(m);
        t = comma == std::string_view::npos ? std::string_view{} : t.substr(comma + 1);
      }
    } else if (name == "math") {
      f.maths.clear();
      std::string_view t = value;
      while (!t.empty()) {
        const auto comma = t.find(',');
        const std::string m(t.substr(0, comma));
        if (m == "fp32") f.maths.push_back(loom::math_mode::fp32);
        else if (m == "bf16") f.maths.push_back(loom::math_mode::bf16);
        else bad_flag("--math takes fp32 and/or bf16, got '" + m + "'");
        t = comma == std::string_view::npos ? std::string_view{} : t.substr(comma + 1);
      }
      if (f.maths.empty()) bad_flag("--math needs at least one of fp32, bf16");
    } else if (name == "batch") f.batches = number_list<std::size_t>(name, value);
    else if (name == "threads") f.threads = number_list<int>(name, value);
    else if (name == "seconds") f.seconds = number<double>(name, value);
    else if (name == "warmup") f.warmup = number<double>(name, value);
    else if (name == "repeats") f.repeats = number<std::size_t>(name, value);
    else if (name == "seed") f.seed = number<std::uint64_t>(name, value);
    else if (name == "data") f.data = value;
    else bad_flag("unknown flag --" + std::string(name));
  }
  if (f.models.empty()) bad_flag("--model needs at least one model");
  for (auto b : f.batches)
    if (b == 0) bad_flag("--batch values must be at least 1");
  for (auto t : f.threads)
    if (t <= 0) bad_flag("--threads values must be at least 1");
  if (!(f.seconds > 0)) bad_flag("--seconds must be > 0");
  if (f.repeats == 0) bad_flag("--repeats must be at least 1");
  return f;
}

// A ceiling: median GFLOP/s of `run` (flop per call) on the current thread count, 3 runs of
// ~0.3 s each after `warmup` calls; per second of wall time and per second of this process's CPU
// time (which a busy machine does not dilute at 1 thread: a preempted thread uses none).
struct ceiling_rate {
  double gflops = 0, cpu_gflops = 0;
};
template <class Run>
ceiling_rate rate_gflops(double flop, int warmup, Run run) {
  for (int i = 0; i < warmup; ++i) run();
  std::vector<double> rates, cpu_rates;
  for (int r = 0; r < 3; ++r) {
    std::size_t calls = 0;
    const auto c0 = cpu_snapshot::now();
    double s = 0;
    do {
      for (int i = 0; i < 10; ++i) run();
      calls += 10;
      s = since(c0.at);
    } while (s < 0.3);
    const double cpu_s = cpu_snapshot::now().own_s - c0.own_s;
    rates.push_back(flop * double(calls) / s / 1e9);
    cpu_rates.push_back(cpu_s > 0 ? flop * double(calls) / cpu_s / 1e9 : 0.0);
  }
  return {median(rates), median(cpu_rates)};
}

// The mlp's ceiling: oneDNN's sgemm on a representative training GEMM (batch 256, 784 -> 256,
// the mlp's first layer).
ceiling_rate sgemm_ceiling(std::size_t m = 256, std::size_t k = 784, std::size_t n = 256) {
  std::vector<float> a(m * k), b(k * n), c(m * n);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = float((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = float((i * 40503u) % 1000) / 1000.0f - 0.5f;
  return rate_gflops(2.0 * double(m) * double(n) * double(k), 20, [&] {
    const auto st = dnnl_sgemm('N', 'N', dnnl_dim_t(m), dnnl_dim_t(n), dnnl_dim_t(k), 1.0f, a.data(), dnnl_dim_t(k),
                               b.data(), dnnl_dim_t(n), 0.0f, c.data(), dnnl_dim_t(n));
    if (st != dnnl_success) {
      std::cerr << "bench_train_throughput: dnnl_sgemm failed (status " << int(st) << ")\n";
      std::exit(1);
    }
  });
}

// The cnn's convolutions (examples/common/networks.hpp): 3x3, stride 1, padding 1.
struct conv_shape {
  int c, h, w, oc;
};
constexpr conv_shape cnn_convs[] = {{1, 28, 28, 32}, {32, 14, 14, 64}};
static_assert(cnn::layer_flops[0] == 2.0 * 32 * 28 * 28 * 1 * 9 && cnn::layer_flops[3] == 2.0 * 64 * 14 * 14 * 32 * 9,
              "cnn_convs are the cnn's conv2d layers 0 and 3");

// The cnn's ceiling: oneDNN's own rate on the cnn's convolutions at `batch` — forward, backward
// weights (with bias) and, except for the first layer (whose input needs no gradient, as in
// cnn_flops), backward data — each primitive on the layouts it prefers (format any, no reorders
// timed), direct algorithm as in loom::cpu, fp32. Counts the convolutions' FLOP only.
ceiling_rate conv_ceiling(std::size_t batch) {
  using dims = dnnl::memory::dims;
  using tag = dnnl::memory::format_tag;
  const auto f32 = dnnl::memory::data_type::f32;
  const auto direct = dnnl::algorithm::convolution_direct;
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(eng);
  const auto n = static_cast<dnnl::memory::dim>(batch);
  const dims strides{1, 1}, pad{1, 1};
  // A memory of desc d, filled with small values (no denormals, no zeros).
  auto filled = [&](const dnnl::memory::desc& d) {
    dnnl::memory m(d, eng);
    auto* p = static_cast<float*>(m.get_data_handle());
    for (std::size_t i = 0; i < d.get_size() / sizeof(float); ++i) p[i] = float((i * 40503u) % 1000) / 1000.0f - 0.5f;
    return m;
  };
  std::vector<std::pair<dnnl::primitive, std::unordered_map<int, dnnl::memory>>> steps;
  double flop = 0;
  for (std::size_t l = 0; l < std::size(cnn_convs); ++l) {
    const auto& g = cnn_convs[l];
    const dnnl::memory::desc src({n, g.c, g.h, g.w}, f32, tag::any), w({g.oc, g.c, 3, 3}, f32, tag::any),
        b({g.oc}, f32, tag::x), dst({n, g.oc, g.h, g.w}, f32, tag::any);
    const dnnl::convolution_forward::primitive_desc fwd(
        dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, direct, src, w, b, dst, strides, pad, pad),
        eng);
    steps.push_back({dnnl::convolution_forward(fwd),
                     {{DNNL_ARG_SRC, filled(fwd.src_desc())}, {DNNL_ARG_WEIGHTS, filled(fwd.weights_desc())},
                      {DNNL_ARG_BIAS, filled(fwd.bias_desc())}, {DNNL_ARG_DST, filled(fwd.dst_desc())}}});
    const dnnl::convolution_backward_weights::primitive_desc bw(
        dnnl::convolution_backward_weights::desc(direct, src, w, b, dst, strides, pad, pad), eng, fwd);
    steps.push_back({dnnl::convolution_backward_weights(bw),
                     {{DNNL_ARG_SRC, filled(bw.src_desc())}, {DNNL_ARG_DIFF_DST, filled(bw.diff_dst_desc())},
                      {DNNL_ARG_DIFF_WEIGHTS, filled(bw.diff_weights_desc())},
                      {DNNL_ARG_DIFF_BIAS, filled(bw.diff_bias_desc())}}});
    const double layer = 2.0 * double(batch) * g.oc * g.h * g.w * g.c * 9;
    flop += 2 * layer;
    if (l == 0) continue;
    const dnnl::convolution_backward_data::primitive_desc bd(
        dnnl::convolution_backward_data::desc(direct, src, w, dst, strides, pad, pad), eng, fwd);
    steps.push_back({dnnl::convolution_backward_data(bd),
                     {{DNNL_ARG_DIFF_DST, filled(bd.diff_dst_desc())}, {DNNL_ARG_WEIGHTS, filled(bd.weights_desc())},
                      {DNNL_ARG_DIFF_SRC, filled(bd.diff_src_desc())}}});
    flop += layer;
  }
  return rate_gflops(flop, 3, [&] {
    for (auto& [p, args] : steps) p.execute(stream, args);
    stream.wait();
  });
}

// Variables that tune other libraries' kernels or thread pools; loom needs none of them, and
// run.sh starts this program without them. Their presence is printed, not obeyed.
std::string foreign_env() {
  std::string out;
  for (const char* v : {"OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
                        "MKL_NUM_THREADS", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "GOMP_SPINCOUNT", "OMP_WAIT_POLICY"})
    if (std::getenv(v)) {
      if (!out.empty()) out += ',';
      out += v;
    }
  return out.empty() ? "none" : out;
}

template <class Net>
bench::fit_rate measure(const flags& f, const loom::data::fashion_mnist_set& train, std::size_t batch, int threads,
                        loom::math_mode math) {
  loom::trainer<Net, loom::softmax_cross_entropy, loom::sgd> t{{.lr = 0.02f, .momentum = 0.9f},
                                                                {.seed = f.seed, .threads = threads, .math = math}};
  return bench::measure_fit(t, train, {.batch = batch, .warmup = f.warmup, .seconds = f.seconds, .repeats = f.repeats});
}

}  // namespace

int main(int argc, char** argv) {
  const flags f = parse(argc, argv);
  try {
    std::cerr << "bench_train_throughput: foreign tuning variables in the environment: " << foreign_env() << "\n";
    bench::print_cpu_line();
    // The ceilings: sgemm per thread count (the mlp's rows), the cnn's convolutions per batch
    // and thread count (the cnn's rows).
    const bool with_cnn = std::find(f.models.begin(), f.models.end(), "cnn") != f.models.end();
    std::vector<ceiling_rate> ceilings(f.threads.size());
    std::vector<std::vector<ceiling_rate>> conv_ceilings(f.batches.size(), std::vector<ceiling_rate>(f.threads.size()));
    if (f.ceiling || f.ceiling_only) {
      for (std::size_t i = 0; i < f.threads.size(); ++i) {
        loom::set_threads(f.threads[i]);
        ceilings[i] = sgemm_ceiling();
        std::printf("ceiling: threads=%d gflops=%.1f cpu_gflops=%.1f shape=256x784x256 what=oneDNN_sgemm\n",
                    f.threads[i], ceilings[i].gflops, ceilings[i].cpu_gflops);
        std::fflush(stdout);
        for (std::size_t bi = 0; with_cnn && bi < f.batches.size(); ++bi) {
          conv_ceilings[bi][i] = conv_ceiling(f.batches[bi]);
          std::printf("ceiling: threads=%d gflops=%.1f cpu_gflops=%.1f shape=cnn_convs_batch%zu what=oneDNN_conv\n",
                      f.threads[i], conv_ceilings[bi][i].gflops, conv_ceilings[bi][i].cpu_gflops, f.batches[bi]);
          std::fflush(stdout);
        }
      }
    }
    if (f.ceiling_only) return 0;

    const auto train = loom::data::fashion_mnist(f.data, loom::data::split::train);
    for (const auto& model : f.models) {
      const double flop = model == "cnn" ? cnn_flops : mlp_flops;
      for (std::size_t bi = 0; bi < f.batches.size(); ++bi) {
        const std::size_t batch = f.batches[bi];
        for (std::size_t ti = 0; ti < f.threads.size(); ++ti)
        for (const loom::math_mode math : f.maths) {
          const int threads = f.threads[ti];
          const ceiling_rate ceiling = model == "cnn" ? conv_ceilings[bi][ti] : ceilings[ti];
          const bench::fit_rate r = model == "cnn" ? measure<cnn>(f, train, batch, threads, math)
                                              : measure<mlp>(f, train, batch, threads, math);
          const double gflops = r.median * flop / 1e9;
          std::string runs;
          for (double v : r.runs) {
            if (!runs.empty()) runs += ',';
            runs += std::to_string(std::lround(v));
          }
          const double cpu_gflops = r.samples_per_cpu_s * flop / 1e9;
          std::printf(
              "row: impl=loom model=%s batch=%zu threads=%d math=%s samples_per_s=%.0f runs=%s steps=%zu "
              "mflop_per_sample=%.3f gflops=%.2f ceiling_gflops=%.1f ceiling_what=%s ceiling_fraction=%.3f "
              "cpu_ceiling_fraction=%.3f nominal_fraction=%.3f train_loss=%.4f others_cores=%.2f env=%s\n",
              model.c_str(), batch, threads, loom::to_string(math), r.median, runs.c_str(), r.steps, flop / 1e6, gflops,
              ceiling.gflops, model == "cnn" ? "oneDNN_conv" : "oneDNN_sgemm",
              ceiling.gflops > 0 ? gflops / ceiling.gflops : 0.0,
              ceiling.cpu_gflops > 0 ? cpu_gflops / ceiling.cpu_gflops : 0.0, gflops / (160.0 * threads), r.train_loss,
              r.others_cores, foreign_env().c_str());
          std::fflush(stdout);
          if (!std::isfinite(r.train_loss)) {
            std::cerr << "bench_train_throughput: training diverged (loss " << r.train_loss << ")\n";
            return 1;
          }
        }
      }
    }
  } catch (const loom::error& e) {
    std::cerr << "bench_train_throughput: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
