// SPDX-License-Identifier: Apache-2.0
// The GPU check (run by scripts/gpu-check): on a machine with an NVIDIA GPU it prints
//   1. loom::cuda against a serial host reference (tests/cuda/reference_backend.hpp: the same kernel
//      bodies, direct loops for products and convolutions) for every layer case of
//      tests/cuda/cases.hpp: output, input gradient and parameter gradients, and the losses of
//      200-step training runs; and in math_mode::bf16 (mixed precision) against the reference's
//      bf16 (operands rounded to bf16, sums in double), normwise;
//   2. training throughput (samples/s) of the main example's mlp and cnn through
//      loom::trainer<..., loom::cuda>, in fp32 and in bf16, beside PyTorch's (fp32) on the same
//      GPU when given its results;
//   3. FP32 GEMM TFLOP/s through loom::cuda::gemm beside cuBLAS called directly;
//   4. NCCL allreduce bandwidth with one rank (through loom::nccl_comm when built with MPI).
// It needs nvcc, cuBLAS and cuDNN (and NCCL for 4) — no oneDNN, Catch2, Boost or MPI.
// Exit code: 0 when every agreement check passes, 1 when one fails, 2 for bad arguments, 77
// without a CUDA device.

#include "loom/backend/cuda.hpp"

#include <cublas_v2.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "cases_impl.hpp"
#include "loom/layers/activation.hpp"
#include "loom/layers/conv2d.hpp"
#include "loom/layers/flatten.hpp"
#include "loom/layers/linear.hpp"
#include "loom/layers/pool2d.hpp"
#include "reference_backend.hpp"

#if defined(LOOM_GPU_CHECK_NCCL)
#include <nccl.h>
#endif
#if defined(LOOM_GPU_CHECK_NCCL) && defined(LOOM_GPU_CHECK_MPI)
#include "loom/comm/nccl.hpp"
#endif

namespace {

using namespace loom;
using namespace loom::cuda_tests;
using loom::gpu_check::reference;

struct options {
  bool quick = false;
  bool agreement = true, training = true, gemm = true, nccl = true;
  std::string torch_results;  // lines "torch <model> <batch> <samples/s>"
};

void usage(std::FILE* to) {
  std::fprintf(to,
               "usage: gpu_check [--quick] [--only agreement|training|gemm|nccl] [--torch-results FILE]\n"
               "  --quick              fewer and shorter measurements\n"
               "  --only PART          run one part (repeatable)\n"
               "  --torch-results FILE PyTorch's training throughput (lines: torch MODEL BATCH SAMPLES_PER_S),\n"
               "                       printed beside loom's\n");
}

/// Parses argv; returns 0 to go on, else the exit code.
int parse(int argc, char** argv, options& o) {
  bool only = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      usage(stdout);
      return -1;
    } else if (a == "--quick") {
      o.quick = true;
    } else if (a == "--only" && i + 1 < argc) {
      if (!only) o.agreement = o.training = o.gemm = o.nccl = false, only = true;
      const std::string p = argv[++i];
      if (p == "agreement") o.agreement = true;
      else if (p == "training") o.training = true;
      else if (p == "gemm") o.gemm = true;
      else if (p == "nccl") o.nccl = true;
      else {
        std::fprintf(stderr, "gpu_check: unknown part '%s' (agreement, training, gemm, nccl)\n", p.c_str());
        return 2;
      }
    } else if (a == "--torch-results" && i + 1 < argc) {
      o.torch_results = argv[++i];
    } else {
      std::fprintf(stderr, "gpu_check: unknown argument '%s'\n", a.c_str());
      usage(stderr);
      return 2;
    }
  }
  return 0;
}

double max_rel_error(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return INFINITY;
  double scale = 0;
  for (float v : want) scale = std::max(scale, std::abs(static_cast<double>(v)));
  const double floor = 1e-2 * scale;
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double a = got[i], b = want[i];
    if (!std::isfinite(a) || !std::isfinite(b)) return INFINITY;
    const double d = std::abs(a - b);
    if (d > 0) worst = std::max(worst, d / std::max(std::abs(a) + std::abs(b), floor));
  }
  return worst;
}

std::vector<float> as_floats(std::size_t n, std::uint64_t seed, double scale, double min_abs) {
  // Distinct values (no ties in max pooling), about uniform in +-[min_abs, scale].
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    const double u = uniform01(counter_hash(seed, 5, i));
    const double t = 2 * u - 1;
    v[i] = static_cast<float>((t < 0 ? -1.0 : 1.0) * (min_abs + (scale - min_abs) * std::abs(t)));
  }
  return v;
}

constexpr double tolerance = 1e-4;
int failures = 0;

template <class Network>
void agreement_row(const char* name) {
  double worst[3] = {0, 0, 0};
  for (std::size_t batch : {1, 7, 32}) {
    pass_input in;
    in.batch = batch;
    in.params = as_floats(Network::parameter_count, 100 + batch, 0.3, 0.01);
    in.x = as_floats(batch * Network::input_shape::size, 200 + batch, 1.0, 0.0);
    in.dy = as_floats(batch * Network::output_shape::size, 300 + batch, 1.0, 0.0);
    const pass_result r = run_pass<Network, reference>(in);
    const pass_result g = run_pass<Network, cuda>(in);
    worst[0] = std::max(worst[0], max_rel_error(g.y, r.y));
    worst[1] = std::max(worst[1], max_rel_error(g.dx, r.dx));
    worst[2] = std::max(worst[2], max_rel_error(g.dparams, r.dparams));
  }
  const bool ok = worst[0] <= tolerance && worst[1] <= tolerance && worst[2] <= tolerance;
  failures += ok ? 0 : 1;
  std::printf("| %-22s | %9.2e | %9.2e | %9.2e | %-4s |\n", name, worst[0], worst[1], worst[2], ok ? "ok" : "FAIL");
  std::fflush(stdout);
}

/// |got - want| / |want| in the 2-norm (bf16 errors scale with a sum's terms, not the sum).
double normwise_error(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return INFINITY;
  double d2 = 0, n2 = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    d2 += (static_cast<double>(got[i]) - want[i]) * (static_cast<double>(got[i]) - want[i]);
    n2 += static_cast<double>(want[i]) * want[i];
  }
  return n2 > 0 && std::isfinite(d2) ? std::sqrt(d2 / n2) : INFINITY;
}

/// loom::cuda in bf16 against the reference in bf16, worst normwise error over batches 1, 7, 32.
/// `tolerance`: 1e-2 for one layer (cuDNN's TF32 convolutions against bf16 rounding); more for
/// networks, where bf16 flips some ReLU and max-pool choices.
template <class Network>
void bf16_agreement_row(const char* name, double tolerance) {
  double worst[3] = {0, 0, 0};
  for (std::size_t batch : {1, 7, 32}) {
    pass_input in;
    in.batch = batch;
    in.math = math_mode::bf16;
    in.params = as_floats(Network::parameter_count, 100 + batch, 0.3, 0.01);
    in.x = as_floats(batch * Network::input_shape::size, 200 + batch, 1.0, 0.0);
    in.dy = as_floats(batch * Network::output_shape::size, 300 + batch, 1.0, 0.0);
    const pass_result r = run_pass<Network, reference>(in);
    const pass_result g = run_pass<Network, cuda>(in);
    worst[0] = std::max(worst[0], normwise_error(g.y, r.y));
    worst[1] = std::max(worst[1], normwise_error(g.dx, r.dx));
    worst[2] = std::max(worst[2], normwise_error(g.dparams, r.dparams));
  }
  const bool ok = worst[0] <= tolerance && worst[1] <= tolerance && worst[2] <= tolerance;
  failures += ok ? 0 : 1;
  std::printf("| %-22s | %9.2e | %9.2e | %9.2e | %-4s | (tolerance %.0e)\n", name, worst[0], worst[1], worst[2],
              ok ? "ok" : "FAIL", tolerance);
  std::fflush(stdout);
}

template <class Network>
void training_row(const char* name, std::size_t steps) {
  const auto t0 = std::chrono::steady_clock::now();
  const train_result g = run_training<Network, cuda>(steps);
  const train_result r = run_training<Network, reference>(steps);
  const double d_train = std::abs(g.train_loss - r.train_loss), d_eval = std::abs(g.eval_loss - r.eval_loss);
  const bool ok = d_train <= 1e-3 && d_eval <= 1e-3;
  failures += ok ? 0 : 1;
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("| %-10s | %5zu | %10.6f | %10.6f | %9.2e | %10.6f | %10.6f | %9.2e | %-4s | (%.1f s)\n", name, steps,
              g.train_loss, r.train_loss, d_train, g.eval_loss, r.eval_loss, d_eval, ok ? "ok" : "FAIL", s);
  std::fflush(stdout);
}

// ---- training throughput -------------------------------------------------------------------

using main_mlp = network<input<784>, linear<256>, relu, linear<128>, relu, linear<10>>;
using main_cnn = network<input<1, 28, 28>, conv2d<32, 3, 1, 1>, relu, max_pool2d<2>, conv2d<64, 3, 1, 1>, relu,
                         max_pool2d<2>, flatten, linear<128>, relu, linear<10>>;

/// 28 x 28 byte images with random pixels and labels, as many as a few epochs need.
template <class Shape>
struct random_images {
  using sample_shape = Shape;
  static constexpr std::size_t classes = 10;
  explicit random_images(std::size_t n) : px_(n * Shape::size), labels_(n) {
    for (std::size_t i = 0; i < px_.size(); ++i) px_[i] = static_cast<std::uint8_t>(counter_hash(3, 1, i));
    for (std::size_t i = 0; i < n; ++i) labels_[i] = static_cast<std::uint8_t>(counter_hash(3, 2, i) % classes);
  }
  std::size_t size() const { return labels_.size(); }
  const std::uint8_t* pixels(std::size_t i) const { return px_.data() + i * Shape::size; }
  int label(std::size_t i) const { return labels_[i]; }
  std::vector<std::uint8_t> px_, labels_;
};

std::map<std::pair<std::string, std::size_t>, double> read_torch(const std::string& path) {
  std::map<std::pair<std::string, std::size_t>, double> out;
  if (path.empty()) return out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string tag, model;
    std::size_t batch = 0;
    double rate = 0;
    if (ls >> tag >> model >> batch >> rate && tag == "torch") out[{model, batch}] = rate;
  }
  return out;
}

/// Samples per second of Network's training on cuda in math mode m.
template <class Network>
double throughput(std::size_t batch, double seconds, math_mode m) {
  static const random_images<typename Network::input_shape> data(16384);
  trainer<Network, softmax_cross_entropy, sgd, single_process, cuda> t{{.lr = 0.02f, .momentum = 0.9f},
                                                                       {.seed = 1, .math = m}};
  fit_options o;
  o.epochs = 1000;
  o.batch = batch;
  o.progress = nullptr;
  o.max_steps = 20;  // warm-up: algorithm choice, allocations
  const fit_result warm = t.fit(data, o);
  const double rate0 = warm.samples_per_s() > 0 ? warm.samples_per_s() : 1000;
  const std::size_t steps = std::max<std::size_t>(20, static_cast<std::size_t>(rate0 * seconds / batch));
  o.max_steps = t.steps() + steps;
  const fit_result f = t.fit(data, o);
  return f.samples_per_s();
}

template <class Network>
void throughput_row(const char* name, std::size_t batch, double seconds,
                    const std::map<std::pair<std::string, std::size_t>, double>& torch) {
  const double rate = throughput<Network>(batch, seconds, math_mode::fp32);
  const double bf16 = cuda::supports(math_mode::bf16) ? throughput<Network>(batch, seconds, math_mode::bf16) : 0;
  char bf16_text[32] = "-", speedup[16] = "-";
  if (bf16 > 0) {
    std::snprintf(bf16_text, sizeof bf16_text, "%.0f", bf16);
    std::snprintf(speedup, sizeof speedup, "%.2f", bf16 / rate);
  }
  const auto it = torch.find({name, batch});
  if (it != torch.end())
    std::printf("| %-5s | %5zu | %12.0f | %12s | %9s | %12.0f | %6.2f |\n", name, batch, rate, bf16_text, speedup,
                it->second, rate / it->second);
  else
    std::printf("| %-5s | %5zu | %12.0f | %12s | %9s | %12s | %6s |\n", name, batch, rate, bf16_text, speedup, "-", "-");
  std::fflush(stdout);
}

// ---- GEMM ----------------------------------------------------------------------------------

/// Seconds per call of f on the compute stream: warm-up, then repeats until `budget` seconds.
template <class F>
double time_on_stream(F&& f, double budget) {
  cudaStream_t s = cuda_compute_stream();
  cudaEvent_t a, b;
  LOOM_CUDA_CHECK(cudaEventCreate(&a));
  LOOM_CUDA_CHECK(cudaEventCreate(&b));
  f();
  f();
  LOOM_CUDA_CHECK(cudaStreamSynchronize(s));
  int reps = 1;
  float ms = 0;
  for (;;) {
    LOOM_CUDA_CHECK(cudaEventRecord(a, s));
    for (int i = 0; i < reps; ++i) f();
    LOOM_CUDA_CHECK(cudaEventRecord(b, s));
    LOOM_CUDA_CHECK(cudaEventSynchronize(b));
    LOOM_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    if (ms / 1000.0 >= budget || reps >= 1 << 12) break;
    reps *= 2;
  }
  LOOM_CUDA_CHECK(cudaEventDestroy(a));
  LOOM_CUDA_CHECK(cudaEventDestroy(b));
  return ms / 1000.0 / reps;
}

void gemm_rows(bool quick) {
  cublasHandle_t h;
  LOOM_CUDA_CHECK(cublasCreate(&h));
  LOOM_CUDA_CHECK(cublasSetStream(h, cuda_compute_stream()));
  std::vector<std::tuple<std::size_t, std::size_t, std::size_t>> sizes = {{1024, 1024, 1024}, {4096, 4096, 4096},
                                                                          {8192, 8192, 8192}, {256, 784, 4096}};
  if (quick) sizes.resize(2);
  for (const auto& size : sizes) {
    const std::size_t m = std::get<0>(size), n = std::get<1>(size), k = std::get<2>(size);
    buffer<float, cuda_space> a(m * k), b(k * n), c(m * n);
    const float one = 1, zero = 0;
    const double flops = 2.0 * m * n * k;
    const double t_loom = time_on_stream(
        [&] { cuda::gemm(false, false, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f, c.data(), n); }, 0.25);
    const double t_cublas = time_on_stream(
        [&] {
          LOOM_CUDA_CHECK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                                      static_cast<int>(k), &one, b.data(), static_cast<int>(n), a.data(),
                                      static_cast<int>(k), &zero, c.data(), static_cast<int>(n)));
        },
        0.25);
    std::printf("| %5zu x %5zu x %5zu | %8.2f | %8.2f | %6.3f |\n", m, n, k, flops / t_loom / 1e12,
                flops / t_cublas / 1e12, t_cublas / t_loom);
    std::fflush(stdout);
  }
  LOOM_CUDA_CHECK(cublasDestroy(h));
}

// ---- NCCL ----------------------------------------------------------------------------------

#if defined(LOOM_GPU_CHECK_NCCL)
void nccl_check(const char* op, ncclResult_t r) {
  if (r != ncclSuccess) throw backend_error(std::string("gpu_check: ") + op + ": " + ncclGetErrorString(r));
}

void nccl_rows(bool quick) {
  ncclUniqueId id;
  nccl_check("ncclGetUniqueId", ncclGetUniqueId(&id));
  ncclComm_t comm;
  nccl_check("ncclCommInitRank", ncclCommInitRank(&comm, 1, id, 0));
#if defined(LOOM_GPU_CHECK_MPI)
  loom::mpi::environment env;
  nccl_comm loom_comm = nccl_comm::world();
#endif
  std::vector<std::size_t> sizes = {1 << 20, 16 << 20, 256 << 20};
  if (quick) sizes.resize(2);
  for (std::size_t bytes : sizes) {
    const std::size_t n = bytes / sizeof(float);
    buffer<float, cuda_space> x(n), y(n);
    const double t_raw = time_on_stream(
        [&] { nccl_check("ncclAllReduce", ncclAllReduce(x.data(), y.data(), n, ncclFloat32, ncclSum, comm, cuda_compute_stream())); },
        0.2);
#if defined(LOOM_GPU_CHECK_MPI)
    const auto t0 = std::chrono::steady_clock::now();
    int reps = 0;
    do {
      loom_comm.allreduce(x.data(), n, reduce_op::sum);
      ++reps;
    } while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 0.2);
    const double t_loom = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
    std::printf("| %9.1f MiB | %10.1f | %10.1f |\n", bytes / 1048576.0, bytes / t_loom / 1e9, bytes / t_raw / 1e9);
#else
    std::printf("| %9.1f MiB | %10s | %10.1f |\n", bytes / 1048576.0, "(no MPI)", bytes / t_raw / 1e9);
#endif
    std::fflush(stdout);
  }
  (void)ncclCommDestroy(comm);
}
#endif

}  // namespace

int main(int argc, char** argv) {
  options o;
  if (const int rc = parse(argc, argv, o); rc != 0) return rc < 0 ? 0 : rc;
  if (cuda_device_count() == 0) {
    std::printf("no CUDA device: skipped\n");
    return 77;
  }
  try {
    int runtime = 0, driver = 0;
    cudaRuntimeGetVersion(&runtime);
    cudaDriverGetVersion(&driver);
    std::printf("device 0: %s; CUDA runtime %d.%d, driver %d.%d; cuDNN %zu; loom::cuda (FP32, no TF32)\n\n",
                cuda_device_name(0).c_str(), runtime / 1000, runtime % 1000 / 10, driver / 1000, driver % 1000 / 10,
                cudnnGetVersion());
    if (o.agreement) {
      std::printf("## loom::cuda against the serial host reference (max relative error, batches 1, 7, 32; "
                  "tolerance %.0e)\n\n", tolerance);
      std::printf("| %-22s | %-9s | %-9s | %-9s | %-4s |\n", "case", "output", "input grad", "param grad", "");
      std::printf("|------------------------|-----------|-----------|-----------|------|\n");
#define LOOM_GPU_CHECK_ROW(name) agreement_row<name>(#name);
      LOOM_CUDA_TEST_PASS_CASES(LOOM_GPU_CHECK_ROW)
#undef LOOM_GPU_CHECK_ROW
      std::printf("\n## training: SGD steps on cuda and on the reference, final losses (tolerance 1e-3)\n\n");
      std::printf("| %-10s | %-5s | %-10s | %-10s | %-9s | %-10s | %-10s | %-9s | %-4s |\n", "network", "steps",
                  "train cuda", "train ref", "diff", "eval cuda", "eval ref", "diff", "");
      std::printf("|------------|-------|------------|------------|-----------|------------|------------|-----------|------|\n");
      training_row<train_mlp>("mlp", o.quick ? 50 : 200);
      training_row<train_cnn>("cnn", o.quick ? 50 : 200);
      if (cuda::supports(math_mode::bf16)) {
        std::printf("\n## bf16 (mixed precision): loom::cuda in math_mode::bf16 against the reference in bf16 "
                    "(normwise error, batches 1, 7, 32; cuDNN convolutions run TF32)\n\n");
        std::printf("| %-22s | %-9s | %-9s | %-9s | %-4s |\n", "case", "output", "input grad", "param grad", "");
        std::printf("|------------------------|-----------|-----------|-----------|------|\n");
        bf16_agreement_row<linear_case>("linear_case", 1e-2);
        bf16_agreement_row<conv_case>("conv_case", 1e-2);
        bf16_agreement_row<conv_strided_case>("conv_strided_case", 1e-2);
        bf16_agreement_row<mlp_case>("mlp_case", 0.15);
        bf16_agreement_row<cnn_case>("cnn_case", 0.15);
      } else {
        std::printf("\n## bf16 (mixed precision): not checked: this GPU has no bf16 tensor cores (compute "
                    "capability below 8.0)\n");
      }
    }
    if (o.training) {
      const auto torch = read_torch(o.torch_results);
      std::printf("\n## training throughput (samples/s, SGD momentum, synthetic 28x28 data through loom::trainer)\n\n");
      std::printf("| %-5s | %-5s | %-12s | %-12s | %-9s | %-12s | %-6s |\n", "model", "batch", "loom cuda", "loom bf16",
                  "bf16/fp32", "pytorch", "ratio");
      std::printf("|-------|-------|--------------|--------------|-----------|--------------|--------|\n");
      const double seconds = o.quick ? 0.5 : 2.0;
      for (std::size_t batch : {64, 256}) throughput_row<main_mlp>("mlp", batch, seconds, torch);
      for (std::size_t batch : {64, 256}) throughput_row<main_cnn>("cnn", batch, seconds, torch);
    }
    if (o.gemm) {
      std::printf("\n## FP32 GEMM (TFLOP/s), row-major through loom::cuda::gemm and cublasSgemm directly\n\n");
      std::printf("| %-21s | %-8s | %-8s | %-6s |\n", "m x n x k", "loom", "cuBLAS", "ratio");
      std::printf("|-----------------------|----------|----------|--------|\n");
      gemm_rows(o.quick);
    }
    if (o.nccl) {
#if defined(LOOM_GPU_CHECK_NCCL)
      std::printf("\n## NCCL allreduce, one rank (GB/s of buffer per call): loom::nccl_comm and ncclAllReduce\n\n");
      std::printf("| %-13s | %-10s | %-10s |\n", "size", "loom", "NCCL");
      std::printf("|---------------|------------|------------|\n");
      nccl_rows(o.quick);
#else
      std::printf("\n## NCCL allreduce: not measured (built without NCCL: nccl.h was not found)\n");
#endif
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpu_check: %s\n", e.what());
    return 1;
  }
  std::printf("\n%s\n", failures ? "gpu_check: SOME AGREEMENT CHECKS FAILED" : "gpu_check: all agreement checks passed");
  return failures ? 1 : 0;
}
