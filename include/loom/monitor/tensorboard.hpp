// SPDX-License-Identifier: Apache-2.0
#pragma once
// TensorBoard event files, written by loom itself: the TFRecord framing, the few fields of the
// Event, Summary, SummaryMetadata and TensorProto protos that TensorBoard reads for scalars,
// text and the hparams plugin's session start and end, and one rank's event file. No protobuf
// dependency: fields are encoded by hand, in field-number order, so the records are byte for
// byte what TensorBoard's own writer makes of the same values (tests/monitor checks it). Not
// here: what is written when (monitor::metrics_writer in metrics.hpp).

#include <unistd.h>

#include <bit>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>
#include <variant>
#include <vector>

#include "loom/core/crc32c.hpp"
#include "loom/core/config.hpp"
#include "loom/core/error.hpp"

namespace loom {

/// One hyperparameter of a run: a number or a string, as TensorBoard's hparams dashboard
/// shows it (e.g. {"lr", 0.02}, {"optimizer", std::string("sgd")}).
struct hparam {
  std::string name;
  std::variant<double, std::string> value;
};

namespace monitor {

/// TFRecord's checksum of n bytes: CRC-32C, rotated right by 15 bits, plus 0xa282ead8 (so that
/// a CRC over data holding CRCs stays informative).
inline std::uint32_t masked_crc32c(const void* data, std::size_t n) noexcept {
  const std::uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

namespace detail::pb {
// Protocol buffer wire format: a key (field number << 3 | wire type), then the value.
enum wire : unsigned { varint_wire = 0, fixed64_wire = 1, length_wire = 2, fixed32_wire = 5 };

inline void varint(std::string& o, std::uint64_t v) {
  for (; v >= 0x80; v >>= 7) o += static_cast<char>(v | 0x80);
  o += static_cast<char>(v);
}
inline void key(std::string& o, unsigned field, wire w) { varint(o, field << 3 | w); }
inline void little_endian(std::string& o, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) o += static_cast<char>(v >> (8 * i));
}
inline void varint_field(std::string& o, unsigned field, std::uint64_t v) {
  key(o, field, varint_wire);
  varint(o, v);
}
inline void double_field(std::string& o, unsigned field, double v) {
  key(o, field, fixed64_wire);
  little_endian(o, std::bit_cast<std::uint64_t>(v), 8);
}
inline void float_field(std::string& o, unsigned field, float v) {
  key(o, field, fixed32_wire);
  little_endian(o, std::bit_cast<std::uint32_t>(v), 4);
}
/// A string, bytes or an embedded message (its serialized bytes).
inline void bytes_field(std::string& o, unsigned field, std::string_view s) {
  key(o, field, length_wire);
  varint(o, s.size());
  o += s;
}
}  // namespace detail::pb

/// Appends one TFRecord to out: the record's length (u64 little-endian), the masked CRC-32C of
/// those 8 bytes, the record, the masked CRC-32C of the record (each CRC u32 little-endian).
LOOM_DECL void append_tfrecord(std::string& out, std::string_view record);

/// The values of one tensorflow.Summary proto (its repeated field 1, Summary.Value), built up
/// value by value and reused from write to write.
class summary {
 public:
  /// A scalar (Summary.Value.simple_value: TensorBoard keeps it as a float).
  summary& scalar(std::string_view tag, double v);

  /// Text for TensorBoard's text dashboard, which renders it as Markdown: a scalar DT_STRING
  /// tensor with the "text" plugin's metadata.
  summary& text(std::string_view tag, std::string_view markdown);

  /// The hparams plugin's session start (HParamsPluginData.session_start_info): the run's
  /// hyperparameters and when it started (seconds since the Unix epoch).
  summary& hparams_start(const std::vector<hparam>& hparams, double start_time_s);

  /// The hparams plugin's session end (HParamsPluginData.session_end_info): status and time.
  summary& hparams_end(bool success, double end_time_s);

  /// The serialized Summary.
  const std::string& bytes() const noexcept { return values_; }
  bool empty() const noexcept { return values_.empty(); }
  void clear() noexcept { values_.clear(); }

 private:
  static constexpr int dt_string = 7, dt_float = 1;  // tensorflow.DataType

  summary& add_value() {
    detail::pb::bytes_field(values_, 1, value_);
    return *this;
  }

  // A Value with tag (1), tensor_ (8) and metadata (9) naming the plugin and its content.
  summary& plugin_value(std::string_view tag, std::string_view plugin, std::string_view content);

  // The hparams plugin's summaries carry their data in the metadata, with the plugin's "null
  // tensor" (an empty float vector) as the value.
  summary& hparams_value(std::string_view tag, std::string_view plugin_data);

  std::string values_, value_, tensor_;
};

/// A serialized tensorflow.Event: wall_time (1), step (2; left out when 0, as protobuf does),
/// file_version (3; only the file's first event carries it) and summary (5).
LOOM_DECL std::string event(double wall_time, std::int64_t step, const summary& s, std::string_view file_version = {});

/// Seconds since the Unix epoch, as Event.wall_time counts them.
LOOM_DECL double wall_time_now();

/// One TensorBoard event file, `events.out.tfevents.<unix time>.<hostname>` in a directory
/// (`.1`, `.2`, ... after it when a file of that name exists: a second fit in the same second).
/// TensorBoard shows each directory under its --logdir as a run.
class event_file {
 public:
  /// Creates `dir` (and its parents), then the file, and writes the file's first event
  /// (file_version "brain.Event:2"). Throws loom::io_error naming the directory or the file
  /// when either cannot be created.
  explicit event_file(const std::string& dir);
  ~event_file();
  event_file(const event_file&) = delete;
  event_file& operator=(const event_file&) = delete;

  /// Appends one event holding s. Throws loom::io_error naming the file when it cannot be written.
  void write(std::int64_t step, const summary& s, double wall_time = wall_time_now(), std::string_view file_version = {});

  /// Hands what was written to the operating system, so that a TensorBoard reading the file
  /// while training runs sees it.
  void flush();

  const std::string& path() const noexcept { return path_; }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
  std::string record_;
};

}  // namespace monitor
}  // namespace loom

#if defined(LOOM_DEFINITIONS_VISIBLE)
#include "loom/monitor/impl/tensorboard.ipp"
#endif
