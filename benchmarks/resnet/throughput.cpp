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

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <random>
#include <string>
#include <string_view>
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
Prints `cpu: impl=loom ...` first, then per row on stdout:
  row: impl=loom model=M batch=B threads=T math=fp32|bf16 samples_per_s=S (median) runs=S1,..
       steps=N train_loss=L others_cores=O (CPU cores other processes used during the timed runs)
or, for bf16 on a CPU without avx512_bf16 or AMX,
  row: impl=loom model=M batch=B threads=T math=bf16 skipped=no_bf16_cpu
)";

flags parse(int argc, char** argv) {
  const bench::flag_reader r("bench_resnet_throughput", usage);
  flags f;
  r.read(argc, argv, {}, [&](std::string_view name, std::string_view value) {
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
          std::printf("row: impl=loom model=%s batch=%zu threads=%d math=%s samples_per_s=%.1f runs=%s steps=%zu "
                      "train_loss=%.4f others_cores=%.2f\n",
                      model.c_str(), f.batch, threads, loom::to_string(math), r.median, runs.c_str(), r.steps,
                      r.train_loss, r.others_cores);
          std::fflush(stdout);
          if (!std::isfinite(r.train_loss)) {
            std::cerr << "bench_resnet_throughput: training diverged (loss " << r.train_loss << ")\n";
            return 1;
          }
        }
  } catch (const loom::error& e) {
    std::cerr << "bench_resnet_throughput: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
