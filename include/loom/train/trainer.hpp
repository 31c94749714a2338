// SPDX-License-Identifier: Apache-2.0
#pragma once
// loom::trainer<Network, Loss, Optimizer, Policy, Backend>: owns a model and its optimizer
// state, and runs fit (epochs of seeded, shuffled batches) and evaluate (loss and accuracy).
// The policy says how many processes share the work; single_process is the default. On a
// backend whose memory the host cannot reach (loom::cuda), batches are filled on the host in
// the backend's staging memory (pinned) and copied over asynchronously.

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iostream>
#include <optional>
#include <typeinfo>
#include <string>
#include <vector>

#include "loom/backend/default_backend.hpp"
#include "loom/core/error.hpp"
#include "loom/data/distributed.hpp"
#include "loom/data/loader.hpp"
#include "loom/nn/loss.hpp"
#include "loom/nn/model.hpp"
#include "loom/optim/clip.hpp"
#include "loom/optim/schedule.hpp"
#include "loom/parallel/chunk_tree.hpp"
#include "loom/parallel/data_parallel.hpp"
#include "loom/parallel/hybrid.hpp"
#include "loom/parallel/single_process.hpp"
#include "loom/parallel/tensor_parallel_engine.hpp"
#include "loom/train/progress.hpp"

namespace loom {

namespace detail {
/// Where the host fills batches for Backend: its staging_space when it has one (page-locked
/// memory for loom::cuda), host memory otherwise.
template <class Backend>
struct staging_space_of {
  using type = host_space;
};
template <class Backend>
  requires requires { typename Backend::staging_space; }
struct staging_space_of<Backend> {
  using type = typename Backend::staging_space;
};

/// The communicator type of a data_parallel policy; void for any other policy. (A trait rather
/// than Policy::comm_type in the constructor's constraint: nvcc 13 substitutes that eagerly.)
template <class Policy>
struct comm_type_of {
  using type = void;
};
template <class Comm, class... Options>
struct comm_type_of<data_parallel<Comm, Options...>> {
  using type = Comm;
};
template <std::size_t Width, class Comm>
struct comm_type_of<model_parallel<tensor_parallel<Width>, Comm>> {
  using type = Comm;
};
template <class Comm, class... Options, std::size_t Width>
struct comm_type_of<hybrid<data_parallel<Comm, Options...>, tensor_parallel<Width>>> {
  using type = Comm;
};

/// The policies of tensor parallelism the trainer runs: model_parallel<tensor_parallel<T>, Comm>
/// and hybrid<data_parallel<Comm, ...>, tensor_parallel<T>>. tensor_width: T (1 otherwise).
template <class Policy>
inline constexpr std::size_t tensor_width_of = 0;
template <std::size_t Width, class Comm>
inline constexpr std::size_t tensor_width_of<model_parallel<tensor_parallel<Width>, Comm>> = Width;
template <class DataParallel, std::size_t Width>
inline constexpr std::size_t tensor_width_of<hybrid<DataParallel, tensor_parallel<Width>>> = Width;
template <class Policy>
inline constexpr bool is_tensor_parallel_policy_v = tensor_width_of<Policy> != 0;

/// The engine the trainer drives for Policy, and the network its model runs (Network, or one
/// rank's slice of it under tensor parallelism).
template <class Network, class T, class Policy>
struct engine_of {
  using type = single_process_engine<Network, T>;
  using network = Network;
};
template <class Network, class T, class Comm, class... Options>
struct engine_of<Network, T, data_parallel<Comm, Options...>> {
  using type = data_parallel_engine<Network, T, data_parallel<Comm, Options...>>;
  using network = Network;
};
template <class Network, class T, std::size_t Width, class Comm>
struct engine_of<Network, T, model_parallel<tensor_parallel<Width>, Comm>> {
  using type = tensor_parallel_engine<Network, T, Comm, Width>;
  using network = typename type::rank_network;
};
template <class Network, class T, class DataParallel, std::size_t Width>
struct engine_of<Network, T, hybrid<DataParallel, tensor_parallel<Width>>> {
  using type = tensor_parallel_engine<Network, T, typename DataParallel::comm_type, Width, DataParallel>;
  using network = typename type::rank_network;
};

/// The place of this process in the whole world (an engine's rank() / world() are the data
/// loader's: the replica index and count, which tensor parallelism makes differ).
template <class Engine>
int world_rank_of(const Engine& e) {
  if constexpr (requires { e.world_rank(); }) return e.world_rank();
  else return e.rank();
}
template <class Engine>
int world_size_of(const Engine& e) {
  if constexpr (requires { e.world_size(); }) return e.world_size();
  else return e.world();
}

/// Whether Policy's communicator can move memory of Backend's space: any can move host memory;
/// GPU memory needs one that says so (nccl_comm::moves_device_memory).
template <class Policy, class Backend>
constexpr bool policy_reaches_backend_memory() {
  if constexpr (std::is_void_v<typename comm_type_of<Policy>::type> || Backend::memory_space::host_accessible) {
    return true;
  } else {
    return requires { requires comm_type_of<Policy>::type::moves_device_memory; };
  }
}
}  // namespace detail

namespace detail {
/// The compile-time checks of a data set against a network (every trainer runs them): the
/// samples have the network's input size and the labels as many classes as its output.
template <class Network, class Dataset>
constexpr void check_dataset_for() {
  using sample = typename Dataset::sample_shape;
  constexpr std::size_t out_width = Network::output_shape::size;
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
}  // namespace detail

/// Options of the trainer itself (not of the optimizer).
struct trainer_options {
  /// Seed of parameter initialisation, shuffling and dropout.
  std::uint64_t seed = 1;
  /// Threads of the one compute pool; 0 = cores available / ranks on this host.
  int threads = 0;
  /// Precision of matrix products and convolutions: fp32, or bf16 (mixed precision: bf16
  /// operands, float accumulation; parameters, gradients and optimizer state stay float).
  /// The trainer's constructor throws loom::invalid_argument when the backend cannot run it
  /// (Backend::supports(math) is false).
  math_mode math = math_mode::fp32;
};

/// Options of one fit() call.
struct fit_options {
  std::size_t epochs = 1;
  /// Samples per step.
  std::size_t batch = 64;
  /// Stop after this many optimizer steps in all (0: no limit).
  std::size_t max_steps = 0;
  /// Gradient accumulation: each optimizer step sums the gradients of this many consecutive
  /// batches (micro-steps), as one step on a batch this many times larger. Under
  /// data_parallel, gradients are communicated only on the last micro-step.
  std::size_t accumulation = 1;
  /// Learning rate at step s from the optimizer's base rate (constant_lr, step_lr,
  /// cosine_warmup, or any float(std::size_t step, float base_lr) callable).
  lr_schedule schedule{};
  /// Clip the global gradient norm to this value before each step (0: no clipping).
  double clip_grad_norm = 0;
  /// Split-invariant (deterministic) mode, 0 = off: cut every global batch into chunks of this
  /// many consecutive samples, run each chunk's forward and backward on its own, and add the
  /// chunk gradients in one fixed binary tree over the chunk index, across ranks by send/recv
  /// instead of an allreduce — so the parameters after any number of steps are bitwise the same
  /// on 1, 2, 4, ... ranks (at the same threads per rank). Ranks must be a power of two; rank r
  /// takes whole chunks (loom::chunk_plan). Gradients are exchanged after every micro-step of
  /// an accumulation group. Costs smaller gemms and an exchange without overlap
  /// (docs/data-parallel.md). single_process and data_parallel only.
  std::size_t deterministic_chunk = 0;
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
  /// Processes that trained together, and each one's figures (rank order; one entry when
  /// training alone).
  int ranks = 1;
  std::vector<rank_figures> figures;
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
  static_assert(detail::policy_reaches_backend_memory<Policy, Backend>(),
                "loom::trainer: this data_parallel communicator cannot move GPU memory (mpi_comm and local_comm "
                "take host memory): with loom::cuda use loom::data_parallel<loom::nccl_comm> from <loom/comm/nccl.hpp> "
                "(tensor parallelism, too, needs a communicator that moves GPU memory)");
  static_assert(std::is_same_v<Policy, single_process> || is_data_parallel_v<Policy> ||
                    detail::is_tensor_parallel_policy_v<Policy>,
                "loom::trainer: Policy must be loom::single_process, loom::data_parallel<Comm, ...>, "
                "loom::model_parallel<loom::tensor_parallel<T>, Comm>, loom::hybrid<loom::data_parallel<Comm, ...>, "
                "loom::tensor_parallel<T>>, or a pipeline (loom::model_parallel<loom::pipeline<...>, Comm>, "
                "loom::hybrid<..., loom::pipeline<...>>)");
  using T = float;
  static constexpr bool tensor_split = detail::is_tensor_parallel_policy_v<Policy>;
  using engine_type = typename detail::engine_of<Network, T, Policy>::type;
  /// The network this rank runs: Network, or under tensor parallelism its slice of it.
  using rank_network = typename detail::engine_of<Network, T, Policy>::network;
  using model_type = ::loom::model<rank_network, T, Backend>;
  using optimizer_state = typename Optimizer::template state<T, Backend>;
  using comm_type = typename detail::comm_type_of<Policy>::type;
  static constexpr std::size_t out_width = Network::output_shape::size;

 public:
  using optimizer_options = typename Optimizer::options;

  /// Trains alone, or under data_parallel<mpi_comm> (tensor parallelism over mpi_comm, hybrid)
  /// on the world communicator.
  explicit trainer(optimizer_options opt = {}, trainer_options options = {})
    requires(std::is_void_v<comm_type> || requires { comm_type::world(); })
      : trainer(make_engine(), opt, options) {}

  /// Trains under data_parallel, tensor parallelism or hybrid on `comm` (e.g. a
  /// loom::local_comm of a local_world). Under tensor parallelism: comm has exactly T ranks
  /// (model_parallel) or a multiple of T (hybrid; world rank r is slice r % T of replica r / T);
  /// collective; throws loom::invalid_argument otherwise.
  template <class Comm>
    requires(!std::is_void_v<comm_type> && std::is_same_v<Comm, comm_type>)
  trainer(Comm comm, optimizer_options opt = {}, trainer_options options = {})
      : trainer(engine_type(std::move(comm)), opt, options) {}

  /// Trains on `data` for opts.epochs epochs (or opts.max_steps optimizer steps). Under
  /// data_parallel, opts.batch is the global batch: each rank trains on its share of every
  /// batch, reading only its own samples. Collective under data_parallel.
  /// Requires: Dataset's samples have Network's input size and Dataset::classes equals the
  /// network's output width (both checked at compile time).
  /// Throws loom::invalid_argument for a zero batch or accumulation, or an empty data set;
  /// loom::communication_error when the ranks were given different options.
  template <class Dataset>
  fit_result fit(const Dataset& data, const fit_options& opts = {}) {
    detail::check_dataset_for<Network, Dataset>();
    if (opts.batch == 0) throw invalid_argument("loom::trainer::fit: batch must be at least 1, got 0");
    if (opts.accumulation == 0) throw invalid_argument("loom::trainer::fit: accumulation must be at least 1, got 0");
    if (data.size() == 0) throw invalid_argument("loom::trainer::fit: the training set is empty");
    engine_.check_same_job("fit: epochs=" + std::to_string(opts.epochs) + ";batch=" + std::to_string(opts.batch) +
                           ";accumulation=" + std::to_string(opts.accumulation) + ";max_steps=" +
                           std::to_string(opts.max_steps) + ";samples=" + std::to_string(data.size()) +
                           ";clip_grad_norm=" + std::to_string(opts.clip_grad_norm) +
                           ";deterministic_chunk=" + std::to_string(opts.deterministic_chunk));
    data::distributed_loader<Dataset> loader(data, opts.batch, options_.seed, engine_.rank(), engine_.world());
    chunks_.reset();
    if (opts.deterministic_chunk) {
      if constexpr (!std::is_same_v<Policy, single_process> && !is_data_parallel_v<Policy>)
        throw invalid_argument("loom::trainer::fit: deterministic_chunk=" + std::to_string(opts.deterministic_chunk) +
                               " needs loom::single_process or loom::data_parallel<Comm, ...>, not this policy "
                               "(tensor or pipeline parallelism): set deterministic_chunk = 0");
      chunks_ = chunk_plan::make(opts.batch, opts.deterministic_chunk, static_cast<std::size_t>(engine_.world()));
      loader.set_rank_block(chunks_->rank_block());
    }
    reserve(opts.batch);
    const bool show = detail::world_rank_of(engine_) == 0;
    progress_display progress(show ? opts.progress : nullptr, opts.progress_style,
                              opts.progress == &std::cerr ? ::isatty(2) : opts.progress == &std::cout ? ::isatty(1) : false);
    rank_figures& fig = engine_.figures();
    fig = {};
    fit_result r;
    r.ranks = detail::world_size_of(engine_);
    const auto start = clock::now();
    bool stop = false;
    for (std::size_t epoch = 0; epoch < opts.epochs && !stop; ++epoch) {
      loader.start_epoch(epoch);
      const std::size_t batches = loader.batches_per_epoch();
      // loss sum, correct, local samples, global samples (summed over ranks at the end).
      double sums[4] = {0, 0, 0, 0};
      std::size_t steps = 0;
      for (std::size_t k = 0; k < batches;) {
        if (opts.max_steps && step_ >= opts.max_steps) {
          stop = true;
          break;
        }
        const std::size_t group = std::min(opts.accumulation, batches - k);
        for (std::size_t m = 0; m < group; ++m, ++k) {
          const auto t0 = clock::now();
          std::size_t global_n = 0;
          const std::size_t n = next_batch(loader, global_n);
          fig.data_s += seconds(t0, clock::now());
          const loss_value v = chunks_ ? chunked_micro_step(n, global_n, loader.local_offset(), m, group)
                                       : micro_step(n, global_n, loader.local_offset(), m, group);
          sums[0] += v.sum;
          sums[1] += static_cast<double>(v.correct);
          sums[2] += static_cast<double>(n);
          sums[3] += static_cast<double>(global_n);
        }
        optimizer_step(opts);
        ++steps;
        progress.update(epoch + 1, opts.epochs, k, batches, sums[2] ? sums[0] / sums[2] : 0, sums[2] ? sums[1] / sums[2] : 0,
                        (r.samples + sums[3]) / std::max(1e-9, seconds(start, clock::now())));
      }
      if (steps == 0) break;
      fig.samples += sums[2];
      engine_.sum(sums, 3);  // loss, correct and samples over all ranks
      r.epochs = epoch + 1;
      r.samples += static_cast<std::size_t>(sums[2]);
      r.steps += steps;
      r.train_loss = sums[0] / sums[2];
      r.train_accuracy = sums[1] / sums[2];
    }
    r.seconds = seconds(start, clock::now());
    fig.seconds = r.seconds;
    r.figures = engine_.gather_figures();
    return r;
  }

  /// Mean loss and accuracy of the current parameters on `data`, in evaluation mode. Under
  /// data_parallel each rank evaluates its share and the results are summed (collective).
  template <class Dataset>
  eval_result evaluate(const Dataset& data, std::size_t batch = 500) {
    detail::check_dataset_for<Network, Dataset>();
    if (batch == 0) throw invalid_argument("loom::trainer::evaluate: batch must be at least 1, got 0");
    data::distributed_loader<Dataset> loader(data, batch, options_.seed, engine_.rank(), engine_.world(), /*shuffle=*/false);
    loader.start_epoch(0);
    reserve(batch);
    double sums[3] = {0, 0, 0};  // loss, correct, samples
    for (std::size_t k = 0; k < loader.batches_per_epoch(); ++k) {
      std::size_t global_n = 0;
      const std::size_t n = next_batch(loader, global_n);
      if (n == 0) continue;
      run_context ctx{.training = false, .accumulate = false, .seed = options_.seed, .step = step_,
                      .sample_offset = loader.local_offset(), .tensor = tensor_group(), .math = options_.math};
      const T* y = model_.forward(ctx, x_.data(), n);
      const loss_value v = Loss::template compute<Backend, out_width, T>(y, labels_.data(), nullptr, n, T(1), ws_);
      sums[0] += v.sum;
      sums[1] += static_cast<double>(v.correct);
      sums[2] += static_cast<double>(n);
    }
    engine_.sum(sums, 3);
    eval_result r;
    r.samples = static_cast<std::size_t>(sums[2]);
    if (r.samples) r.loss = sums[0] / sums[2], r.accuracy = sums[1] / sums[2];
    return r;
  }

  model_type& model() noexcept { return model_; }
  const model_type& model() const noexcept { return model_; }
  optimizer_state& optimizer() noexcept { return state_; }
  /// Optimizer steps taken so far, over all fit() calls.
  std::size_t steps() const noexcept { return step_; }
  /// This process's rank and the number of ranks (0 and 1 when training alone), in the whole
  /// world (under tensor parallelism each group's ranks count apart).
  int rank() const { return detail::world_rank_of(engine_); }
  int ranks() const { return detail::world_size_of(engine_); }
  engine_type& engine() noexcept { return engine_; }

  /// The L2 norm of the whole model's parameters, summed in double. Under tensor parallelism
  /// the split parameters' squares are summed over the tensor group and replicated ones count
  /// once, so every rank gets the whole model's norm (collective over the tensor group).
  double parameters_l2() {
    if constexpr (tensor_split) return engine_.template l2<Backend>(model_.parameters().data());
    else return model_.parameters_l2();
  }

  /// The whole model's flat parameters (Network::parameter_count, Network's layout) as a host
  /// vector, on every rank. Under tensor parallelism the slices are gathered over the tensor
  /// group (collective over it); otherwise a copy of model().parameters().
  std::vector<T> gather_parameters() {
    if constexpr (tensor_split) return engine_.gather_parameters(model_.copy_parameters_to_host());
    else return model_.copy_parameters_to_host();
  }

 private:
  using clock = std::chrono::steady_clock;
  static double seconds(clock::time_point a, clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

  /// The tensor group of this rank for run_context::tensor (null unless tensor parallel).
  loom::tensor_group* tensor_group() noexcept {
    if constexpr (tensor_split) return engine_.group();
    else return nullptr;
  }
  static tensor_shard model_shard(engine_type& engine) {
    if constexpr (tensor_split) return engine.shard();
    else return {};
  }

  static engine_type make_engine() {
    if constexpr (!std::is_void_v<comm_type>)
      return engine_type(comm_type::world());
    else
      return engine_type();
  }

  trainer(engine_type engine, optimizer_options opt, trainer_options options)
      : options_(options), opt_(opt), init_threads_((set_threads(options.threads), 0)), engine_(std::move(engine)),
        model_(options.seed, 0, model_shard(engine_)), state_(opt, model_type::parameter_count) {
    if (!Backend::supports(options_.math))
      throw invalid_argument(std::string("loom::trainer: trainer_options::math = loom::math_mode::") +
                             to_string(options_.math) + " is not available on loom::" + Backend::name +
                             " here (see loom::" + Backend::name + "::supports): use math_mode::fp32");
    engine_.check_same_job(job_description());
    engine_.broadcast_parameters(model_.parameters().data(), model_type::parameter_count);
  }

  std::string job_description() const {
    return "network=" + std::string(typeid(Network).name()) + ";parameters=" + std::to_string(Network::parameter_count) +
           ";loss=" + Loss::name + ";optimizer=" + Optimizer::name + ";seed=" + std::to_string(options_.seed) +
           ";ranks=" + std::to_string(engine_.world()) + ";math=" + to_string(options_.math);
  }

  void reserve(std::size_t batch) {
    x_.reserve_discard(batch * Network::input_shape::size);
    labels_.reserve_discard(batch);
    dy_.reserve_discard(batch * out_width);
    if constexpr (staged) {
      x_stage_.reserve_discard(batch * Network::input_shape::size);
      labels_stage_.reserve_discard(batch);
    }
  }

  /// The loader's next batch into x_ and labels_ (through the staging buffers when the host
  /// cannot write the backend's memory). Returns this rank's sample count.
  template <class Loader>
  std::size_t next_batch(Loader& loader, std::size_t& global_n) {
    if constexpr (!staged) {
      return loader.next(x_.data(), labels_.data(), global_n);
    } else {
      // The previous batch's copies must have left the staging buffers; the loss sum of that
      // batch already waited for them, so this returns at once.
      Backend::synchronize();
      const std::size_t n = loader.next(x_stage_.data(), labels_stage_.data(), global_n);
      Backend::copy(x_.data(), x_stage_.data(), n * Network::input_shape::size);
      Backend::copy(labels_.data(), labels_stage_.data(), n);
      return n;
    }
  }

  /// One micro-step m of a group of `group`: this rank's n of the batch's global_n samples.
  /// The loss gradient is scaled by 1 / (global_n * group), so summing over ranks and the
  /// group gives the mean over every sample of the optimizer step.
  loss_value micro_step(std::size_t n, std::size_t global_n, std::size_t offset, std::size_t m, std::size_t group) {
    const auto t0 = clock::now();
    const bool last = m + 1 == group;
    T* grads = model_.gradients().data();
    loss_value v;
    if (n > 0) {
      run_context ctx{.training = true, .accumulate = m > 0 && had_samples_, .seed = options_.seed,
                      .step = step_ * 1000003 + m, .sample_offset = offset, .tensor = tensor_group(), .math = options_.math};
      const T* y = model_.forward(ctx, x_.data(), n);
      v = Loss::template compute<Backend, out_width, T>(y, labels_.data(), dy_.data(), n,
                                                        T(1) / static_cast<T>(global_n * group), ws_);
      if (last)
        model_.backward(ctx, dy_.data(), n, [&](std::size_t layer) { engine_.layer_done(layer, grads); });
      else
        model_.backward(ctx, dy_.data(), n);
      had_samples_ = true;
    } else if (!(m > 0 && had_samples_)) {
      Backend::zero(grads, model_type::parameter_count);  // nothing of this batch here: contribute zeros
      had_samples_ = true;
    }
    engine_.figures().compute_s += seconds(t0, clock::now());
    if (last) engine_.finish(grads);
    return v;
  }

  /// micro_step in deterministic mode (chunks_ set): each chunk of this rank's n samples runs
  /// forward and backward alone from the same buffer; their gradients go into the chunk tree,
  /// whose sum is finished across ranks by tree_allreduce, then into the tree over the group's
  /// micro-steps, which gradients() gets on the last one.
  loss_value chunked_micro_step(std::size_t n, std::size_t global_n, std::size_t offset, std::size_t m, std::size_t group) {
    constexpr std::size_t in = Network::input_shape::size;
    constexpr std::size_t count = model_type::parameter_count;
    const std::size_t c = chunks_->chunk;
    const auto t0 = clock::now();
    T* grads = model_.gradients().data();
    x_chunk_.reserve_discard(c * in);
    labels_chunk_.reserve_discard(c);
    if (m == 0) step_tree_.reset(count);
    chunk_tree_.reset(count);
    loss_value v;
    for (std::size_t at = 0; at < n; at += c) {
      // (k, input) from one buffer for every chunk, so each chunk is computed alike on any rank.
      const std::size_t k = std::min(c, n - at);
      Backend::copy(x_chunk_.data(), x_.data() + at * in, k * in);
      Backend::copy(labels_chunk_.data(), labels_.data() + at, k);
      run_context ctx{.training = true, .accumulate = false, .seed = options_.seed, .step = step_ * 1000003 + m,
                      .sample_offset = offset + at, .math = options_.math};
      const T* y = model_.forward(ctx, x_chunk_.data(), k);
      const loss_value u = Loss::template compute<Backend, out_width, T>(y, labels_chunk_.data(), dy_.data(), k,
                                                                        T(1) / static_cast<T>(global_n * group), ws_);
      v.sum += u.sum;
      v.correct += u.correct;
      model_.backward(ctx, dy_.data(), k);
      chunk_tree_.push(grads);
    }
    chunk_tree_.fold(grads);  // this rank's subtree; nothing when it has no sample
    const auto t1 = clock::now();
    auto& fig = engine_.figures();
    fig.compute_s += seconds(t0, t1);
    if constexpr (is_data_parallel_v<Policy>) {
      if (engine_.world() > 1) {
        tree_scratch_.reserve_discard(count);
        fig.bytes_sent += tree_allreduce<T, Backend>(engine_.comm(), grads, tree_scratch_.data(), count,
                                                     [&](std::size_t first, std::size_t) { return chunks_->has_samples(first, global_n); });
        const double s = seconds(t1, clock::now());
        fig.comm_s += s;
        fig.comm_exposed_s += s;
      }
    }
    if (group > 1) {
      const auto t2 = clock::now();
      step_tree_.push(grads);
      if (m + 1 == group) step_tree_.fold(grads);
      fig.compute_s += seconds(t2, clock::now());
    }
    return v;
  }

  void optimizer_step(const fit_options& opts) {
    const auto t0 = clock::now();
    auto grads = model_.gradients();
    if (opts.clip_grad_norm > 0) {
      if constexpr (tensor_split) {
        // The whole model's gradient norm, as clip_grad_norm computes it for one buffer.
        const double norm = engine_.template l2<Backend>(grads.data());
        const double factor = opts.clip_grad_norm / (norm + 1e-6);
        if (std::isfinite(norm) && factor < 1.0)
          Backend::for_each(grads.size(), detail::scale_by<T>{grads.data(), static_cast<T>(factor)});
      } else {
        clip_grad_norm<Backend>(grads.data(), grads.size(), opts.clip_grad_norm);
      }
    }
    state_.step(model_.parameters().data(), grads.data(), grads.size(), opts.schedule(step_, opt_.lr));
    ++step_;
    had_samples_ = false;
    engine_.figures().compute_s += seconds(t0, clock::now());
  }

  trainer_options options_;
  optimizer_options opt_;
  int init_threads_;
  engine_type engine_;
  model_type model_;
  optimizer_state state_;
  static constexpr bool staged = !Backend::memory_space::host_accessible;
  using staging_space = typename detail::staging_space_of<Backend>::type;
  buffer<T, typename Backend::memory_space> x_, dy_;
  buffer<std::int32_t, typename Backend::memory_space> labels_;
  buffer<T, staging_space> x_stage_;  // (batch, input) on the host; empty unless staged
  buffer<std::int32_t, staging_space> labels_stage_;
  loss_workspace<Backend> ws_;
  std::size_t step_ = 0;
  bool had_samples_ = false;
  // Deterministic mode (fit_options::deterministic_chunk): the plan of the current fit, one
  // chunk's input, the sums over chunks and over micro-steps, and the exchange's receive buffer.
  std::optional<chunk_plan> chunks_;
  buffer<T, typename Backend::memory_space> x_chunk_, tree_scratch_;
  buffer<std::int32_t, typename Backend::memory_space> labels_chunk_;
  gradient_tree<T, Backend> chunk_tree_, step_tree_;  // gradients of the current optimizer step have been written
};

}  // namespace loom
#include "loom/train/pipeline_trainer.hpp"
