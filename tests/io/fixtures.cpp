// SPDX-License-Identifier: Apache-2.0
// The C++ side of the io tests that real readers check (ONNX Runtime, onnx's checker, PyTorch,
// the safetensors package):
//   io_fixtures write DIR        for every case in cases.hpp: the weights (CASE.safetensors),
//                                the ONNX exports (CASE.onnx, .fp16.onnx, .bf16.onnx,
//                                .softmax.onnx, .external.onnx + its .data), and inputs with
//                                loom's outputs at batch 1 and 7 (CASE.io.safetensors)
//   io_fixtures check-torch DIR  loads the weights check_torch.py saved from PyTorch
//                                (CASE.torch.safetensors) and compares loom's forward with
//                                PyTorch's (CASE.torch_out.safetensors); exit 1 on a mismatch
//   io_fixtures predict WEIGHTS DATA OUT  loom's class for each Fashion-MNIST test image with
//                                the mlp's weights, one byte per image (for check_main_job.py)

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cases.hpp"
#include "loom/io/onnx.hpp"
#include "loom/io/safetensors.hpp"

namespace {

namespace fs = std::filesystem;

std::vector<float> read_tensor(const loom::io::safetensors_file& f, const std::string& name) {
  const auto* e = f.find(name);
  if (!e || e->dtype != "F32") throw loom::io_error(f.path().string() + ": no F32 tensor " + name);
  std::vector<float> v((e->end - e->begin) / sizeof(float));
  f.read(*e, v.data());
  return v;
}

template <class Network>
std::vector<std::size_t> batch_shape(std::size_t batch) {
  std::vector<std::size_t> s{batch};
  for (auto d : Network::input_shape::dims) s.push_back(d);
  return s;
}
template <class Network>
std::vector<std::size_t> batch_output_shape(std::size_t batch) {
  std::vector<std::size_t> s{batch};
  for (auto d : Network::output_shape::dims) s.push_back(d);
  return s;
}

struct write_case {
  fs::path dir;
  template <class Network>
  void operator()(const char* name) const {
    const std::vector<float> p = io_cases::parameters<Network>(7);
    const std::span<const float> ps(p);
    const fs::path base = dir / name;
    loom::save_weights<Network, float>(ps, base.string() + ".safetensors");
    loom::export_onnx<Network>(ps, base.string() + ".onnx");
    loom::export_onnx<Network>(ps, base.string() + ".fp16.onnx", {.precision = loom::onnx_precision::fp16});
    loom::export_onnx<Network>(ps, base.string() + ".bf16.onnx", {.precision = loom::onnx_precision::bf16});
    loom::export_onnx<Network>(ps, base.string() + ".softmax.onnx", {.softmax = true});
    loom::export_onnx<Network>(ps, base.string() + ".external.onnx", {.external_data = loom::onnx_external_data::always});
    const auto x1 = io_cases::inputs<Network>(1, 11), x7 = io_cases::inputs<Network>(7, 17);
    const auto y1 = io_cases::forward<Network>(p, x1, 1), y7 = io_cases::forward<Network>(p, x7, 7);
    std::vector<loom::io::named_tensor<float>> io{{"x1", batch_shape<Network>(1), x1},
                                                  {"x7", batch_shape<Network>(7), x7},
                                                  {"y1", batch_output_shape<Network>(1), y1},
                                                  {"y7", batch_output_shape<Network>(7), y7}};
    loom::io::write_safetensors<float>(base.string() + ".io.safetensors", io,
                                       {{"loom.network", loom::io::describe<Network>().text()}});
  }
};

struct check_torch_case {
  fs::path dir;
  bool* ok;
  template <class Network>
  void operator()(const char* name) const {
    const fs::path base = dir / name;
    loom::model<Network> m(1);
    loom::load_weights(m, base.string() + ".torch.safetensors");
    const loom::io::safetensors_file io(base.string() + ".io.safetensors");
    const loom::io::safetensors_file torch_out(base.string() + ".torch_out.safetensors");
    const auto x7 = read_tensor(io, "x7");
    const auto expected = read_tensor(torch_out, "y7");
    const auto actual = io_cases::forward<Network>(m.copy_parameters_to_host(), x7, 7);
    // Relative errors of the whole output in the 2-norm and the max norm, as the Python checks.
    double d2 = 0, n2 = 0, dmax = 0, nmax = 0;
    const bool same_size = actual.size() == expected.size();
    for (std::size_t i = 0; same_size && i < actual.size(); ++i) {
      const double d = static_cast<double>(actual[i]) - expected[i], e = expected[i];
      d2 += d * d, n2 += e * e, dmax = std::max(dmax, std::abs(d)), nmax = std::max(nmax, std::abs(e));
    }
    const double e2 = n2 > 0 ? std::sqrt(d2 / n2) : (d2 > 0 ? INFINITY : 0.0), emax = nmax > 0 ? dmax / nmax : e2;
    const bool pass = same_size && e2 <= 1e-5 && emax <= 1e-5;
    std::printf("%-12s loom with PyTorch's weights vs PyTorch (2-norm/max): %.1e/%.1e %s\n", name, e2, emax,
                pass ? "ok" : "FAILED (limit 1e-5)");
    if (!pass) *ok = false;
  }
};

int predict(const fs::path& weights, const fs::path& data, const fs::path& out) {
  using net = io_cases::mlp;
  loom::model<net> m(1);
  loom::load_weights(m, weights);
  const auto test = loom::data::fashion_mnist(data.string(), loom::data::split::test);
  std::vector<float> x(net::input_shape::size);
  std::vector<unsigned char> classes(test.size());
  constexpr std::size_t batch = 500;
  x.resize(batch * net::input_shape::size);
  loom::run_context ctx;
  ctx.training = false;
  for (std::size_t at = 0; at < test.size(); at += batch) {
    const std::size_t n = std::min(batch, test.size() - at);
    for (std::size_t k = 0; k < n; ++k) {
      const std::uint8_t* px = test.pixels(at + k);  // pixel / 255, as loom's loaders feed them
      for (std::size_t j = 0; j < net::input_shape::size; ++j)
        x[k * net::input_shape::size + j] = static_cast<float>(px[j]) / 255.0f;
    }
    const float* y = m.forward(ctx, x.data(), n);
    for (std::size_t k = 0; k < n; ++k)
      classes[at + k] = static_cast<unsigned char>(std::max_element(y + k * 10, y + k * 10 + 10) - (y + k * 10));
  }
  std::ofstream(out, std::ios::binary).write(reinterpret_cast<const char*>(classes.data()),
                                             static_cast<std::streamsize>(classes.size()));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string what = argc > 1 ? argv[1] : "";
    if (what == "write" && argc == 3) {
      fs::create_directories(argv[2]);
      io_cases::each_case(write_case{argv[2]});
      std::printf("io_fixtures: wrote every case to %s\n", argv[2]);
      return 0;
    }
    if (what == "check-torch" && argc == 3) {
      bool ok = true;
      io_cases::each_case(check_torch_case{argv[2], &ok});
      return ok ? 0 : 1;
    }
    if (what == "predict" && argc == 5) return predict(argv[2], argv[3], argv[4]);
    std::fprintf(stderr, "usage: io_fixtures write DIR | check-torch DIR | predict WEIGHTS DATA_DIR OUT\n");
    return 2;
  } catch (const loom::error& e) {
    std::fprintf(stderr, "io_fixtures: %s\n", e.what());
    return 1;
  }
}
