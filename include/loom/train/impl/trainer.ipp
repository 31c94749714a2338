// SPDX-License-Identifier: Apache-2.0
#pragma once
// The definitions of trainer.hpp's non-template functions (the fit loop, trainer_core::run_fit, and
// the checks and descriptions of fit and the job): included at the end of the header (header-only),
// or compiled once in src/loom.cpp (LOOM_SEPARATE_COMPILATION; see loom/core/config.hpp).

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "loom/train/trainer.hpp"

namespace loom::detail {

LOOM_DECL bool restarted_by_launcher() {
  const char* v = std::getenv("LOOM_RESTART");
  return v && *v && std::strtoul(v, nullptr, 10) > 0;
}

/// For the tests of the deadlines of a checkpoint's collectives (tests/fault), as a checkpoint
/// begins on this rank; with neither variable set (always, outside those tests) nothing:
/// - $LOOM_TEST_SLOW_CHECKPOINT_S: rank 0 takes that many seconds more for each periodic
///   checkpoint, as a slow disk would (slow_checkpoint.sh);
/// - $LOOM_TEST_STOP_AT_CHECKPOINT = "K:R": rank R stops itself (SIGSTOP, a hang) as its K-th
///   periodic checkpoint begins, after saying so on stderr with the time (checkpoint_hang.sh).
LOOM_DECL void checkpoint_hooks_for_tests(int rank) {
  struct hooks {
    double slow_s = 0;
    long stop_at = 0, stop_rank = -1;
  };
  static const hooks h = [] {
    hooks r;
    if (const char* v = std::getenv("LOOM_TEST_SLOW_CHECKPOINT_S"); v && *v) r.slow_s = std::strtod(v, nullptr);
    if (const char* v = std::getenv("LOOM_TEST_STOP_AT_CHECKPOINT");
        v && *v && std::sscanf(v, "%ld:%ld", &r.stop_at, &r.stop_rank) != 2)
      r.stop_at = 0;
    return r;
  }();
  static long seen = 0;
  if (rank == 0 && h.slow_s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(h.slow_s));
  if (h.stop_at <= 0 || rank != h.stop_rank || ++seen != h.stop_at) return;
  const double unix_s = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::fprintf(stderr, "loom: test: rank %d stops itself (SIGSTOP) as checkpoint %ld begins (unix time %.3f)\n", rank,
               h.stop_at, unix_s);
  std::fflush(stderr);
  std::raise(SIGSTOP);
}

LOOM_DECL void check_fit_options(const fit_options& opts, std::size_t samples) {
  if (opts.batch == 0) throw invalid_argument("loom::trainer::fit: batch must be at least 1, got 0");
  if (opts.accumulation == 0) throw invalid_argument("loom::trainer::fit: accumulation must be at least 1, got 0");
  if (samples == 0) throw invalid_argument("loom::trainer::fit: the training set is empty");
  if (!(opts.clip_grad_norm >= 0) || !std::isfinite(opts.clip_grad_norm))
    throw invalid_argument("loom::trainer::fit: clip_grad_norm must be finite and >= 0 (0: no clipping), got " +
                           std::to_string(opts.clip_grad_norm));
  if (!(opts.sample_every_s >= 0) || !std::isfinite(opts.sample_every_s))
    throw invalid_argument("loom::trainer::fit: sample_every_s must be finite and >= 0 (0: after every step), got " +
                           std::to_string(opts.sample_every_s));
}

LOOM_DECL void check_replace(const fault_options& fo, bool watch, bool replace, const std::string& policy) {
  if (fo.replace && !watch)
    throw invalid_argument("loom::trainer::fit: fault_options::replace (start a replacement for a lost rank) needs "
                           "data_parallel over loom::mpi_comm without shard_optimizer_state; this policy (" + policy +
                           ") cannot go on without a lost rank, let alone take a new one: a "
                           "failure ends the job and loomrun resumes it from its last checkpoint (docs/fault-tolerance.md)");
  if (fo.replace && !replace)
    throw invalid_argument("loom::trainer::fit: fault_options::replace (start a replacement for a lost rank) needs "
                           "data_parallel over loom::mpi_comm; this policy (" + policy +
                           ") recovers on fewer ranks but cannot merge a new process into its communicator "
                           "(docs/fault-tolerance.md)");
}

LOOM_DECL std::string describe_fit(const fit_options& opts, std::size_t samples) {
  const checkpoint_options& co = opts.checkpoint;
  const fault_options& fo = opts.fault;
  return "fit: epochs=" + std::to_string(opts.epochs) + ";batch=" + std::to_string(opts.batch) +
         ";accumulation=" + std::to_string(opts.accumulation) + ";max_steps=" + std::to_string(opts.max_steps) +
         ";samples=" + std::to_string(samples) + ";clip_grad_norm=" + std::to_string(opts.clip_grad_norm) +
         ";deterministic_chunk=" + std::to_string(opts.deterministic_chunk) +
         ";trace=" + (opts.trace.empty() ? "off" : "on") + ";live_every_s=" + std::to_string(opts.live_every_s) +
         ";checkpoint=" + co.directory +
         ";checkpoint_every=" + std::to_string(co.every_steps) + "," + std::to_string(co.every_s) +
         ";resume=" + (co.resume ? "yes" : "no") + ";on_signal=" + (co.on_signal ? "yes" : "no") +
         ";fault=" + std::to_string(static_cast<int>(fo.recovery)) + "," + (fo.detect ? "detect" : "no") +
         "," + std::to_string(fo.deadline_s) + ";replace=" + (fo.replace ? "yes" : "no");
}

LOOM_DECL void warn_replace_without_recovery(const fault_options& fo, bool watching) {
  std::fprintf(stderr, "loom: fault_options::replace is on, but no recovery runs in this fit (%s): a lost rank ends "
               "the job and no replacement is started\n",
               !watching ? "failure detection is off" : fo.recovery == recovery_mode::off ? "recovery is off"
                                                                    : "not under mpirun --enable-recovery");
  std::fflush(stderr);
}

LOOM_DECL std::string describe_job(const std::string& network, std::size_t parameters, const char* loss, const char* optimizer,
                                   std::uint64_t seed, math_mode math, const std::string& policy) {
  return "network=" + network + ";parameters=" + std::to_string(parameters) + ";loss=" + loss +
         ";optimizer=" + optimizer + ";seed=" + std::to_string(seed) + ";math=" + to_string(math) + ";policy=" + policy;
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

LOOM_DECL fit_result trainer_core::run_fit(fit_host& h, const fit_options& opts, std::size_t samples, bool joining,
                                           std::uint64_t seed, float base_lr) {
  const checkpoint_options& co = opts.checkpoint;
  const fault_options& fo = opts.fault;
  const bool checkpoints = !co.directory.empty();
  const std::unique_ptr<collectives> coll = h.make_collectives();
  fit_result r;
  const bool resume = checkpoints && (co.resume || detail::restarted_by_launcher());
  if (resume && !joining) h.load_checkpoint(*coll, opts, samples);
  // Failure detection (deadlines on every collective), and recovery where the runtime keeps
  // the survivors alive: data parallelism over a communicator that offers it (loom::mpi_comm).
  watching_ = false;
  if (h.can_watch) {
    if (h.can_replace) {
      if (joining) {
        resume_ = h.join_as_replacement(opts);  // the survivors' job check, detector and state
        watching_ = true;
      }
    }
    if (!joining && fo.detect && h.world() > 1) {
      h.watch_for_failures(fo.deadline_s > 0 ? fo.deadline_s : fo.startup_deadline_s);
      watching_ = true;
    }
  }
  // Where no recovery is possible (pipelines, tensor parallelism, the hybrids, sharded state):
  // deadlines on every communicator and, on a failure, a roll call before the job ends.
  const bool detecting = !h.can_watch && h.can_detect && fo.detect && h.world() > 1;
  if (detecting) h.watch_for_failures(fo.deadline_s > 0 ? fo.deadline_s : fo.startup_deadline_s);
  const bool recovering = watching_ && (fo.recovery == recovery_mode::on ||
                                        (fo.recovery == recovery_mode::automatic && runtime_keeps_survivors()));
  // A hybrid that recovers commits each step over the world (docs/fault-tolerance.md, "Hybrids").
  h.set_step_commit(recovering);
  if (fo.replace && !recovering && h.rank() == 0 && h.world() > 1 && !joining) {
    detail::warn_replace_without_recovery(fo, watching_);
  }
  // Under failure detection every rank keeps the whole batch's loss sums, step by step, so that
  // a survivor's position (and an emergency checkpoint) has them without a collective.
  global_sums_ = !h.per_epoch_sums || watching_;
  // Under failure detection the step's sums come before its optimizer step (see the loop).
  const bool sums_before_step = watching_;
  // Where this fit starts: where a loaded checkpoint stopped, or at the beginning.
  const position start_at = std::exchange(resume_, position{});
  cur_ = start_at;
  last_fit_ = {opts.batch, opts.accumulation, opts.epochs, opts.max_steps, opts.deterministic_chunk,
               opts.clip_grad_norm, samples};
  r.resumed_from_step = start_at.valid ? step_ : 0;
  const std::size_t first_step = step_;
  // Every rank leaves that collective at about the same time: the timeline's common zero.
  std::optional<monitor::timeline> timeline;
  if (!opts.trace.empty()) timeline.emplace().set_zero(monitor::clock::now());
  monitor::timeline_scope recording(timeline ? &*timeline : nullptr);
  h.open_loader(opts.batch);
  if (const std::size_t block = h.prepare_fit(opts.batch, opts.deterministic_chunk)) h.set_rank_block(block);
  h.reserve(opts.batch);
  progress_display progress(h.rank() == 0 ? opts.progress : nullptr, opts.progress_style,
                            opts.progress == &std::cerr ? ::isatty(2) : opts.progress == &std::cout ? ::isatty(1) : false);
  h.reset_figures();
  rank_figures& fig = h.figures();
  monitor::metrics_writer metrics(opts.metrics, h.rank(), h.world());
  // The machine's ceiling, against which the achieved GFLOP/s are shown: measured once per
  // process (about 0.1 s) when something shows it.
  if (metrics.enabled() || opts.live_every_s > 0 || timeline) fig.peak_gflops = h.peak_gflops();
  monitor::sampler sampler(fig, h.device_monitor(), opts.sample_every_s);
  // Training FLOPs per sample of this rank: forward, and backward's two products (data and weights).
  const double flops_per_sample = 3.0 * h.flops_per_sample();
  monitor::training_point point;
  // Preemption by signal and checkpoints by time: the ranks agree each step (one allreduce).
  detail::preemption_guard signals(checkpoints && co.on_signal);
  const bool agree_each_step = checkpoints && (co.on_signal || co.every_s > 0) && h.world() > 1;
  auto last_checkpoint_time = monitor::clock::now();
  std::size_t saved_step = start_at.valid ? step_ : static_cast<std::size_t>(-1);
  monitor::live_view live(opts.live_every_s, fig, h.rank() == 0 ? opts.progress : nullptr, opts.progress_style);
  step_clock steps_timed(fo, recovering ? fo.min_deadline_s : std::max(fo.min_deadline_s, fo.min_deadline_without_recovery_s));
  // The communicators of a policy without a detector of its own (over a communicator other than
  // loom::mpi_comm) wait at most the step-derived deadline too, where the runtime keeps
  // survivors alive: a dead peer then ends the job (loomrun restarts it from its checkpoint)
  // instead of hanging it.
  const bool shared_deadlines = !h.can_watch && !detecting && fo.detect && detail::shared_deadline_s > 0;
  // Sets the deadline of the collectives from here on (failure detection's, or the shared one).
  auto set_deadline = [&](double d) {
    if (shared_deadlines) detail::shared_deadline_s = d;
    if (watching_ || detecting) h.set_deadline(d);
  };
  const auto start = monitor::clock::now();
  bool stop = false;
  // The report of the last recovery, printed once the first step after it is good.
  std::string recovery_report;
  monitor::clock::time_point failure_seen{};

  auto run = [&](const position& start_at) {
  for (std::size_t epoch = start_at.valid ? start_at.epoch : 0; epoch < opts.epochs && !stop; ++epoch) {
    h.start_epoch(epoch);
    const bool resumed_epoch = start_at.valid && epoch == start_at.epoch;
    if (resumed_epoch) h.skip(start_at.batch);
    const std::size_t batches = h.batches_per_epoch();
    // Loss sum, correct and samples of this rank's replica, summed over the replicas at the
    // end of the epoch — or after every step (global_sums_) where rank 0 holds no loss (a
    // pipeline's first stage), so that its progress shows the whole batch's, or under failure
    // detection.
    double sums[3] = {0, 0, 0};
    if (resumed_epoch) {  // the whole epoch's sums on the ranks that count them once
      const bool counts = global_sums_ || h.replica() == 0;
      for (int i = 0; i < 3; ++i) sums[i] = counts ? start_at.sums[i] : 0;
    }
    std::size_t steps = 0, global_samples = 0;
    // What progress shows: with max_steps, where this epoch and the fit will stop.
    std::size_t shown_batches = batches, shown_epochs = opts.epochs;
    if (opts.max_steps) {
      const std::size_t first_k = resumed_epoch ? start_at.batch : 0;
      const std::size_t left = opts.max_steps > step_ ? opts.max_steps - step_ : 0;  // steps
      const std::size_t per_epoch = (batches + opts.accumulation - 1) / opts.accumulation;
      const std::size_t this_epoch = (batches - first_k + opts.accumulation - 1) / opts.accumulation;
      shown_batches = std::min(batches, first_k + left * opts.accumulation);
      if (left > this_epoch && per_epoch)
        shown_epochs = std::min(opts.epochs, epoch + 1 + (left - this_epoch + per_epoch - 1) / per_epoch);
      else
        shown_epochs = std::min(opts.epochs, epoch + 1);
    }
    for (std::size_t k = resumed_epoch ? start_at.batch : 0; k < batches;) {
      if (opts.max_steps && step_ >= opts.max_steps) {
        stop = true;
        break;
      }
      const std::size_t group = std::min(opts.accumulation, batches - k);
      const auto step_start = monitor::clock::now();
      detail::fault_here.step = step_;
      if (timeline) timeline->set_step(static_cast<std::uint32_t>(step_));
      double step_sums[3] = {0, 0, 0};
      std::size_t step_global = 0;
      for (std::size_t m = 0; m < group; ++m, ++k) {
        batch_view<float> b;
        {
          detail::set_phase(fault_phase::data);
          monitor::timed data_time(fig, &rank_figures::data_s);
          b = h.next_batch();
        }
        detail::set_phase(fault_phase::forward_backward);
        const loss_value v = h.micro_step(b, m, group, seed, step_ * 1000003 + m);
        step_sums[0] += v.sum;
        step_sums[1] += static_cast<double>(v.correct);
        step_sums[2] += static_cast<double>(b.n);
        fig.samples += static_cast<double>(b.n);
        fig.flops += flops_per_sample * static_cast<double>(b.n);
        step_global += b.global_n;
      }
      // Under failure detection the sums come before the optimizer step, so that a rank's
      // state after its step (parameters, step count, position, sums) has no collective inside.
      detail::set_phase(fault_phase::loss_sums);
      if (sums_before_step) h.sum(step_sums, 3);
      detail::set_phase(fault_phase::optimizer);
      const float lr = opts.schedule(step_, base_lr);
      h.optimizer_step(lr, opts.clip_grad_norm);
      ++step_;
      ++steps;
      global_samples += step_global;
      last_lr_ = lr;
      detail::set_phase(fault_phase::bookkeeping);
      if (!h.per_epoch_sums && !sums_before_step) h.sum(step_sums, 3);
      for (int i = 0; i < 3; ++i) sums[i] += step_sums[i];
      cur_ = {.valid = true, .epoch = epoch, .batch = k, .batches = batches, .sums = {sums[0], sums[1], sums[2]}};
      const auto step_end = monitor::clock::now();
      monitor::record_span(monitor::step_span, step_start, step_end);
      if (shared_deadlines || watching_ || detecting) set_deadline(steps_timed.add(monitor::seconds_between(step_start, step_end)));
      if (watching_) {
        if (!recovery_report.empty()) {
          detail::report_first_good_step(h.rank(), h.world(), step_, recovery_report, failure_seen, step_end,
                                         replacement_began_);
          recovery_report.clear();
          replacement_began_.reset();
        }
      }
      point = {.step = step_, .epoch = epoch + 1, .loss = sums[2] ? sums[0] / sums[2] : 0,
               .accuracy = sums[2] ? sums[1] / sums[2] : 0, .lr = lr,
               .elapsed_s = monitor::seconds_between(start, monitor::clock::now())};
      point.samples_per_s = static_cast<double>(r.trained_samples + global_samples) / std::max(1e-9, point.elapsed_s);
      progress.update(epoch + 1, shown_epochs, k, shown_batches, point.loss, point.accuracy, point.samples_per_s);
      sampler.tick();
      metrics.tick(fig, point, sampler.latest());
      const std::size_t exchanges = live.exchanges();
      live.step(epoch, [&] { return h.gather_figures(); });
      if (live.exchanges() != exchanges) {  // an exchange: the straggler it found, if any, named
        const straggler& s = live.last_straggler();
        metrics.straggler_seen(step_, s);
        if (s) {
          const auto now = monitor::clock::now();
          monitor::record_span(monitor::span_kind::straggler, now, now, s.rank, s.why == straggler::cause::data ? 1 : 0,
                               s.score);
        }
      }
      if (checkpoints) {
        // The step boundary: a checkpoint when due, and a stop when a signal asked for one.
        detail::set_phase(fault_phase::checkpoint);
        bool due = co.every_steps && step_ % co.every_steps == 0;
        std::uint64_t flags[2] = {static_cast<std::uint64_t>(detail::preemption_signal), 0};
        if (co.every_s > 0 && h.rank() == 0)
          flags[1] = monitor::seconds_between(last_checkpoint_time, monitor::clock::now()) >= co.every_s;
        if (agree_each_step) coll->max(flags, 2);
        due = due || flags[1] || flags[0];
        if (due) {
          // The checkpoint's collectives: the peers of the rank that writes the most wait for
          // it (and, here, for the previous checkpoint's writers). Every rank leaves save_current
          // after its last collective, and an asynchronous write goes on beside the steps
          // without holding any collective of theirs: the next step has the step deadline.
          set_deadline(steps_timed.checkpoint_deadline());
          const auto saving = monitor::clock::now();
          {
            monitor::span writing(monitor::span_kind::checkpoint);
            checkpoint_hooks_for_tests(h.rank());
            h.save_current(*coll, opts, /*async=*/co.async && !flags[0]);
          }
          saved_step = step_;
          last_checkpoint_time = monitor::clock::now();
          steps_timed.add_checkpoint(monitor::seconds_between(saving, last_checkpoint_time), h.ckpt().last_seconds());
          set_deadline(steps_timed.deadline());
        }
        if (flags[0]) {
          r.preempted = true;
          r.signal = static_cast<int>(flags[0]);
          stop = true;
          break;
        }
      }
    }
    if (steps == 0) break;
    if (h.per_epoch_sums && !global_sums_) h.sum(sums, 3);
    r.epochs = epoch + 1;
    r.samples += static_cast<std::size_t>(sums[2]);
    r.trained_samples += global_samples;
    r.train_loss = sums[2] ? sums[0] / sums[2] : 0;
    r.train_accuracy = sums[2] ? sums[1] / sums[2] : 0;
  }
  detail::set_phase(fault_phase::end_of_fit);
  if (checkpoints) {
    set_deadline(steps_timed.checkpoint_deadline());
    if (co.at_end && saved_step != step_) {
      // The run's end: the next epoch's start (or where max_steps stopped it, mid-epoch).
      monitor::span writing(monitor::span_kind::checkpoint);
      h.save_current(*coll, opts, co.async);
      saved_step = step_;
    }
    h.ckpt().wait(*coll);
    if (saved_step == step_) r.checkpoint = (std::filesystem::path(co.directory) / ("step-" + std::to_string(step_))).string();
  }
  r.seconds = monitor::seconds_between(start, monitor::clock::now());
  fig.seconds = r.seconds;
  fig.memory_peak_bytes = static_cast<double>(host_memory().peak_bytes);
  fig.planned_bytes = static_cast<double>(h.planned_bytes(opts.batch));
  point.elapsed_s = r.seconds;
  live.finish();
  metrics.tick(fig, point, sampler.sample_now(), /*force=*/true);
  r.figures = h.gather_figures();
  };

  position from = start_at;
  for (int recoveries = 0;;) {
    try {
      run(from);
      break;
    } catch (const rank_failure& first) {
      rank_failure f = first;
      failed_at_ = detail::fault_here;
      failure_seen = monitor::clock::now() - std::chrono::duration_cast<monitor::clock::duration>(
                                                 std::chrono::duration<double>(f.waited_s()));
      if (!recovering) {
        if (detecting || h.ends_without_recovery) h.end_after_failure(f, opts);
        h.emergency_checkpoint(opts);
        throw;
      }
      // Reports of recoveries that another failure cut short go out with the next recovery's,
      // by the rank 0 after it: the rank 0 of the world they left may be the one that died.
      std::string earlier;
      // The last recovery's report waits for its first good step; a failure came first (two
      // failures close together).
      if (!recovery_report.empty()) {
        earlier = recovery_report + "\nloom: recovery: no good step after it: another failure came first (" +
                  f.what() + ")\n";
        recovery_report.clear();
        replacement_began_.reset();
      }
      // A survivor that dies during the recovery (its state broadcast) makes the next one.
      for (;;) {
        try {
          from = h.survive(f, opts, ++recoveries, recovery_report);
          break;
        } catch (const detail::no_replica_left&) {
          throw;  // a hybrid with no whole replica left: the job ends
        } catch (const rank_failure& again) {
          earlier += "loom: recovery " + std::to_string(recoveries) + " at step " + std::to_string(step_) + ": lost " +
                     (interrupted_lost_.empty() ? std::string("no rank") : interrupted_lost_) +
                     "; interrupted during its state exchange: " + again.what() + "\n";
          f = again;
          failed_at_ = detail::fault_here;
        }
      }
      if (!earlier.empty()) recovery_report = earlier + recovery_report;
      saved_step = static_cast<std::size_t>(-1);  // a checkpoint in flight was given up
      h.reshard(h.replica(), h.replicas());
      h.set_rank_block(h.prepare_fit(opts.batch, opts.deterministic_chunk));
      steps_timed.restart();
      live.restart();  // the same exchange steps on every rank, replacements included
      if (h.can_watch) h.set_deadline(steps_timed.deadline());
      r.recoveries = recoveries;
    }
  }
  r.steps = step_ - first_step;
  r.ranks = h.world();
  metrics.end_of_fit(r.figures);
  if (timeline) h.write_trace(opts.trace, *timeline);
  if (watching_ && h.rank() == 0 && r.recoveries > 0) {
    std::error_code ec;  // the verdicts of this job are history now
    if (h.can_watch)
      std::filesystem::remove_all(verdict_directory(fo, co.directory) / ("job-" + h.watch_job_id()), ec);
  }
  return r;
}

LOOM_DECL io::trainer_record trainer_core::record_now(state_host& h) {
  const state_host::facts& f = h.state_facts();
  io::trainer_record r;
  position p = cur_.next();  // an epoch that just ended: the next one's start
  if (f.per_epoch_sums && !global_sums_) h.sum_over_replicas(p.sums, 3);
  r.step = step_;
  r.epoch = p.epoch;
  r.batch_in_epoch = p.batch;
  for (int i = 0; i < 3; ++i) r.epoch_sums[i] = p.sums[i];
  r.seed = f.seed;
  r.batch = last_fit_.batch;
  r.accumulation = last_fit_.accumulation;
  r.epochs = last_fit_.epochs;
  r.max_steps = last_fit_.max_steps;
  r.deterministic_chunk = last_fit_.deterministic_chunk;
  r.clip_grad_norm = last_fit_.clip_grad_norm;
  r.samples = last_fit_.samples;
  r.data = data_identity_;
  r.lr = last_lr_;
  r.math = to_string(f.math);
  r.loss = f.loss;
  r.optimizer = f.optimizer;
  r.optimizer_options = f.optimizer_options;
  r.optimizer_steps = h.optimizer_steps();
  r.optimizer_buffers = h.optimizer_buffer_names();
  r.policy = f.policy;
  const shard_map m = h.parameter_shard();
  r.ranks = h.world_size();
  r.replicas = m.replicas;
  r.stages = m.stages;
  r.slices = m.slices;
  r.network = f.network->text();
  r.fingerprint = f.network->fingerprint();
  r.parameter_count = f.parameter_count;
  return r;
}

LOOM_DECL io::rank_snapshot trainer_core::snapshot(state_host& h) {
  io::rank_snapshot s;
  s.map = h.parameter_shard();
  if (std::optional<shard_map> sm = h.optimizer_shard()) {
    s.state_map = std::move(*sm);
    s.own_state_map = true;
  }
  const std::size_t n = h.parameter_values(), nb = h.buffer_values(), m = h.state_values();
  const std::size_t k = h.optimizer_buffer_names().size();
  // The parameters, the model's buffers right after them (one run, as the checkpointer writes
  // them), then each optimizer buffer.
  float* host = h.snapshot_staging(n + nb + m * k);
  if (host) {
    s.owner = std::shared_ptr<const void>(host, [](const void*) {});  // the trainer's; outlives the write
  } else {
    auto v = std::make_shared<std::vector<float>>(n + nb + m * k);
    host = v->data();
    s.owner = v;
  }
  h.parameters_to_host(host);
  s.params = {host, n};
  if (nb) h.buffers_to_host(host + n);
  s.model_buffers = {host + n, nb};
  for (std::size_t i = 0; i < k; ++i) {
    h.buffer_to_host(i, host + n + nb + i * m);
    s.buffers.emplace_back(host + n + nb + i * m, m);
  }
  return s;
}

LOOM_DECL void trainer_core::save_current(state_host& h, collectives& c, const std::filesystem::path& directory,
                                          bool async, std::size_t keep, double commit_timeout_s) {
  ckpt().wait(c);  // the previous checkpoint is done with the staging memory
  io::trainer_record rec = record_now(h);
  ckpt().start(c, directory, *h.state_facts().tensors, snapshot(h), rec, h.optimizer_buffer_names(), async, keep,
               commit_timeout_s);
}

LOOM_DECL std::filesystem::path trainer_core::load_checkpoint(state_host& h, collectives& c,
                                                              const std::filesystem::path& where, bool none_ok,
                                                              std::ostream* log, std::ostream* warnings,
                                                              const fit_options* opts, std::size_t samples) {
  const state_host::facts& f = h.state_facts();
  const io::load_expectation want{.network = f.network->text(), .optimizer = f.optimizer,
                                  .parameter_count = f.parameter_count, .buffer_names = h.optimizer_buffer_names()};
  const shard_map m = h.parameter_shard();
  const std::optional<shard_map> sm = h.optimizer_shard();
  std::optional<io::loaded_checkpoint> got =
      io::read_checkpoint(c, where, *f.tensors, m, want, none_ok, c.rank() == 0 ? warnings : nullptr, sm ? &*sm : nullptr);
  if (!got) {
    if (log && c.rank() == 0) *log << "loom: no checkpoint in " << where.string() << " yet: starting from step 0\n";
    return {};
  }
  const io::trainer_record& rec = got->record;
  if (opts) check_resumable(rec, got->path, f.seed, *opts, samples, data_identity_);
  h.parameters_from_host(got->params.data(), got->params.size());
  if (!got->model_buffers.empty()) h.buffers_from_host(got->model_buffers.data(), got->model_buffers.size());
  for (std::size_t i = 0; i < got->buffers.size(); ++i) h.buffer_from_host(i, got->buffers[i].data());
  h.set_optimizer_steps(rec.optimizer_steps);
  step_ = rec.step;
  last_lr_ = static_cast<float>(rec.lr);
  resume_ = {.valid = true, .epoch = rec.epoch, .batch = rec.batch_in_epoch, .batches = 0,
             .sums = {rec.epoch_sums[0], rec.epoch_sums[1], rec.epoch_sums[2]}};
  // After a refusal the step it went back to is part of the warning.
  if (std::ostream* to = got->refused ? warnings : log; to && c.rank() == 0)
    *to << "loom: resumed from " << got->path.string() << " (step " << rec.step << ", epoch " << rec.epoch + 1
        << ", batch " << rec.batch_in_epoch << " of it)" << (got->refused ? " instead of the newer checkpoint refused above" : "")
        << "\n";
  return got->path;
}

LOOM_DECL void trainer_core::write_emergency_checkpoint(state_host& h, const fit_options& opts, int rank) {
  const checkpoint_options& co = opts.checkpoint;
  emergency_checkpoint(co.directory, rank, step_, ckpt_.get(), [&](io::checkpointer& writer, collectives& solo) {
    writer.start(solo, co.directory, *h.state_facts().tensors, snapshot(h), record_now(h), h.optimizer_buffer_names(),
                 /*async=*/false, co.keep, 10);
  });
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

LOOM_DECL void write_rank_trace(const std::string& path, const monitor::timeline& t, int rank, int world) {
  monitor::write_file_atomically(monitor::rank_path(path, rank, world), monitor::chrome_trace({t.events()}, {t.dropped()}, rank));
}

LOOM_DECL void write_whole_trace(const std::string& path, const std::vector<std::vector<monitor::span_event>>& all,
                                 const std::vector<std::size_t>& dropped) {
  monitor::write_file_atomically(path, monitor::chrome_trace(all, dropped));
}

}  // namespace loom::detail
