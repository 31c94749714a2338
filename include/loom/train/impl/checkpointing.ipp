// SPDX-License-Identifier: Apache-2.0
#pragma once
// The definitions of checkpointing.hpp's non-template functions: included at the end of the header
// (header-only), or compiled once in src/loom.cpp (LOOM_SEPARATE_COMPILATION; see loom/core/config.hpp).

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ostream>

#include "loom/core/test_hooks.hpp"
#include "loom/monitor/timeline.hpp"
#include "loom/train/checkpointing.hpp"

namespace loom::detail {

LOOM_DECL bool restarted_by_launcher() {
  const char* v = std::getenv("LOOM_RESTART");
  return v && *v && std::strtoul(v, nullptr, 10) > 0;
}

LOOM_DECL void check_resumable(const io::trainer_record& rec, const std::filesystem::path& path, std::uint64_t seed,
                               const fit_options& opts, std::size_t samples, const std::string& data) {
  std::string why;
  if (rec.seed != seed)
    why = "it was saved with seed " + std::to_string(rec.seed) + ", this trainer has seed " + std::to_string(seed);
  else if (rec.batch_in_epoch != 0 && rec.batch != opts.batch)
    why = "it stopped in the middle of an epoch with batch " + std::to_string(rec.batch) + ", and this fit asks for batch " +
          std::to_string(opts.batch) + " (a different batch can resume only at an epoch's start)";
  else if (rec.batch_in_epoch != 0 && rec.samples != samples)
    why = "it stopped in the middle of an epoch of " + std::to_string(rec.samples) + " samples, and this training set has " +
          std::to_string(samples);
  else if (rec.batch_in_epoch != 0 && rec.data != data)
    why = "it stopped in the middle of an epoch of the data " + (rec.data.empty() ? std::string("(an IDX set)") : rec.data) +
          ", and this training set is " + (data.empty() ? std::string("an IDX set") : data) +
          " (other shards, streams or shuffle window give another order)";
  if (!why.empty()) throw invalid_argument("loom::trainer::fit: cannot resume exactly from " + path.string() + ": " + why);
}

LOOM_DECL io::trainer_record checkpoints::record_now() const {
  io::trainer_record r;
  fit_position p = run.at.next();  // an epoch that just ended: the next one's start
  if (engine.caps.every_rank_holds_loss && !run.global_sums) engine.sum(p.sums);
  r.step = run.step;
  r.epoch = p.epoch;
  r.batch_in_epoch = p.batch;
  r.epoch_sums[0] = p.sums.loss;
  r.epoch_sums[1] = p.sums.correct;
  r.epoch_sums[2] = p.sums.samples;
  r.seed = facts.seed;
  const fit_record& fit = run.last_fit;
  r.batch = fit.batch;
  r.accumulation = fit.accumulation;
  r.epochs = fit.epochs;
  r.max_steps = fit.max_steps;
  r.deterministic_chunk = fit.deterministic_chunk;
  r.clip_grad_norm = fit.clip_grad_norm;
  r.samples = fit.samples;
  r.data = run.data_identity;
  r.lr = run.last_lr;
  r.math = to_string(facts.math);
  r.label_smoothing = facts.label_smoothing;
  r.loss = facts.loss;
  r.optimizer = facts.optimizer;
  r.optimizer_options = facts.optimizer_options;
  r.optimizer_steps = engine.optimizer_steps();
  r.optimizer_buffers = facts.optimizer_buffers;
  r.policy = facts.policy;
  const shard_map m = engine.shard();
  r.ranks = engine.world();
  r.replicas = m.replicas;
  r.stages = m.stages;
  r.slices = m.slices;
  r.network = facts.network->text();
  r.fingerprint = facts.network->fingerprint();
  r.parameter_count = facts.parameter_count;
  const ema_state& ema = run.ema;
  r.ema = ema.valid;  // (the snapshot holds it then)
  r.ema_decay = ema.opts.decay;
  r.ema_every = ema.opts.every;
  r.ema_warmup_steps = ema.opts.warmup_steps;
  r.ema_updates = ema.updates;
  return r;
}

LOOM_DECL io::rank_snapshot checkpoints::snapshot() const {
  io::rank_snapshot s;
  s.map = engine.shard();
  if (std::optional<shard_map> sm = engine.state_shard()) {
    s.state_map = std::move(*sm);
    s.own_state_map = true;
  }
  const std::size_t n = engine.local_count(), nb = engine.buffer_values(), m = engine.state_count(),
                    k = facts.optimizer_buffers.size();
  const std::size_t ne = run.ema.valid ? run.ema.values.size() : 0;  // the EMA of the weights
  // The parameters, the model's buffers right after them (one run, as the checkpointer writes
  // them), then each optimizer buffer, then the EMA (a copy: training goes on updating it).
  float* host = engine.snapshot_staging(n + nb + m * k + ne);
  if (host) {
    s.owner = std::shared_ptr<const void>(host, [](const void*) {});  // the trainer's; outlives the write
  } else {
    auto v = std::make_shared<std::vector<float>>(n + nb + m * k + ne);
    host = v->data();
    s.owner = v;
  }
  engine.parameters_to_host(host);
  s.params = {host, n};
  if (nb) engine.buffers_to_host(host + n);
  s.model_buffers = {host + n, nb};
  for (std::size_t i = 0; i < k; ++i) {
    engine.buffer_to_host(i, host + n + nb + i * m);
    s.buffers.emplace_back(host + n + nb + i * m, m);
  }
  if (ne) {
    float* ema = host + n + nb + m * k;
    std::copy(run.ema.values.begin(), run.ema.values.end(), ema);
    s.ema = {ema, ne};
  }
  return s;
}

LOOM_DECL void checkpoints::save(collectives& c, const std::filesystem::path& directory, bool async, std::size_t keep,
                                 double commit_timeout_s) const {
  writer().wait(c);  // the previous checkpoint is done with the staging memory
  io::trainer_record rec = record_now();
  writer().start(c, directory, *facts.tensors, snapshot(), rec, facts.optimizer_buffers, async, keep, commit_timeout_s);
}

LOOM_DECL std::filesystem::path checkpoints::load(collectives& c, const std::filesystem::path& where, bool none_ok,
                                                  std::ostream* log, std::ostream* warnings, const fit_options* opts,
                                                  std::size_t samples) const {
  const io::load_expectation want{.network = facts.network->text(), .optimizer = facts.optimizer,
                                  .parameter_count = facts.parameter_count, .buffer_names = facts.optimizer_buffers,
                                  .ema = run.ema.on()};
  const shard_map m = engine.shard();
  const std::optional<shard_map> sm = engine.state_shard();
  std::optional<io::loaded_checkpoint> got =
      io::read_checkpoint(c, where, *facts.tensors, m, want, none_ok, c.rank() == 0 ? warnings : nullptr, sm ? &*sm : nullptr);
  if (!got) {
    if (log && c.rank() == 0) *log << "loom: no checkpoint in " << where.string() << " yet: starting from step 0\n";
    return {};
  }
  const io::trainer_record& rec = got->record;
  if (opts) check_resumable(rec, got->path, facts.seed, *opts, samples, run.data_identity);
  engine.parameters_from_host(got->params.data(), got->params.size());
  if (!got->model_buffers.empty()) engine.buffers_from_host(got->model_buffers.data(), got->model_buffers.size());
  for (std::size_t i = 0; i < got->buffers.size(); ++i) engine.buffer_from_host(i, got->buffers[i].data());
  engine.set_optimizer_steps(rec.optimizer_steps);
  load_ema(*got, c.rank() == 0 ? warnings : nullptr);
  run.step = rec.step;
  run.last_lr = static_cast<float>(rec.lr);
  run.resume = {.valid = true, .epoch = rec.epoch, .batch = rec.batch_in_epoch, .batches = 0,
                .sums = {rec.epoch_sums[0], rec.epoch_sums[1], rec.epoch_sums[2]}};
  // After a refusal the step it went back to is part of the warning.
  if (std::ostream* to = got->refused ? warnings : log; to && c.rank() == 0)
    *to << "loom: resumed from " << got->path.string() << " (step " << rec.step << ", epoch " << rec.epoch + 1
        << ", batch " << rec.batch_in_epoch << " of it)" << (got->refused ? " instead of the newer checkpoint refused above" : "")
        << "\n";
  return got->path;
}

LOOM_DECL void checkpoints::load_ema(const io::loaded_checkpoint& got, std::ostream* warnings) const {
  ema_state& ema = run.ema;
  if (!ema.on()) return;  // (a checkpoint's EMA is left unread)
  if (!got.ema.empty()) {
    ema.values = got.ema;
    ema.updates = got.record.ema_updates;
    ema.valid = true;
    return;
  }
  // Saved without an EMA: it starts from the weights loaded, as if this were its first update.
  std::copy(got.params.begin(), got.params.end(), ema.values.begin());
  std::copy(got.model_buffers.begin(), got.model_buffers.end(), ema.values.begin() + static_cast<std::ptrdiff_t>(ema.params));
  ema.updates = 1;
  ema.valid = true;
  if (warnings)
    *warnings << "loom: " << got.path.string() << " holds no EMA of the weights (it was saved without "
              << "trainer_options::ema): the EMA starts from its weights\n";
}

LOOM_DECL void checkpoints::emergency(const fit_options& opts) const noexcept {
  const checkpoint_options& co = opts.checkpoint;
  if (co.directory.empty() || !co.on_signal || !opts.fault.emergency_checkpoint || !run.global_sums) return;
  const int rank = engine.rank();
  if (engine.shards_state()) {
    std::fprintf(stderr,
                 "loom: rank %d: no emergency checkpoint of step %zu: the optimizer state is sharded over the ranks "
                 "(loom::shard_optimizer_state) and no survivor holds all of it; resume from the last periodic "
                 "checkpoint\n",
                 rank, run.step);
    std::fflush(stderr);
    return;
  }
  // (A hybrid ends with a roll call instead, engine_caps::ends_with_roll_call: no rank holds a
  // whole replica.)
  if (!engine.caps.keeps_whole_replica) return;
  emergency_checkpoint(co.directory, rank, run.step, writer_slot.get(), [&](io::checkpointer& w, collectives& solo) {
    w.start(solo, co.directory, *facts.tensors, snapshot(), record_now(), facts.optimizer_buffers, /*async=*/false, co.keep,
            10);
  });
}

extern "C" inline void loom_preemption_handler(int sig) { fault_state.preemption_signal = sig; }

LOOM_DECL preemption_guard::preemption_guard(bool on) : on_(on) {
  fault_state.preemption_signal = 0;
  if (!on_) return;
  struct sigaction sa {};
  sa.sa_handler = loom_preemption_handler;
  sa.sa_flags = SA_RESTART;  // system calls the signal lands in (the writer thread's, MPI's) resume
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGUSR1, &sa, &old_usr1_);
  ::sigaction(SIGTERM, &sa, &old_term_);
}

LOOM_DECL preemption_guard::~preemption_guard() {
  if (!on_) return;
  ::sigaction(SIGUSR1, &old_usr1_, nullptr);
  ::sigaction(SIGTERM, &old_term_, nullptr);
}

LOOM_DECL void checkpoint_schedule::resume_if_asked(checkpoints ck, collectives& world, const fit_options& opts,
                                                    std::size_t samples, bool joining) {
  const checkpoint_options& co = opts.checkpoint;
  if (co.directory.empty() || joining || !(co.resume || restarted_by_launcher())) return;
  ck.load(world, co.directory, /*none_ok=*/true, opts.progress, opts.warnings, &opts, samples);
}

LOOM_DECL checkpoint_schedule::checkpoint_schedule(checkpoints ck, collectives& world, failure_watch& watch,
                                                   const fit_options& opts, bool resumed)
    : ck_(ck),
      world_(world),
      watch_(watch),
      opts_(opts),
      signals_(on() && opts.checkpoint.on_signal),
      agree_each_step_(on() && (opts.checkpoint.on_signal || opts.checkpoint.every_s > 0) && ck.engine.world() > 1),
      last_checkpoint_time_(monitor::clock::now()),
      saved_step_(resumed ? ck.run.step : none) {}

LOOM_DECL bool checkpoint_schedule::after_step(const step_point& p) {
  if (!on()) return true;
  const checkpoint_options& co = opts_.checkpoint;
  set_phase(fault_phase::checkpoint);
  // What the ranks agree on (the largest over the ranks): a preemption signal seen anywhere,
  // and rank 0's clock saying a checkpoint by time is due.
  struct boundary {
    std::uint64_t signal = 0, time_due = 0;
  } b{.signal = static_cast<std::uint64_t>(fault_state.preemption_signal)};
  if (co.every_s > 0 && ck_.engine.rank() == 0)
    b.time_due = monitor::seconds_between(last_checkpoint_time_, monitor::clock::now()) >= co.every_s;
  if (agree_each_step_) {
    std::array<std::uint64_t, 2> v{b.signal, b.time_due};
    world_.max(v.data(), v.size());
    b = {.signal = v[0], .time_due = v[1]};
  }
  if ((co.every_steps && p.step % co.every_steps == 0) || b.time_due || b.signal) {
    watch_.checkpoint_begins();
    const auto saving = monitor::clock::now();
    {
      monitor::span writing(monitor::span_kind::checkpoint);
      test_hooks::checkpoint_begins(ck_.engine.rank());
      save(/*async=*/co.async && !b.signal);
    }
    saved_step_ = p.step;
    last_checkpoint_time_ = monitor::clock::now();
    watch_.checkpoint_ended(monitor::seconds_between(saving, last_checkpoint_time_), ck_.writer().last_seconds());
  }
  signal_ = static_cast<int>(b.signal);
  return b.signal == 0;
}

LOOM_DECL void checkpoint_schedule::save(bool async) {
  const checkpoint_options& co = opts_.checkpoint;
  if (ck_.writer().busy()) {
    ck_.writer().wait(world_);
    watch_.checkpoint_measured(ck_.writer().last_seconds());
  }
  ck_.save(world_, co.directory, async, co.keep, co.commit_timeout_s);  // its wait() finds nothing in progress
}

LOOM_DECL void checkpoint_schedule::finish(fit_result& r) {
  r.preempted = signal_ != 0;
  r.signal = signal_;
  if (!on()) return;
  const checkpoint_options& co = opts_.checkpoint;
  watch_.checkpoint_begins();
  const std::size_t step = ck_.run.step;
  if (co.at_end && saved_step_ != step) {
    // The run's end: the next epoch's start (or where max_steps stopped it, mid-epoch).
    monitor::span writing(monitor::span_kind::checkpoint);
    save(co.async);
    saved_step_ = step;
  }
  ck_.writer().wait(world_);
  if (saved_step_ == step) r.checkpoint = (std::filesystem::path(co.directory) / ("step-" + std::to_string(step))).string();
}

LOOM_DECL std::vector<float> gather_whole_buffers(collectives& c, const shard_map& m, const std::vector<float>& mine) {
  const std::size_t whole_count = m.whole_buffer_count;
  // Per rank: its values in the whole layout, then one flag byte per value it writes.
  std::vector<char> own(whole_count * (sizeof(float) + 1), 0);
  float value = 0;
  for (const shard_piece& p : m.buffer_pieces) {
    if (!m.writes(p)) continue;
    for (std::size_t r = 0; r < p.rows; ++r)
      for (std::size_t k = 0; k < p.count; ++k) {
        const std::size_t w = p.whole_offset + r * p.whole_stride + k;
        value = mine[p.local_offset + r * p.local_stride + k];
        std::memcpy(own.data() + w * sizeof(float), &value, sizeof(float));
        own[whole_count * sizeof(float) + w] = 1;
      }
  }
  std::vector<char> all(own.size() * static_cast<std::size_t>(c.size()));
  c.allgather(own.data(), all.data(), own.size());
  std::vector<float> whole(whole_count, 0.0f);
  for (int r = 0; r < c.size(); ++r) {
    const char* from = all.data() + own.size() * static_cast<std::size_t>(r);
    for (std::size_t w = 0; w < whole_count; ++w)
      if (from[whole_count * sizeof(float) + w]) std::memcpy(&whole[w], from + w * sizeof(float), sizeof(float));
  }
  return whole;
}

}  // namespace loom::detail
