// SPDX-License-Identifier: Apache-2.0
#pragma once
// The one implementation of detail::erased_engine (loom/train/erased_engine.hpp), for any
// engine: each member is the engine's own, or its capability's where the engine has it
// (engine_traits, the concepts of loom/parallel/engine.hpp) and a no-op or a refusal where it
// has not. Also the erased loader over a data set's loader, and the trainer's batch buffers
// (samples and labels in the backend's memory, filled through page-locked staging where the
// host cannot write it).

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "loom/core/memory.hpp"
#include "loom/monitor/sampler.hpp"
#include "loom/parallel/collectives.hpp"
#include "loom/parallel/engine.hpp"
#include "loom/train/erased_engine.hpp"
#include "loom/train/recovery.hpp"

namespace loom::detail {

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

/// Copies between Backend's memory and the host's.
template <class Backend>
struct host_copies {
  using space = typename Backend::memory_space;
  static void to_host(const float* src, std::size_t n, float* dst) {
    if constexpr (space::host_accessible) {
      if (n) std::memcpy(dst, src, n * sizeof(float));
    } else {
      space::copy_to_host(dst, src, n * sizeof(float));
    }
  }
  static void from_host(const float* src, std::size_t n, float* dst) {
    if constexpr (space::host_accessible) {
      if (n) std::memcpy(dst, src, n * sizeof(float));
    } else {
      space::copy_from_host(dst, src, n * sizeof(float));
    }
  }
};

/// NVML's view of the device Backend computes on (loom::cuda), or null: on the CPU, or without
/// NVML (monitor/sampler.hpp). Opened once per process.
template <class Backend>
std::shared_ptr<const monitor::nvml> device_monitor_of() {
  if constexpr (requires { Backend::pci_bus_id(); }) {
    static const std::shared_ptr<const monitor::nvml> device = [] {
      auto n = std::make_shared<const monitor::nvml>(Backend::pci_bus_id());
      return n->available() ? n : nullptr;
    }();
    return device;
  } else {
    return nullptr;
  }
}

/// Engine behind erased_engine (see the file comment). Refers to the engine and to the
/// trainer's snapshot staging, both of which must outlive it; `planned(batch)` is
/// loom::memory_plan's bytes for this rank at that global batch (0: no plan).
template <engine Engine>
class erased_engine_of final : public erased_engine {
  using traits = engine_traits<Engine>;
  using Backend = typename Engine::backend_type;
  using copies = host_copies<Backend>;
  static constexpr bool staged = !Backend::memory_space::host_accessible;

 public:
  using staging = buffer<float, typename staging_space_of<Backend>::type>;

  erased_engine_of(Engine& e, staging& snapshot_stage, std::function<std::size_t(std::size_t)> planned)
      : engine_(e), snapshot_stage_(snapshot_stage), planned_(std::move(planned)) {
    caps.recovering = traits::recovers;
    if constexpr (traits::recovers) caps.recovers = engine_.can_recover();
    caps.replaces = traits::replaces && caps.recovers;
    caps.detects = traits::detects && !caps.recovers;
    caps.ends_with_roll_call = traits::detects && traits::replica_ranks > 1;
    caps.keeps_whole_replica = traits::recovers && traits::replica_ranks == 1;
    caps.every_rank_holds_loss = traits::every_rank_holds_loss;
    caps.replica_ranks = traits::replica_ranks;
  }

  // monitor::rank_source
  int rank() const override { return engine_.rank(); }
  int world() const override { return engine_.world(); }
  rank_figures& figures() override { return engine_.figures(); }
  void reset_figures() override { engine_.reset_figures(); }
  std::vector<rank_figures> gather_figures() override { return engine_.gather_figures(); }
  std::vector<std::vector<monitor::span_event>> gather_timelines(const monitor::timeline& t,
                                                                 std::vector<std::size_t>& dropped) override {
    return engine_.gather_timelines(t, dropped);
  }
  double flops_per_sample() const override { return static_cast<double>(engine_.flops_per_sample()); }
  double peak_gflops() override { return monitor::measure_peak_gflops<Backend>(); }
  std::shared_ptr<const monitor::nvml> device_monitor() override { return device_monitor_of<Backend>(); }

  // loom::engine
  int replica() const override { return engine_.replica(); }
  int replicas() const override { return engine_.replicas(); }
  std::size_t prepare_fit(std::size_t batch, std::size_t chunk) override { return engine_.prepare_fit(batch, chunk); }
  loss_value micro_step(const batch_view<float>& b, std::size_t m, std::size_t group, std::uint64_t seed,
                        std::uint64_t salt) override {
    return engine_.micro_step(b, m, group, seed, salt);
  }
  void sum(double* v, std::size_t n) override { engine_.sum(v, n); }
  using erased_engine::sum;
  void optimizer_step(float lr, double clip) override { engine_.optimizer_step(lr, clip); }
  shard_map shard() const override { return engine_.shard(); }
  std::size_t local_count() const override { return engine_.local_count(); }
  std::unique_ptr<collectives> world_collectives() override {
    if constexpr (traits::communicates)
      return std::make_unique<comm_collectives<std::remove_cvref_t<decltype(engine_.world_comm())>>>(engine_.world_comm());
    else
      return std::make_unique<solo_collectives>();
  }
  void set_step_commit(bool on) override {
    if constexpr (traits::commits) engine_.set_step_commit(on);
  }

  // The state through host memory.
  std::optional<shard_map> state_shard() const override {
    if constexpr (traits::shards)
      if (engine_.shards_state()) return engine_.state_shard();
    return std::nullopt;
  }
  bool shards_state() const override {
    if constexpr (traits::shards) return engine_.shards_state();
    else return false;
  }
  std::size_t state_count() const override {
    if constexpr (traits::shards)
      if (engine_.shards_state()) return engine_.state_count();
    return engine_.local_count();
  }
  void parameters_to_host(float* dst) override { copies::to_host(engine_.local_parameters(), engine_.local_count(), dst); }
  void parameters_from_host(const float* src, std::size_t n) override { copies::from_host(src, n, engine_.local_parameters()); }
  std::size_t buffer_values() const override { return engine_.local_buffer_count(); }
  void buffers_to_host(float* dst) override { copies::to_host(engine_.local_buffers(), engine_.local_buffer_count(), dst); }
  void buffers_from_host(const float* src, std::size_t n) override { copies::from_host(src, n, engine_.local_buffers()); }
  void buffer_to_host(std::size_t i, float* dst) override {
    const std::size_t m = state_count();
    copies::to_host(engine_.optimizer().buffers().data() + i * m, m, dst);
  }
  void buffer_from_host(std::size_t i, const float* src) override {
    const std::size_t m = state_count();
    copies::from_host(src, m, engine_.optimizer().buffers().data() + i * m);
  }
  std::size_t optimizer_steps() override { return engine_.optimizer().steps(); }
  void set_optimizer_steps(std::size_t n) override { engine_.optimizer().set_steps(n); }
  float* snapshot_staging(std::size_t n) override {
    if constexpr (staged) {
      snapshot_stage_.reserve_discard(n);
      return snapshot_stage_.data();
    } else {
      (void)n;
      return nullptr;
    }
  }

  // Failures.
  void watch_for_failures(double deadline_s) override {
    if constexpr (traits::detects) engine_.watch_for_failures(deadline_s);
  }
  void set_deadline(double deadline_s) override {
    if constexpr (traits::detects) engine_.set_deadline(deadline_s);
  }
  std::string watch_job_id() override {
    if constexpr (traits::recovers) return engine_.world_comm().watch()->job_id;
    else return {};
  }
  void after_recovery() override {
    if constexpr (traits::recovers) engine_.after_recovery();
  }
  void broadcast_state(int root) override {
    if constexpr (traits::recovers) engine_.broadcast_state(root);
  }
  bool finish_committed_step() override {
    if constexpr (traits::commits) return engine_.finish_committed_step();
    else return false;
  }
  fit_position survive(run_state& s, const rank_failure& f, const fit_options& opts, int number, io::checkpointer* ckpt,
                       std::string& report) override {
    if constexpr (traits::recovers)
      return detail::survive(engine_.world_comm(), *this, s, f, opts.fault, opts.checkpoint.directory, number, ckpt, report);
    else
      throw f;
  }
  [[noreturn]] void end_after_failure(run_state& s, const rank_failure& f, const fit_options& opts) override {
    if constexpr (traits::detects)
      detail::end_after_failure(engine_.world_comm(), f, opts.fault, opts.checkpoint.directory, s.step, s.failed_at,
                                why_no_recovery(*this));
    throw f;
  }
  fit_position join_as_replacement(run_state& s, const fit_options& opts) override {
    if constexpr (traits::replaces) return detail::join_as_replacement(engine_.world_comm(), *this, s, opts.fault);
    else return {};
  }

  std::size_t planned_bytes(std::size_t batch) const override { return planned_ ? planned_(batch) : 0; }

 private:
  Engine& engine_;
  staging& snapshot_stage_;
  std::function<std::size_t(std::size_t)> planned_;
};

/// A batch of n samples in Backend's memory: the samples where the engine reads them, the labels
/// likewise, filled on the host (through page-locked staging where the host cannot write
/// Backend's memory). The trainer's, for fit and evaluate.
template <class Backend, std::size_t InWidth>
class batch_buffers {
  using space = typename Backend::memory_space;
  using staging_space = typename staging_space_of<Backend>::type;
  static constexpr bool staged = !space::host_accessible;

 public:
  /// Room for n samples of an engine that reads `samples` and `labels`.
  void reserve(std::size_t n, bool samples, bool labels) {
    samples_ = samples;
    labels_ = labels;
    if (samples) x_.reserve_discard(n * InWidth);
    if (labels) y_.reserve_discard(n);
    if constexpr (staged) {
      if (samples) x_stage_.reserve_discard(n * InWidth);
      if (labels) y_stage_.reserve_discard(n);
    }
  }

  /// The loader's next batch (data::distributed_loader's interface) into these buffers.
  template <class Loader>
  batch_view<float> next(Loader& loader) {
    batch_view<float> b;
    if constexpr (!staged) {
      b.n = loader.next(samples_ ? x_.data() : nullptr, labels_ ? y_.data() : nullptr, b.global_n);
    } else {
      // The previous batch's copies must have left the staging buffers; the loss sum of that
      // batch already waited for them, so this returns at once.
      if (samples_ || labels_) Backend::synchronize();
      b.n = loader.next(samples_ ? x_stage_.data() : nullptr, labels_ ? y_stage_.data() : nullptr, b.global_n);
      if (samples_) Backend::copy(x_.data(), x_stage_.data(), b.n * InWidth);
      if (labels_) Backend::copy(y_.data(), y_stage_.data(), b.n);
    }
    b.offset = loader.local_offset();
    b.x = samples_ ? x_.data() : nullptr;
    b.labels = labels_ ? y_.data() : nullptr;
    return b;
  }

 private:
  bool samples_ = true, labels_ = true;
  buffer<float, space> x_;                     // (batch, input)
  buffer<std::int32_t, space> y_;              // (batch)
  buffer<float, staging_space> x_stage_;       // (batch, input) on the host; empty unless staged
  buffer<std::int32_t, staging_space> y_stage_;
};

/// Loader (data::loader_for_t<Dataset>) behind erased_loader, filling `batches`.
template <class Loader, class Batches>
class erased_loader_of final : public erased_loader {
 public:
  template <class... Args>
  explicit erased_loader_of(Batches& batches, Args&&... args) : batches_(batches), loader_(std::forward<Args>(args)...) {}
  void start_epoch(std::size_t epoch) override { loader_.start_epoch(epoch); }
  void skip(std::size_t batches) override { loader_.skip(batches); }
  std::size_t batches_per_epoch() const override { return loader_.batches_per_epoch(); }
  void set_rank_block(std::size_t block) override { loader_.set_rank_block(block); }
  void reshard(int replica, int replicas) override { loader_.reshard(replica, replicas); }
  batch_view<float> next_batch() override { return batches_.next(loader_); }

 private:
  Batches& batches_;
  Loader loader_;
};

}  // namespace loom::detail
