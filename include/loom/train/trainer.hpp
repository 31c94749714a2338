// SPDX-License-Identifier: Apache-2.0
#pragma once
// loom::trainer<Network, Loss, Optimizer, Policy, Backend>: the one trainer of every policy, and
// what a user calls: fit, evaluate, save and load, the weights files, the model. It owns the
// policy's engine (loom/parallel/engine.hpp: loom::replica_engine for single_process,
// data_parallel, tensor parallelism and its hybrid; loom::pipeline_engine for pipelines and
// their hybrid), which holds the model and optimizer state and does everything within a step.
// fit's loop, its checkpoints and its recoveries are written once for every trainer, over the
// engine and the data set's loader with their types erased (loom/train/fit_loop.hpp,
// erased_engine.hpp); what stays here is typed: the engine's construction, the batch buffers,
// evaluate, and the facts of the policy the user named (detail::trainer_facts). The options and
// results are loom/train/fit_options.hpp.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "loom/backend/default_backend.hpp"
#include "loom/core/config.hpp"
#include "loom/core/error.hpp"
#include "loom/core/fault.hpp"
#include "loom/core/type_name.hpp"
#include "loom/data/distributed.hpp"
#include "loom/data/loader.hpp"
#include "loom/io/checkpoint.hpp"
#include "loom/nn/loss.hpp"
#include "loom/nn/model.hpp"
#include "loom/optim/adam.hpp"
#include "loom/optim/any.hpp"
#include "loom/optim/schedule.hpp"
#include "loom/optim/sgd.hpp"
#include "loom/parallel/collectives.hpp"
#include "loom/parallel/data/data_parallel.hpp"
#include "loom/parallel/engine.hpp"
#include "loom/parallel/hybrid.hpp"
#include "loom/parallel/memory_plan.hpp"
#include "loom/parallel/pipeline/engine.hpp"
#include "loom/parallel/data/replica_engine.hpp"
#include "loom/parallel/single_process.hpp"
#include "loom/parallel/tensor/sync.hpp"
#include "loom/train/checkpointing.hpp"
#include "loom/train/decay_exempt.hpp"
#include "loom/train/erased_engine_of.hpp"
#include "loom/train/fit_loop.hpp"
#include "loom/train/fit_options.hpp"
#include "loom/train/recovery.hpp"
#include "loom/train/run_state.hpp"

namespace loom {

namespace detail {
/// Stands for the engine of a policy the trainer does not take, so that the trainer's
/// static_assert is the one error the compiler prints.
struct no_engine_for_policy {};
/// The erased engine over E; for a policy the trainer does not take, a stand-in, so that
/// trainer_body's static_assert is the only error (not a cascade of erased_engine_of's
/// constraint failures).
template <class E>
struct erased_engine_for {
  using type = erased_engine_of<E>;
};
template <>
struct erased_engine_for<no_engine_for_policy> {
  struct type {
    using staging = char;
  };
};
/// The engine the trainer drives for Policy (no_engine_for_policy: a policy the trainer does
/// not take), and its communicator (void when training alone). One specialisation per policy;
/// the engines satisfy loom::engine.
template <class Network, class Loss, class Optimizer, class Policy, class Backend>
struct engine_for {
  using type = no_engine_for_policy;
  using comm = void;
  template <class... Args>
  static type make(Args&&...) {
    return {};
  }
};
template <class Network, class Loss, class Optimizer, class Backend>
struct engine_for<Network, Loss, Optimizer, single_process, Backend> {
  using type = replica_engine<Network, Loss, Optimizer, Backend, single_process_sync<Network, float>>;
  using comm = void;
  static type make(const engine_setup<typename Optimizer::options>& s) { return type(single_process_sync<Network, float>(), s); }
};
template <class Network, class Loss, class Optimizer, class Comm, class... Options, class Backend>
struct engine_for<Network, Loss, Optimizer, data_parallel<Comm, Options...>, Backend> {
  using sync = gradient_allreduce<Network, float, data_parallel<Comm, Options...>>;
  using type = replica_engine<Network, Loss, Optimizer, Backend, sync>;
  using comm = Comm;
  static type make(Comm c, const engine_setup<typename Optimizer::options>& s) {
    return type(sync(std::move(c), s.data_parallel), s);
  }
};
template <class Network, class Loss, class Optimizer, std::size_t Width, class Comm, class Backend>
struct engine_for<Network, Loss, Optimizer, model_parallel<tensor_parallel<Width>, Comm>, Backend> {
  using sync = tensor_parallel_sync<Network, float, Comm, Width>;
  using type = replica_engine<Network, Loss, Optimizer, Backend, sync>;
  using comm = Comm;
  static type make(Comm c, const engine_setup<typename Optimizer::options>& s) { return type(sync(std::move(c)), s); }
};
template <class Network, class Loss, class Optimizer, class Comm, class... DO, std::size_t Width, class Backend>
struct engine_for<Network, Loss, Optimizer, hybrid<data_parallel<Comm, DO...>, tensor_parallel<Width>>, Backend> {
  using sync = tensor_parallel_sync<Network, float, Comm, Width, data_parallel<Comm, DO...>>;
  using type = replica_engine<Network, Loss, Optimizer, Backend, sync>;
  using comm = Comm;
  static type make(Comm c, const engine_setup<typename Optimizer::options>& s) { return type(sync(std::move(c)), s); }
};
template <class Network, class Loss, class Optimizer, std::size_t S, class... O, class Comm, class Backend>
struct engine_for<Network, Loss, Optimizer, model_parallel<pipeline<S, O...>, Comm>, Backend> {
  using type = pipeline_engine<Network, Loss, Optimizer, Backend, pipeline<S, O...>, Comm>;
  using comm = Comm;
  static type make(Comm c, const engine_setup<typename Optimizer::options>& s, const pipeline_run_table& table) {
    return type(std::move(c), s, table);
  }
};
template <class Network, class Loss, class Optimizer, class Comm, class... DO, std::size_t S, class... O, class Backend>
struct engine_for<Network, Loss, Optimizer, hybrid<data_parallel<Comm, DO...>, pipeline<S, O...>>, Backend> {
  using type = pipeline_engine<Network, Loss, Optimizer, Backend, pipeline<S, O...>, Comm, data_parallel<Comm, DO...>>;
  using comm = Comm;
  static type make(Comm c, const engine_setup<typename Optimizer::options>& s, const pipeline_run_table& table) {
    return type(std::move(c), s, table);
  }
};

/// The policy whose code a trainer of Policy runs: Policy itself, except that a pipeline's
/// micro-batch count and schedule are left out (its stage count and cut points stay), so that
/// every micro-batch count and schedule of one cut shares one compiled trainer; and that
/// data_parallel's wire format (compress<>) and ZeRO (shard_optimizer_state) are left to run
/// time (loom::choose_at_run_time), so that plain, compressed and sharded data parallelism
/// over one communicator share one too. The schedule is still verified at compile time
/// (loom::trainer builds its tables from Policy), and both reach the shared code as data
/// (trainer_facts).
template <class Policy>
struct code_policy {
  using type = Policy;
};
template <class Comm, class... O>
  requires sharding_communicator<Comm>
struct code_policy<data_parallel<Comm, O...>> {
  using type = data_parallel<Comm, bucket_bytes<data_parallel<Comm, O...>::bucket_cap_bytes>, choose_at_run_time>;
};
template <std::size_t S, class... O, class Comm>
struct code_policy<model_parallel<pipeline<S, O...>, Comm>> {
  using type = model_parallel<typename stage_cut_of<pipeline<S, O...>>::type, Comm>;
};
template <class Comm, class... DO, std::size_t S, class... O>
struct code_policy<hybrid<data_parallel<Comm, DO...>, pipeline<S, O...>>> {
  using type = hybrid<data_parallel<Comm, DO...>, typename stage_cut_of<pipeline<S, O...>>::type>;
};
template <class Policy>
using code_policy_t = typename code_policy<Policy>::type;

/// What the trainer's shared code (trainer_body, keyed by code_policy_t<Policy>) needs to know
/// of the policy a user named, as values: its name (job descriptions, checkpoint records,
/// messages), a pipeline's schedule tables, and loom::memory_plan's bytes for a rank.
template <class OptimizerOptions>
struct trainer_facts {
  std::string name;
  std::optional<pipeline_run_table> table;  // pipelines: the schedule the user named
  data_parallel_choice data_parallel;       // data_parallel: its wire format and ZeRO
  /// memory_plan's bytes of rank `rank` at `share` samples of a global `batch` over `replicas`
  /// replicas; null where the plan does not apply (a backend other than loom::cpu).
  std::size_t (*planned)(const OptimizerOptions& opt, std::size_t rank, std::size_t share, std::size_t batch,
                         std::size_t replicas) = nullptr;
};
template <class Network, class Optimizer, class Policy, class Backend>
trainer_facts<typename Optimizer::options> trainer_facts_of() {
  trainer_facts<typename Optimizer::options> f;
  f.name = type_name<Policy>();
  f.data_parallel = data_parallel_choice_of<Policy>();
  if constexpr (requires { typename Policy::parallelism; }) {
    if constexpr (is_pipeline_v<typename Policy::parallelism>)
      f.table = pipeline_run_table::of<typename Policy::parallelism>();
  }
  if constexpr (std::is_same_v<Backend, cpu>)
    f.planned = [](const typename Optimizer::options& opt, std::size_t rank, std::size_t share, std::size_t batch,
                   std::size_t replicas) -> std::size_t {
      return rank_memory_for<Network, Optimizer, Policy>(opt, rank).bytes_at(share, batch, replicas);
    };
  return f;
}

/// The data_parallel policy that names what a run-time choice chose: Policy
/// (data_parallel<Comm, ..., choose_at_run_time>) with Chosen (compress<H>,
/// shard_optimizer_state, sync_batch_norm) in place of choose_at_run_time, its bucket size kept.
template <class Policy, class... Chosen>
using chosen_data_parallel =
    std::conditional_t<Policy::bucket_cap_bytes == data_parallel<typename Policy::comm_type>::bucket_cap_bytes,
                       data_parallel<typename Policy::comm_type, Chosen...>,
                       data_parallel<typename Policy::comm_type, bucket_bytes<Policy::bucket_cap_bytes>, Chosen...>>;

/// The facts of a trainer of Policy (data_parallel<Comm, ..., choose_at_run_time>) built with
/// `choice`: those of the policy that names the same options (chosen_data_parallel), so that
/// the run describes itself as that policy's would (job checks, checkpoint records, the memory
/// plan). Throws loom::invalid_argument for a choice the communicator or the backend cannot run.
template <class Network, class Optimizer, class Policy, class Backend>
trainer_facts<typename Optimizer::options> trainer_facts_of_choice(const data_parallel_choice& choice) {
  using comm = typename Policy::comm_type;
  auto with = [&]<class... Chosen>() {
    if (choice.sync_batch_norm)
      return trainer_facts_of<Network, Optimizer, chosen_data_parallel<Policy, Chosen..., sync_batch_norm>, Backend>();
    return trainer_facts_of<Network, Optimizer, chosen_data_parallel<Policy, Chosen...>, Backend>();
  };
  if (choice.wire != gradient_wire::native && choice.wire != gradient_wire::bf16 && choice.wire != gradient_wire::fp16)
    throw invalid_argument("loom::trainer: data_parallel_choice::wire is not one of loom::gradient_wire's values (found " +
                           std::to_string(static_cast<int>(choice.wire)) + ")");
  if (choice.wire != gradient_wire::native && !Backend::memory_space::host_accessible)
    throw invalid_argument(std::string("loom::trainer: data_parallel_choice::wire = gradient_wire::") +
                           to_string(choice.wire) +
                           " (loom::compress<>): compressed gradients are converted in host memory; this backend's "
                           "gradients are not (loom::" + Backend::name + "): choose gradient_wire::native");
  if (choice.shard_state) {
    if constexpr (sharding_communicator<comm>) {
      if (choice.wire == gradient_wire::bf16) return with.template operator()<compress<bf16>, shard_optimizer_state>();
      if (choice.wire == gradient_wire::fp16) return with.template operator()<compress<fp16>, shard_optimizer_state>();
      return with.template operator()<shard_optimizer_state>();
    } else {
      throw invalid_argument("loom::trainer: data_parallel_choice::shard_state (ZeRO): this communicator has no "
                             "ireduce_scatter_v / iallgather_v (blocks of different sizes); use loom::mpi_comm, "
                             "loom::nccl_comm or loom::local_comm");
    }
  }
  if (choice.wire == gradient_wire::bf16) return with.template operator()<compress<bf16>>();
  if (choice.wire == gradient_wire::fp16) return with.template operator()<compress<fp16>>();
  return with.template operator()<>();
}

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


/// The checks of fit's options, on every rank alike before anything is communicated.
LOOM_DECL void check_fit_options(const fit_options& opts, std::size_t samples);

/// fault_options::replace where the policy cannot have it: `watch` (the policy recovers on
/// fewer ranks) and `replace` (it can also merge new processes in) say what it has.
LOOM_DECL void check_replace(const fault_options& fo, bool watch, bool replace, const std::string& policy);

/// A fit's options as the ranks compare them (and a replacement with the survivors').
LOOM_DECL std::string describe_fit(const fit_options& opts, std::size_t samples);

/// The job every rank must share (the trainer's part; the engine adds its policy's own fields).
LOOM_DECL std::string describe_job(const std::string& network, std::size_t parameters, const char* loss, const char* optimizer,
                                   std::uint64_t seed, math_mode math, const std::string& policy,
                                   float label_smoothing);

/// The checks of the trainer's options against its loss (`loss`, its name; `smooths`: whether it
/// takes label smoothing); returns them. Throws loom::invalid_argument naming the value.
LOOM_DECL const trainer_options& checked_trainer_options(const trainer_options& o, const char* loss, bool smooths);
template <class Loss>
constexpr bool takes_label_smoothing() {
  if constexpr (requires { Loss::takes_label_smoothing; }) return Loss::takes_label_smoothing;
  else return false;
}

/// io::describe<Network>() and its tensors, made once per network type (not per trainer type).
template <class Network>
const io::network_description& described() {
  static const io::network_description d = io::describe<Network>();
  return d;
}
/// The values of Network that get no weight decay under decay_norm_and_bias = false (the norm
/// layers' parameters and every bias), from its description, made once per network type.
template <class Network>
const std::vector<index_range>& decay_exempt_of_network() {
  static const std::vector<index_range> r = decay_exempt_of(described<Network>());
  return r;
}
template <class Network>
const std::vector<io::tensor_description>& described_tensors() {
  static const std::vector<io::tensor_description> t = described<Network>().tensors();
  return t;
}

/// Everything of loom::trainer, keyed by the policy whose code it runs (code_policy_t<Policy>):
/// trainers whose policies differ only in run-time facts (a pipeline's micro-batch count and
/// schedule) share it; what they differ in arrives as trainer_facts. See loom::trainer.
template <class Network, class Loss, class Optimizer, class Policy, class Backend>
class trainer_body {
  static_assert(is_network_v<Network>, "loom::trainer's first argument must be a loom::network<loom::input<...>, ...>");
  using traits = detail::engine_for<Network, Loss, Optimizer, Policy, Backend>;
  static_assert(!std::is_same_v<typename traits::type, detail::no_engine_for_policy>,
                "loom::trainer: Policy must be loom::single_process, loom::data_parallel<Comm, ...>, "
                "loom::model_parallel<loom::tensor_parallel<T>, Comm>, loom::hybrid<loom::data_parallel<Comm, ...>, "
                "loom::tensor_parallel<T>>, or a pipeline (loom::model_parallel<loom::pipeline<...>, Comm>, "
                "loom::hybrid<loom::data_parallel<Comm, ...>, loom::pipeline<...>>)");
  // (A pipeline's engine says it for pipelines, in its own words.)
  static_assert(staged_engine<typename traits::type> || detail::comm_reaches_memory_of<typename traits::comm, Backend>(),
                "loom::trainer: this data_parallel communicator cannot move GPU memory (mpi_comm and local_comm "
                "take host memory): with loom::cuda use loom::data_parallel<loom::nccl_comm> from <loom/comm/nccl.hpp> "
                "(tensor parallelism, too, needs a communicator that moves GPU memory)");

 public:
  /// The engine of Policy (loom::replica_engine or loom::pipeline_engine).
  using engine_type = typename traits::type;
  static_assert(std::is_same_v<engine_type, detail::no_engine_for_policy> || engine<engine_type>,
                "loom::trainer: internal error: the engine of this policy does not satisfy loom::engine");
  using comm_type = typename traits::comm;
  using optimizer_options = typename Optimizer::options;
  using value_type = float;

  /// Trains alone, or on Comm::world() (e.g. loom::mpi_comm under mpirun). Collective.
  explicit trainer_body(trainer_facts<optimizer_options> facts, optimizer_options opt, trainer_options options)
      : facts_(std::move(facts)),
        options_(detail::checked_trainer_options(options, Loss::name, detail::takes_label_smoothing<Loss>())), opt_(opt), init_threads_((set_threads(options.threads), 0)),
        engine_(make_engine()), checkpoint_facts_(make_checkpoint_facts()) {
    give_decay_exemption();
    init_ema();
  }

  /// Trains on `comm` (e.g. a loom::local_comm of a local_world). Collective over comm.
  /// Throws loom::invalid_argument when comm's size does not fit the policy (a pipeline: S
  /// ranks, under hybrid a multiple of S; tensor parallelism: T ranks, under hybrid a multiple
  /// of T) or Backend cannot run options.math; loom::communication_error when the ranks were
  /// built differently (every rank names the fields that differ).
  template <class Comm>
    requires(!std::is_void_v<comm_type> && std::is_same_v<Comm, comm_type>)
  explicit trainer_body(trainer_facts<optimizer_options> facts, Comm comm, optimizer_options opt, trainer_options options)
      : facts_(std::move(facts)),
        options_(detail::checked_trainer_options(options, Loss::name, detail::takes_label_smoothing<Loss>())), opt_(opt), init_threads_((set_threads(options.threads), 0)),
        engine_(make_engine(std::move(comm))), checkpoint_facts_(make_checkpoint_facts()) {
    give_decay_exemption();
    init_ema();
  }

  /// Trains on `data` for opts.epochs epochs (or opts.max_steps optimizer steps in all).
  /// opts.batch is the global batch: split over the replicas (each reads only its share), and
  /// in a pipeline each replica's share into the schedule's micro-batches. The result equals
  /// one process training on the whole batch. Collective over the world.
  /// Throws loom::invalid_argument for a zero batch or accumulation, an empty data set, a
  /// negative or non-finite clip_grad_norm, or a deterministic_chunk the policy cannot run;
  /// loom::communication_error when the ranks were given different options.
  template <class Dataset>
  fit_result fit(const Dataset& data, const fit_options& opts = {}) {
    detail::check_dataset_for<Network, Dataset>();
    detail::check_fit_options(opts, data.size());
    if (opts.fault.replace) detail::check_replace(opts.fault, watches(), replaces(), facts_.name);
    // A replacement of a lost rank (fault_options::replace): the survivors are in their
    // recovery, not here; it checks the job with them as it joins (join_as_replacement).
    const bool joining = replaces() && detail::fault_state.joining_as_replacement;
    const std::string fit_description = detail::describe_fit(opts, data.size());
    run_.joined_description = job_description() + ";" + fit_description;
    if (!joining) engine_.check_same_job(fit_description);
    run_.data_identity = data::identity_of(data);
    auto e = erased();
    batches_.reserve(opts.batch, engine_.reads_samples(), engine_.reads_labels());
    detail::erased_loader_of<data::loader_for_t<Dataset>, batches_type> loader(
        batches_, data, opts.batch, options_.seed, engine_.replica(), engine_.replicas());
    fit_result r = detail::run_fit({.engine = e, .data = loader, .ck = checkpoints(e), .opts = opts, .samples = data.size(),
                                    .joining = joining, .seed = options_.seed, .base_lr = detail::base_lr<Optimizer>(opt_)});
    // ZeRO leaves the last step's parameter gathers in flight for a next forward: complete
    // them, so that the model is whole when fit returns.
    engine_.settle();
    return r;
  }

  /// Saves a checkpoint of the current state as `dir`/step-<steps()> (see loom/io/checkpoint.hpp),
  /// and waits until it is committed. Collective. Returns its path. After fit, the position saved
  /// is the end of fit's last epoch. Throws loom::io_error on every rank when any rank's part
  /// cannot be written; nothing is left in its place.
  std::filesystem::path save(const std::filesystem::path& dir) {
    auto e = erased();
    const std::unique_ptr<collectives> coll = e.world_collectives();
    checkpoints(e).save(*coll, dir, /*async=*/false, /*keep=*/0, 600);
    return dir / ("step-" + std::to_string(run_.step));
  }

  /// Loads the checkpoint `where` (a step-<n> directory, or the newest valid one in a run's
  /// directory), saved under any policy and world size for this network and optimizer: the
  /// parameters, the optimizer state, the step count, and the position in the data, so that the
  /// next fit continues where the saved run stopped. Collective. Throws loom::io_error on every
  /// rank (naming the file, tensor or field, what was expected and what was found) when no
  /// valid checkpoint is there; nothing is changed then. A newer checkpoint refused in favour of
  /// an older one is named on stderr (rank 0).
  std::filesystem::path load(const std::filesystem::path& where) {
    if (replacement_pending()) return {};  // a replacement takes the survivors' state in fit
    auto e = erased();
    const std::unique_ptr<collectives> coll = e.world_collectives();
    return checkpoints(e).load(*coll, where, /*none_ok=*/false, nullptr, &std::cerr, nullptr, 0);
  }

  /// Writes the whole model's weights as one safetensors file (loom::save_weights' format, for
  /// torch.nn.Sequential): rank 0 writes, from the parameters every rank contributes. Collective.
  void save_weights(const std::filesystem::path& path) {
    const std::vector<value_type> whole = gather_parameters();
    const std::unique_ptr<collectives> coll = erased().world_collectives();
    // The buffers (running statistics): replica 0's, the stages' own (collective).
    const std::vector<value_type> buffers = gather_buffers(*coll);
    std::string err;
    if (rank() == 0) {
      try {
        io::save_weights<Network, value_type>(std::span<const value_type>(whole), std::span<const value_type>(buffers),
                                              path);
      } catch (const std::exception& e) {
        err = e.what();
      }
    }
    if (const std::string all = coll->agree_on_errors(err); !all.empty()) throw io_error(all);
  }

  /// Sets the parameters from a whole-model safetensors file (loom::load_weights' checks): every
  /// rank reads the file and takes the part it holds. Collective; on any rank's error every rank
  /// throws and no parameter changes.
  void load_weights(const std::filesystem::path& path) {
    if (replacement_pending()) return;  // a replacement takes the survivors' state in fit
    io::model_weights<value_type> whole;
    std::string err;
    try {
      whole = io::load_weights_and_buffers<Network, value_type>(path);
    } catch (const std::exception& e) {
      err = e.what();
    }
    auto e = erased();
    if (const std::string all = e.world_collectives()->agree_on_errors(err); !all.empty()) throw io_error(all);
    const shard_map m = engine_.shard();
    std::vector<value_type> mine(m.local_count);
    copy_from_whole(m, whole.parameters.data(), mine.data());
    e.parameters_from_host(mine.data(), mine.size());
    std::vector<value_type> mine_buffers(m.local_buffer_count);
    copy_from_whole(detail::buffer_map(m), whole.buffers.data(), mine_buffers.data());
    e.buffers_from_host(mine_buffers.data(), mine_buffers.size());
  }

  /// Mean loss and accuracy of the current parameters on `data`, in evaluation mode: each
  /// replica evaluates its share (through its stages, in a pipeline) and the sums reach every
  /// rank. Collective over the world.
  template <class Dataset>
  eval_result evaluate(const Dataset& data, std::size_t batch = 500) {
    detail::check_dataset_for<Network, Dataset>();
    if (batch == 0) throw invalid_argument("loom::trainer::evaluate: batch must be at least 1, got 0");
    data::loader_for_t<Dataset> loader(data, batch, options_.seed, engine_.replica(), engine_.replicas(),
                                       /*shuffle=*/false);
    loader.start_epoch(0);
    batches_.reserve(batch, engine_.reads_samples(), engine_.reads_labels());
    loss_sums sums;
    for (std::size_t k = 0; k < loader.batches_per_epoch(); ++k) {
      const batch_view<value_type> b = batches_.next(loader);
      if (b.n == 0) continue;  // the same on every rank of this replica
      const loss_value v = engine_.evaluate_batch(b, options_.seed, run_.step);
      sums += {.loss = v.sum, .correct = static_cast<double>(v.correct), .samples = static_cast<double>(b.n)};
    }
    engine_.end_evaluation();
    erased().sum(sums);
    return {.samples = static_cast<std::size_t>(sums.samples), .loss = sums.mean_loss(), .accuracy = sums.accuracy()};
  }

  /// Whether this trainer keeps an EMA of the weights (trainer_options::ema) and it holds one:
  /// after fit's first optimizer step, or a checkpoint loaded.
  bool has_ema() const noexcept { return run_.ema.on() && run_.ema.valid; }

  /// This rank's EMA of the weights (empty without trainer_options::ema): the parameters then
  /// the buffers, in the whole model's flat layout (Network's, as gather_parameters and
  /// gather_buffers lay them), in host memory.
  const std::vector<value_type>& ema_values() const noexcept { return run_.ema.values; }

  /// evaluate (its result, its batches) with the EMA of the weights, buffers included, in place
  /// of the weights; they come back after. Collective over the world. Throws
  /// loom::invalid_argument when has_ema() is false.
  template <class Dataset>
  eval_result evaluate_ema(const Dataset& data, std::size_t batch = 500) {
    return with_ema("evaluate_ema", [&] { return evaluate(data, batch); });
  }

  /// save_weights of the EMA of the weights: the same safetensors file, names and buffers
  /// (replica 0's EMA of them). Collective. Throws loom::invalid_argument when has_ema() is
  /// false, loom::io_error as save_weights.
  void save_ema_weights(const std::filesystem::path& path) {
    with_ema("save_ema_weights", [&] {
      save_weights(path);
      return 0;
    });
  }

  /// This rank's model: a loom::model of the whole network (or of its tensor-parallel slice);
  /// in a pipeline a std::variant over the stages' models holding this rank's stage (use
  /// std::visit, or stage_model<S>()).
  decltype(auto) model() noexcept { return engine_.model(); }
  decltype(auto) model() const noexcept { return engine_.model(); }
  /// This rank's optimizer state (of its part of the model).
  decltype(auto) optimizer() noexcept { return engine_.optimizer(); }
  /// Optimizer steps taken so far, over all fit() calls.
  std::size_t steps() const noexcept { return run_.step; }
  /// This process's rank and the number of ranks, in the whole world (0 and 1 alone).
  int rank() const { return engine_.rank(); }
  int ranks() const { return engine_.world(); }
  /// This rank's model replica and the number of replicas (data parallelism's split).
  int replica() const { return engine_.replica(); }
  int replicas() const { return engine_.replicas(); }
  /// What this rank holds of the whole model (see loom::shard_map).
  shard_map shard() const { return engine_.shard(); }
  engine_type& engine() noexcept { return engine_; }

  /// The pipeline stage this rank runs (pipelines).
  int stage() const
    requires staged_engine<engine_type>
  {
    return engine_.stage();
  }
  /// This rank's stage model as its type, when the caller knows the stage (pipelines).
  /// Throws loom::invalid_argument when this rank runs another stage.
  template <std::size_t Stage>
    requires staged_engine<engine_type>
  auto& stage_model() {
    static_assert(Stage < engine_type::stages, "loom::trainer::stage_model<Stage>: no such stage");
    if (stage() != static_cast<int>(Stage))
      throw invalid_argument("loom::trainer::stage_model<" + std::to_string(Stage) + ">: rank " + std::to_string(rank()) +
                             " runs stage " + std::to_string(stage()) + ", not " + std::to_string(Stage));
    return std::get<Stage>(engine_.models());
  }

  /// The L2 norm of the whole model's parameters, summed in double (split parameters' squares
  /// summed over the model-parallel group, replicated ones counted once). Collective over the
  /// model-parallel group.
  double parameters_l2() { return engine_.parameters_l2(); }

  /// The whole model's flat parameters (Network::parameter_count, Network's layout) as a host
  /// vector, on every rank. Collective over the model-parallel group.
  std::vector<value_type> gather_parameters() { return engine_.gather_parameters(); }

  /// The whole model's buffers (running statistics; Network::buffer_count, its flat buffer of
  /// buffers) as a host vector, on every rank: replica 0's (each replica's are its own), each
  /// stage's from its rank. Collective over the world.
  std::vector<value_type> gather_buffers() { return gather_buffers(*erased().world_collectives()); }

 private:
  /// The EMA of trainer_options::ema, checked, sized as this rank's parameters and buffers; the
  /// policies whose ranks hold whole replicas only (single_process, data_parallel).
  void init_ema() {
    detail::check_ema_options(options_.ema);
    detail::ema_state& ema = run_.ema;
    ema.opts = options_.ema;
    if (!ema.on()) return;
    const shard_map m = engine_.shard();
    if (m.stages > 1 || m.slices > 1)
      throw invalid_argument("loom::trainer_options::ema: an EMA of the weights is kept under single_process and "
                             "data_parallel, where every rank holds whole replicas; not yet under " + facts_.name +
                             " (a pipeline's stages or tensor-parallel slices would each average their part)");
    auto e = erased();
    ema.params = e.local_count();
    ema.values.assign(ema.params + e.buffer_values(), 0.0f);
    for (const auto& t : detail::described_tensors<Network>())
      if (t.kind == tensor_kind::buffer && t.element == tensor_element::int64)
        for (std::size_t i = 0; i < t.count; ++i) ema.counts.push_back(ema.params + t.offset + i);
  }

  /// f() with the EMA of the weights in place of the weights (parameters and buffers), which
  /// come back after, also when f throws.
  template <class F>
  auto with_ema(const char* what, F&& f) {
    if (!has_ema())
      throw invalid_argument(std::string("loom::trainer::") + what + ": " +
                             (run_.ema.on() ? "no EMA of the weights yet (fit has taken no optimizer step and no "
                                              "checkpoint was loaded)"
                                            : "this trainer keeps no EMA of the weights (trainer_options::ema.decay "
                                              "is 0)"));
    auto e = erased();
    const detail::ema_state& ema = run_.ema;
    std::vector<value_type> kept(ema.values.size());
    e.parameters_to_host(kept.data());
    if (kept.size() > ema.params) e.buffers_to_host(kept.data() + ema.params);
    auto put = [&](const std::vector<value_type>& v) {
      e.parameters_from_host(v.data(), ema.params);
      if (v.size() > ema.params) e.buffers_from_host(v.data() + ema.params, v.size() - ema.params);
    };
    put(ema.values);
    try {
      auto r = f();
      put(kept);
      return r;
    } catch (...) {
      put(kept);
      throw;
    }
  }

  std::vector<value_type> gather_buffers(collectives& c) {
    auto e = erased();
    const shard_map m = e.shard();
    std::vector<value_type> mine(e.buffer_values());
    e.buffers_to_host(mine.data());
    return detail::gather_whole_buffers(c, m, mine);
  }

  using batches_type = detail::batch_buffers<Backend, Network::input_shape::size>;
  using erased_type = typename detail::erased_engine_for<engine_type>::type;

  /// The engine behind the shared code's interface (see loom/train/erased_engine.hpp).
  erased_type erased() {
    return erased_type(engine_, snapshot_stage_, [this](std::size_t batch) { return planned_bytes(batch); });
  }
  detail::checkpoints checkpoints(detail::erased_engine& e) { return {e, run_, checkpoint_facts_, checkpoint_writer_}; }

  /// Whether this run detects failures and recovers (the engine can, recovering_engine, and
  /// this run can: not where it shards the optimizer state), and also replaces lost ranks.
  bool watches() const {
    if constexpr (engine_traits<engine_type>::recovers) return engine_.can_recover();
    else return false;
  }
  bool replaces() const { return engine_traits<engine_type>::replaces && watches(); }
  /// Whether this process replaces a lost rank and has not joined yet (its first fit joins).
  bool replacement_pending() const { return watches() && detail::fault_state.joining_as_replacement; }

  /// What loom::memory_plan says this rank needs at its share of a full batch of `batch` (its
  /// stage or slice, its replica's share); 0 where the plan does not apply: a backend other
  /// than loom::cpu, which the plan models (loom::cuda, a test's reference backend).
  std::size_t planned_bytes(std::size_t batch) const {
    if constexpr (!std::is_same_v<Backend, cpu>) {
      return 0;
    } else {
      const std::size_t replicas = static_cast<std::size_t>(engine_.replicas()), i = static_cast<std::size_t>(engine_.replica());
      const std::size_t share = batch * (i + 1) / replicas - batch * i / replicas;
      return facts_.planned ? facts_.planned(opt_, static_cast<std::size_t>(engine_.rank()), share, batch, replicas) : 0;
    }
  }

  /// What a checkpoint records and checks of this trainer: its facts, and the names of the
  /// optimizer buffers this rank keeps (as many of Optimizer::buffer_names as it has).
  detail::checkpoint_facts make_checkpoint_facts() {
    const std::size_t n = erased().state_count();
    // A rank holding no parameters (a pipeline stage of activations only) asks a one-value state.
    const std::size_t k = n ? engine_.optimizer().buffers().size() / n
                            : typename Optimizer::template state<value_type, Backend>(opt_, 1).buffers().size();
    detail::checkpoint_facts f{.network = &detail::described<Network>(), .tensors = &detail::described_tensors<Network>(),
                               .parameter_count = Network::parameter_count, .loss = Loss::name,
                               .optimizer = detail::optimizer_name<Optimizer>(opt_), .policy = facts_.name,
                               .seed = options_.seed, .math = options_.math, .label_smoothing = options_.label_smoothing,
                               .optimizer_options = detail::optimizer_options_text<Optimizer>(opt_), .optimizer_buffers = {}};
    for (std::size_t i = 0; i < k; ++i) f.optimizer_buffers.emplace_back(detail::optimizer_buffer_names<Optimizer>(opt_)[i]);
    return f;
  }

  /// decay_norm_and_bias = false: the optimizer state's elements that get no weight decay, the
  /// network's norm parameters and biases as this rank's state holds them (the whole model, a
  /// stage, a tensor slice, or ZeRO's slices of any of them).
  void give_decay_exemption() {
    if constexpr (requires(std::vector<index_range> v) { engine_.optimizer().set_decay_exempt(v); }) {
      if (!detail::skips_norm_and_bias_decay(opt_)) return;
      auto e = erased();
      const std::optional<shard_map> state_map = e.state_shard();
      engine_.optimizer().set_decay_exempt(
          detail::state_decay_exempt(state_map ? *state_map : e.shard(), detail::decay_exempt_of_network<Network>()));
    }
  }

  engine_setup<optimizer_options> setup() const {
    return {.seed = options_.seed, .math = options_.math, .optimizer = opt_, .job = job_description(),
            .data_parallel = facts_.data_parallel, .label_smoothing = options_.label_smoothing};
  }
  engine_type make_engine() const {
    if constexpr (std::is_void_v<comm_type>) return traits::make(setup());
    else return make_engine(comm_type::world());
  }
  template <class Comm>
  engine_type make_engine(Comm comm) const {
    if constexpr (staged_engine<engine_type>)
      return traits::make(std::move(comm), setup(), facts_.table.value());  // trainer_facts_of sets it for pipelines
    else
      return traits::make(std::move(comm), setup());
  }

  /// The job every rank must share; the engine adds its policy's own fields.
  std::string job_description() const {
    std::string job = detail::describe_job(type_name<Network>(), Network::parameter_count, Loss::name,
                                           detail::optimizer_name<Optimizer>(opt_), options_.seed, options_.math, facts_.name,
                                           options_.label_smoothing);
    if (options_.ema.decay > 0)  // every rank keeps it alike, or none does
      job += ";ema=" + std::to_string(options_.ema.decay) + "/" + std::to_string(options_.ema.every) + "/" +
             std::to_string(options_.ema.warmup_steps);
    return job;
  }

  trainer_facts<optimizer_options> facts_;
  trainer_options options_;
  optimizer_options opt_;
  int init_threads_;
  engine_type engine_;
  detail::checkpoint_facts checkpoint_facts_;
  detail::run_state run_;
  batches_type batches_;
  typename erased_type::staging snapshot_stage_;  // checkpoints' host copy; empty unless staged
  std::unique_ptr<io::checkpointer> checkpoint_writer_;
};
}  // namespace detail

/// Trains Network with Loss and Optimizer under Policy on Backend (see detail::trainer_body for
/// the members, which are all of this class's but its constructors). Policy is one of
/// loom::single_process (the default), loom::data_parallel<Comm, ...>,
/// loom::model_parallel<loom::pipeline<S, ...>, Comm>, loom::model_parallel<loom::tensor_parallel<T>, Comm>,
/// loom::hybrid<loom::data_parallel<Comm, ...>, loom::pipeline<S, ...>> or
/// loom::hybrid<loom::data_parallel<Comm, ...>, loom::tensor_parallel<T>>.
///
/// Compile time: the members are compiled once per detail::code_policy_t<Policy>, so the
/// micro-batch counts and schedules of one pipeline cut share them (their tables are verified
/// here, at compile time, and handed over as data).
template <class Network, class Loss, class Optimizer, class Policy = single_process, class Backend = cpu>
class trainer : public detail::trainer_body<Network, Loss, Optimizer, detail::code_policy_t<Policy>, Backend> {
  using body = detail::trainer_body<Network, Loss, Optimizer, detail::code_policy_t<Policy>, Backend>;
  using comm_ = typename body::comm_type;
  // (The shared body takes data_parallel's wire format at run time: checked here, on Policy.)
  static_assert(detail::data_parallel_choice_of<Policy>().wire == gradient_wire::native ||
                    Backend::memory_space::host_accessible,
                "loom::compress<>: compressed gradients are converted in host memory; this backend's gradients are "
                "not (loom::cuda): drop compress<> for now");
  static constexpr bool chooses_ = detail::chooses_at_run_time_v<Policy>;
  static detail::trainer_facts<typename Optimizer::options> facts(const data_parallel_choice& choice = {}) {
    if constexpr (chooses_) return detail::trainer_facts_of_choice<Network, Optimizer, Policy, Backend>(choice);
    else return detail::trainer_facts_of<Network, Optimizer, Policy, Backend>();
  }

 public:
  using optimizer_options = typename Optimizer::options;
  using policy_type = Policy;

  /// Trains alone, or on Comm::world() (e.g. loom::mpi_comm under mpirun). Collective.
  explicit trainer(optimizer_options opt = {}, trainer_options options = {})
    requires(std::is_void_v<comm_> || requires { comm_::world(); })
      : body(facts(), opt, options) {}

  /// Under loom::data_parallel<Comm, ..., loom::choose_at_run_time>: trains on Comm::world()
  /// with the wire format and ZeRO that `choice` names (without it: float gradients, no ZeRO),
  /// bitwise as the policy that names them would. Every rank must choose alike: the job check
  /// names the policy field that differs. Throws loom::invalid_argument for a choice the
  /// communicator (ZeRO needs ireduce_scatter_v) or the backend (compression: host memory)
  /// cannot run. Collective.
  trainer(optimizer_options opt, trainer_options options, const data_parallel_choice& choice)
    requires(chooses_ && requires { comm_::world(); })
      : body(facts(choice), opt, options) {}
  /// The same on `comm`. Collective over comm.
  template <class Comm>
    requires(chooses_ && std::is_same_v<Comm, comm_>)
  trainer(Comm comm, optimizer_options opt, trainer_options options, const data_parallel_choice& choice)
      : body(facts(choice), std::move(comm), opt, options) {}

  /// Trains on `comm` (e.g. a loom::local_comm of a local_world). Collective over comm.
  /// Throws loom::invalid_argument when comm's size does not fit the policy (a pipeline: S
  /// ranks, under hybrid a multiple of S; tensor parallelism: T ranks, under hybrid a multiple
  /// of T) or Backend cannot run options.math; loom::communication_error when the ranks were
  /// built differently (every rank names the fields that differ).
  template <class Comm>
    requires(!std::is_void_v<comm_> && std::is_same_v<Comm, comm_>)
  explicit trainer(Comm comm, optimizer_options opt = {}, trainer_options options = {})
      : body(facts(), std::move(comm), opt, options) {}
};


}  // namespace loom

#include "loom/train/instantiations.hpp"

#if defined(LOOM_DEFINITIONS_VISIBLE)
#include "loom/train/impl/trainer.ipp"
#endif
