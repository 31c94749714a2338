// SPDX-License-Identifier: Apache-2.0
// The C++ side of the presets' checks against torchvision and ONNX Runtime (tests/models/*.py):
//   models_fixtures write DIR        resnet18.safetensors (a loom resnet<18> whose running
//                                    statistics moved in 3 training steps), resnet18.onnx, an
//                                    input batch and loom's evaluation logits for it
//                                    (resnet18.io.safetensors); and the CIFAR run for
//                                    check_cifar_sgd.py: resnet_cifar<20>'s initial weights, 20
//                                    batches, loom's loss at each of 20 SGD steps and its final
//                                    weights (cifar_*.safetensors)
//   models_fixtures check-torch DIR  loads torchvision's resnet18 weights that check_torchvision.py
//                                    saved (torchvision_resnet18.safetensors) and compares loom's
//                                    evaluation logits with torchvision's (exit 1 on a mismatch)

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "loom/io/onnx.hpp"
#include "loom/io/safetensors.hpp"
#include "loom/loom.hpp"
#include "loom/models/resnet.hpp"

namespace {

namespace fs = std::filesystem;
using resnet18 = loom::models::resnet<18>;
using cifar20 = loom::models::resnet_cifar<20>;

constexpr std::size_t eval_batch = 2;
// A run whose float rounding does not steer it: PyTorch against itself with its initial weights
// moved by 1e-7 of themselves stays within 1e-5 of its losses over these 20 steps (at batch 16
// and lr 0.01 it drifts by 1e-2: check_cifar_sgd.py prints that floor beside the comparison).
constexpr std::size_t cifar_batch = 64, cifar_steps = 20;
constexpr float cifar_lr = 5e-4f, cifar_momentum = 0.9f;

std::vector<float> values(std::size_t n, std::uint64_t seed, double scale = 1.0) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(scale * loom::normal_at(seed, 1, i));
  return v;
}

std::vector<float> read_tensor(const loom::io::safetensors_file& f, const std::string& name) {
  const auto* e = f.find(name);
  if (!e || e->dtype != "F32") throw loom::io_error(f.path().string() + ": no F32 tensor " + name);
  std::vector<float> v((e->end - e->begin) / sizeof(float));
  f.read(*e, v.data());
  return v;
}

template <class Model>
std::vector<float> evaluate(Model& m, const std::vector<float>& x, std::size_t batch) {
  loom::run_context eval;
  eval.training = false;
  const float* y = m.forward(eval, x.data(), batch);
  return {y, y + batch * Model::output_shape::size};
}

void write(const fs::path& dir) {
  fs::create_directories(dir);
  // resnet18: He-initialised, then 3 training steps of SGD so the running statistics move away
  // from (0, 1) and num_batches_tracked counts 3.
  auto m = std::make_unique<loom::model<resnet18, float>>(5);
  {
    const auto x = values(4 * resnet18::input_shape::size, 11);
    std::vector<std::int32_t> labels{1, 7, 42, 999};
    loom::sgd::state<float, loom::cpu> opt({.lr = 0.01f}, resnet18::parameter_count);
    loom::loss_workspace<loom::cpu> ws;
    std::vector<float> dy(4 * 1000);
    for (int step = 0; step < 3; ++step) {
      const float* y = m->forward(loom::run_context{}, x.data(), 4);
      loom::softmax_cross_entropy::compute<loom::cpu, 1000, float>(y, labels.data(), dy.data(), 4, 0.25f, ws);
      m->backward(loom::run_context{}, dy.data(), 4);
      opt.step(m->parameters().data(), m->gradients().data(), resnet18::parameter_count, 0.01f);
    }
  }
  loom::save_weights(*m, dir / "resnet18.safetensors");
  loom::export_onnx(*m, dir / "resnet18.onnx");
  const auto x = values(eval_batch * resnet18::input_shape::size, 13);
  const auto y = evaluate(*m, x, eval_batch);
  const std::vector<loom::io::named_tensor<float>> io{{"input", {eval_batch, 3, 224, 224}, x},
                                                      {"logits", {eval_batch, 1000}, y}};
  loom::io::write_safetensors<float>(dir / "resnet18.io.safetensors", io);

  // CIFAR: 20 SGD steps with momentum on 20 fixed batches, loom's loss at each.
  loom::model<cifar20, float> c(7);
  loom::save_weights(c, dir / "cifar_init.safetensors");
  const auto xs = values(cifar_steps * cifar_batch * cifar20::input_shape::size, 17);
  // Labels a network can learn: the class is where the mean of a sample's first channel (about
  // N(0, 1/32^2)) falls among 10 bins, so that training descends steadily rather than chasing
  // noise (where float's rounding would steer PyTorch's run and loom's apart).
  std::vector<float> labels(cifar_steps * cifar_batch);
  std::vector<std::int32_t> int_labels(labels.size());
  for (std::size_t i = 0; i < labels.size(); ++i) {
    double mean = 0;
    for (std::size_t k = 0; k < 32 * 32; ++k) mean += xs[i * cifar20::input_shape::size + k];
    const double z = mean / 32;  // about N(0, 1)
    int_labels[i] = static_cast<std::int32_t>(std::clamp(std::floor((z + 2.5) * 2), 0.0, 9.0));
    labels[i] = static_cast<float>(int_labels[i]);
  }
  loom::sgd::state<float, loom::cpu> opt({.lr = cifar_lr, .momentum = cifar_momentum}, cifar20::parameter_count);
  loom::loss_workspace<loom::cpu> ws;
  std::vector<float> dy(cifar_batch * 10), losses;
  for (std::size_t s = 0; s < cifar_steps; ++s) {
    const float* xb = xs.data() + s * cifar_batch * cifar20::input_shape::size;
    const float* y = c.forward(loom::run_context{}, xb, cifar_batch);
    const auto v = loom::softmax_cross_entropy::compute<loom::cpu, 10, float>(
        y, int_labels.data() + s * cifar_batch, dy.data(), cifar_batch, 1.0f / cifar_batch, ws);
    losses.push_back(static_cast<float>(v.sum / cifar_batch));
    c.backward(loom::run_context{}, dy.data(), cifar_batch);
    opt.step(c.parameters().data(), c.gradients().data(), cifar20::parameter_count, cifar_lr);
  }
  loom::save_weights(c, dir / "cifar_final.safetensors");
  const std::vector<float> settings{cifar_lr, cifar_momentum};
  const std::vector<loom::io::named_tensor<float>> run{{"x", {cifar_steps, cifar_batch, 3, 32, 32}, xs},
                                                       {"labels", {cifar_steps, cifar_batch}, labels},
                                                       {"losses", {cifar_steps}, losses},
                                                       {"lr_momentum", {2}, settings}};
  loom::io::write_safetensors<float>(dir / "cifar_run.safetensors", run);
  std::printf("models_fixtures: wrote resnet18 and the CIFAR run in %s (loss %.6f -> %.6f)\n", dir.c_str(), losses.front(),
              losses.back());
}

int check_torch(const fs::path& dir) {
  if (!fs::exists(dir / "torchvision_resnet18.safetensors")) {
    std::printf("no torchvision_resnet18.safetensors in %s (check_torchvision.py was skipped): skipped\n", dir.c_str());
    return 77;
  }
  auto m = std::make_unique<loom::model<resnet18, float>>(1);
  loom::load_weights(*m, dir / "torchvision_resnet18.safetensors");
  const loom::io::safetensors_file io(dir / "torchvision_resnet18.io.safetensors");
  const auto x = read_tensor(io, "input"), expected = read_tensor(io, "logits");
  const std::size_t batch = x.size() / resnet18::input_shape::size;
  const auto y = evaluate(*m, x, batch);
  double largest = 0, diff = 0;
  for (float v : expected) largest = std::max(largest, std::abs(static_cast<double>(v)));
  for (std::size_t i = 0; i < y.size(); ++i) diff = std::max(diff, std::abs(static_cast<double>(y[i]) - expected[i]));
  const double rel = diff / largest;
  std::printf("loom reads torchvision's resnet18: max |loom - torchvision| logit %.3g, relative to the largest %.3g\n", diff,
              rel);
  return rel <= 1e-5 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    loom::set_threads(2);
    const std::string cmd = argc > 1 ? argv[1] : "";
    if (cmd == "write" && argc == 3) {
      write(argv[2]);
      return 0;
    }
    if (cmd == "check-torch" && argc == 3) return check_torch(argv[2]);
    std::fprintf(stderr, "usage: models_fixtures write DIR | check-torch DIR\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "models_fixtures: %s\n", e.what());
    return 1;
  }
}
