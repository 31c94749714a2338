// SPDX-License-Identifier: Apache-2.0
// The presets of loom/models against torchvision's facts: parameter counts at 3x224x224 and
// 1,000 classes (compile time: parameters only — buffers are not parameters in torchvision's
// count), the names of the tensors (torchvision's state_dict keys), other inputs and class
// counts, and a CIFAR ResNet that trains.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <set>
#include <string>
#include <vector>

#include "loom/io/layer_description.hpp"
#include "loom/loom.hpp"
#include "loom/models/resnet.hpp"

using namespace loom;

// torchvision.models.resnet18/34/50(): sum(p.numel() for p in model.parameters()).
static_assert(models::resnet<18>::parameter_count == 11'689'512);
static_assert(models::resnet<34>::parameter_count == 21'797'672);
static_assert(models::resnet<50>::parameter_count == 25'557'032);
// Buffers: each batch norm's running mean and variance (C each) and num_batches_tracked.
static_assert(models::resnet<18>::buffer_count == 2 * 4'800 + 20);
static_assert(std::is_same_v<models::resnet<18>::output_shape, shape<1000>>);
// He et al.'s CIFAR ResNets (option B shortcuts: the 269,722 of option A plus two 1x1
// convolutions and their batch norms, 2,752).
static_assert(models::resnet_cifar<20>::parameter_count == 272'474);
static_assert(models::resnet_cifar<56>::parameter_count == 855'770);
static_assert(std::is_same_v<models::resnet_cifar<20>::output_shape, shape<10>>);
// Any input big enough, any class count: the head follows.
static_assert(std::is_same_v<models::resnet<18, 37, input<3, 64, 96>>::output_shape, shape<37>>);
static_assert(models::resnet<18, 37, input<3, 64, 96>>::parameter_count == 11'689'512 - 1000 * 513 + 37 * 513);
static_assert(std::is_same_v<models::resnet_cifar<56, 100, input<1, 28, 28>>::output_shape, shape<100>>);

TEST_CASE("resnet<18> names its tensors as torchvision's resnet18 state_dict does", "[models][resnet]") {
  const auto d = io::describe<models::resnet<18>>();
  std::vector<std::string> names;
  for (const auto& t : d.tensors()) names.push_back(t.name);
  // torchvision: 62 parameters and 60 buffers (20 batch norms).
  CHECK(names.size() == 122);
  const std::set<std::string> all(names.begin(), names.end());
  for (const char* n : {"conv1.weight", "bn1.weight", "bn1.bias", "bn1.running_mean", "bn1.running_var",
                        "bn1.num_batches_tracked", "layer1.0.conv1.weight", "layer1.0.bn1.running_var", "layer1.1.conv2.weight",
                        "layer2.0.downsample.0.weight", "layer2.0.downsample.1.running_mean", "layer4.1.bn2.bias",
                        "fc.weight", "fc.bias"})
    CHECK(all.count(n) == 1);
  CHECK(all.count("layer1.0.downsample.0.weight") == 0);  // layer1's blocks keep the shape
  CHECK(all.count("conv1.bias") == 0);                    // convolutions without bias
  CHECK(names.front() == "conv1.weight");
  CHECK(names.back() == "fc.bias");
}

TEST_CASE("resnet<50> has torchvision's bottlenecks, downsample in every stage's first block", "[models][resnet]") {
  const auto d = io::describe<models::resnet<50>>();
  std::set<std::string> all;
  for (const auto& t : d.tensors()) all.insert(t.name);
  CHECK(all.size() == 161 + 159);  // torchvision: 161 parameters, 159 buffers (53 batch norms x 3)
  for (const char* n : {"layer1.0.downsample.0.weight", "layer1.0.conv3.weight", "layer3.5.bn3.running_var",
                        "layer4.2.conv2.weight"})
    CHECK(all.count(n) == 1);
  CHECK(all.size() == d.tensors().size());
}

TEST_CASE("resnet_cifar<20> trains: its loss falls on a small fixed set, and evaluation uses the running statistics",
          "[models][resnet_cifar]") {
  using net = models::resnet_cifar<20>;
  model<net, float> m(3);
  constexpr std::size_t batch = 16, classes = 10;
  const auto xd = [] {
    std::vector<float> x(batch * net::input_shape::size);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i)));
    return x;
  }();
  std::vector<std::int32_t> labels(batch);
  for (std::size_t i = 0; i < batch; ++i) labels[i] = static_cast<std::int32_t>(i % classes);
  sgd::state<float, cpu> opt({.lr = 0.05f, .momentum = 0.9f}, net::parameter_count);
  loss_workspace<cpu> ws;
  std::vector<float> dy(batch * classes);
  double first = 0, last = 0;
  for (int step = 0; step < 12; ++step) {
    const float* y = m.forward(run_context{}, xd.data(), batch);
    const auto v = softmax_cross_entropy::compute<cpu, classes, float>(y, labels.data(), dy.data(), batch, 1.0f / batch, ws);
    m.backward(run_context{}, dy.data(), batch);
    opt.step(m.parameters().data(), m.gradients().data(), net::parameter_count, 0.05f);
    (step == 0 ? first : last) = v.sum / batch;
  }
  INFO("loss " << first << " -> " << last);
  CHECK(last < 0.5 * first);
  const auto b = m.copy_buffers_to_host();
  CHECK(b[2 * 16] == 12.0f);  // bn1's num_batches_tracked
  run_context eval;
  eval.training = false;
  const float* y = m.forward(eval, xd.data(), 1);  // one sample: fine in evaluation
  CHECK(std::all_of(y, y + classes, [](float v) { return std::isfinite(v); }));
}
