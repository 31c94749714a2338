// SPDX-License-Identifier: Apache-2.0
// The examples' shared code that does not depend on a network or a trainer type (example.hpp):
// the flags, fit()'s options, the `result:` line. Compiled once for the three examples (library
// example_common), not in each of them.

#include "example.hpp"

#include <algorithm>

namespace example {

[[noreturn]] void parser::fail(const std::string& msg) const {
  std::cerr << program_ << ": " << msg << "\n\n" << usage_;
  std::exit(2);
}

flags parser::parse(int argc, char** argv, const std::function<bool(std::string_view, std::string_view)>& extra) const {
  flags f;
  f.model = models_.front();
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a == "--help" || a == "-h") {
      std::cout << usage_;
      std::exit(0);
    }
    if (a.substr(0, 2) == "--" && extra &&
        std::find(switches_.begin(), switches_.end(), a.substr(2)) != switches_.end()) {
      extra(a.substr(2), {});
      continue;
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
  if (std::find(models_.begin(), models_.end(), f.model) == models_.end()) {
    std::string names;
    for (std::size_t i = 0; i < models_.size(); ++i)
      names += (i == 0 ? "" : i + 1 == models_.size() ? " or " : ", ") + models_[i];
    fail("--model must be " + names + ", got '" + f.model + "'");
  }
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

parser& parser::with_weights_flags() {
  weights_ = true;
  usage_ += weights_usage;
  return *this;
}

parser& parser::with_zero_flag() {
  zero_ = true;
  usage_ +=
      "  --zero                 shard the optimizer state over the data-parallel replicas\n"
      "                         (ZeRO stage 1, loom::shard_optimizer_state)\n";
  return *this;
}

parser& parser::with_models(std::vector<std::string> names) {
  models_ = std::move(names);
  return *this;
}

parser& parser::with_switches(std::vector<std::string> names) {
  switches_ = std::move(names);
  return *this;
}

loom::fit_options fit_options_of(const flags& f) {
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

void print_valid_world_sizes(const std::vector<std::size_t>& sizes) {
#if LOOM_HAS_MPI
  if (loom::mpi_comm::world().rank() != 0) return;
#endif
  std::string line = "valid_world_sizes:";
  for (std::size_t w : sizes) line += " " + std::to_string(w);
  std::printf("%s\n", line.c_str());
}

void print_result(const flags& f, const loom::fit_result& fit, const loom::eval_result& eval, double params_l2,
                  const std::string& extra) {
  std::printf("result: model=%s epochs=%zu batch=%zu test_accuracy=%.4f train_loss=%.4f samples_per_s=%.0f "
              "params_l2=%.6f ranks=%d comm_exposed_s=%.3f%s\n",
              f.model.c_str(), fit.epochs, f.batch, eval.accuracy, fit.train_loss, fit.samples_per_s(), params_l2,
              fit.ranks, fit.figures.empty() ? 0.0 : fit.figures[0].comm_exposed_s, extra.c_str());
}

}  // namespace example
