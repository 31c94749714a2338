// SPDX-License-Identifier: Apache-2.0
// The recipe options against PyTorch (check_recipe_torch.py reads what this writes):
//   recipe_fixtures write DIR   recipe_loss.safetensors: random logits and labels, loom's mean
//                               softmax_cross_entropy and its gradient at label smoothing 0.1 and
//                               0.3; recipe_init / recipe_final.safetensors: a conv + batch_norm +
//                               linear + layer_norm network before and after 3 SGD steps (momentum,
//                               weight decay with decay_norm_and_bias = false, label smoothing) on
//                               one batch, which recipe_run.safetensors holds with the losses.

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "loom/io/safetensors.hpp"
#include "loom/loom.hpp"

namespace {

namespace fs = std::filesystem;
using cnn = loom::network<loom::input<1, 28, 28>, loom::conv2d<4, 3, 2, 1>, loom::batch_norm, loom::relu, loom::flatten,
                          loom::linear<16>, loom::layer_norm, loom::relu, loom::linear<10>>;

constexpr std::size_t batch = 16, steps = 3, loss_batch = 32;
constexpr float lr = 0.05f, momentum = 0.9f, weight_decay = 0.05f, smoothing = 0.1f;

std::vector<float> values(std::size_t n, std::uint64_t seed, double scale = 1.0) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(scale * loom::normal_at(seed, 1, i));
  return v;
}

void write(const fs::path& dir) {
  fs::create_directories(dir);
  // The loss alone.
  {
    const std::vector<float> z = values(loss_batch * 10, 3, 4.0);
    std::vector<std::int32_t> labels(loss_batch);
    std::vector<float> labels_f(loss_batch);
    for (std::size_t i = 0; i < loss_batch; ++i) labels[i] = static_cast<std::int32_t>((i * 7) % 10), labels_f[i] = labels[i];
    const std::vector<float> eps{0.1f, 0.3f};
    std::vector<float> losses, grads;
    for (float e : eps) {
      loom::loss_workspace<loom::cpu> ws;
      ws.label_smoothing = e;
      std::vector<float> g(z.size());
      const auto v = loom::softmax_cross_entropy::compute<loom::cpu, 10, float>(z.data(), labels.data(), g.data(), loss_batch,
                                                                                 1.0f / loss_batch, ws);
      losses.push_back(static_cast<float>(v.sum / loss_batch));
      grads.insert(grads.end(), g.begin(), g.end());
    }
    const std::vector<loom::io::named_tensor<float>> t{{"logits", {loss_batch, 10}, z},
                                                       {"labels", {loss_batch}, labels_f},
                                                       {"eps", {2}, eps},
                                                       {"losses", {2}, losses},
                                                       {"grads", {2, loss_batch, 10}, grads}};
    loom::io::write_safetensors<float>(dir / "recipe_loss.safetensors", t);
  }
  // A few steps of the recipe.
  loom::model<cnn, float> m(7);
  loom::save_weights(m, dir / "recipe_init.safetensors");
  std::vector<float> x = values(batch * cnn::input_shape::size, 11, 0.5);
  std::vector<std::int32_t> labels(batch);
  std::vector<float> labels_f(batch);
  for (std::size_t i = 0; i < batch; ++i) labels[i] = static_cast<std::int32_t>((i * 3) % 10), labels_f[i] = labels[i];
  loom::sgd::state<float, loom::cpu> opt(
      {.lr = lr, .momentum = momentum, .weight_decay = weight_decay, .decay_norm_and_bias = false}, cnn::parameter_count);
  opt.set_decay_exempt(loom::detail::decay_exempt_of(loom::io::describe<cnn>()));
  loom::loss_workspace<loom::cpu> ws;
  ws.label_smoothing = smoothing;
  std::vector<float> dy(batch * 10), losses;
  for (std::size_t s = 0; s < steps; ++s) {
    const float* y = m.forward(loom::run_context{}, x.data(), batch);
    const auto v = loom::softmax_cross_entropy::compute<loom::cpu, 10, float>(y, labels.data(), dy.data(), batch,
                                                                               1.0f / batch, ws);
    losses.push_back(static_cast<float>(v.sum / batch));
    m.backward(loom::run_context{}, dy.data(), batch);
    opt.step(m.parameters().data(), m.gradients().data(), cnn::parameter_count, lr);
  }
  loom::save_weights(m, dir / "recipe_final.safetensors");
  const std::vector<float> settings{lr, momentum, weight_decay, smoothing};
  const std::vector<loom::io::named_tensor<float>> run{{"x", {batch, 1, 28, 28}, x},
                                                       {"labels", {batch}, labels_f},
                                                       {"losses", {steps}, losses},
                                                       {"settings", {4}, settings}};
  loom::io::write_safetensors<float>(dir / "recipe_run.safetensors", run);
  std::printf("recipe_fixtures: wrote the loss and the recipe run in %s (loss %.6f -> %.6f)\n", dir.c_str(),
              losses.front(), losses.back());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "write") {
    write(argv[2]);
    return 0;
  }
  std::fprintf(stderr, "usage: recipe_fixtures write DIR\n");
  return 2;
}
