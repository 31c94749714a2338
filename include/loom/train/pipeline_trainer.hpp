// SPDX-License-Identifier: Apache-2.0
#pragma once
// loom::trainer for pipeline model parallelism: the partial specialisations for
// Policy = loom::model_parallel<loom::pipeline<S, ...>, Comm> (S ranks, one stage each) and
// Policy = loom::hybrid<loom::data_parallel<Comm, ...>, loom::pipeline<S, ...>> (replicas of
// S-stage pipelines). Same fit / evaluate as the primary trainer; each rank holds only its
// stage's parameters, and model() is that stage's model. The stage execution itself is
// loom::pipeline_engine (loom/parallel/pipeline_engine.hpp). On a GPU backend the host fills the
// batches in the backend's staging memory (pinned) and copies them over, as the primary trainer
// does. No communicator is included here.

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <iostream>
#include <string>
#include <typeinfo>
#include <vector>

#include "loom/parallel/hybrid.hpp"
#include "loom/parallel/pipeline_engine.hpp"
#include "loom/parallel/pipeline_plan.hpp"
#include "loom/train/trainer.hpp"

namespace loom {

namespace detail {

/// The trainer of one pipeline stage, the body of both specialisations below. DataParallel is
/// loom::data_parallel<Comm, ...> under hybrid, detail::no_data_parallel otherwise.
template <class Network, class Loss, class Optimizer, class Backend, class Pipeline, class Comm, class DataParallel>
class pipeline_trainer {
  static_assert(is_network_v<Network>, "loom::trainer's first argument must be a loom::network<loom::input<...>, ...>");
  using T = float;
  using engine_type = pipeline_engine<Network, Loss, T, Backend, Pipeline, Comm, DataParallel>;
  using partition = typename engine_type::partition;
  using optimizer_state = typename Optimizer::template state<T, Backend>;
  using space = typename Backend::memory_space;
  static constexpr std::size_t in_width = Network::input_shape::size;
  static constexpr std::size_t out_width = Network::output_shape::size;

 public:
  using optimizer_options = typename Optimizer::options;
  /// This rank's stage model: a std::variant over the stages' model types
  /// (loom::model<partition::stage_network<s>>), holding the one of stage(). Use std::visit,
  /// or stage_model<S>() when the stage is known.
  using models_type = typename engine_type::models_type;
  template <std::size_t Stage>
  using stage_model_type = typename engine_type::template stage_model_type<Stage>;
  static constexpr std::size_t stages = Pipeline::stages;
  static constexpr std::size_t micro_batch_count = Pipeline::micro_batch_count;

  /// Trains on Comm::world() (e.g. loom::mpi_comm under mpirun).
  explicit pipeline_trainer(optimizer_options opt = {}, trainer_options options = {})
    requires requires { Comm::world(); }
      : pipeline_trainer(Comm::world(), opt, options) {}

  /// Trains on `comm` (e.g. a loom::local_comm of a local_world). Collective over comm.
  /// Throws loom::invalid_argument when comm's size does not fit the pipeline (S ranks; under
  /// hybrid a multiple of S), loom::communication_error when the ranks were built differently.
  explicit pipeline_trainer(Comm comm, optimizer_options opt = {}, trainer_options options = {})
      : options_(checked(options)), opt_(opt), init_threads_((set_threads(options.threads), 0)),
        engine_(std::move(comm), options.seed, options.math, job_description(options)),
        state_(opt, engine_.parameter_count()) {
    engine_.broadcast_parameters();
  }

  /// Trains on `data` for opts.epochs epochs (or opts.max_steps optimizer steps). opts.batch is
  /// the global batch: under hybrid it is split over the replicas, then each replica's share
  /// into micro_batch_count micro-batches (sizes differing by at most one). The result equals
  /// one process training on the whole batch. The first stage reads the samples, the last
  /// stage the labels, the others only how many there are. Collective over the world.
  /// Throws loom::invalid_argument for a zero batch or accumulation, an empty data set or a
  /// negative or non-finite clip_grad_norm; loom::communication_error when the ranks were given
  /// different options.
  template <class Dataset>
  fit_result fit(const Dataset& data, const fit_options& opts = {}) {
    detail::check_dataset_for<Network, Dataset>();
    if (opts.batch == 0) throw invalid_argument("loom::trainer::fit: batch must be at least 1, got 0");
    if (opts.accumulation == 0) throw invalid_argument("loom::trainer::fit: accumulation must be at least 1, got 0");
    if (data.size() == 0) throw invalid_argument("loom::trainer::fit: the training set is empty");
    if (!(opts.clip_grad_norm >= 0) || !std::isfinite(opts.clip_grad_norm))
      throw invalid_argument("loom::trainer::fit: clip_grad_norm must be finite and >= 0 (0: no clipping), got " +
                             std::to_string(opts.clip_grad_norm));
    const bool show = opts.progress != nullptr;
    engine_.check_same_job("fit: epochs=" + std::to_string(opts.epochs) + ";batch=" + std::to_string(opts.batch) +
                           ";accumulation=" + std::to_string(opts.accumulation) + ";max_steps=" +
                           std::to_string(opts.max_steps) + ";samples=" + std::to_string(data.size()) +
                           ";clip_grad_norm=" + std::to_string(opts.clip_grad_norm) + ";progress=" + (show ? "on" : "off"));
    data::distributed_loader<Dataset> loader(data, opts.batch, options_.seed, engine_.replica(), engine_.replicas());
    reserve(loader.max_local_batch());
    progress_display progress(rank() == 0 ? opts.progress : nullptr, opts.progress_style,
                              opts.progress == &std::cerr ? ::isatty(2) : opts.progress == &std::cout ? ::isatty(1) : false);
    engine_.reset_figures();
    rank_figures& fig = engine_.figures();
    fit_result r;
    r.ranks = engine_.world();
    const auto start = clock::now();
    bool stop = false;
    for (std::size_t epoch = 0; epoch < opts.epochs && !stop; ++epoch) {
      loader.start_epoch(epoch);
      const std::size_t batches = loader.batches_per_epoch();
      // Loss sum, correct and samples, counted on the last stages; summed over the world each
      // step when progress is shown (every rank then knows them), else at the end of the epoch.
      double sums[3] = {0, 0, 0};
      std::size_t steps = 0, global_samples = 0;
      for (std::size_t k = 0; k < batches;) {
        if (opts.max_steps && step_ >= opts.max_steps) {
          stop = true;
          break;
        }
        const std::size_t group = std::min(opts.accumulation, batches - k);
        double step_sums[3] = {0, 0, 0};
        engine_.start_step();
        for (std::size_t a = 0; a < group; ++a, ++k) {
          const auto t0 = clock::now();
          typename engine_type::batch_view b;
          b.n = next_batch(loader, b.global_n);
          b.offset = loader.local_offset();
          b.x = x_.data();
          b.labels = labels_.data();
          fig.data_s += seconds(t0, clock::now());
          const loss_value v = engine_.micro_step(b, a, group, options_.seed, step_ * 1000003 + a);
          if (engine_.last_stage()) {
            step_sums[0] += v.sum;
            step_sums[1] += static_cast<double>(v.correct);
            step_sums[2] += static_cast<double>(b.n);
          }
          fig.samples += static_cast<double>(b.n);
          global_samples += b.global_n;
        }
        optimizer_step(opts);
        ++steps;
        if (show) engine_.sum_over_world(step_sums, 3);
        for (int i = 0; i < 3; ++i) sums[i] += step_sums[i];
        progress.update(epoch + 1, opts.epochs, k, batches, sums[2] ? sums[0] / sums[2] : 0, sums[2] ? sums[1] / sums[2] : 0,
                        (r.samples + global_samples) / std::max(1e-9, seconds(start, clock::now())));
      }
      if (steps == 0) break;
      if (!show) engine_.sum_over_world(sums, 3);
      r.epochs = epoch + 1;
      r.samples += static_cast<std::size_t>(sums[2]);
      r.steps += steps;
      r.train_loss = sums[2] ? sums[0] / sums[2] : 0;
      r.train_accuracy = sums[2] ? sums[1] / sums[2] : 0;
    }
    r.seconds = seconds(start, clock::now());
    fig.seconds = r.seconds;
    r.figures = engine_.gather_figures();
    return r;
  }

  /// Mean loss and accuracy of the current parameters on `data`, in evaluation mode: batches
  /// flow through the stages (under hybrid each replica takes its share); the sums reach every
  /// rank. Collective over the world.
  template <class Dataset>
  eval_result evaluate(const Dataset& data, std::size_t batch = 500) {
    detail::check_dataset_for<Network, Dataset>();
    if (batch == 0) throw invalid_argument("loom::trainer::evaluate: batch must be at least 1, got 0");
    data::distributed_loader<Dataset> loader(data, batch, options_.seed, engine_.replica(), engine_.replicas(),
                                             /*shuffle=*/false);
    loader.start_epoch(0);
    reserve(loader.max_local_batch());
    double sums[3] = {0, 0, 0};  // loss, correct, samples (last stages)
    for (std::size_t k = 0; k < loader.batches_per_epoch(); ++k) {
      typename engine_type::batch_view b;
      b.n = next_batch(loader, b.global_n);
      if (b.n == 0) continue;  // the same on every stage of this replica
      b.offset = loader.local_offset();
      b.x = x_.data();
      b.labels = labels_.data();
      const loss_value v = engine_.evaluate_batch(b, options_.seed, step_);
      if (engine_.last_stage()) {
        sums[0] += v.sum;
        sums[1] += static_cast<double>(v.correct);
        sums[2] += static_cast<double>(b.n);
      }
    }
    engine_.complete_sends();
    engine_.sum_over_world(sums, 3);
    eval_result r;
    r.samples = static_cast<std::size_t>(sums[2]);
    if (r.samples) r.loss = sums[0] / sums[2], r.accuracy = sums[1] / sums[2];
    return r;
  }

  /// This rank's stage model (see models_type).
  models_type& model() noexcept { return engine_.models(); }
  const models_type& model() const noexcept { return engine_.models(); }
  /// This rank's stage model as its type, when the caller knows the stage.
  /// Throws loom::invalid_argument when this rank runs another stage.
  template <std::size_t Stage>
  stage_model_type<Stage>& stage_model() {
    static_assert(Stage < stages, "loom::trainer::stage_model<Stage>: no such stage");
    if (stage() != static_cast<int>(Stage))
      throw invalid_argument("loom::trainer::stage_model<" + std::to_string(Stage) + ">: rank " + std::to_string(rank()) +
                             " runs stage " + std::to_string(stage()) + ", not " + std::to_string(Stage));
    return std::get<Stage>(engine_.models());
  }
  optimizer_state& optimizer() noexcept { return state_; }
  /// Optimizer steps taken so far, over all fit() calls.
  std::size_t steps() const noexcept { return step_; }
  /// This process's rank and the number of ranks in the world.
  int rank() const { return engine_.rank(); }
  int ranks() const { return engine_.world(); }
  /// The stage this rank runs, and (hybrid) its replica and the number of replicas.
  int stage() const { return engine_.stage(); }
  int replica() const { return engine_.replica(); }
  int replicas() const { return engine_.replicas(); }
  /// The L2 norm of the whole model's parameters (the squares summed over the stages of this
  /// rank's replica). Collective over the pipeline group.
  double parameters_l2() { return engine_.parameters_l2(); }
  /// The whole model's parameters in the whole network's flat layout (Network::parameter_count
  /// values, stage s's at partition::parameter_offsets[s]), on every rank: for tests and
  /// checkpoints. Collective over the pipeline group.
  std::vector<float> gather_parameters() { return engine_.gather_parameters(); }
  engine_type& engine() noexcept { return engine_; }

 private:
  using clock = std::chrono::steady_clock;
  static double seconds(clock::time_point a, clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

  static const trainer_options& checked(const trainer_options& options) {
    if (!Backend::supports(options.math))
      throw invalid_argument(std::string("loom::trainer: trainer_options::math = loom::math_mode::") +
                             to_string(options.math) + " is not available on loom::" + Backend::name +
                             " here (see loom::" + Backend::name + "::supports): use math_mode::fp32");
    return options;
  }

  /// The job every rank must share (checked by the engine before the ranks split into groups).
  static std::string job_description(const trainer_options& options) {
    std::string bounds;
    for (std::size_t b : partition::bounds) {
      if (!bounds.empty()) bounds += ',';
      bounds += std::to_string(b);
    }
    return "network=" + std::string(typeid(Network).name()) + ";parameters=" + std::to_string(Network::parameter_count) +
           ";loss=" + Loss::name + ";optimizer=" + Optimizer::name + ";seed=" + std::to_string(options.seed) +
           ";replicated=" + (engine_type::hybrid ? "yes" : "no") + ";stages=" + std::to_string(stages) +
           ";micro_batches=" + std::to_string(micro_batch_count) + ";schedule=" +
           std::string(typeid(typename Pipeline::schedule_policy).name()) + ";bounds=" + bounds +
           ";math=" + to_string(options.math);
  }

  /// Room for one replica's share of a batch: the samples on the first stage, the labels on the last.
  void reserve(std::size_t n) {
    if (engine_.first_stage()) x_.reserve_discard(n * in_width);
    if (engine_.last_stage()) labels_.reserve_discard(n);
    if constexpr (staged) {
      if (engine_.first_stage()) x_stage_.reserve_discard(n * in_width);
      if (engine_.last_stage()) labels_stage_.reserve_discard(n);
    }
  }

  /// The loader's next batch: the samples into x_ on the first stage, the labels into labels_ on
  /// the last (through the staging buffers when the host cannot write the backend's memory).
  /// Returns this replica's sample count.
  template <class Loader>
  std::size_t next_batch(Loader& loader, std::size_t& global_n) {
    const bool first = engine_.first_stage(), last = engine_.last_stage();
    if constexpr (!staged) {
      return loader.next(first ? x_.data() : nullptr, last ? labels_.data() : nullptr, global_n);
    } else {
      // The previous batch's copies must have left the staging buffers before the host refills them.
      if (first || last) Backend::synchronize();
      const std::size_t n = loader.next(first ? x_stage_.data() : nullptr, last ? labels_stage_.data() : nullptr, global_n);
      if (first) Backend::copy(x_.data(), x_stage_.data(), n * in_width);
      if (last) Backend::copy(labels_.data(), labels_stage_.data(), n);
      return n;
    }
  }

  /// Clips the gradient norm of the whole model (the squares summed over the stages) and steps
  /// this stage's optimizer on its own buffers.
  void optimizer_step(const fit_options& opts) {
    T* grads = engine_.gradients();
    const std::size_t n = engine_.parameter_count();
    if (opts.clip_grad_norm > 0) {
      const double norm = std::sqrt(engine_.gradient_squared_norm());  // collective over the pipeline group
      const double factor = opts.clip_grad_norm / (norm + 1e-6);      // as loom::clip_grad_norm
      if (std::isfinite(norm) && factor < 1.0) Backend::for_each(n, detail::scale_by<T>{grads, static_cast<T>(factor)});
    }
    const auto t0 = clock::now();
    state_.step(engine_.parameters(), grads, n, opts.schedule(step_, opt_.lr));
    ++step_;
    engine_.figures().compute_s += seconds(t0, clock::now());
  }

  trainer_options options_;
  optimizer_options opt_;
  int init_threads_;
  engine_type engine_;
  optimizer_state state_;
  static constexpr bool staged = !space::host_accessible;
  using staging_space = typename detail::staging_space_of<Backend>::type;
  buffer<T, space> x_;                      // (batch, input): the first stage's samples
  buffer<std::int32_t, space> labels_;      // (batch): the last stage's labels
  buffer<T, staging_space> x_stage_;        // (batch, input) on the host; empty unless staged
  buffer<std::int32_t, staging_space> labels_stage_;
  std::size_t step_ = 0;
};

}  // namespace detail

/// Pipeline model parallelism: S ranks, rank s runs stage s. See detail::pipeline_trainer.
template <class Network, class Loss, class Optimizer, std::size_t S, class... O, class Comm, class Backend>
class trainer<Network, Loss, Optimizer, model_parallel<pipeline<S, O...>, Comm>, Backend>
    : public detail::pipeline_trainer<Network, Loss, Optimizer, Backend, pipeline<S, O...>, Comm,
                                      detail::no_data_parallel> {
 public:
  using detail::pipeline_trainer<Network, Loss, Optimizer, Backend, pipeline<S, O...>, Comm,
                                 detail::no_data_parallel>::pipeline_trainer;
};

/// Data parallelism over replicas of an S-stage pipeline: world rank r runs stage r % S of
/// replica r / S; each stage's gradients are averaged over the replicas. See
/// detail::pipeline_trainer.
template <class Network, class Loss, class Optimizer, class Comm, class... DO, std::size_t S, class... O, class Backend>
class trainer<Network, Loss, Optimizer, hybrid<data_parallel<Comm, DO...>, pipeline<S, O...>>, Backend>
    : public detail::pipeline_trainer<Network, Loss, Optimizer, Backend, pipeline<S, O...>, Comm,
                                      data_parallel<Comm, DO...>> {
 public:
  using detail::pipeline_trainer<Network, Loss, Optimizer, Backend, pipeline<S, O...>, Comm,
                                 data_parallel<Comm, DO...>>::pipeline_trainer;
};

}  // namespace loom
