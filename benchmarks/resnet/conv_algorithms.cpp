// SPDX-License-Identifier: Apache-2.0
// oneDNN's Winograd convolutions against its direct ones, the measurements behind
// loom::conv_algorithm::automatic (detail::conv2d_winograd_pays in loom/backend/cpu/conv2d.hpp):
// for each 3x3, stride-1, padding-1 convolution of C channels in and out at H x W, each batch
// and thread count, the fp32 primitives' forward (training), input gradient and weight gradient
// times (median of 5 runs after one warm-up, on the layouts the primitives prefer, no reorders
// timed), direct and Winograd, their sum's ratio (below 1: Winograd faster), and whether loom's
// rule picks Winograd there. One `row:` line per case on stdout, after a `cpu:` line. Where this
// CPU has no Winograd kernels (no AVX-512) the rows say so.
//
//   bench_conv_algorithms [--shapes 64x56,128x28,256x14,512x7] [--batch 1,4,16,64] [--threads 1,2]

#include <dnnl.hpp>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <unordered_map>
#include <string>
#include <string_view>
#include <vector>

#include "../common/bench.hpp"
#include "loom/loom.hpp"

namespace {

constexpr const char* usage = R"(usage: bench_conv_algorithms [flags]
  --shapes LIST   3x3 stride-1 convolutions as CxH (C channels in and out, H x H pixels),
                  comma-separated (default 64x56,128x28,256x14,512x7,32x14,32x28,64x16,128x8)
  --batch LIST    batch sizes, comma-separated (default 1,4,16,64)
  --threads LIST  thread counts, comma-separated (default 1,2)
Prints `cpu: impl=loom ...` first, then per (shape, batch, threads):
  row: channels=C pixels=HxH batch=N threads=T direct_ms=F/D/W winograd_ms=F/D/W ratio=R loom_picks=winograd|direct
  (F forward, D input gradient, W weight gradient; R = Winograd's sum over direct's), or
  row: ... winograd=unavailable (oneDNN has no Winograd kernel for it on this CPU)
)";

struct shape {
  int c, h;
};

struct flags {
  std::vector<shape> shapes{{64, 56}, {128, 28}, {256, 14}, {512, 7}, {32, 14}, {32, 28}, {64, 16}, {128, 8}};
  std::vector<int> batches{1, 4, 16, 64};
  std::vector<int> threads{1, 2};
};

flags parse(int argc, char** argv) {
  flags f;
  bench::flag_reader r("bench_conv_algorithms", usage);
  r.read(argc, argv, {}, [&](std::string_view name, std::string_view value) {
    if (name == "shapes") {
      f.shapes.clear();
      for (const std::string& s : bench::flag_reader::list(value)) {
        const auto x = s.find('x');
        if (x == std::string::npos) r.bad("--shapes takes CxH items, got '" + s + "'");
        const int c = r.number<int>(name, std::string_view(s).substr(0, x)),
                  h = r.number<int>(name, std::string_view(s).substr(x + 1));
        if (c <= 0 || h <= 0) r.bad("--shapes takes positive CxH items, got '" + s + "'");
        f.shapes.push_back({c, h});
      }
    } else if (name == "batch") {
      f.batches = r.numbers<int>(name, value);
    } else if (name == "threads") {
      f.threads = r.numbers<int>(name, value);
    } else {
      return false;
    }
    return true;
  });
  return f;
}

// Median of 5 timed runs of `run` (after one untimed), in ms.
template <class F>
double median_ms(F&& run) {
  run();
  std::vector<double> t;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    run();
    t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[2];
}

// Forward, input gradient and weight gradient times of one algorithm; false where oneDNN has
// no kernel of it for the convolution.
bool time_passes(dnnl::algorithm alg, const shape& s, int batch, double (&ms)[3]) {
  using tag = dnnl::memory::format_tag;
  using dt = dnnl::memory::data_type;
  static dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(eng);
  const dnnl::memory::dims x{batch, s.c, s.h, s.h}, w{s.c, s.c, 3, 3}, one{1, 1};
  const dnnl::memory::desc xd(x, dt::f32, tag::any), wd(w, dt::f32, tag::any), yd(x, dt::f32, tag::any);
  try {
    const dnnl::convolution_forward::primitive_desc fwd(
        dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, alg, xd, wd, yd, one, one, one), eng);
    const dnnl::convolution_backward_data::primitive_desc bwd_d(
        dnnl::convolution_backward_data::desc(alg, xd, wd, yd, one, one, one), eng, fwd);
    const dnnl::convolution_backward_weights::primitive_desc bwd_w(
        dnnl::convolution_backward_weights::desc(alg, xd, wd, yd, one, one, one), eng, fwd);
    auto filled = [&](const dnnl::memory::desc& d) {  // small values: no denormals
      dnnl::memory m(d, eng);
      auto* p = static_cast<float*>(m.get_data_handle());
      for (std::size_t i = 0; i < d.get_size() / sizeof(float); ++i) p[i] = float((i * 40503u) % 1000) / 1000.0f - 0.5f;
      return m;
    };
    dnnl::convolution_forward f(fwd);
    dnnl::convolution_backward_data d(bwd_d);
    dnnl::convolution_backward_weights g(bwd_w);
    const std::unordered_map<int, dnnl::memory> fa{{DNNL_ARG_SRC, filled(fwd.src_desc())},
                                                   {DNNL_ARG_WEIGHTS, filled(fwd.weights_desc())},
                                                   {DNNL_ARG_DST, filled(fwd.dst_desc())}},
        da{{DNNL_ARG_DIFF_DST, filled(bwd_d.diff_dst_desc())},
           {DNNL_ARG_WEIGHTS, filled(bwd_d.weights_desc())},
           {DNNL_ARG_DIFF_SRC, filled(bwd_d.diff_src_desc())}},
        ga{{DNNL_ARG_SRC, filled(bwd_w.src_desc())},
           {DNNL_ARG_DIFF_DST, filled(bwd_w.diff_dst_desc())},
           {DNNL_ARG_DIFF_WEIGHTS, filled(bwd_w.diff_weights_desc())}};
    ms[0] = median_ms([&] { f.execute(stream, fa), stream.wait(); });
    ms[1] = median_ms([&] { d.execute(stream, da), stream.wait(); });
    ms[2] = median_ms([&] { g.execute(stream, ga), stream.wait(); });
    return true;
  } catch (const dnnl::error& e) {
    if (e.status != dnnl_unimplemented) throw;
    return false;
  }
}

}  // namespace

int main(int argc, char** argv) {
  const flags f = parse(argc, argv);
  try {
    bench::print_cpu_line();
    for (const shape& s : f.shapes)
      for (const int batch : f.batches)
        for (const int threads : f.threads) {
          if (batch <= 0 || threads <= 0) {
            std::fprintf(stderr, "bench_conv_algorithms: --batch and --threads take positive numbers\n");
            return 2;
          }
          omp_set_num_threads(threads);
          const loom::conv2d_geometry g{std::size_t(s.c), std::size_t(s.h), std::size_t(s.h), std::size_t(s.c), 3, 1, 1};
          const bool picks = loom::detail::conv2d_winograd_pays(g, std::size_t(batch), std::size_t(threads));
          double direct[3], wino[3];
          time_passes(dnnl::algorithm::convolution_direct, s, batch, direct);
          std::printf("row: channels=%d pixels=%dx%d batch=%d threads=%d direct_ms=%.3f/%.3f/%.3f", s.c, s.h, s.h, batch,
                      threads, direct[0], direct[1], direct[2]);
          if (time_passes(dnnl::algorithm::convolution_winograd, s, batch, wino))
            std::printf(" winograd_ms=%.3f/%.3f/%.3f ratio=%.2f", wino[0], wino[1], wino[2],
                        (wino[0] + wino[1] + wino[2]) / (direct[0] + direct[1] + direct[2]));
          else
            std::printf(" winograd=unavailable");
          std::printf(" loom_picks=%s\n", picks ? "winograd" : "direct");
          std::fflush(stdout);
        }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_conv_algorithms: %s\n", e.what());
    return 1;
  }
}
