// SPDX-License-Identifier: Apache-2.0
#pragma once
// The definitions of tensorboard.hpp's non-template functions: included at the end of the header
// (header-only), or compiled once in src/loom.cpp (LOOM_SEPARATE_COMPILATION; see loom/core/config.hpp).

#include "loom/monitor/tensorboard.hpp"

namespace loom {
namespace monitor {

LOOM_DECL void append_tfrecord(std::string& out, std::string_view record) {
  std::string head;
  detail::pb::little_endian(head, record.size(), 8);
  detail::pb::little_endian(head, masked_crc32c(head.data(), 8), 4);
  out += head;
  out += record;
  detail::pb::little_endian(out, masked_crc32c(record.data(), record.size()), 4);
}

LOOM_DECL summary& summary::scalar(std::string_view tag, double v) {
  value_.clear();
  detail::pb::bytes_field(value_, 1, tag);
  detail::pb::float_field(value_, 2, static_cast<float>(v));
  return add_value();
}

LOOM_DECL summary& summary::text(std::string_view tag, std::string_view markdown) {
  tensor_.clear();
  detail::pb::varint_field(tensor_, 1, dt_string);
  detail::pb::bytes_field(tensor_, 2, {});  // TensorShapeProto of a scalar
  detail::pb::bytes_field(tensor_, 8, markdown);
  return plugin_value(tag, "text", {});
}

LOOM_DECL summary& summary::hparams_start(const std::vector<hparam>& hparams, double start_time_s) {
  std::string info, entry, value;  // SessionStartInfo, one map entry, a google.protobuf.Value
  for (const hparam& h : hparams) {
    value.clear();
    if (const double* d = std::get_if<double>(&h.value)) detail::pb::double_field(value, 2, *d);  // number_value
    else detail::pb::bytes_field(value, 3, std::get<std::string>(h.value));                        // string_value
    entry.clear();
    detail::pb::bytes_field(entry, 1, h.name);
    detail::pb::bytes_field(entry, 2, value);
    detail::pb::bytes_field(info, 1, entry);  // map<string, Value> hparams = 1
  }
  detail::pb::double_field(info, 5, start_time_s);
  std::string data;
  detail::pb::bytes_field(data, 3, info);
  return hparams_value("_hparams_/session_start_info", data);
}

LOOM_DECL summary& summary::hparams_end(bool success, double end_time_s) {
  std::string info, data;
  detail::pb::varint_field(info, 1, success ? 1 : 2);  // STATUS_SUCCESS, STATUS_FAILURE
  detail::pb::double_field(info, 2, end_time_s);
  detail::pb::bytes_field(data, 4, info);
  return hparams_value("_hparams_/session_end_info", data);
}

LOOM_DECL summary& summary::plugin_value(std::string_view tag, std::string_view plugin, std::string_view content) {
  std::string plugin_data, metadata;
  detail::pb::bytes_field(plugin_data, 1, plugin);
  if (!content.empty()) detail::pb::bytes_field(plugin_data, 2, content);
  detail::pb::bytes_field(metadata, 1, plugin_data);
  value_.clear();
  detail::pb::bytes_field(value_, 1, tag);
  detail::pb::bytes_field(value_, 8, tensor_);
  detail::pb::bytes_field(value_, 9, metadata);
  return add_value();
}

LOOM_DECL summary& summary::hparams_value(std::string_view tag, std::string_view plugin_data) {
  tensor_.clear();
  detail::pb::varint_field(tensor_, 1, dt_float);
  std::string dim, shape;
  detail::pb::bytes_field(shape, 2, dim);  // one dimension of size 0
  detail::pb::bytes_field(tensor_, 2, shape);
  return plugin_value(tag, "hparams", plugin_data);
}

LOOM_DECL std::string event(double wall_time, std::int64_t step, const summary& s, std::string_view file_version) {
  std::string e;
  detail::pb::double_field(e, 1, wall_time);
  if (step != 0) detail::pb::varint_field(e, 2, static_cast<std::uint64_t>(step));
  if (!file_version.empty()) detail::pb::bytes_field(e, 3, file_version);
  if (!s.empty()) detail::pb::bytes_field(e, 5, s.bytes());
  return e;
}

LOOM_DECL double wall_time_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

LOOM_DECL event_file::event_file(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw io_error("loom::tensorboard: cannot create directory " + dir + ": " + ec.message());
  char host[256] = "localhost";
  if (::gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "localhost");
  host[sizeof host - 1] = 0;
  char stem[64];
  std::snprintf(stem, sizeof stem, "/events.out.tfevents.%010lld.", static_cast<long long>(std::time(nullptr)));
  const std::string base = dir + stem + host;
  for (int k = 0; !file_; ++k) {
    path_ = k == 0 ? base : base + "." + std::to_string(k);
    file_ = std::fopen(path_.c_str(), "wbx");  // x: fails when the file exists
    if (!file_ && errno != EEXIST)
      throw io_error("loom::tensorboard: cannot create " + path_ + ": " + std::strerror(errno));
  }
  try {
    write(0, summary{}, wall_time_now(), "brain.Event:2");
    flush();
  } catch (...) {
    std::fclose(file_);
    throw;
  }
}

LOOM_DECL event_file::~event_file() {
  if (file_) std::fclose(file_);
}

LOOM_DECL void event_file::write(std::int64_t step, const summary& s, double wall_time, std::string_view file_version) {
  record_.clear();
  append_tfrecord(record_, event(wall_time, step, s, file_version));
  if (std::fwrite(record_.data(), 1, record_.size(), file_) != record_.size())
    throw io_error("loom::tensorboard: cannot write " + path_ + ": " + std::strerror(errno));
}

LOOM_DECL void event_file::flush() {
  if (std::fflush(file_) != 0) throw io_error("loom::tensorboard: cannot write " + path_ + ": " + std::strerror(errno));
}
}  // namespace monitor
}  // namespace loom
