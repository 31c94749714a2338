// SPDX-License-Identifier: Apache-2.0
// ResNet training throughput of loom, single process: samples per second of the CIFAR ResNet-20
// on 1 x 28 x 28 images (loom::models::resnet_cifar<20, 10, input<1, 28, 28>>) and torchvision's
// ResNet-18 on 3 x 64 x 64 images (loom::models::resnet<18, 10, input<3, 64, 64>>), trained with
// SGD (lr 0.02, momentum 0.9) through loom::trainer::fit on seeded random images and labels, for
// each (model, threads, math) row — math: fp32, or bf16 (trainer_options::math: bf16 products,
// fp32 accumulation and master weights; only where this CPU runs it, else the row says skipped).
// Each row: warm-up steps for `--warmup` seconds, then `--repeats` timed runs of a fixed number
// of steps (sized to last about `--seconds`), and the median. One `row:` line per row on stdout
// and a `cpu:` line first. benchmarks/resnet/throughput.py is the PyTorch side with the same
// rows and method; benchmarks/resnet/throughput.sh runs both and prints the table.
//
// The ceiling: oneDNN's own rate on the same convolutions — every convolution of the network
// (the table below) at the row's batch, forward, backward weights and, except for the first
// (whose input needs no gradient), backward data, run back to back as primitives on the layouts
// they prefer (format any, no reorders timed), by the algorithm loom::cpu picks for it under
// --conv (loom::conv_algorithm: Winograd or direct, detail::conv2d_winograd_wanted), fp32 or bf16
// (bf16 sources, weights and destinations, float weight gradients), on the row's threads. The
// row's `ceiling_fraction` is loom's rate on those convolutions' FLOP (samples/s x the FLOP a
// sample takes in them) over oneDNN's: how much of a step is the convolutions at oneDNN's speed.

#include <dnnl.hpp>  // the ceiling runs oneDNN directly
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <random>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../common/fit_rate.hpp"
#include "loom/loom.hpp"
#include "loom/models/resnet.hpp"

namespace {

using resnet20 = loom::models::resnet_cifar<20, 10, loom::input<1, 28, 28>>;
using resnet18 = loom::models::resnet<18, 10, loom::input<3, 64, 64>>;

struct flags {
  std::vector<std::string> models{"resnet20", "resnet18"};
  std::vector<int> threads{1, 2};
  std::vector<loom::math_mode> maths{loom::math_mode::fp32, loom::math_mode::bf16};
  std::size_t batch = 64;
  std::size_t samples = 1024;  // random images in the training set
  double seconds = 3.0;        // per timed repeat
  double warmup = 1.0;         // seconds of warm-up steps per row
  std::size_t repeats = 1;
  std::uint64_t seed = 1;
  bool ceiling = true;
  loom::conv_algorithm conv = loom::conv_algorithm::automatic;
};

constexpr const char* usage = R"(usage: bench_resnet_throughput [flags]
  --model LIST       models, comma-separated: resnet20 (1x28x28), resnet18 (3x64x64) (default both)
  --threads LIST     thread counts, comma-separated (default 1,2)
  --math LIST        fp32 and/or bf16 (default both; bf16 rows are skipped where the CPU lacks it)
  --batch N          batch size (default 64)
  --samples N        seeded random images in the training set (default 1024)
  --seconds X        length of one timed repeat in seconds (default 3)
  --warmup X         seconds of warm-up steps before the repeats (default 1)
  --repeats N        timed repeats per row; the median is reported (default 1)
  --seed N           data, initialisation and shuffling seed (default 1)
  --conv ALG         auto (default), direct or winograd: loom's fp32 convolution algorithm (loom::conv_algorithm)
  --no-ceiling       do not measure oneDNN's rate on the network's convolutions (by loom's algorithms for --conv)
Prints `cpu: impl=loom ...` first, then per row on stdout:
  row: impl=loom model=M batch=B threads=T math=fp32|bf16 conv=auto|direct|winograd samples_per_s=S (median) runs=S1,..
       steps=N train_loss=L others_cores=O (CPU cores other processes used during the timed runs)
       conv_mflop_per_sample=F ceiling_gflops=C (oneDNN's rate on them) ceiling_fraction=S*F/C
or, for bf16 on a CPU without avx512_bf16 or AMX,
  row: impl=loom model=M batch=B threads=T math=bf16 skipped=no_bf16_cpu
)";

flags parse(int argc, char** argv) {
  const bench::flag_reader r("bench_resnet_throughput", usage);
  flags f;
  r.read(argc, argv, {"no-ceiling"}, [&](std::string_view name, std::string_view value) {
    if (name == "model") {
      f.models = r.list(value);
      for (const auto& m : f.models)
        if (m != "resnet20" && m != "resnet18") r.bad("--model takes resnet20 and/or resnet18, got '" + m + "'");
    } else if (name == "math") {
      f.maths.clear();
      for (const auto& m : r.list(value)) {
        if (m == "fp32") f.maths.push_back(loom::math_mode::fp32);
        else if (m == "bf16") f.maths.push_back(loom::math_mode::bf16);
        else r.bad("--math takes fp32 and/or bf16, got '" + m + "'");
      }
    } else if (name == "threads") f.threads = r.numbers<int>(name, value);
    else if (name == "batch") f.batch = r.number<std::size_t>(name, value);
    else if (name == "samples") f.samples = r.number<std::size_t>(name, value);
    else if (name == "seconds") f.seconds = r.number<double>(name, value);
    else if (name == "warmup") f.warmup = r.number<double>(name, value);
    else if (name == "repeats") f.repeats = r.number<std::size_t>(name, value);
    else if (name == "seed") f.seed = r.number<std::uint64_t>(name, value);
    else if (name == "no-ceiling") f.ceiling = false;
    else if (name == "conv") {
      if (value == "auto") f.conv = loom::conv_algorithm::automatic;
      else if (value == "direct") f.conv = loom::conv_algorithm::direct;
      else if (value == "winograd") f.conv = loom::conv_algorithm::winograd;
      else r.bad("--conv takes auto, direct or winograd, got '" + std::string(value) + "'");
    }
    else return false;
    return true;
  });
  if (f.models.empty()) r.bad("--model needs at least one model");
  if (f.maths.empty()) r.bad("--math needs at least one of fp32, bf16");
  for (auto t : f.threads)
    if (t <= 0) r.bad("--threads values must be at least 1");
  if (f.batch == 0) r.bad("--batch must be at least 1");
  if (f.samples < f.batch) r.bad("--samples must be at least --batch");
  if (!(f.seconds > 0)) r.bad("--seconds must be > 0");
  if (f.repeats == 0) r.bad("--repeats must be at least 1");
  return f;
}

/// `n` seeded random images of the network's input shape with random labels in 0..9.
template <class Net>
auto random_images(std::size_t n, std::uint64_t seed) {
  using shape = typename Net::input_shape;
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> byte(0, 255), label(0, 9);
  std::vector<std::uint8_t> pixels(n * shape::size), labels(n);
  for (auto& p : pixels) p = static_cast<std::uint8_t>(byte(rng));
  for (auto& l : labels) l = static_cast<std::uint8_t>(label(rng));
  return loom::data::labelled_images<shape, 10>(std::move(pixels), std::move(labels), "random images");
}

// One convolution: c x h x w in, oc out, k x k kernel, stride s, padding p; no bias (every
// convolution of a ResNet is followed by a batch norm).
struct conv_shape {
  int c, h, w, oc, k, s, p;
  constexpr int oh() const { return (h + 2 * p - k) / s + 1; }
  constexpr int ow() const { return (w + 2 * p - k) / s + 1; }
  constexpr double flop() const { return 2.0 * oc * oh() * ow() * c * k * k; }  // forward, one sample
};

// The CIFAR ResNet-20 on 1 x 28 x 28: conv1, three stages of three basic blocks (16, 32, 64
// channels; the first block of stages 2 and 3 strided, with a 1 x 1 strided projection).
std::vector<conv_shape> resnet20_convs() {
  std::vector<conv_shape> v{{1, 28, 28, 16, 3, 1, 1}};
  for (int i = 0; i < 6; ++i) v.push_back({16, 28, 28, 16, 3, 1, 1});
  v.push_back({16, 28, 28, 32, 3, 2, 1});
  v.push_back({16, 28, 28, 32, 1, 2, 0});
  for (int i = 0; i < 5; ++i) v.push_back({32, 14, 14, 32, 3, 1, 1});
  v.push_back({32, 14, 14, 64, 3, 2, 1});
  v.push_back({32, 14, 14, 64, 1, 2, 0});
  for (int i = 0; i < 5; ++i) v.push_back({64, 7, 7, 64, 3, 1, 1});
  return v;
}

// torchvision's ResNet-18 on 3 x 64 x 64: the 7 x 7 stride-2 stem (then a 3 x 3 stride-2 max
// pool: 16 x 16), four stages of two basic blocks (64, 128, 256, 512 channels; the first block
// of stages 2-4 strided, with a 1 x 1 strided projection).
std::vector<conv_shape> resnet18_convs() {
  std::vector<conv_shape> v{{3, 64, 64, 64, 7, 2, 3}};
  for (int i = 0; i < 4; ++i) v.push_back({64, 16, 16, 64, 3, 1, 1});
  int c = 64, hw = 16;
  for (int oc : {128, 256, 512}) {
    v.push_back({c, hw, hw, oc, 3, 2, 1});
    v.push_back({c, hw, hw, oc, 1, 2, 0});
    hw /= 2;
    for (int i = 0; i < 3; ++i) v.push_back({oc, hw, hw, oc, 3, 1, 1});
    c = oc;
  }
  return v;
}

// The FLOP of one sample's training step in the convolutions: forward, weight gradient, and
// input gradient for all but the first.
double training_flop(const std::vector<conv_shape>& convs) {
  double f = 0;
  for (std::size_t i = 0; i < convs.size(); ++i) f += (i == 0 ? 2 : 3) * convs[i].flop();
  return f;
}

// The table against the network: its forward FLOP are the convolutions' and a few percent more
// (batch norms, ReLUs, additions, pooling, the last linear layer); a table that left a
// convolution out, or had one wrong, falls outside that.
template <class Net>
void check_table(const char* model, const std::vector<conv_shape>& convs) {
  double forward = 0;
  for (const conv_shape& c : convs) forward += c.flop();
  const double share = forward / Net::flops_per_sample;
  if (share > 1 || share < 0.95)
    throw loom::error(std::string("bench_resnet_throughput: the convolution table of ") + model + " does not match the " +
                      "network: its forward FLOP are " + std::to_string(share) + " of the network's, expected 0.95 .. 1");
}

// oneDNN's GFLOP/s on the convolutions' training work at `batch` (see the file comment): the
// median of 3 timings of about 0.5 s each, after 3 warm-up passes.
double conv_ceiling(const std::vector<conv_shape>& convs, std::size_t batch, int threads, loom::math_mode math,
                    loom::conv_algorithm algorithm) {
  using dims = dnnl::memory::dims;
  using tag = dnnl::memory::format_tag;
  using dt = dnnl::memory::data_type;
  const dt data = math == loom::math_mode::bf16 ? dt::bf16 : dt::f32;
  omp_set_num_threads(threads);
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(eng);
  const auto n = static_cast<dnnl::memory::dim>(batch);
  auto filled = [&](const dnnl::memory::desc& d) {  // small values: no denormals, no zeros
    dnnl::memory m(d, eng);
    if (d.data_type() == dt::f32) {
      auto* p = static_cast<float*>(m.get_data_handle());
      for (std::size_t i = 0; i < d.get_size() / sizeof(float); ++i) p[i] = float((i * 40503u) % 1000) / 1000.0f - 0.5f;
    } else {
      auto* p = static_cast<std::uint16_t*>(m.get_data_handle());
      for (std::size_t i = 0; i < d.get_size() / 2; ++i) p[i] = std::uint16_t(0x3e00 + (i * 40503u) % 256);  // 0.125 .. 0.25
    }
    return m;
  };
  std::vector<std::pair<dnnl::primitive, std::unordered_map<int, dnnl::memory>>> steps;
  for (std::size_t l = 0; l < convs.size(); ++l) {
    const conv_shape& g = convs[l];
    const dims stride{g.s, g.s}, pad{g.p, g.p};
    const dnnl::memory::desc src({n, g.c, g.h, g.w}, data, tag::any), w({g.oc, g.c, g.k, g.k}, data, tag::any),
        dst({n, g.oc, g.oh(), g.ow()}, data, tag::any), dw({g.oc, g.c, g.k, g.k}, dt::f32, tag::any);
    // The algorithm loom's plan picks for it (loom::conv_algorithm: Winograd in fp32 where it
    // pays or is asked for, and where oneDNN has it; direct otherwise).
    const loom::conv2d_geometry geometry{std::size_t(g.c), std::size_t(g.h),  std::size_t(g.w), std::size_t(g.oc),
                                         std::size_t(g.k), std::size_t(g.s), std::size_t(g.p)};
    auto algorithm_of = [&](auto&& make) {
      if (math == loom::math_mode::fp32 &&
          loom::detail::conv2d_winograd_wanted(algorithm, geometry, batch, std::size_t(threads)))
        try {
          return make(dnnl::algorithm::convolution_winograd);
        } catch (const dnnl::error& e) {
          if (e.status != dnnl_unimplemented) throw;
        }
      return make(dnnl::algorithm::convolution_direct);
    };
    const auto fwd = algorithm_of([&](dnnl::algorithm a) {
      return dnnl::convolution_forward::primitive_desc(
          dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, a, src, w, dst, stride, pad, pad), eng);
    });
    steps.push_back({dnnl::convolution_forward(fwd),
                     {{DNNL_ARG_SRC, filled(fwd.src_desc())}, {DNNL_ARG_WEIGHTS, filled(fwd.weights_desc())},
                      {DNNL_ARG_DST, filled(fwd.dst_desc())}}});
    const auto bw = algorithm_of([&](dnnl::algorithm a) {
      return dnnl::convolution_backward_weights::primitive_desc(
          dnnl::convolution_backward_weights::desc(a, src, dw, dst, stride, pad, pad), eng, fwd);
    });
    steps.push_back({dnnl::convolution_backward_weights(bw),
                     {{DNNL_ARG_SRC, filled(bw.src_desc())}, {DNNL_ARG_DIFF_DST, filled(bw.diff_dst_desc())},
                      {DNNL_ARG_DIFF_WEIGHTS, filled(bw.diff_weights_desc())}}});
    if (l == 0) continue;
    const auto bd = algorithm_of([&](dnnl::algorithm a) {
      return dnnl::convolution_backward_data::primitive_desc(
          dnnl::convolution_backward_data::desc(a, src, w, dst, stride, pad, pad), eng, fwd);
    });
    steps.push_back({dnnl::convolution_backward_data(bd),
                     {{DNNL_ARG_DIFF_DST, filled(bd.diff_dst_desc())}, {DNNL_ARG_WEIGHTS, filled(bd.weights_desc())},
                      {DNNL_ARG_DIFF_SRC, filled(bd.diff_src_desc())}}});
  }
  auto pass = [&] {
    for (auto& [p, args] : steps) p.execute(stream, args);
    stream.wait();
  };
  for (int i = 0; i < 3; ++i) pass();
  const double flop = training_flop(convs) * double(batch);
  std::vector<double> rates;
  for (int r = 0; r < 3; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    std::size_t passes = 0;
    double s = 0;
    do {
      pass();
      ++passes;
      s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    } while (s < 0.5);
    rates.push_back(flop * double(passes) / s / 1e9);
  }
  std::sort(rates.begin(), rates.end());
  return rates[1];
}

template <class Net>
bench::fit_rate measure(const flags& f, int threads, loom::math_mode math) {
  const auto train = random_images<Net>(f.samples, f.seed);
  loom::trainer<Net, loom::softmax_cross_entropy, loom::sgd> t{{.lr = 0.02f, .momentum = 0.9f},
                                                                {.seed = f.seed, .threads = threads, .math = math}};
  return bench::measure_fit(t, train,
                            {.batch = f.batch, .warmup = f.warmup, .seconds = f.seconds, .repeats = f.repeats,
                             .first_chunk = 1, .max_chunk = 64, .min_steps = 2});
}

}  // namespace

int main(int argc, char** argv) {
  const flags f = parse(argc, argv);
  try {
    bench::print_cpu_line();
    std::fflush(stdout);
    loom::set_conv_algorithm(f.conv);
    const bool bf16_ok = loom::detect_cpu_features().bf16;
    for (const auto& model : f.models)
      for (const int threads : f.threads)
        for (const loom::math_mode math : f.maths) {
          if (math == loom::math_mode::bf16 && !bf16_ok) {
            std::printf("row: impl=loom model=%s batch=%zu threads=%d math=bf16 skipped=no_bf16_cpu\n", model.c_str(),
                        f.batch, threads);
            std::fflush(stdout);
            continue;
          }
          const bench::fit_rate r =
              model == "resnet18" ? measure<resnet18>(f, threads, math) : measure<resnet20>(f, threads, math);
          std::string runs;
          for (double v : r.runs) {
            if (!runs.empty()) runs += ',';
            runs += std::to_string(std::lround(v));
          }
          std::string ceiling;
          if (f.ceiling) {
            const auto convs = model == "resnet18" ? resnet18_convs() : resnet20_convs();
            if (model == "resnet18") check_table<resnet18>(model.c_str(), convs);
            else check_table<resnet20>(model.c_str(), convs);
            const double c = conv_ceiling(convs, f.batch, threads, math, f.conv), per_sample = training_flop(convs);
            char text[160];
            std::snprintf(text, sizeof text, " conv_mflop_per_sample=%.1f ceiling_gflops=%.1f ceiling_fraction=%.3f",
                          per_sample / 1e6, c, r.median * per_sample / 1e9 / c);
            ceiling = text;
          }
          std::printf("row: impl=loom model=%s batch=%zu threads=%d math=%s conv=%s samples_per_s=%.1f runs=%s "
                      "steps=%zu train_loss=%.4f others_cores=%.2f%s\n",
                      model.c_str(), f.batch, threads, loom::to_string(math),
                      f.conv == loom::conv_algorithm::winograd ? "winograd"
                      : f.conv == loom::conv_algorithm::direct ? "direct"
                                                                : "auto",
                      r.median, runs.c_str(), r.steps,
                      r.train_loss, r.others_cores, ceiling.c_str());
          std::fflush(stdout);
          if (!std::isfinite(r.train_loss)) {
            std::cerr << "bench_resnet_throughput: training diverged (loss " << r.train_loss << ")\n";
            return 1;
          }
        }
  } catch (const loom::error& e) {
    std::cerr << "bench_resnet_throughput: " << e.what() << "\n";
    return 1;
  } catch (const dnnl::error& e) {
    std::cerr << "bench_resnet_throughput: oneDNN failed while measuring the convolution ceiling: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
