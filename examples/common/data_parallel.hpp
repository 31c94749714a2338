// SPDX-License-Identifier: Apache-2.0
#pragma once
// How the data-parallel examples (fashion_mnist, resnet) train a network: the trainer built
// from the flags, fit, evaluation, the files asked for and the `result:` line — one template
// for both, with the flags of the training recipe (recipe_flags) they share.
//
// Built with MPI, the policy is loom::data_parallel<loom::mpi_comm, loom::choose_at_run_time>:
// the wire format (--grad-compression), ZeRO (--zero) and synchronized batch norm (--sync-bn)
// come from flags, as the optimizer does (loom::any_optimizer), so one trainer type per network
// serves every combination, bitwise as the policy naming them would. A program with fixed
// choices names them: loom::data_parallel<loom::mpi_comm, loom::sync_batch_norm>, loom::sgd.

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <string>
#include <string_view>

#include "example.hpp"
#include "weights.hpp"
#if LOOM_HAS_IMAGES
#include "shards.hpp"
#endif

namespace example {

#if LOOM_HAS_MPI
using data_parallel_policy = loom::data_parallel<loom::mpi_comm, loom::choose_at_run_time>;
#else
using data_parallel_policy = loom::single_process;
#endif

inline constexpr const char* recipe_usage = R"(  --grad-compression none|bf16|fp16  gradients sent in 16 bits, summed in float
                         (loom::compress<>; data parallel; default none)
  --sync-bn              batch norms normalise with the statistics of the global batch, summed
                         over the ranks (loom::sync_batch_norm; data parallel; default: each
                         rank's own share, as PyTorch DDP)
  --lr-schedule constant|cosine  the learning rate over the run: --lr throughout (default), or
                         cosine annealing from --lr to 0 over every step of the run (--epochs
                         of the training set, or --max-steps when fewer; PyTorch's
                         CosineAnnealingLR stepped per batch; loom::cosine_warmup)
  --warmup-steps N       with --lr-schedule cosine: a linear warm-up over the first N steps
                         (LinearLR before it; default 0)
  --label-smoothing X    train against (1 - X) one-hot + X / classes (default 0)
  --weight-decay X       L2 penalty added to the gradient (default 0)
  --no-norm-bias-decay   no weight decay on batch norm and layer norm parameters nor on biases
                         (torchvision's --norm-weight-decay 0 --bias-weight-decay 0)
  --ema                  also keep an exponential moving average of the weights and buffers, and
                         report its test accuracy (ema_test_accuracy=): torchvision's --model-ema,
                         its decay adjusted to the batch and epochs as its train.py does
  --ema-decay D          torchvision's --model-ema-decay (default 0.99998)
  --ema-every N          optimizer steps between updates, torchvision's --model-ema-steps (default 32)
  --math fp32|bf16       what the matrix products and convolutions take: fp32 (default), or
                         operands rounded to bf16 and summed in float, weights, gradients,
                         batch norms and the optimizer staying float (loom::math_mode::bf16,
                         as PyTorch's CPU autocast; needs avx512_bf16 or AMX, refused otherwise)
  --conv auto|direct|winograd
                         how fp32 convolutions compute: auto (default) by Winograd where that
                         was measured faster (3x3, stride 1, 48+ channels or 32+ at 20x20+
                         pixels, enough 4x4 tiles in the batch; AVX-512), direct elsewhere;
                         direct everywhere (PyTorch's); or Winograd for every 3x3 stride-1
                         one of 32+ channels and 4x4+ pixels (loom::conv_algorithm; Winograd's
                         results are not direct's bits)
)";

/// The recipe's flags (parser's `extra`; --sync-bn is a switch: parser::with_switches).
struct recipe_flags {
  std::string grad_compression = "none";
  bool sync_bn = false;
  std::string lr_schedule = "constant";
  std::size_t warmup_steps = 0;
  bool warmup_given = false;
  float label_smoothing = 0;
  float weight_decay = 0;
  bool norm_bias_decay = true;
  bool ema = false;
  double ema_decay = 0.99998;
  std::size_t ema_every = 32;
  loom::math_mode math = loom::math_mode::fp32;
  loom::conv_algorithm conv = loom::conv_algorithm::automatic;
#if LOOM_HAS_IMAGES
  /// --shard-streams, --shuffle-window, --on-bad-sample, --decode-threads (shards in --data).
  shard_flags shards;
#endif
  static inline const std::vector<std::string> switches{"sync-bn", "no-norm-bias-decay", "ema"};

  /// Takes one of the flags above; false when `name` is none of them.
  bool take(const parser& p, std::string_view name, std::string_view value) {
#if LOOM_HAS_IMAGES
    if (shards.take(p, name, value)) return true;
#endif
    if (name == "sync-bn") {
      sync_bn = true;
    } else if (name == "no-norm-bias-decay") {
      norm_bias_decay = false;
    } else if (name == "ema") {
      ema = true;
    } else if (name == "lr-schedule") {
      lr_schedule = value;
      if (lr_schedule != "constant" && lr_schedule != "cosine")
        p.fail("--lr-schedule must be constant or cosine, got '" + lr_schedule + "'");
    } else if (name == "warmup-steps") {
      warmup_steps = p.number<std::size_t>(name, value);
      warmup_given = true;
    } else if (name == "label-smoothing") {
      label_smoothing = p.number<float>(name, value);
    } else if (name == "weight-decay") {
      weight_decay = p.number<float>(name, value);
    } else if (name == "ema-decay") {
      ema_decay = p.number<double>(name, value);
    } else if (name == "ema-every") {
      ema_every = p.number<std::size_t>(name, value);
    } else if (name == "math") {
      if (value != "fp32" && value != "bf16") p.fail("--math must be fp32 or bf16, got '" + std::string(value) + "'");
      math = value == "bf16" ? loom::math_mode::bf16 : loom::math_mode::fp32;
    } else if (name == "conv") {
      if (value != "auto" && value != "direct" && value != "winograd")
        p.fail("--conv must be auto, direct or winograd, got '" + std::string(value) + "'");
      conv = value == "winograd" ? loom::conv_algorithm::winograd
             : value == "direct" ? loom::conv_algorithm::direct
                                 : loom::conv_algorithm::automatic;
    } else if (name == "grad-compression") {
      grad_compression = value;
      if (grad_compression != "none" && grad_compression != "bf16" && grad_compression != "fp16")
        p.fail("--grad-compression must be none, bf16 or fp16, got '" + grad_compression + "'");
    } else {
      return false;
    }
    return true;
  }
};

/// The usage lines of the recipe's flags (and of the shard flags with the image component).
inline std::string recipe_usage_text() {
  std::string u = recipe_usage;
#if LOOM_HAS_IMAGES
  u += shards_usage;
#endif
  return u;
}

/// Parses the command line of a data-parallel example: the common flags, the weights flags,
/// --zero and the recipe's (into r).
inline flags parse_data_parallel(parser& p, recipe_flags& r, int argc, char** argv) {
  flags f = p.with_weights_flags().with_zero_flag().with_switches(r.switches).parse(
      argc, argv, [&](std::string_view name, std::string_view value) { return r.take(p, name, value); });
  if (r.warmup_given && r.lr_schedule != "cosine") p.fail("--warmup-steps needs --lr-schedule cosine");
  return f;
}

/// The fit options of the flags, with the learning-rate schedule of the recipe: cosine annealing
/// over every step of the run (the epochs of `train_samples`, or --max-steps when fewer).
inline loom::fit_options fit_options_of(const flags& f, const recipe_flags& r, std::size_t train_samples) {
  loom::fit_options o = fit_options_of(f);
  if (r.lr_schedule == "cosine") {
    std::size_t total = (train_samples + f.batch - 1) / f.batch * f.epochs;
    if (f.max_steps && f.max_steps < total) total = f.max_steps;
    o.schedule = loom::cosine_warmup{.warmup_steps = r.warmup_steps, .total_steps = total};
  }
  return o;
}

/// Trains Net on train_set (IDX or shards) and evaluates it on test_set; rank 0 prints the
/// `result:` line. Returns the program's exit status.
template <class Net, class TrainSet, class TestSet>
int train_on(const char* program, const flags& f, const recipe_flags& r, const TrainSet& train_set,
             const TestSet& test_set) {
  const loom::any_optimizer::options opt =
      f.optimizer == "adam"
          ? loom::any_optimizer::options(loom::adam::options{
                .lr = f.lr, .weight_decay = r.weight_decay, .decay_norm_and_bias = r.norm_bias_decay})
          : loom::any_optimizer::options(loom::sgd::options{.lr = f.lr, .momentum = f.momentum, .weight_decay = r.weight_decay,
                                                            .decay_norm_and_bias = r.norm_bias_decay});
  loom::set_conv_algorithm(r.conv);  // before the network's first batch creates its convolutions
  loom::trainer_options options{.seed = f.seed, .threads = f.threads, .math = r.math, .label_smoothing = r.label_smoothing};
  if (r.ema) options.ema = loom::ema_options::torchvision(r.ema_decay, f.batch, r.ema_every, std::max<std::size_t>(f.epochs, 1));
  using trainer_type = loom::trainer<Net, loom::softmax_cross_entropy, loom::any_optimizer, data_parallel_policy>;
#if LOOM_HAS_MPI
  const loom::data_parallel_choice choice{.wire = r.grad_compression == "bf16"   ? loom::gradient_wire::bf16
                                                  : r.grad_compression == "fp16" ? loom::gradient_wire::fp16
                                                                                 : loom::gradient_wire::native,
                                          .shard_state = f.zero,
                                          .sync_batch_norm = r.sync_bn};
  trainer_type t{opt, options, choice};
#else
  if (f.zero) throw loom::invalid_argument("--zero needs the MPI build (data parallelism)");
  if (r.grad_compression != "none") throw loom::invalid_argument("--grad-compression needs the MPI build (data parallelism)");
  if (r.sync_bn) throw loom::invalid_argument("--sync-bn needs the MPI build (data parallelism)");
  trainer_type t{opt, options};
#endif
  const bool lead = t.rank() == 0;
  if (!f.quiet && lead)
    std::cerr << program << ": " << f.model << " (" << Net::parameter_count << " parameters), " << train_set.size()
              << " training and " << test_set.size() << " test images, " << t.ranks() << " rank(s) x "
              << loom::threads() << " thread(s)\n";
  load_weights(f, t);
  // --epochs 0 (with --load-weights): no training, only evaluation and the files asked for.
  const auto fit = [&] {
    if (f.epochs) return t.fit(train_set, fit_options_of(f, r, train_set.size()));
    loom::fit_result none;
    none.ranks = t.ranks();
    return none;
  }();
  if (after_fit(program, f, t, fit)) return 0;
  const auto eval = t.evaluate(test_set);
  std::string extra;  // the EMA's accuracy (collective: every rank evaluates)
  if (r.ema && t.has_ema()) {
    char text[64];
    std::snprintf(text, sizeof text, " ema_test_accuracy=%.4f", t.evaluate_ema(test_set).accuracy);
    extra = text;
  }
#if LOOM_HAS_IMAGES
  // Every rank that left bad samples out says so (on_bad_sample::skip), --quiet or not.
  report_skipped(program, t.rank(), "training", train_set);
  report_skipped(program, t.rank(), "test", test_set);
#endif
  // After a recovery from a failed rank the lead may be another process: ask again.
  if (t.rank() != 0) return 0;
  if (!f.quiet && fit.ranks > 1) std::cerr << loom::figures_table(fit.figures);
  print_result(f, fit, eval, t.model().parameters_l2(), extra);
  write_onnx(f, t.model());
  return 0;
}

/// Fashion-MNIST from the shards in --data when it holds train-*.tar and test-*.tar, else from
/// its IDX files.
template <class Net>
int train_data_parallel(const char* program, const flags& f, const recipe_flags& r) {
#if LOOM_HAS_IMAGES
  if (has_shards(f.data)) {
    const auto train_set = load_shards(f, loom::data::split::train, r.shards.options);
    const auto test_set = load_shards(f, loom::data::split::test, r.shards.options);
    describe_shards(program, f, train_set);
    return train_on<Net>(program, f, r, train_set, test_set);
  }
#endif
  const auto train_set = load(f, loom::data::split::train);
  const auto test_set = load(f, loom::data::split::test);
  return train_on<Net>(program, f, r, train_set, test_set);
}

}  // namespace example
