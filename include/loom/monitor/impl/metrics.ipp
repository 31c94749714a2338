// SPDX-License-Identifier: Apache-2.0
#pragma once
// The definitions of metrics.hpp's non-template functions: included at the end of the header
// (header-only), or compiled once in src/loom.cpp (LOOM_SEPARATE_COMPILATION; see loom/core/config.hpp).

#include "loom/monitor/metrics.hpp"

namespace loom {
namespace monitor {

LOOM_DECL std::string rank_path(const std::string& path, int rank, int world) {
  if (world <= 1) return path;
  const std::size_t slash = path.find_last_of('/');
  const std::size_t dot = path.find_last_of('.');
  const std::size_t name = slash == std::string::npos ? 0 : slash + 1;  // a leading dot is no extension
  const bool has_ext = dot != std::string::npos && dot > name;
  const std::string tag = ".rank" + std::to_string(rank);
  return has_ext ? path.substr(0, dot) + tag + path.substr(dot) : path + tag;
}

LOOM_DECL std::string figures_markdown(const std::vector<rank_figures>& ranks) {
  std::string head = "| rank |", rule = "| ---: |", rows;
  for (const auto& field : figure_fields) {
    head += ' ';
    head += field.name;
    head += " |";
    rule += " ---: |";
  }
  head += " samples_per_s |\n";
  rule += " ---: |\n";
  char cell[64];
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    rows += "| " + std::to_string(r) + " |";
    for (const auto& field : figure_fields) {
      std::snprintf(cell, sizeof cell, " %.6g |", ranks[r].*field.member);
      rows += cell;
    }
    std::snprintf(cell, sizeof cell, " %.6g |\n", ranks[r].samples_per_s());
    rows += cell;
  }
  return head + rule + rows;
}

LOOM_DECL std::string hparams_markdown(const std::vector<hparam>& hparams) {
  std::string out = "| hparam | value |\n| --- | --- |\n";
  char cell[64];
  for (const hparam& h : hparams) {
    out += "| " + h.name + " | ";
    if (const double* d = std::get_if<double>(&h.value)) {
      std::snprintf(cell, sizeof cell, "%.17g", *d);
      out += cell;
    } else {
      out += std::get<std::string>(h.value);
    }
    out += " |\n";
  }
  return out;
}

[[gnu::noinline]] LOOM_DECL metrics_writer::metrics_writer(const metrics_options& o, int rank, int world)
      : every_s_(o.every_s), rank_(rank), prom_(o.prometheus_file.empty() ? "" : rank_path(o.prometheus_file, rank, world)),
        jsonl_(o.jsonl_file.empty() ? "" : rank_path(o.jsonl_file, rank, world)), hparams_(o.hparams) {
  if (!(every_s_ >= 0))
    throw invalid_argument("loom::metrics_options: every_s must be >= 0 (0: every step), got " + std::to_string(every_s_));
  if (!prom_.empty()) create_parent_directories(prom_, "loom::metrics");
  if (!jsonl_.empty()) {
    create_parent_directories(jsonl_, "loom::metrics");
    jsonl_out_.open(jsonl_, std::ios::app);
    if (!jsonl_out_) throw io_error("loom::metrics: cannot open " + jsonl_ + " for appending: " + std::strerror(errno));
  }
  if (!o.tensorboard_dir.empty() && (rank == 0 || !o.tensorboard_rank0_only)) {
    tb_.emplace(o.tensorboard_dir + "/rank" + std::to_string(rank));
    bool has_ranks = false;
    for (const hparam& h : hparams_) has_ranks = has_ranks || h.name == "ranks";
    if (!has_ranks) hparams_.push_back({"ranks", static_cast<double>(world)});
    // The session starts now: the hparams dashboard lists the run while it trains.
    tb_summary_.clear();
    tb_->write(0, tb_summary_.hparams_start(hparams_, wall_time_now()));
    tb_->flush();
  }
}

LOOM_DECL void metrics_writer::straggler_seen(std::size_t step, const straggler& s) {
  if (!tb_ || rank_ != 0) return;
  tb_summary_.clear();
  tb_summary_.scalar("live/straggler_rank", s ? s.rank : -1).scalar("live/straggler_score", s.score);
  tb_->write(static_cast<std::int64_t>(step), tb_summary_);
  tb_->flush();
}

[[gnu::noinline]] LOOM_DECL void metrics_writer::end_of_fit(const std::vector<rank_figures>& ranks) {
  if (!tb_) return;
  tb_summary_.clear();
  tb_summary_.text("run/figures", figures_markdown(ranks)).text("run/hparams", hparams_markdown(hparams_));
  tb_summary_.hparams_end(true, wall_time_now());
  tb_->write(static_cast<std::int64_t>(tb_step_), tb_summary_);
  tb_->flush();
}

[[gnu::noinline]] LOOM_DECL void metrics_writer::write_if_due(const rank_figures& f, const training_point& p, const machine_sample& s, bool force) {
  const auto now = clock::now();
  if (!force && written_ && seconds_between(last_, now) < every_s_) return;
  last_ = now;
  written_ = true;
  if (!prom_.empty()) write_prometheus(f, p, s);
  if (!jsonl_.empty()) write_jsonl(f, p, s);
  if (tb_) write_tensorboard(f, p, s);
}

LOOM_DECL std::string metrics_writer::num(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%.17g", v);
  return b;
}

LOOM_DECL void metrics_writer::write_prometheus(const rank_figures& f, const training_point& p, const machine_sample& m) {
  const process_sample& s = m.process;
  std::string out;
  const std::string label = "{rank=\"" + std::to_string(rank_) + "\"}";
  auto metric = [&](std::string_view name, std::string_view type, std::string_view help, double v) {
    out += "# HELP loom_";
    out += name;
    out += ' ';
    out += help;
    out += "\n# TYPE loom_";
    out += name;
    out += ' ';
    out += type;
    out += "\nloom_";
    out += name;
    out += label + ' ' + num(v) + '\n';
  };
  metric("steps_total", "counter", "Optimizer steps taken.", static_cast<double>(p.step));
  metric("epoch", "gauge", "Epoch in progress (1-based).", static_cast<double>(p.epoch));
  metric("train_loss", "gauge", "Mean training loss of this rank's replica over the epoch so far.", p.loss);
  metric("train_accuracy", "gauge", "Training accuracy of this rank's replica over the epoch so far.", p.accuracy);
  metric("learning_rate", "gauge", "Learning rate of the last step.", p.lr);
  metric("samples_per_second", "gauge", "Global samples per second since fit started.", p.samples_per_s);
  metric("fit_elapsed_seconds", "gauge", "Seconds since fit started.", p.elapsed_s);
  metric("compute_seconds_total", "counter", "Seconds in forward, backward and the optimizer.", f.compute_s);
  metric("comm_seconds_total", "counter", "Seconds gradient communication was in flight.", f.comm_s);
  metric("comm_exposed_seconds_total", "counter", "Seconds blocked waiting for gradients (communication not hidden).",
         f.comm_exposed_s);
  metric("wait_seconds_total", "counter", "Seconds blocked in other collectives.", f.wait_s);
  metric("data_seconds_total", "counter", "Seconds reading and converting samples.", f.data_s);
  metric("bubble_seconds_total", "counter", "Seconds a pipeline stage waited on its neighbours.", f.bubble_s);
  metric("sent_bytes_total", "counter", "Gradient and activation bytes sent.", f.bytes_sent);
  metric("samples_total", "counter", "Samples this rank trained on.", f.samples);
  metric("resident_memory_bytes", "gauge", "Resident set size of the process.", s.rss_bytes);
  metric("peak_resident_memory_bytes", "gauge", "Most resident memory at once since the process started.",
         s.peak_rss_bytes);
  metric("cpu_seconds_total", "counter", "User and system CPU time of the process.", s.cpu_s);
  metric("comm_bytes_total", "counter", "Payload bytes of the gradient collectives.", f.comm_bytes);
  metric("bus_bytes_total", "counter", "Bytes the collectives moved over this rank's links (allreduce: 2(n-1)/n of the payload).",
         f.bus_bytes);
  metric("bus_bandwidth_gbytes_per_second", "gauge", "Bus bandwidth of the gradient collectives while in flight, GB/s.",
         f.bus_gbps());
  metric("comm_overlap_ratio", "gauge", "Share of gradient communication hidden behind compute (0 to 1).",
         f.overlap_percent() / 100);
  metric("flops_total", "counter", "Floating-point operations of the passes (3x the layers' forward FLOPs per sample).",
         f.flops);
  metric("achieved_gflops", "gauge", "GFLOP/s achieved while computing.", f.achieved_gflops());
  if (f.peak_gflops > 0)
    metric("peak_gflops", "gauge", "This rank's measured GEMM ceiling, GFLOP/s.", f.peak_gflops);
  if (m.network) {
    metric("network_receive_bytes_per_second", "gauge", "Bytes per second received by the host's interfaces (not lo).",
           m.received_bytes_per_s);
    metric("network_transmit_bytes_per_second", "gauge", "Bytes per second sent by the host's interfaces (not lo).",
           m.sent_bytes_per_s);
  }
  if (m.device) {
    metric("gpu_memory_used_bytes", "gauge", "Device memory in use (NVML).", m.device->memory_used_bytes);
    metric("gpu_memory_total_bytes", "gauge", "Device memory in all (NVML).", m.device->memory_total_bytes);
    metric("gpu_utilization_ratio", "gauge", "Share of time a kernel ran on the device (NVML, 0 to 1).",
           m.device->utilization_percent / 100);
  }
  // Atomically: a reader (node_exporter) sees the old file or the new one, never half of one.
  write_file_atomically(prom_, out);
}

LOOM_DECL void metrics_writer::write_jsonl(const rank_figures& f, const training_point& p, const machine_sample& m) {
  const process_sample& s = m.process;
  std::string line = "{\"rank\":" + std::to_string(rank_) + ",\"step\":" + std::to_string(p.step) +
                     ",\"epoch\":" + std::to_string(p.epoch) + ",\"loss\":" + num(p.loss) +
                     ",\"accuracy\":" + num(p.accuracy) + ",\"lr\":" + num(p.lr) +
                     ",\"samples_per_s\":" + num(p.samples_per_s) + ",\"elapsed_s\":" + num(p.elapsed_s);
  for (const auto& field : figure_fields) {
    line += ",\"";
    line += field.name;
    line += "\":" + num(f.*field.member);
  }
  line += ",\"rss_bytes\":" + num(s.rss_bytes) + ",\"peak_rss_bytes\":" + num(s.peak_rss_bytes) +
          ",\"cpu_s\":" + num(s.cpu_s) + ",\"cpu_percent\":" + num(m.cpu_percent) +
          ",\"bus_gbps\":" + num(f.bus_gbps()) + ",\"overlap_percent\":" + num(f.overlap_percent()) +
          ",\"achieved_gflops\":" + num(f.achieved_gflops());
  if (m.network)
    line += ",\"net_received_bytes_per_s\":" + num(m.received_bytes_per_s) +
            ",\"net_sent_bytes_per_s\":" + num(m.sent_bytes_per_s);
  if (m.device)
    line += ",\"gpu_memory_used_bytes\":" + num(m.device->memory_used_bytes) +
            ",\"gpu_utilization_percent\":" + num(m.device->utilization_percent);
  line += "}\n";
  jsonl_out_ << line << std::flush;
  if (!jsonl_out_) throw io_error("loom::metrics: cannot append to " + jsonl_ + ": " + std::strerror(errno));
}

LOOM_DECL void metrics_writer::write_tensorboard(const rank_figures& f, const training_point& p, const machine_sample& m) {
  const process_sample& s = m.process;
  if (!tb_written_) tb_step_time_s_ = p.elapsed_s;
  else if (p.step > tb_step_)
    tb_step_time_s_ = (p.elapsed_s - tb_elapsed_s_) / static_cast<double>(p.step - tb_step_);
  tb_written_ = true;
  tb_step_ = p.step;
  tb_elapsed_s_ = p.elapsed_s;
  auto percent = [&](double x) { return p.elapsed_s > 0 ? 100.0 * x / p.elapsed_s : 0.0; };
  summary& t = tb_summary_;
  t.clear();
  t.scalar("train/loss", p.loss).scalar("train/accuracy", p.accuracy).scalar("train/lr", p.lr);
  t.scalar("train/samples_per_s", p.samples_per_s).scalar("train/step_time_s", tb_step_time_s_);
  t.scalar("train/epoch", static_cast<double>(p.epoch));
  for (const auto& field : figure_fields) {
    tb_tag_ = "figures/";
    tb_tag_ += field.name;
    t.scalar(tb_tag_, f.*field.member);
  }
  t.scalar("percent/compute", percent(f.compute_s)).scalar("percent/comm_exposed", percent(f.comm_exposed_s));
  t.scalar("percent/wait", percent(f.wait_s)).scalar("percent/data", percent(f.data_s));
  t.scalar("percent/bubble", percent(f.bubble_s));
  t.scalar("process/rss_bytes", s.rss_bytes).scalar("process/peak_rss_bytes", s.peak_rss_bytes);
  t.scalar("process/cpu_s", s.cpu_s).scalar("process/cpu_percent", m.cpu_percent);
  t.scalar("comm/bus_gbps", f.bus_gbps()).scalar("comm/overlap_percent", f.overlap_percent());
  t.scalar("compute/achieved_gflops", f.achieved_gflops());
  if (f.peak_gflops > 0) t.scalar("compute/peak_percent", f.peak_percent());
  if (m.network)
    t.scalar("network/received_bytes_per_s", m.received_bytes_per_s).scalar("network/sent_bytes_per_s", m.sent_bytes_per_s);
  if (m.device)
    t.scalar("gpu/memory_used_bytes", m.device->memory_used_bytes)
        .scalar("gpu/utilization_percent", m.device->utilization_percent);
  tb_->write(static_cast<std::int64_t>(p.step), t);
  tb_->flush();
}
}  // namespace monitor
}  // namespace loom
