// SPDX-License-Identifier: Apache-2.0
#pragma once
// loom::trainer<Network, Loss, Optimizer, Policy, Backend>: owns a model and its optimizer
// state, and runs fit (epochs of seeded, shuffled batches) and evaluate (loss and accuracy).
// The policy says how many processes share the work; single_process is the default.

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "loom/backend/cpu.hpp"
#include "loom/core/error.hpp"
#include "loom/data/loader.hpp"
#include "loom/nn/loss.hpp"
#include "loom/nn/model.hpp"
#include "loom/optim/clip.hpp"
#include "loom/optim/schedule.hpp"
#include "loom/train/progress.hpp"

namespace loom {

/// The default policy: one process trains alone.
struct single_process {};

/// Options of the trainer itself (not of the optimizer).
struct trainer_options {
  /// Seed of parameter initialisation, shuffling and dropout.
  std::uint64_t seed = 1;
  /// Threads of the one compute pool; 0 = cores available / ranks on this host.
  int threads = 0;
};

/// Options of one fit() call.
struct fit_options {
  std::size_t epochs = 1;
  /// Samples per step.
  std::size_t batch = 64;
  /// Stop after this many steps in all (0: no limit).
  std::size_t max_steps = 0;
  /// Learning rate at step s from the optimizer's base rate (constant_lr, step_lr,
  /// cosine_warmup, or any float(std::size_t step, float base_lr) callable).
  lr_schedule schedule{};
  /// Clip the global gradient norm to this value before each step (0: no clipping).
  double clip_grad_norm = 0;
  /// Where progress goes (null: nowhere) and how.
  std::ostream* progress = &std::cerr;
  progress_mode progress_style = progress_mode::automatic;
};

/// What fit() measured.
struct fit_result {
  std::size_t epochs = 0;
  std::size_t steps = 0;
  std::size_t samples = 0;
  /// Mean loss and accuracy over the samples of the last epoch run.
  double train_loss = 0;
  double train_accuracy = 0;
  /// Wall time spent in training steps (data preparation included, evaluation excluded).
  double seconds = 0;
  double samples_per_s() const { return seconds > 0 ? samples / seconds : 0; }
};

/// What evaluate() measured.
struct eval_result {
  std::size_t samples = 0;
  double loss = 0;
  double accuracy = 0;
};

template <class Network, class Loss, class Optimizer, class Policy = single_process, class Backend = cpu>
class trainer {
  static_assert(is_network_v<Network>, "loom::trainer's first argument must be a loom::network<loom::input<...>, ...>");
  static_assert(std::is_same_v<Policy, single_process>,
                "this loom::trainer runs the single_process policy; data_parallel and model_parallel come with "
                "their own headers");
  using T = float;
  using model_type = ::loom::model<Network, T, Backend>;
  using optimizer_state = typename Optimizer::template state<T, Backend>;
  static constexpr std::size_t out_width = Network::output_shape::size;

 public:
  using optimizer_options = typename Optimizer::options;

  explicit trainer(optimizer_options opt = {}, trainer_options options = {})
      : options_(options), opt_(opt), init_threads_((set_threads(options.threads), 0)), model_(options.seed),
        state_(opt, Network::parameter_count) {}

  /// Trains on `data` for opts.epochs epochs (or opts.max_steps steps).
  /// Requires: Dataset's samples have Network's input size and Dataset::classes equals the
  /// network's output width (both checked at compile time).
  /// Throws loom::invalid_argument for a zero batch or an empty data set.
  template <class Dataset>
  fit_result fit(const Dataset& data, const fit_options& opts = {}) {
    check_dataset<Dataset>();
    if (opts.batch == 0) throw invalid_argument("loom::trainer::fit: batch must be at least 1, got 0");
    if (data.size() == 0) throw invalid_argument("loom::trainer::fit: the training set is empty");
    data::batch_loader<Dataset> loader(data, opts.batch, options_.seed);
    reserve(opts.batch);
    progress_display progress(opts.progress, opts.progress_style,
                              opts.progress == &std::cerr ? ::isatty(2) : opts.progress == &std::cout ? ::isatty(1) : false);
    fit_result r;
    const auto start = std::chrono::steady_clock::now();
    for (std::size_t epoch = 0; epoch < opts.epochs; ++epoch) {
      loader.start_epoch(epoch);
      const std::size_t batches = loader.batches_per_epoch();
      double loss_sum = 0;
      std::size_t correct = 0, seen = 0, done = 0;
      while (std::size_t n = loader.next(x_.data(), labels_.data())) {
        if (opts.max_steps && step_ >= opts.max_steps) break;
        const loss_value v = train_step(n, opts);
        loss_sum += v.sum;
        correct += v.correct;
        seen += n;
        ++done;
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        progress.update(epoch + 1, opts.epochs, done, batches, loss_sum / seen, double(correct) / seen,
                        secs > 0 ? (r.samples + seen) / secs : 0);
      }
      if (seen == 0) break;
      r.epochs = epoch + 1;
      r.samples += seen;
      r.steps += done;
      r.train_loss = loss_sum / seen;
      r.train_accuracy = double(correct) / seen;
      if (opts.max_steps && step_ >= opts.max_steps) break;
    }
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return r;
  }

  /// Mean loss and accuracy of the current parameters on `data`, in evaluation mode.
  template <class Dataset>
  eval_result evaluate(const Dataset& data, std::size_t batch = 500) {
    check_dataset<Dataset>();
    if (batch == 0) throw invalid_argument("loom::trainer::evaluate: batch must be at least 1, got 0");
    data::batch_loader<Dataset> loader(data, batch, options_.seed, /*shuffle=*/false);
    loader.start_epoch(0);
    reserve(batch);
    run_context ctx{.training = false, .accumulate = false, .seed = options_.seed, .step = step_};
    eval_result r;
    double loss_sum = 0;
    std::size_t correct = 0;
    while (std::size_t n = loader.next(x_.data(), labels_.data())) {
      const T* y = model_.forward(ctx, x_.data(), n);
      const loss_value v = Loss::template compute<Backend, out_width, T>(y, labels_.data(), nullptr, n, T(1), ws_);
      loss_sum += v.sum;
      correct += v.correct;
      r.samples += n;
    }
    if (r.samples) r.loss = loss_sum / r.samples, r.accuracy = double(correct) / r.samples;
    return r;
  }

  model_type& model() noexcept { return model_; }
  const model_type& model() const noexcept { return model_; }
  optimizer_state& optimizer() noexcept { return state_; }
  /// Steps taken so far, over all fit() calls.
  std::size_t steps() const noexcept { return step_; }

 private:
  template <class Dataset>
  static constexpr void check_dataset() {
    using sample = typename Dataset::sample_shape;
    static_assert(!Network::chain::ok || sample::size == Network::input_shape::size,
                  "loom::trainer: the data set's samples do not have the network's input size (the network input "
                  "shape and the sample shape are in the loom::diagnostic:: name the compiler prints)");
    if constexpr (Network::chain::ok && sample::size != Network::input_shape::size)
      detail::fail_with<diagnostic::network_input_does_not_match_samples<typename Network::input_shape, sample>>();
    static_assert(!Network::chain::ok || out_width == Dataset::classes,
                  "loom::trainer: the loss's width (the network's output size) does not match the number of classes "
                  "of the data set's labels: end the network with loom::linear<Classes> (both numbers are in the "
                  "loom::diagnostic:: name the compiler prints)");
    if constexpr (Network::chain::ok && out_width != Dataset::classes)
      detail::fail_with<diagnostic::loss_width_does_not_match_classes<typename Network::output_shape, Dataset::classes>>();
  }

  void reserve(std::size_t batch) {
    x_.reserve_discard(batch * Network::input_shape::size);
    labels_.reserve_discard(batch);
    dy_.reserve_discard(batch * out_width);
  }

  loss_value train_step(std::size_t n, const fit_options& opts) {
    run_context ctx{.training = true, .accumulate = false, .seed = options_.seed, .step = step_};
    const T* y = model_.forward(ctx, x_.data(), n);
    const loss_value v = Loss::template compute<Backend, out_width, T>(y, labels_.data(), dy_.data(), n, T(1) / T(n), ws_);
    model_.backward(ctx, dy_.data(), n);
    auto grads = model_.gradients();
    if (opts.clip_grad_norm > 0) clip_grad_norm<Backend>(grads.data(), grads.size(), opts.clip_grad_norm);
    const float base = opt_.lr;
    const float lr = opts.schedule(step_, base);
    state_.step(model_.parameters().data(), grads.data(), grads.size(), lr);
    ++step_;
    return v;
  }

  trainer_options options_;
  optimizer_options opt_;
  int init_threads_;
  model_type model_;
  optimizer_state state_;
  buffer<T, typename Backend::memory_space> x_, dy_;
  buffer<std::int32_t, typename Backend::memory_space> labels_;
  loss_workspace<Backend> ws_;
  std::size_t step_ = 0;
};

}  // namespace loom
