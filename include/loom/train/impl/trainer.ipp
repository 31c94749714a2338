// SPDX-License-Identifier: Apache-2.0
#pragma once
// The definitions of trainer.hpp's non-template functions (the checks and descriptions of fit and
// the job): included at the end of the header (header-only), or compiled once in src/loom.cpp
// (LOOM_SEPARATE_COMPILATION; see loom/core/config.hpp).

#include <charconv>
#include <cmath>

#include "loom/train/trainer.hpp"

namespace loom::detail {

/// The shortest decimal that reads back as the same float (0.1f: "0.1").
inline std::string shortest_text(float v) {
  char b[32];
  const auto end = std::to_chars(b, b + sizeof b, v).ptr;
  return std::string(b, end);
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

LOOM_DECL std::string describe_job(const std::string& network, std::size_t parameters, const char* loss, const char* optimizer,
                                   std::uint64_t seed, math_mode math, const std::string& policy,
                                   float label_smoothing) {
  return "network=" + network + ";parameters=" + std::to_string(parameters) + ";loss=" + loss +
         ";optimizer=" + optimizer + ";seed=" + std::to_string(seed) + ";math=" + to_string(math) + ";policy=" + policy +
         ";label_smoothing=" + shortest_text(label_smoothing);
}

LOOM_DECL const trainer_options& checked_trainer_options(const trainer_options& o, const char* loss, bool smooths) {
  const float eps = o.label_smoothing;
  if (!(eps >= 0.0f && eps < 1.0f))
    throw invalid_argument("loom::trainer: trainer_options::label_smoothing = " + shortest_text(eps) +
                           " is out of range: it must be in [0, 1) (0: no smoothing)");
  if (eps != 0.0f && !smooths)
    throw invalid_argument("loom::trainer: trainer_options::label_smoothing = " + shortest_text(eps) +
                           " applies to loom::softmax_cross_entropy only; this trainer's loss is loom::" + loss +
                           ": leave it 0");
  return o;
}

}  // namespace loom::detail
