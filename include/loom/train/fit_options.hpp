// SPDX-License-Identifier: Apache-2.0
#pragma once
// What a user hands loom::trainer and gets back: the trainer's own options (trainer_options),
// the options of one fit (fit_options) and what it measured (fit_result), and evaluate's result
// (eval_result). The trainer itself is loom/train/trainer.hpp.

#include <cstddef>
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include "loom/core/fault.hpp"
#include "loom/core/math_mode.hpp"
#include "loom/io/checkpoint.hpp"
#include "loom/monitor/figures.hpp"
#include "loom/monitor/metrics.hpp"
#include "loom/monitor/progress.hpp"
#include "loom/optim/schedule.hpp"
#include "loom/train/ema_state.hpp"

namespace loom {

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
  /// Label smoothing of loom::softmax_cross_entropy, as torch.nn.CrossEntropyLoss(label_smoothing=eps):
  /// the target is (1 - eps) one_hot + eps / classes, in training and in evaluate (accuracy
  /// stays the argmax's). In [0, 1); 0 (the default) is the plain loss, bit for bit. Another
  /// loss refuses a non-zero value (the trainer's constructor throws loom::invalid_argument).
  float label_smoothing = 0.0f;
  /// An exponential moving average of the weights, buffers included (loom::ema_options; off by
  /// default): trainer::evaluate_ema, save_ema_weights, checkpoints hold it. single_process and
  /// data_parallel (every rank keeps the whole model's); the constructor refuses it under
  /// pipeline and tensor parallelism, and throws loom::invalid_argument for a decay outside
  /// [0, 1) or every = 0.
  ema_options ema{};
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
  /// on 1, 2, 3, ... ranks (at the same threads per rank), and a run resumed on another number
  /// of ranks ends as the one that never stopped. Any number of ranks, as long as a full batch
  /// has at least one chunk per rank; rank r takes a contiguous range of whole chunks
  /// (loom::chunk_plan). Gradients are exchanged after every micro-step of an accumulation
  /// group. Costs smaller gemms and an exchange without overlap (docs/data-parallel.md).
  /// single_process and data_parallel only.
  std::size_t deterministic_chunk = 0;
  /// Where progress goes (null: nowhere) and how.
  std::ostream* progress = &std::cerr;
  /// Where warnings go, apart from progress so that silencing progress never silences them: a
  /// checkpoint refused on resume (and the older one taken instead). Null: nowhere. (A lost rank
  /// and its recovery, a preemption's checkpoint and skipped samples are reported on stderr by
  /// the ranks themselves.)
  std::ostream* warnings = &std::cerr;
  progress_mode progress_style = progress_mode::automatic;
  /// Each rank's live metrics files (Prometheus textfile, JSON lines, TensorBoard events) and how often they are
  /// rewritten (loom/monitor/metrics.hpp); none by default.
  metrics_options metrics{};
  /// Seconds between refreshes of the live view on rank 0's progress stream (0: none;
  /// loom/monitor/live.hpp): a row per rank (past 16, min / median / max), the straggler when
  /// there is one. The ranks exchange their figures at step counts derived from rank 0's step
  /// time, about this often. Every rank must ask alike (checked).
  double live_every_s = 0;
  /// A Chrome trace JSON timeline of this fit (empty: none; loom/monitor/timeline.hpp): rank 0
  /// writes this file with every rank as a process, clocks aligned on the collective that
  /// starts fit; under several ranks each rank also writes its own, `.rank<r>` before the
  /// extension. Opens in Perfetto (ui.perfetto.dev) and chrome://tracing. Every rank must ask
  /// alike (checked).
  std::string trace;
  /// Seconds between samples of the machine (memory, CPU, network, the GPU through NVML;
  /// loom/monitor/sampler.hpp), which the metrics files carry and the timeline shows as
  /// counters. A sample costs a few microseconds.
  double sample_every_s = 1.0;
  /// Checkpoints: where, how often, how many kept, resuming, preemption by signal
  /// (loom/io/checkpoint.hpp, docs/checkpoints.md); none by default. Every rank must ask alike
  /// (checked).
  checkpoint_options checkpoint{};
  /// Failure detection and recovery from a dead or hung rank (data_parallel over
  /// loom::mpi_comm; docs/fault-tolerance.md). Every rank must ask alike (checked).
  fault_options fault{};
};

/// What fit() measured.
struct fit_result {
  std::size_t epochs = 0;
  /// Optimizer steps this fit took.
  std::size_t steps = 0;
  /// Samples of the epochs this fit ran, over all replicas — a resumed epoch's samples before
  /// the checkpoint included (what train_loss and train_accuracy average over).
  std::size_t samples = 0;
  /// Samples this fit trained on itself, over all replicas (after a resume, only those after
  /// the checkpoint): what samples_per_s() divides.
  std::size_t trained_samples = 0;
  /// Mean loss and accuracy over the samples of the last epoch run.
  double train_loss = 0;
  double train_accuracy = 0;
  /// Wall time spent in training steps (data preparation included, evaluation excluded).
  double seconds = 0;
  /// The training rate of this fit: trained_samples / seconds.
  double samples_per_s() const { return seconds > 0 ? static_cast<double>(trained_samples) / seconds : 0; }
  /// Processes that trained together, and each one's figures (rank order; one entry when
  /// training alone).
  int ranks = 1;
  std::vector<rank_figures> figures;
  /// The optimizer step this fit started from (non-zero when it resumed from a checkpoint).
  std::size_t resumed_from_step = 0;
  /// fit stopped early because of SIGUSR1 or SIGTERM (checkpoint_options::on_signal), after
  /// committing a checkpoint: `checkpoint` says where; resuming from it continues exactly.
  bool preempted = false;
  int signal = 0;
  /// The last checkpoint this fit committed (empty: none).
  std::string checkpoint;
  /// Recoveries from a failed or hung rank during this fit (each reported on stderr); `ranks`
  /// is the world after them.
  int recoveries = 0;
};

/// What evaluate() measured.
struct eval_result {
  std::size_t samples = 0;
  double loss = 0;
  double accuracy = 0;
};


}  // namespace loom
