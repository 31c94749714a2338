// SPDX-License-Identifier: Apache-2.0
// TensorBoard event files (loom/monitor/tensorboard.hpp): the masked CRC-32C and records byte
// for byte against TensorBoard's own writer, the file's name and framing, what a fit writes
// (an event per metrics write, the end-of-run text and hparams; only rank 0 when asked) and a
// directory that cannot be made. TensorBoard itself reads a real run's files in
// tensorboard_check.py.

#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "../../examples/common/networks.hpp"
#include "loom/comm/local.hpp"
#include "loom/loom.hpp"
#include "monitor_common.hpp"

namespace {

namespace fs = std::filesystem;
using loom::monitor::summary;
using loom_test::small_set;
using loom_test::temp_dir;
using loom_test::text_of;

// Made by TensorBoard 2.21's RecordWriter from protos it serialized itself (python protobuf):
// Event(wall_time=1700000000.25, file_version="brain.Event:2");
// Event(wall_time=1700000001.5, step=42) with simple_value train/loss 0.75 and train/lr 0;
// Event(wall_time=1700000002, step=7) with text_pb("run/figures", "| a |\n| - |");
// Event(wall_time=1700000000.5) with the hparams plugin's SessionStartInfo
// (hparams {"optimizer": "sgd"}, start_time_secs=1700000000), metadata and NULL_TENSOR.
  const unsigned char first_event[] = {
      0x18, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xa3, 0x7f, 0x4b, 0x22, 0x09, 0x00, 0x00, 0x10,
      0x40, 0xfc, 0x54, 0xd9, 0x41, 0x1a, 0x0d, 0x62, 0x72, 0x61, 0x69, 0x6e, 0x2e, 0x45, 0x76, 0x65,
      0x6e, 0x74, 0x3a, 0x32, 0x33, 0x8d, 0x2f, 0xe9,
  };
  const unsigned char scalar_event[] = {
      0x31, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x9d, 0x83, 0x83, 0xe9, 0x09, 0x00, 0x00, 0x60,
      0x40, 0xfc, 0x54, 0xd9, 0x41, 0x10, 0x2a, 0x2a, 0x24, 0x0a, 0x11, 0x0a, 0x0a, 0x74, 0x72, 0x61,
      0x69, 0x6e, 0x2f, 0x6c, 0x6f, 0x73, 0x73, 0x15, 0x00, 0x00, 0x40, 0x3f, 0x0a, 0x0f, 0x0a, 0x08,
      0x74, 0x72, 0x61, 0x69, 0x6e, 0x2f, 0x6c, 0x72, 0x15, 0x00, 0x00, 0x00, 0x00, 0x7c, 0x7f, 0x99,
      0x55,
  };
  const unsigned char text_event[] = {
      0x39, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x8b, 0x07, 0x37, 0xf1, 0x09, 0x00, 0x00, 0x80,
      0x40, 0xfc, 0x54, 0xd9, 0x41, 0x10, 0x07, 0x2a, 0x2c, 0x0a, 0x2a, 0x0a, 0x0b, 0x72, 0x75, 0x6e,
      0x2f, 0x66, 0x69, 0x67, 0x75, 0x72, 0x65, 0x73, 0x42, 0x11, 0x08, 0x07, 0x12, 0x00, 0x42, 0x0b,
      0x7c, 0x20, 0x61, 0x20, 0x7c, 0x0a, 0x7c, 0x20, 0x2d, 0x20, 0x7c, 0x4a, 0x08, 0x0a, 0x06, 0x0a,
      0x04, 0x74, 0x65, 0x78, 0x74, 0xfe, 0xa2, 0xbb, 0x55,
  };
  const unsigned char hparams_event[] = {
      0x61, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x8f, 0x90, 0x64, 0x09, 0x00, 0x00, 0x20,
      0x40, 0xfc, 0x54, 0xd9, 0x41, 0x2a, 0x56, 0x0a, 0x54, 0x0a, 0x1c, 0x5f, 0x68, 0x70, 0x61, 0x72,
      0x61, 0x6d, 0x73, 0x5f, 0x2f, 0x73, 0x65, 0x73, 0x73, 0x69, 0x6f, 0x6e, 0x5f, 0x73, 0x74, 0x61,
      0x72, 0x74, 0x5f, 0x69, 0x6e, 0x66, 0x6f, 0x42, 0x06, 0x08, 0x01, 0x12, 0x02, 0x12, 0x00, 0x4a,
      0x2c, 0x0a, 0x2a, 0x0a, 0x07, 0x68, 0x70, 0x61, 0x72, 0x61, 0x6d, 0x73, 0x12, 0x1f, 0x1a, 0x1d,
      0x0a, 0x12, 0x0a, 0x09, 0x6f, 0x70, 0x74, 0x69, 0x6d, 0x69, 0x7a, 0x65, 0x72, 0x12, 0x05, 0x1a,
      0x03, 0x73, 0x67, 0x64, 0x29, 0x00, 0x00, 0x00, 0x40, 0xfc, 0x54, 0xd9, 0x41, 0x14, 0x47, 0x9d,
      0x47,
  };

std::string bytes_of(const unsigned char* p, std::size_t n) { return {reinterpret_cast<const char*>(p), n}; }

std::string framed(const std::string& record) {
  std::string out;
  loom::monitor::append_tfrecord(out, record);
  return out;
}

std::uint64_t little_endian(const std::string& s, std::size_t at, int bytes) {
  std::uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= std::uint64_t(static_cast<unsigned char>(s[at + i])) << (8 * i);
  return v;
}

/// The records of a TFRecord file, each checked against both of its CRCs.
std::vector<std::string> records_of(const std::string& file) {
  std::vector<std::string> out;
  std::size_t at = 0;
  while (at < file.size()) {
    REQUIRE(at + 12 <= file.size());
    const std::uint64_t n = little_endian(file, at, 8);
    REQUIRE(little_endian(file, at + 8, 4) == loom::monitor::masked_crc32c(file.data() + at, 8));
    REQUIRE(at + 16 + n <= file.size());
    out.push_back(file.substr(at + 12, n));
    REQUIRE(little_endian(file, at + 12 + n, 4) == loom::monitor::masked_crc32c(out.back().data(), n));
    at += 16 + n;
  }
  return out;
}

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

/// The event files in dir.
std::vector<fs::path> event_files(const fs::path& dir) {
  std::vector<fs::path> out;
  if (fs::exists(dir))
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().filename().string().starts_with("events.out.tfevents.")) out.push_back(e.path());
  return out;
}

}  // namespace

TEST_CASE("The masked CRC-32C is TensorBoard's", "[monitor][tensorboard]") {
  using loom::monitor::masked_crc32c;
  // TensorBoard's pywrap_tensorflow.masked_crc32c of the same bytes.
  CHECK(masked_crc32c("", 0) == 0xa282ead8u);
  CHECK(masked_crc32c("a", 1) == 0x28e46e78u);
  CHECK(masked_crc32c("123456789", 9) == 0xc78ab0e5u);  // CRC-32C 0xe3069283
  const char zeros[8] = {};
  CHECK(masked_crc32c(zeros, 8) == 0x07980329u);
}

TEST_CASE("Events are framed byte for byte as TensorBoard's writer frames them", "[monitor][tensorboard]") {
  using loom::monitor::event;
  CHECK(framed(event(1700000000.25, 0, summary{}, "brain.Event:2")) == bytes_of(first_event, sizeof first_event));
  summary s;
  s.scalar("train/loss", 0.75).scalar("train/lr", 0.0);
  CHECK(framed(event(1700000001.5, 42, s)) == bytes_of(scalar_event, sizeof scalar_event));
  s.clear();
  CHECK(s.empty());
  s.text("run/figures", "| a |\n| - |");
  CHECK(framed(event(1700000002.0, 7, s)) == bytes_of(text_event, sizeof text_event));
  s.clear();
  s.hparams_start({{"optimizer", std::string("sgd")}}, 1700000000.0);
  CHECK(framed(event(1700000000.5, 0, s)) == bytes_of(hparams_event, sizeof hparams_event));
}

TEST_CASE("An event file is named for its time and host and begins with the file version", "[monitor][tensorboard]") {
  temp_dir d;
  const fs::path dir = d.path / "a" / "b";  // made with its parents
  std::string first, second;
  {
    loom::monitor::event_file f(dir.string());
    loom::monitor::event_file g(dir.string());  // in the same second, most likely: a suffix then
    first = f.path();
    second = g.path();
    summary s;
    f.write(3, s.scalar("x", 1.5));
    f.flush();
    // Flushed: what a live TensorBoard would read now.
    CHECK(records_of(text_of(first)).size() == 2);
  }
  CHECK(first != second);
  char host[256] = {};
  REQUIRE(::gethostname(host, sizeof host - 1) == 0);
  const std::string name = fs::path(first).filename().string();
  CHECK(fs::path(first).parent_path() == dir);
  CHECK(name.starts_with("events.out.tfevents."));
  CHECK(name.find(std::string(".") + host) != std::string::npos);
  const long long t = std::stoll(name.substr(std::strlen("events.out.tfevents.")));
  CHECK(std::abs(t - static_cast<long long>(std::time(nullptr))) < 60);
  const auto records = records_of(text_of(first));
  REQUIRE(records.size() == 2);
  CHECK(records[0].find("brain.Event:2") != std::string::npos);
  CHECK(records[1].find("brain.Event:2") == std::string::npos);
  CHECK(records_of(text_of(second)).size() == 1);
}

TEST_CASE("fit writes an event of scalars per metrics write, then the figures and hparams", "[monitor][tensorboard]") {
  temp_dir d;
  loom::trainer<example::mlp, loom::softmax_cross_entropy, loom::sgd> t{{.lr = 0.02f}, {.seed = 1, .threads = 1}};
  loom::fit_options o = loom_test::one_epoch();
  o.metrics.every_s = 0;
  o.metrics.tensorboard_dir = d.path.string();
  o.metrics.hparams = {{"batch", 64.0}, {"optimizer", std::string("sgd")}};
  const auto r = t.fit(small_set(), o);
  REQUIRE(r.steps == 10);
  const auto files = event_files(d.path / "rank0");
  REQUIRE(files.size() == 1);
  const std::string text = text_of(files[0]);
  const auto records = records_of(text);
  // The file version, the hparams session's start, a write per step and the final state, the end.
  REQUIRE(records.size() == 1 + 1 + 11 + 1);
  CHECK(count(text, "train/loss") == 11);
  CHECK(count(text, "figures/comm_exposed_s") == 11);
  CHECK(count(text, "process/rss_bytes") == 11);
  CHECK(count(text, "_hparams_/session_start_info") == 1);
  CHECK(count(text, "_hparams_/session_end_info") == 1);
  const std::string& end = records.back();
  CHECK(end.find("run/figures") != std::string::npos);
  CHECK(end.find("| rank | compute_s | comm_s |") != std::string::npos);
  CHECK(end.find("| hparam | value |") != std::string::npos);
  CHECK(end.find("| optimizer | sgd |") != std::string::npos);
  CHECK(end.find("| ranks | 1 |") != std::string::npos);  // added by the writer
}

TEST_CASE("Each rank writes its own TensorBoard run, or only rank 0 when asked", "[monitor][tensorboard]") {
  for (const bool rank0_only : {false, true}) {
    temp_dir d;
    loom::local_world(2).run([&](loom::local_comm& c) {
      loom::trainer<example::mlp, loom::softmax_cross_entropy, loom::sgd, loom::data_parallel<loom::local_comm>> t{
          c, {.lr = 0.02f}, {.seed = 1, .threads = 1}};
      loom::fit_options o = loom_test::one_epoch();
      o.max_steps = 3;
      o.metrics.every_s = 0;
      o.metrics.tensorboard_dir = d.path.string();
      o.metrics.tensorboard_rank0_only = rank0_only;
      t.fit(small_set(), o);
    });
    INFO("rank0_only " << rank0_only);
    REQUIRE(event_files(d.path / "rank0").size() == 1);
    CHECK(records_of(text_of(event_files(d.path / "rank0")[0])).size() == 1 + 1 + 4 + 1);
    CHECK(event_files(d.path / "rank1").size() == (rank0_only ? 0u : 1u));
    CHECK(fs::exists(d.path / "rank1") == !rank0_only);
  }
}

TEST_CASE("A TensorBoard directory that cannot be made stops fit with its path", "[monitor][tensorboard]") {
  temp_dir d;
  std::ofstream(d.path / "file") << "not a directory";
  loom::trainer<example::mlp, loom::softmax_cross_entropy, loom::sgd> t{{.lr = 0.02f}, {.seed = 1, .threads = 1}};
  loom::fit_options o = loom_test::one_epoch();
  o.max_steps = 1;
  o.metrics.tensorboard_dir = (d.path / "file" / "tb").string();
  CHECK_THROWS_AS(t.fit(small_set(), o), loom::io_error);
  CHECK_THROWS_WITH(t.fit(small_set(), o), Catch::Contains((d.path / "file" / "tb").string()));
}
