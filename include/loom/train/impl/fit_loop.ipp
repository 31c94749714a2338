// SPDX-License-Identifier: Apache-2.0
#pragma once
// The definitions of fit_loop.hpp's functions: included at the end of the header (header-only),
// or compiled once in src/loom.cpp (LOOM_SEPARATE_COMPILATION; see loom/core/config.hpp).

#include <algorithm>
#include <memory>
#include <utility>

#include "loom/monitor/fit_monitor.hpp"
#include "loom/train/fit_loop.hpp"

namespace loom::detail {

namespace fit_parts {
/// The monitoring fit_options asks for.
inline monitor::fit_monitor_options monitor_options(const fit_options& o) {
  return {.progress = o.progress, .progress_style = o.progress_style, .metrics = o.metrics,
          .live_every_s = o.live_every_s, .trace = o.trace, .sample_every_s = o.sample_every_s, .epochs = o.epochs,
          .accumulation = o.accumulation, .max_steps = o.max_steps};
}
/// The data's next batch, its time this rank's data time.
inline batch_view<float> next_batch(erased_loader& data, rank_figures& fig) {
  set_phase(fault_phase::data);
  monitor::timed data_time(fig, &rank_figures::data_s);
  return data.next_batch();
}
/// The engine readies a fit of this global batch; the data deals it as the engine needs.
inline void prepare(erased_engine& e, erased_loader& data, const fit_options& opts) {
  data.set_rank_block(e.prepare_fit(opts.batch, opts.deterministic_chunk));
}
}  // namespace fit_parts

LOOM_DECL fit_result run_fit(const fit_job& job) {
  erased_engine& e = job.engine;
  run_state& s = job.ck.run;
  const fit_options& opts = job.opts;
  const std::unique_ptr<collectives> world = e.world_collectives();
  checkpoint_schedule::resume_if_asked(job.ck, *world, opts, job.samples, job.joining);
  failure_watch watch(e, s, opts, job.joining, job.ck.writer_slot);
  // Under failure detection every rank keeps the whole batch's loss sums, step by step, so that
  // a survivor's position (and an emergency checkpoint) has them without a collective.
  s.global_sums = !e.caps.every_rank_holds_loss || s.watching;
  // Where this fit starts: where a loaded checkpoint (or the survivors' state) stopped, or at the
  // beginning.
  const fit_position start_at = std::exchange(s.resume, fit_position{});
  s.at = start_at;
  s.last_fit = {.batch = opts.batch, .accumulation = opts.accumulation, .epochs = opts.epochs,
                .max_steps = opts.max_steps, .deterministic_chunk = opts.deterministic_chunk,
                .clip_grad_norm = opts.clip_grad_norm, .samples = job.samples};
  fit_result r;
  r.resumed_from_step = start_at.valid ? s.step : 0;
  const std::size_t first_step = s.step;
  monitor::fit_monitor monitor(e, fit_parts::monitor_options(opts));
  fit_parts::prepare(e, job.data, opts);
  checkpoint_schedule checkpoints(job.ck, *world, watch, opts, start_at.valid);
  ema_tracker ema(e, s.ema);  // before the checkpoints: a step's checkpoint holds its EMA
  step_observers observers{&watch, &monitor, &ema, &checkpoints};
  const auto start = monitor::clock::now();
  r.recoveries = watch.run(
      start_at, observers,
      [&](const fit_position& from) {
        train_epochs(job, from, observers, r);
        set_phase(fault_phase::end_of_fit);
        checkpoints.finish(r);
        r.seconds = monitor::seconds_between(start, monitor::clock::now());
        r.figures = monitor.finish(r.seconds, static_cast<double>(e.planned_bytes(opts.batch)));
      },
      [&] {  // the survivors deal every global batch anew
        job.data.reshard(e.replica(), e.replicas());
        fit_parts::prepare(e, job.data, opts);
      },
      [&] { job.ck.emergency(opts); });
  r.steps = s.step - first_step;
  r.ranks = e.world();
  monitor.end(r.figures);
  watch.end(r.recoveries);
  return r;
}

LOOM_DECL void train_epochs(const fit_job& job, const fit_position& from, step_observers& observers, fit_result& r) {
  erased_engine& e = job.engine;
  run_state& s = job.ck.run;
  const fit_options& opts = job.opts;
  bool stop = false;
  for (std::size_t epoch = from.valid ? from.epoch : 0; epoch < opts.epochs && !stop; ++epoch) {
    const bool resumed = from.valid && epoch == from.epoch;
    const std::size_t first = resumed ? from.batch : 0;
    job.data.start_epoch(epoch);
    if (resumed) job.data.skip(first);
    const std::size_t batches = job.data.batches_per_epoch();
    // This epoch's loss sums of this rank's replica, summed over the replicas at its end — or
    // the whole batch's, after every step (s.global_sums). A resumed epoch starts from its
    // sums so far, on the ranks that count them once.
    loss_sums sums = resumed && (s.global_sums || e.replica() == 0) ? from.sums : loss_sums{};
    std::size_t steps = 0, trained = 0;  // this epoch's steps, and the global samples they trained
    observers.epoch_begins({.epoch = epoch, .first_batch = first, .batches = batches, .step = s.step});
    for (std::size_t k = first; k < batches;) {
      if (opts.max_steps && s.step >= opts.max_steps) {
        stop = true;
        break;
      }
      const std::size_t group = std::min(opts.accumulation, batches - k);
      step_point p{.started = step_point::clock::now()};
      fault_state.here.step = s.step;
      observers.step_begins(s.step);
      loss_sums step{};
      for (std::size_t m = 0; m < group; ++m, ++k) {
        const batch_view<float> b = fit_parts::next_batch(job.data, e.figures());
        set_phase(fault_phase::forward_backward);
        const loss_value v = e.micro_step(b, m, group, job.seed, s.step * micro_step_salt_stride + m);
        step += {.loss = v.sum, .correct = static_cast<double>(v.correct), .samples = static_cast<double>(b.n)};
        p.samples += b.n;
        trained += b.global_n;
      }
      // Under failure detection the sums come before the optimizer step, so that a rank's state
      // after its step (parameters, step count, position, sums) has no collective inside.
      set_phase(fault_phase::loss_sums);
      if (s.watching) e.sum(step);
      set_phase(fault_phase::optimizer);
      const float lr = opts.schedule(s.step, job.base_lr);
      e.optimizer_step(lr, opts.clip_grad_norm);
      ++s.step;
      ++steps;
      s.last_lr = lr;
      set_phase(fault_phase::bookkeeping);
      if (!e.caps.every_rank_holds_loss && !s.watching) e.sum(step);
      sums += step;
      s.at = {.valid = true, .epoch = epoch, .batch = k, .batches = batches, .sums = sums};
      p = {.step = s.step, .epoch = epoch, .batch = k, .batches = batches, .epoch_sums = sums, .lr = lr,
           .samples = p.samples, .trained = r.trained_samples + trained, .started = p.started,
           .ended = step_point::clock::now()};
      if (!observers.after_step(p)) {
        stop = true;
        break;
      }
    }
    if (steps == 0) break;
    if (e.caps.every_rank_holds_loss && !s.global_sums) e.sum(sums);
    r.epochs = epoch + 1;
    r.samples += static_cast<std::size_t>(sums.samples);
    r.trained_samples += trained;
    r.train_loss = sums.mean_loss();
    r.train_accuracy = sums.accuracy();
  }
}

}  // namespace loom::detail
