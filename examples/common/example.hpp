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
  std::string model = "mlp";  // (parser::with_models: its first name)
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

/// --model of the examples that train the main job's networks (examples/common/networks.hpp).
inline constexpr const char* model_usage = R"(  --model mlp|cnn        network to train (default mlp: 784-256-128-10 with ReLU;
                         cnn: two 3x3 conv + max-pool blocks, then 128 and 10)
)";

inline constexpr const char* common_usage = R"(  --epochs N             passes over the training set (default 5)
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
                         mpirun --enable-recovery or loomrun; docs/fault-tolerance.md); where
                         no rank holds a copy of the lost one's state (pipeline stages, tensor
                         slices, --zero) the job ends after a roll call naming it
  --fault-deadline S     a collective unfinished after S seconds means a failed peer (default:
                         20 x the median step time, at least 0.5 s, or 30 s where a failure
                         ends the job)
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
/// (Defined in example.cpp, compiled once for the three examples: library example_common.)
class parser {
 public:
  parser(std::string program, std::string usage) : program_(std::move(program)), usage_(std::move(usage)) {}

  /// Prints "program: msg", a blank line and the usage to stderr, and exits with status 2.
  [[noreturn]] void fail(const std::string& msg) const;

  /// text as a number of type N, or fail() naming the flag.
  template <class N>
  N number(std::string_view flag, std::string_view text) const {
    N v{};
    auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (ec != std::errc{} || p != text.data() + text.size())
      fail("--" + std::string(flag) + " needs a number, got '" + std::string(text) + "'");
    return v;
  }

  flags parse(int argc, char** argv, const std::function<bool(std::string_view, std::string_view)>& extra = {}) const;

  /// Takes --load-weights, --save-weights and --export-onnx too (and --epochs 0 with
  /// --load-weights), and lists them in the usage.
  parser& with_weights_flags();
  /// Takes --zero (ZeRO stage 1 under data parallelism) and lists it in the usage.
  parser& with_zero_flag();
  /// The values --model takes (default: mlp and cnn); the first is the default.
  parser& with_models(std::vector<std::string> names);
  /// Flags without a value the example takes itself: `--name` reaches `extra(name, "")`.
  parser& with_switches(std::vector<std::string> names);

 private:
  std::string program_, usage_;
  bool weights_ = false, zero_ = false;
  std::vector<std::string> models_{"mlp", "cnn"}, switches_;
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

/// fit()'s options from the flags.
loom::fit_options fit_options_of(const flags& f);

/// --print-valid-world-sizes: the line `valid_world_sizes: N ...` (ascending; nothing after the
/// colon when no world trains the job), from world rank 0 only.
void print_valid_world_sizes(const std::vector<std::size_t>& sizes);

/// The machine-readable line every example ends with (printed by rank 0). `extra` is appended
/// (e.g. " stages=2 micro_batches=4 schedule=1f1b").
void print_result(const flags& f, const loom::fit_result& fit, const loom::eval_result& eval, double params_l2,
                  const std::string& extra = "");

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
