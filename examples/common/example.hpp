// SPDX-License-Identifier: Apache-2.0
#pragma once
// What the Fashion-MNIST examples share: the networks, the command-line flags, loading the data
// and the `result:` line. examples/fashion_mnist trains data-parallel, examples/pipeline and
// examples/tensor_parallel split the same networks over ranks; with the same flags all three
// start from the same parameters and print comparable results.

#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include "loom/loom.hpp"
#include "networks.hpp"
#if LOOM_HAS_MPI
#include "loom/comm/mpi.hpp"
#include "loom/data/mapped.hpp"
#endif

namespace example {

struct flags {
  std::string model = "mlp";
  std::size_t epochs = 5;
  std::size_t batch = 64;
  float lr = 0.02f;
  float momentum = 0.9f;
  std::string optimizer = "sgd";
  std::uint64_t seed = 1;
  int threads = 0;
  std::size_t max_steps = 0;
  std::size_t train_samples = 0;
  std::size_t test_samples = 0;
  std::size_t deterministic_chunk = 0;
  std::string metrics_file, metrics_jsonl, trace, tensorboard;
  double monitor_every = 5;
  double live_every = 5;
  loom::progress_mode progress = loom::progress_mode::automatic;
  std::string data = loom::data::default_fashion_mnist_dir;
  bool quiet = false;
  // --print-valid-world-sizes: print the world sizes this job trains on and exit.
  bool print_valid_world_sizes = false;
  // --zero: the optimizer state sharded over the ranks (loom::shard_optimizer_state; parser::with_zero_flag).
  bool zero = false;
  // Weights in and out (examples/common/weights.hpp), for the examples whose parser takes them
  // (parser::with_weights_flags); empty: not asked for.
  std::string save_weights, load_weights, export_onnx;
  // Checkpoints (docs/checkpoints.md).
  std::string checkpoint_dir;
  std::size_t checkpoint_every = 0;
  double checkpoint_every_s = 0;
  std::size_t checkpoint_keep = 3;
  bool resume = false;
  // Failures (docs/fault-tolerance.md).
  bool fault_detection = true;
  double fault_deadline = 0;
  std::string recovery = "auto";
  bool replace_failed = false;
};

inline constexpr const char* common_usage = R"(  --model mlp|cnn        network to train (default mlp: 784-256-128-10 with ReLU;
                         cnn: two 3x3 conv + max-pool blocks, then 128 and 10)
  --epochs N             passes over the training set (default 5)
  --batch N              samples per step, over all ranks (default 64)
  --lr X                 learning rate (default 0.02)
  --momentum X           SGD momentum (default 0.9)
  --optimizer sgd|adam   (default sgd)
  --seed N               seed of initialisation and shuffling (default 1)
  --threads N            compute threads per rank, 0 = cores / ranks on this host (default 0)
  --max-steps N          stop after N steps in all (default: no limit)
  --train-samples N      use only the first N training images (default: all 60000)
  --test-samples N       evaluate on the first N test images (default: all 10000)
  --data DIR             directory with the IDX files (default /usr/share/datasets/fashion-mnist)
  --deterministic-chunk C  split-invariant mode: chunks of C samples summed in one fixed tree,
                         so results are bitwise equal on 1, 2, 3, ... ranks (at least one chunk
                         per rank; single process and data parallel only; default 0: off)
  --metrics-file FILE    each rank's live metrics as a Prometheus textfile, rewritten atomically
                         (several ranks: FILE with .rank<r> before its extension)
  --metrics-jsonl FILE   each rank's metrics appended as JSON lines (likewise per rank)
  --monitor-every S      seconds between metrics writes (default 5; 0: every step)
  --live-every S         seconds between refreshes of the live view of every rank on rank 0
                         (default 5; 0: none; none with --quiet)
  --progress auto|bar|lines  how progress and the live view are drawn: redrawn in place (bar) or
                         as lines; auto: bar on a terminal (under mpirun stderr is a pipe: use bar)
  --trace FILE           Chrome trace JSON timeline of training (Perfetto, chrome://tracing): every
                         rank in FILE, and each rank's own with .rank<r> before the extension
  --checkpoint-dir DIR   write checkpoints in DIR (step-<n>/ directories; shared storage under
                         several hosts); one when training ends, and on SIGUSR1 or SIGTERM, after
                         which the program exits with status 0 (resume it with --resume)
  --checkpoint-every N   also a checkpoint every N steps
  --checkpoint-every-s S also a checkpoint every S seconds
  --checkpoint-keep K    committed checkpoints kept (default 3; 0: all)
  --resume               continue from the newest valid checkpoint in --checkpoint-dir (none: start
                         afresh); --epochs and --max-steps count the whole run, so a resumed run
                         ends where an uninterrupted one would
  --recovery auto|on|off when a rank dies or hangs, go on with the others (auto: under
                         mpirun --enable-recovery or loomrun; docs/fault-tolerance.md)
  --fault-deadline S     a collective unfinished after S seconds means a failed peer (default:
                         20 x the median step time, at least 0.5 s)
  --replace-failed       after a recovery that lost ranks, start as many new processes of this
                         program (MPI_Comm_spawn) and go on with the same number of ranks
                         again (data parallel without --zero; under mpirun --enable-recovery)
  --no-fault-detection   no deadlines: a dead peer blocks the others until mpirun ends the job
  --load-weights FILE    start from the weights in FILE (safetensors, PyTorch's names)
  --save-weights FILE    after training, write the weights to FILE (one safetensors file)
  --tensorboard DIR      TensorBoard event files, each rank's under DIR/rank<r>/ (tensorboard
                         --logdir DIR): scalars at each metrics write, then the end-of-run
                         figures and the hparams (these flags)
  --quiet                no progress output
  --print-valid-world-sizes  print the numbers of ranks this job (model, --batch,
                         --deterministic-chunk) can train on, one line
                         `valid_world_sizes: N ...`, and exit (loom::world_size_rules;
                         for a launcher restarting on the ranks left: docs/memory-plan.md)
)";

inline constexpr const char* weights_usage = R"(  --export-onnx FILE     after training, write the model to FILE as ONNX (opset 17); with
                         --load-weights FILE --epochs 0: convert FILE without training
)";

/// Parses the command line. `program` names the example in messages; `usage` is its whole usage
/// text; `extra(name, value)` takes the example's own flags and returns false for an unknown one.
class parser {
 public:
  parser(std::string program, std::string usage) : program_(std::move(program)), usage_(std::move(usage)) {}

  [[noreturn]] void fail(const std::string& msg) const {
    std::cerr << program_ << ": " << msg << "\n\n" << usage_;
    std::exit(2);
  }

  template <class N>
  N number(std::string_view flag, std::string_view text) const {
    N v{};
    auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (ec != std::errc{} || p != text.data() + text.size())
      fail("--" + std::string(flag) + " needs a number, got '" + std::string(text) + "'");
    return v;
  }

  flags parse(int argc, char** argv, const std::function<bool(std::string_view, std::string_view)>& extra = {}) const {
    flags f;
    for (int i = 1; i < argc; ++i) {
      std::string_view a = argv[i];
      if (a == "--help" || a == "-h") {
        std::cout << usage_;
        std::exit(0);
      }
      if (a == "--quiet") {
        f.quiet = true;
        continue;
      }
      if (a == "--print-valid-world-sizes") {
        f.print_valid_world_sizes = true;
        continue;
      }
      if (a == "--zero" && zero_) {
        f.zero = true;
        continue;
      }
      if (a == "--resume") {
        f.resume = true;
        continue;
      }
      if (a == "--replace-failed") {
        f.replace_failed = true;
        continue;
      }
      if (a == "--no-fault-detection") {
        f.fault_detection = false;
        continue;
      }
      if (a.substr(0, 2) != "--") fail("unexpected argument '" + std::string(a) + "'");
      std::string_view name = a.substr(2), value;
      if (auto eq = name.find('='); eq != std::string_view::npos) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
      } else {
        if (i + 1 >= argc) fail("--" + std::string(name) + " needs a value");
        value = argv[++i];
      }
      if (name == "model") f.model = value;
      else if (name == "epochs") f.epochs = number<std::size_t>(name, value);
      else if (name == "batch") f.batch = number<std::size_t>(name, value);
      else if (name == "lr") f.lr = number<float>(name, value);
      else if (name == "momentum") f.momentum = number<float>(name, value);
      else if (name == "optimizer") f.optimizer = value;
      else if (name == "seed") f.seed = number<std::uint64_t>(name, value);
      else if (name == "threads") f.threads = number<int>(name, value);
      else if (name == "max-steps") f.max_steps = number<std::size_t>(name, value);
      else if (name == "train-samples") f.train_samples = number<std::size_t>(name, value);
      else if (name == "test-samples") f.test_samples = number<std::size_t>(name, value);
      else if (name == "data") f.data = value;
      else if (name == "deterministic-chunk") f.deterministic_chunk = number<std::size_t>(name, value);
      else if (name == "metrics-file") f.metrics_file = value;
      else if (name == "metrics-jsonl") f.metrics_jsonl = value;
      else if (name == "monitor-every") f.monitor_every = number<double>(name, value);
      else if (name == "live-every") f.live_every = number<double>(name, value);
      else if (name == "trace") f.trace = value;
      else if (name == "load-weights") f.load_weights = value;
      else if (name == "save-weights") f.save_weights = value;
      else if (name == "tensorboard") f.tensorboard = value;
      else if (name == "progress") {
        if (value == "auto") f.progress = loom::progress_mode::automatic;
        else if (value == "bar") f.progress = loom::progress_mode::bar;
        else if (value == "lines") f.progress = loom::progress_mode::lines;
        else fail("--progress must be auto, bar or lines, got '" + std::string(value) + "'");
      }
      else if (weights_ && name == "export-onnx") f.export_onnx = value;
      else if (name == "checkpoint-dir") f.checkpoint_dir = value;
      else if (name == "checkpoint-every") f.checkpoint_every = number<std::size_t>(name, value);
      else if (name == "checkpoint-every-s") f.checkpoint_every_s = number<double>(name, value);
      else if (name == "checkpoint-keep") f.checkpoint_keep = number<std::size_t>(name, value);
      else if (name == "fault-deadline") {
        f.fault_deadline = number<double>(name, value);
        if (!(f.fault_deadline > 0)) fail("--fault-deadline must be a number of seconds above 0, got " + std::string(value));
      }
      else if (name == "recovery") {
        f.recovery = value;
        if (f.recovery != "auto" && f.recovery != "on" && f.recovery != "off")
          fail("--recovery must be auto, on or off, got '" + f.recovery + "'");
      }
      else if (!extra || !extra(name, value)) fail("unknown flag --" + std::string(name));
    }
    if (f.model != "mlp" && f.model != "cnn") fail("--model must be mlp or cnn, got '" + f.model + "'");
    if (f.optimizer != "sgd" && f.optimizer != "adam") fail("--optimizer must be sgd or adam, got '" + f.optimizer + "'");
    if (f.batch == 0) fail("--batch must be at least 1");
    if (f.epochs == 0 && f.load_weights.empty()) fail("--epochs must be at least 1 (0 only with --load-weights)");
    if (!(f.monitor_every >= 0)) fail("--monitor-every must be >= 0 seconds");
    if (!(f.checkpoint_every_s >= 0)) fail("--checkpoint-every-s must be >= 0 seconds");
    if (f.checkpoint_dir.empty() && (f.resume || f.checkpoint_every || f.checkpoint_every_s > 0))
      fail("--resume and --checkpoint-every need --checkpoint-dir DIR");
    if (!(f.live_every >= 0)) fail("--live-every must be >= 0 seconds");
    return f;
  }

  /// Takes --load-weights, --save-weights and --export-onnx too (and --epochs 0 with
  /// --load-weights), and lists them in the usage.
  parser& with_weights_flags() {
    weights_ = true;
    usage_ += weights_usage;
    return *this;
  }
  /// Takes --zero (ZeRO stage 1 under data parallelism) and lists it in the usage.
  parser& with_zero_flag() {
    zero_ = true;
    usage_ +=
        "  --zero                 shard the optimizer state over the ranks (ZeRO stage 1,\n"
        "                         loom::shard_optimizer_state; data parallel)\n";
    return *this;
  }

 private:
  std::string program_, usage_;
  bool weights_ = false, zero_ = false;
};

template <class Set>
Set subset(Set set, std::size_t n) {
  return n ? set.first(n) : std::move(set);
}

/// The training or test images. With MPI, memory-mapped: a rank touches only the pages of its
/// own samples.
inline auto load(const flags& f, loom::data::split which) {
  const std::size_t n = which == loom::data::split::train ? f.train_samples : f.test_samples;
#if LOOM_HAS_MPI
  return subset(loom::data::mapped_fashion_mnist(f.data, which), n);
#else
  return subset(loom::data::fashion_mnist(f.data, which), n);
#endif
}

inline loom::fit_options fit_options_of(const flags& f) {
  loom::fit_options fo;
  fo.epochs = f.epochs;
  fo.batch = f.batch;
  fo.max_steps = f.max_steps;
  fo.deterministic_chunk = f.deterministic_chunk;
  fo.metrics.prometheus_file = f.metrics_file;
  fo.metrics.jsonl_file = f.metrics_jsonl;
  fo.metrics.every_s = f.monitor_every;
  fo.metrics.tensorboard_dir = f.tensorboard;
  if (!f.tensorboard.empty()) {
    // A float flag as it was typed (0.02, not 0.0199999996): its shortest decimal, read as a double.
    auto number = [](auto v) {
      char text[32];
      return std::strtod(std::string(text, std::to_chars(text, text + sizeof text, v).ptr).c_str(), nullptr);
    };
    fo.metrics.hparams = {{"model", f.model}, {"optimizer", f.optimizer}, {"lr", number(f.lr)},
                          {"momentum", number(f.momentum)}, {"epochs", number(f.epochs)}, {"batch", number(f.batch)},
                          {"seed", number(f.seed)}, {"threads", number(f.threads)}, {"max_steps", number(f.max_steps)},
                          {"train_samples", number(f.train_samples)},
                          {"deterministic_chunk", number(f.deterministic_chunk)}};
  }
  fo.trace = f.trace;
  fo.checkpoint = {.directory = f.checkpoint_dir, .every_steps = f.checkpoint_every, .every_s = f.checkpoint_every_s,
                   .keep = f.checkpoint_keep, .resume = f.resume};
  fo.fault.detect = f.fault_detection;
  fo.fault.deadline_s = f.fault_deadline;
  fo.fault.replace = f.replace_failed;
  fo.fault.recovery = f.recovery == "on" ? loom::recovery_mode::on : f.recovery == "off" ? loom::recovery_mode::off
                                                                                        : loom::recovery_mode::automatic;
  fo.progress = f.quiet ? nullptr : &std::cerr;
  fo.progress_style = f.progress;
  fo.live_every_s = f.quiet ? 0 : f.live_every;  // nothing to draw on: no exchanges
  return fo;
}

/// --print-valid-world-sizes: the line `valid_world_sizes: N ...` (ascending; nothing after the
/// colon when no world trains the job), from world rank 0 only.
inline void print_valid_world_sizes(const std::vector<std::size_t>& sizes) {
#if LOOM_HAS_MPI
  if (loom::mpi_comm::world().rank() != 0) return;
#endif
  std::string line = "valid_world_sizes:";
  for (std::size_t w : sizes) line += " " + std::to_string(w);
  std::printf("%s\n", line.c_str());
}

/// The machine-readable line every example ends with (printed by rank 0). `extra` is appended
/// (e.g. " stages=2 micro_batches=4 schedule=1f1b").
inline void print_result(const flags& f, const loom::fit_result& fit, const loom::eval_result& eval, double params_l2,
                         const std::string& extra = "") {
  std::printf("result: model=%s epochs=%zu batch=%zu test_accuracy=%.4f train_loss=%.4f samples_per_s=%.0f "
              "params_l2=%.6f ranks=%d comm_exposed_s=%.3f%s\n",
              f.model.c_str(), fit.epochs, f.batch, eval.accuracy, fit.train_loss, fit.samples_per_s(), params_l2,
              fit.ranks, fit.figures.empty() ? 0.0 : fit.figures[0].comm_exposed_s, extra.c_str());
}

/// The weights of --load-weights, if given, into t (any policy; collective).
template <class Trainer>
void load_weights(const flags& f, Trainer& t) {
  if (f.load_weights.empty()) return;
  t.load_weights(f.load_weights);
  if (!f.quiet && t.rank() == 0) std::cerr << "loaded the weights of " << f.load_weights << "\n";
}

/// After fit: the --save-weights file (collective), or — when a signal stopped fit — the line
/// saying where its checkpoint is. Returns true when the program should end now (preempted).
template <class Trainer>
bool after_fit(const char* program, const flags& f, Trainer& t, const loom::fit_result& fit) {
  if (fit.preempted) {
    if (t.rank() == 0)
      std::printf("%s: stopped by signal %d at step %zu; checkpoint committed: %s (continue with --resume)\n", program,
                  fit.signal, t.steps(), fit.checkpoint.c_str());
    std::fflush(stdout);
    return true;
  }
  if (!f.save_weights.empty()) {
    t.save_weights(f.save_weights);
    if (!f.quiet && t.rank() == 0) std::cerr << "wrote the weights to " << f.save_weights << "\n";
  }
  return false;
}

/// Runs body; a loom::error ends the whole job (peers may be waiting in a collective for this
/// rank) with the message, exit status 1.
template <class Body>
int guarded(const char* program, Body&& body) {
  try {
    return body();
  } catch (const loom::error& e) {
#if LOOM_HAS_MPI
    if (loom::mpi_comm::world().size() > 1) {
      // Under mpirun --enable-recovery MPI_Abort does not end the job (the runtime keeps the
      // others alive); they have deadlines and end by themselves: leave alone.
      if (loom::runtime_keeps_survivors()) {
        std::fprintf(stderr, "loom: rank %d: %s: %s\n", loom::mpi_comm::world().rank(), program, e.what());
        std::fflush(stderr);
        loom::detail::write_exit_status("failed 1");
        std::_Exit(1);
      }
      loom::mpi_comm::world().abort(1, std::string(program) + ": " + e.what());
    }
#endif
    std::cerr << program << ": " << e.what() << "\n";
    loom::detail::write_exit_status("failed 1");
    return 1;
  }
}

}  // namespace example
