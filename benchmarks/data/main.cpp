// SPDX-License-Identifier: Apache-2.0
// loom's side of the data benchmark (benchmarks/data/run.sh): images per second of decoding and
// augmenting JPEGs (random_resized_crop 224, flip, normalize) and Fashion-MNIST PNGs (grey,
// pixel / 255), in one thread and end to end through batch_prefetch with N threads, batches of
// 64 in a shuffled order. Prints `row:` lines (key=value) and the CPU and library versions.
//
//   bench_data --dir DIR [--what jpeg|png] [--mode one|pool] [--threads N] [--seconds S] [--repeats R]

#include <spng.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <numeric>
#include <string>
#include <vector>

#include <jpeglib.h>

#include "../common/bench.hpp"
#include "loom/core/random.hpp"
#include "loom/data/decode_pool.hpp"
#include "loom/data/image_pipeline.hpp"

#define BENCH_STRING2(x) #x
#define BENCH_STRING(x) BENCH_STRING2(x)

namespace {

namespace ld = loom::data;
using jpeg_pipeline = ld::image_pipeline<ld::rgb, ld::random_resized_crop<224>, ld::flip, ld::imagenet_normalize>;
using png_pipeline = ld::decode_to<1, 28, 28>;

std::vector<std::vector<std::byte>> read_files(const std::filesystem::path& dir, const std::string& ext) {
  std::vector<std::filesystem::path> paths;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ext) paths.push_back(e.path());
  std::sort(paths.begin(), paths.end());
  std::vector<std::vector<std::byte>> files;
  for (const auto& p : paths) {
    std::ifstream f(p, std::ios::binary);
    std::vector<char> d((std::istreambuf_iterator<char>(f)), {});
    files.emplace_back(reinterpret_cast<const std::byte*>(d.data()), reinterpret_cast<const std::byte*>(d.data()) + d.size());
  }
  return files;
}

// Decodes file after file in this thread for about `seconds`; images per second.
template <class P>
double one_thread(const std::vector<std::vector<std::byte>>& files, double seconds, std::uint64_t round) {
  const P pipeline;
  std::vector<float> out(P::output_shape::size);
  std::size_t n = 0;
  const auto t0 = bench::clock_type::now();
  double elapsed = 0;
  do {
    for (std::size_t k = 0; k < 64; ++k, ++n) {
      const std::size_t i = n % files.size();
      pipeline(files[i], {1, round, i}, out.data());
    }
    elapsed = bench::since(t0);
  } while (elapsed < seconds);
  return static_cast<double>(n) / elapsed;
}

// batch_prefetch with `threads` threads: steps of 64 samples in a shuffled order, submitted
// `ahead` + 1 ahead of the consumer, which takes each batch and reads one value of each sample.
template <class P>
double end_to_end(const std::vector<std::vector<std::byte>>& files, int threads, double seconds, std::uint64_t round) {
  constexpr std::size_t batch = 64;
  ld::batch_prefetch<P> pf(P{}, {.batch = batch, .ahead = 2, .threads = threads});
  std::vector<std::size_t> order(files.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  loom::splitmix64 rng(round);
  std::size_t pos = files.size(), step = 0, epoch = 0;
  auto submit = [&] {
    std::vector<ld::decode_item> items;
    for (std::size_t s = 0; s < batch; ++s) {
      if (pos == files.size()) {  // a new epoch: a new order
        for (std::size_t i = order.size() - 1; i > 0; --i) std::swap(order[i], order[rng.below(i + 1)]);
        pos = 0, ++epoch;
      }
      const std::size_t i = order[pos++];
      items.push_back({files[i], {1, epoch, i}, s});
    }
    pf.submit(std::move(items));
    ++step;
  };
  for (int k = 0; k < 3; ++k) submit();
  volatile float sink = 0;
  // A warm-up batch, then the timed ones.
  pf.next();
  submit();
  std::size_t images = 0;
  const auto t0 = bench::clock_type::now();
  double elapsed = 0;
  do {
    const auto b = pf.next();
    for (std::size_t s = 0; s < b.samples; ++s) sink = sink + b.data[s * P::output_shape::size];
    images += b.samples;
    submit();
    elapsed = bench::since(t0);
  } while (elapsed < seconds);
  return static_cast<double>(images) / elapsed;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir, what = "jpeg", mode = "one";
  int threads = 1, repeats = 3;
  double seconds = 2;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&] {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_data: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return std::string(argv[++i]);
    };
    if (a == "--dir") dir = value();
    else if (a == "--what") what = value();
    else if (a == "--mode") mode = value();
    else if (a == "--threads") threads = std::stoi(value());
    else if (a == "--seconds") seconds = std::stod(value());
    else if (a == "--repeats") repeats = std::stoi(value());
    else {
      std::fprintf(stderr, "bench_data: unknown flag %s (see the top of benchmarks/data/main.cpp)\n", a.c_str());
      return 2;
    }
  }
  if (dir.empty() || (what != "jpeg" && what != "png") || (mode != "one" && mode != "pool")) {
    std::fprintf(stderr, "usage: bench_data --dir DIR [--what jpeg|png] [--mode one|pool] [--threads N] [--seconds S] [--repeats R]\n");
    return 2;
  }
  const auto files = read_files(dir, what == "jpeg" ? ".jpg" : ".png");
  if (files.empty()) {
    std::fprintf(stderr, "bench_data: no %s files in %s\n", what.c_str(), dir.c_str());
    return 1;
  }
  bench::print_cpu_line();
  std::printf("versions: impl=loom libjpeg-turbo=%s libspng=%d.%d.%d compiler=gcc-%d.%d\n", BENCH_STRING(LIBJPEG_TURBO_VERSION),
              SPNG_VERSION_MAJOR, SPNG_VERSION_MINOR, SPNG_VERSION_PATCH, __GNUC__, __GNUC_MINOR__);
  std::vector<double> rates;
  const auto c0 = bench::cpu_snapshot::now();
  for (int r = 0; r < repeats; ++r) {
    const auto round = static_cast<std::uint64_t>(r);
    double v = 0;
    if (what == "jpeg")
      v = mode == "one" ? one_thread<jpeg_pipeline>(files, seconds, round) : end_to_end<jpeg_pipeline>(files, threads, seconds, round);
    else
      v = mode == "one" ? one_thread<png_pipeline>(files, seconds, round) : end_to_end<png_pipeline>(files, threads, seconds, round);
    rates.push_back(v);
  }
  const double others = bench::cpu_snapshot::others_cores(c0, bench::cpu_snapshot::now());
  const double median = bench::median(rates);
  std::printf("row: impl=loom variant=loom what=%s mode=%s threads=%d images_per_s=%.1f per_core=%.1f repeats=%d others_cores=%.2f\n",
              what.c_str(), mode.c_str(), mode == "one" ? 1 : threads, median, median / (mode == "one" ? 1 : threads), repeats,
              others);
  return 0;
}
