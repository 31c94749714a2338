// SPDX-License-Identifier: Apache-2.0
// Layers written outside loom, in this file alone, used as loom's own are: a swish with a
// learnable beta that describes itself with members (its text, its tensor under its own PyTorch
// name, its ONNX nodes, what it keeps for backward), and a per-feature scale_shift, as if from a
// library one cannot edit, described by a loom::layer_traits specialisation. A network of both
// (one inside a residual) trains in a trainer, checkpoints and resumes bitwise, saves and loads
// its weights under the layers' names, gets its memory plan, and exports to ONNX: the hidden case
// "[own_layer_files]" writes the files that check_onnx.py runs in ONNX Runtime
// (io.own_layer.onnx_runtime).

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "loom/comm/local.hpp"
#include "loom/io/checkpoint.hpp"
#include "loom/io/onnx.hpp"
#include "loom/io/safetensors.hpp"
#include "loom/loom.hpp"

namespace {

// ---- swish: described by its members -------------------------------------------------------------

/// y = x sigmoid(beta x) and its gradients, element by element (LOOM_HD functors, as loom's kernels).
template <class T>
struct swish_forward {
  const T* x;
  const T* beta;
  T* s;  // sigmoid(beta x), kept for backward
  T* y;
  LOOM_HD void operator()(std::size_t i) const {
    s[i] = T(1) / (T(1) + std::exp(-beta[0] * x[i]));
    y[i] = x[i] * s[i];
  }
};
template <class T>
struct swish_input_gradient {
  const T* x;
  const T* beta;
  const T* s;
  const T* dy;
  T* dx;
  LOOM_HD void operator()(std::size_t i) const { dx[i] = dy[i] * (s[i] + beta[0] * x[i] * s[i] * (T(1) - s[i])); }
};
/// d beta = sum over the batch of dy x^2 s (1 - s): one index, a sequential sum (the same on every run).
template <class T>
struct swish_beta_gradient {
  const T* x;
  const T* s;
  const T* dy;
  T* dbeta;
  std::size_t n;
  bool accumulate;
  LOOM_HD void operator()(std::size_t) const {
    double sum = 0;
    for (std::size_t i = 0; i < n; ++i) sum += double(dy[i]) * x[i] * x[i] * s[i] * (T(1) - s[i]);
    dbeta[0] = (accumulate ? dbeta[0] : T(0)) + T(sum);
  }
};

/// Swish with a learnable beta, y = x sigmoid(beta x), as a torch module with
/// `self.beta = nn.Parameter(torch.ones(1))`. Any shape; one parameter. It keeps sigmoid(beta x)
/// from forward for backward.
struct swish {
  static constexpr bool is_loom_layer = true;
  static constexpr const char* name = "swish";
  template <class In>
  static constexpr bool accepts = true;
  template <std::size_t Index, class In>
  static constexpr bool check() {
    return true;
  }
  template <class In>
  using output_shape = In;
  template <class In>
  static constexpr std::size_t parameter_count = 1;
  template <class In>
  static constexpr double flops = 4.0 * In::size;

  // How it saves, exports and plans.
  template <class In>
  static void describe(loom::layer_description& d) {
    d.set_text("swish");
    d.parameter("beta", {1});
  }
  static std::string onnx(loom::onnx_graph& g, const loom::layer_description& d, const std::string& x) {
    const std::string bx = g.add_node("Mul", {x, g.initializer(d.tensors[0])});
    return g.add_node("Mul", {x, g.add_node("Sigmoid", {bx})});
  }
  template <class In, class Backend>
  static constexpr loom::sequence_elements footprint(const loom::footprint_context&) {
    return {.saved = In::size};  // s_
  }
  template <class In, class Backend>
  static constexpr loom::layout_effect layout = loom::layout_effect::keeps;

  template <class In, class T, class Backend>
  class impl {
   public:
    explicit impl(loom::layer_site) {}
    void initialize(T* params, std::uint64_t) const { params[0] = T(1); }
    void forward(const loom::run_context&, const T* params, loom::activation<const T, Backend> x,
                 loom::activation<T, Backend>& y, std::size_t batch) {
      s_.reserve_discard(batch * In::size);
      Backend::for_each(batch * In::size, swish_forward<T>{x.data, params, s_.data(), y.data});
      y.format = x.format;
    }
    void backward(const loom::run_context& ctx, const T* params, loom::activation<const T, Backend> x,
                  loom::activation<const T, Backend>, const T* dy, T* dx, T* dparams, std::size_t batch) {
      Backend::for_each(1, swish_beta_gradient<T>{x.data, s_.data(), dy, dparams, batch * In::size, ctx.accumulate});
      if (dx) Backend::for_each(batch * In::size, swish_input_gradient<T>{x.data, params, s_.data(), dy, dx});
    }

   private:
    loom::buffer<T, typename Backend::memory_space> s_;  // (batch, In): sigmoid(beta x)
  };
};

}  // namespace

// ---- scale_shift: a layer one cannot edit ---------------------------------------------------------

namespace thirdparty {

template <class T, std::size_t Width>
struct scale_shift_forward {
  const T* x;
  const T* w;
  T* y;
  LOOM_HD void operator()(std::size_t i) const { y[i] = x[i] * w[i % Width] + w[Width + i % Width]; }
};
template <class T, std::size_t Width>
struct scale_shift_backward {
  const T* x;
  const T* w;
  const T* dy;
  T* dx;  // may be null
  T* dw;
  std::size_t batch;
  bool accumulate;
  LOOM_HD void operator()(std::size_t j) const {
    T dscale = accumulate ? dw[j] : T(0), dshift = accumulate ? dw[Width + j] : T(0);
    for (std::size_t n = 0; n < batch; ++n) {
      dscale += dy[n * Width + j] * x[n * Width + j];
      dshift += dy[n * Width + j];
      if (dx) dx[n * Width + j] = dy[n * Width + j] * w[j];
    }
    dw[j] = dscale, dw[Width + j] = dshift;
  }
};

/// y = x * weight + bias per feature; weight (init 1), then bias (init 0), each of the sample's
/// shape. It knows nothing of loom's file formats or memory plan.
struct scale_shift {
  static constexpr bool is_loom_layer = true;
  static constexpr const char* name = "scale_shift";
  template <class In>
  static constexpr bool accepts = true;
  template <std::size_t Index, class In>
  static constexpr bool check() {
    return true;
  }
  template <class In>
  using output_shape = In;
  template <class In>
  static constexpr std::size_t parameter_count = 2 * In::size;
  template <class In>
  static constexpr double flops = 2.0 * In::size;

  template <class In, class T, class Backend>
  class impl {
   public:
    explicit impl(loom::layer_site) {}
    void initialize(T* params, std::uint64_t) const {
      for (std::size_t j = 0; j < In::size; ++j) params[j] = T(1), params[In::size + j] = T(0);
    }
    void forward(const loom::run_context&, const T* params, loom::activation<const T, Backend> x,
                 loom::activation<T, Backend>& y, std::size_t batch) {
      Backend::for_each(batch * In::size, scale_shift_forward<T, In::size>{x.data, params, y.data});
      y.format = {};
    }
    void backward(const loom::run_context& ctx, const T* params, loom::activation<const T, Backend> x,
                  loom::activation<const T, Backend>, const T* dy, T* dx, T* dparams, std::size_t batch) {
      Backend::for_each(In::size, scale_shift_backward<T, In::size>{x.data, params, dy, dx, dparams, batch, ctx.accumulate});
    }
  };
};

}  // namespace thirdparty

/// scale_shift described from outside: its weights under PyTorch's names (weight, bias of the
/// sample's shape) and its ONNX nodes. It holds nothing but its output and writes it plain,
/// loom's defaults, so it has no footprint or layout.
template <>
struct loom::layer_traits<thirdparty::scale_shift> {
  template <class In>
  static void describe(loom::layer_description& d) {
    d.set_text("scale_shift");
    d.parameter("weight", In::dims);
    d.parameter("bias", In::dims);
  }
  static std::string onnx(loom::onnx_graph& g, const loom::layer_description& d, const std::string& x) {
    const std::string scaled = g.add_node("Mul", {x, g.initializer(d.tensors[0])});
    return g.add_node("Add", {scaled, g.initializer(d.tensors[1])});
  }
};

namespace {

namespace fs = std::filesystem;

/// Both layers, swish also inside a residual.
using net = loom::network<loom::input<784>, loom::linear<64>, swish, loom::linear<32>, thirdparty::scale_shift,
                          loom::residual<loom::linear<32>, swish>, loom::linear<10>>;

// ---- The memory plan (compile time) --------------------------------------------------------------

constexpr std::size_t f32 = 4;
constexpr std::size_t params = (784 * 64 + 64) + 1 + (64 * 32 + 32) + 2 * 32 + (32 * 32 + 32 + 1) + (32 * 10 + 10);
static_assert(net::parameter_count == params);
using plan = loom::memory_plan<net, loom::sgd, loom::single_process, loom::with_momentum>;
static_assert(plan::parameter_bytes == f32 * params && plan::optimizer_state_bytes == f32 * params);
// Every layer's output (64, 64, 32, 32, the residual's 32, 10) and the residual's inner outputs
// (32, 32); swish keeps its sigmoid besides (64, and 32 inside the residual).
static_assert(plan::activation_bytes_per_sample == f32 * ((64 + 64 + 32 + 32 + 32 + 10) + (32 + 32) + (64 + 32)));
// Backward's two gradient buffers (64 each), the residual's inner one (32) and dx_inner_ (32),
// the loss gradient (10) and workspace (a double and a byte).
static_assert(plan::workspace_bytes_per_sample == f32 * (64 + 64 + 32 + 32 + 10) + 9);
static_assert(plan::workspace_bytes == 0 && plan::communication_bytes == 0);

const loom::data::fashion_mnist_set& data() {
  static const auto s = loom::data::fashion_mnist(loom::data::split::train).first(1000);
  return s;
}

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("loom_own_layer_test_" + name);
  fs::remove_all(d);
  return d;
}

loom::fit_options options(std::size_t max_steps, const fs::path& dir = {}, std::size_t every = 0) {
  loom::fit_options o;
  o.epochs = 10;
  o.max_steps = max_steps;
  o.batch = 64;
  o.accumulation = 2;
  o.progress = nullptr;
  o.checkpoint.directory = dir.string();
  o.checkpoint.every_steps = every;
  o.checkpoint.at_end = false;  // as if killed after the last periodic checkpoint
  o.checkpoint.on_signal = false;
  return o;
}

/// Trains net under Policy on `ranks` ranks (threads), calling body(trainer) on each; returns
/// rank 0's gather of the parameters.
template <class Policy, class Body>
std::vector<float> on_ranks(int ranks, Body&& body) {
  std::vector<float> out;
  const loom::adam::options adam{.lr = 2e-3f};
  if constexpr (std::is_same_v<Policy, loom::single_process>) {
    loom::trainer<net, loom::softmax_cross_entropy, loom::adam> t{adam, {.seed = 3, .threads = 1}};
    body(t);
    out = t.gather_parameters();
  } else {
    std::mutex m;
    loom::local_world(ranks).run([&](loom::local_comm& c) {
      loom::trainer<net, loom::softmax_cross_entropy, loom::adam, Policy> t{c, adam, {.seed = 3, .threads = 1}};
      body(t);
      auto p = t.gather_parameters();
      std::lock_guard<std::mutex> lock(m);
      if (t.rank() == 0) out = std::move(p);
    });
  }
  return out;
}

/// The uninterrupted run of 21 steps against a run stopped at 15 (checkpoints every 6: step 12
/// survives) and resumed to 21.
template <class Policy>
void check_exact_resume(int ranks, const std::string& name) {
  constexpr std::size_t total = 21, stop_at = 15, every = 6;
  const auto whole = on_ranks<Policy>(ranks, [&](auto& t) { t.fit(data(), options(total)); });
  const fs::path dir = fresh_dir(name);
  on_ranks<Policy>(ranks, [&](auto& t) { t.fit(data(), options(stop_at, dir, every)); });
  // The checkpoint names the layers' tensors and their optimizer state as the weights file does.
  auto text_of = [](const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const std::string model_index = text_of(dir / "step-12" / "model.safetensors.index.json");
  const std::string optimizer_index = text_of(dir / "step-12" / "optimizer.safetensors.index.json");
  for (const char* n : {"\"1.beta\"", "\"3.weight\"", "\"3.bias\"", "\"4.1.beta\""})
    CHECK(model_index.find(n) != std::string::npos);
  CHECK(optimizer_index.find("\"1.beta.exp_avg\"") != std::string::npos);
  std::size_t resumed_from = 0;
  const auto resumed = on_ranks<Policy>(ranks, [&](auto& t) {
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

/// The parameters of a short training run (every layer's moved from its initialisation).
const std::vector<float>& trained() {
  static const std::vector<float> p = on_ranks<loom::single_process>(1, [](auto& t) { t.fit(data(), options(8)); });
  return p;
}

template <class F>
std::size_t measure_peak(F&& run) {
  const std::size_t base = loom::host_memory().live_bytes;
  loom::reset_host_memory_peak();
  run();
  return loom::host_memory().peak_bytes - base;
}

}  // namespace

TEST_CASE("Layers written outside loom are described by their members or by loom::layer_traits", "[io][own_layer]") {
  const auto d = loom::io::describe<net>();
  CHECK(d.text() == "network<input<784>,linear<64>,swish,linear<32>,scale_shift,residual<linear<32>,swish>,linear<10>>");
  struct expected {
    const char* name;
    std::vector<std::size_t> shape;
  };
  const std::vector<expected> want{{"0.weight", {64, 784}}, {"0.bias", {64}},         {"1.beta", {1}},
                                   {"2.weight", {32, 64}},  {"2.bias", {32}},         {"3.weight", {32}},
                                   {"3.bias", {32}},        {"4.0.weight", {32, 32}}, {"4.0.bias", {32}},
                                   {"4.1.beta", {1}},       {"5.weight", {10, 32}},   {"5.bias", {10}}};
  const auto got = d.tensors();
  REQUIRE(got.size() == want.size());
  std::size_t at = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("tensor " << i);
    CHECK(got[i].name == want[i].name);
    CHECK(got[i].shape == want[i].shape);
    CHECK(got[i].offset == at);  // they tile the flat buffer in order
    at += got[i].count;
  }
  CHECK(at == net::parameter_count);
}

TEST_CASE("A network of layers written outside loom checkpoints and resumes bitwise", "[io][own_layer][checkpoint]") {
  check_exact_resume<loom::single_process>(1, "single");
  check_exact_resume<loom::data_parallel<loom::local_comm>>(2, "data_parallel");
}

TEST_CASE("Layers written outside loom save and load their weights under their own PyTorch names", "[io][own_layer]") {
  const fs::path dir = fresh_dir("weights");
  fs::create_directories(dir);
  const auto& p = trained();
  loom::save_weights<net, float>(p, dir / "own.safetensors");
  const loom::io::safetensors_file f(dir / "own.safetensors");
  std::vector<std::string> names;
  for (const auto& e : f.tensors()) names.push_back(e.name);
  CHECK_THAT(names, Catch::Matchers::UnorderedEquals(std::vector<std::string>{
                        "0.weight", "0.bias", "1.beta", "2.weight", "2.bias", "3.weight", "3.bias", "4.0.weight",
                        "4.0.bias", "4.1.beta", "5.weight", "5.bias"}));
  REQUIRE(f.find("1.beta") != nullptr);
  float beta = 0;
  f.read(*f.find("1.beta"), &beta);
  CHECK(beta == p[784 * 64 + 64]);
  CHECK(beta != 1.0f);  // trained
  loom::model<net> m(99);
  loom::load_weights(m, dir / "own.safetensors");
  CHECK(m.copy_parameters_to_host() == p);
  fs::remove_all(dir);
}

TEST_CASE("The memory plan of layers written outside loom is the bytes their buffers hold at the peak of fit",
          "[io][own_layer][memory_plan]") {
  constexpr std::size_t batch = 50;
  const auto images = data().first(4 * batch);
  const std::size_t measured = measure_peak([&] {
    loom::trainer<net, loom::softmax_cross_entropy, loom::sgd> t{{.lr = 0.02f, .momentum = 0.9f}, {.seed = 1, .threads = 2}};
    loom::fit_options o;
    o.epochs = 1;
    o.batch = batch;
    o.progress = nullptr;
    t.fit(images, o);
  });
  CHECK(measured == plan::bytes_per_rank(batch));
}

TEST_CASE("Layers written outside loom export to ONNX (the files check_onnx.py runs)", "[.][own_layer_files]") {
  const char* dir_env = std::getenv("LOOM_OWN_LAYER_DIR");
  REQUIRE(dir_env != nullptr);
  const fs::path dir = dir_env;
  fs::create_directories(dir);
  const auto& p = trained();
  const std::span<const float> ps(p);
  const std::string base = (dir / "own").string();
  loom::save_weights<net, float>(ps, base + ".safetensors");
  loom::export_onnx<net>(ps, base + ".onnx");
  loom::export_onnx<net>(ps, base + ".fp16.onnx", {.precision = loom::onnx_precision::fp16});
  loom::export_onnx<net>(ps, base + ".bf16.onnx", {.precision = loom::onnx_precision::bf16});
  loom::export_onnx<net>(ps, base + ".softmax.onnx", {.softmax = true});
  loom::export_onnx<net>(ps, base + ".external.onnx", {.external_data = loom::onnx_external_data::always});
  // Inputs and loom's outputs at batch 1 and 7, as io_fixtures writes them.
  loom::model<net> m(1);
  m.copy_parameters_from_host(p);
  auto inputs = [](std::size_t b) {
    std::vector<float> x(b * 784);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(loom::normal_at(5, b, i));
    return x;
  };
  auto outputs = [&](const std::vector<float>& x, std::size_t b) {
    loom::run_context ctx;
    ctx.training = false;
    const float* y = m.forward(ctx, x.data(), b);
    return std::vector<float>(y, y + b * 10);
  };
  const auto x1 = inputs(1), x7 = inputs(7);
  const auto y1 = outputs(x1, 1), y7 = outputs(x7, 7);
  const std::vector<loom::io::named_tensor<float>> io{
      {"x1", {1, 784}, x1}, {"x7", {7, 784}, x7}, {"y1", {1, 10}, y1}, {"y7", {7, 10}, y7}};
  loom::io::write_safetensors<float>(base + ".io.safetensors", io);
  const std::string onnx = [&] {
    std::ifstream in(base + ".onnx", std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  CHECK(onnx.find("/1/Sigmoid") != std::string::npos);  // swish's nodes, named after its path
  CHECK(onnx.find("/4/1/Sigmoid") != std::string::npos);
  CHECK(onnx.find("/3/Add") != std::string::npos);  // scale_shift's
}
