// SPDX-License-Identifier: Apache-2.0
// Checkpoints given bad input: each damage is refused with a message naming the file, the
// tensor or field, what was expected and what was found; nothing is half-loaded (the trainer's
// parameters and step stay as they were); a damaged newest checkpoint is reported and the one
// before it resumed; a write that fails (the disk filling) fails loudly and leaves the previous
// checkpoint the newest and valid. And a fuzz: 1,000 random corruptions, each refused with a
// message or loaded correctly, none crashing.

#include <sys/resource.h>

#include <catch2/catch.hpp>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "loom/core/crc32c.hpp"
#include "loom/io/checkpoint.hpp"
#include "loom/comm/local.hpp"
#include "loom/loom.hpp"

using Catch::Matchers::Contains;

namespace {

namespace fs = std::filesystem;

using net = loom::network<loom::input<784>, loom::linear<32>, loom::relu, loom::linear<10>>;
using other_net = loom::network<loom::input<784>, loom::linear<16>, loom::relu, loom::linear<10>>;
using adam_trainer = loom::trainer<net, loom::softmax_cross_entropy, loom::adam>;
using dp = loom::data_parallel<loom::local_comm>;

const loom::data::fashion_mnist_set& data() {
  static const auto s = loom::data::fashion_mnist(loom::data::split::train).first(640);
  return s;
}

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("loom_checkpoint_bad_" + name);
  fs::remove_all(d);
  return d;
}

loom::fit_options options(std::size_t steps, const fs::path& dir) {
  loom::fit_options o;
  o.epochs = 5;
  o.max_steps = steps;
  o.batch = 32;
  o.progress = nullptr;
  o.checkpoint.directory = dir.string();
  o.checkpoint.on_signal = false;
  return o;
}

std::string bytes_of(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
void write(const fs::path& p, const std::string& b) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << b;
}
/// checkpoint.json rewritten by edit, with its own checksum made right again (as a real file of
/// another version or network would be).
void edit_manifest(const fs::path& step, const std::string& from, const std::string& to) {
  std::string t = bytes_of(step / "checkpoint.json");
  const auto at = t.find(from);
  REQUIRE(at != std::string::npos);
  t.replace(at, from.size(), to);
  const auto c = t.rfind("\"manifest_crc32c\"");
  const auto crc = loom::crc32c_hex(loom::crc32c(t.data(), c));
  t.replace(t.find('"', c + 18) + 1, 8, crc.data());
  write(step / "checkpoint.json", t);
}

/// A good checkpoint at step 6 of an Adam run (and its trainer's parameters).
struct good {
  fs::path dir, step;
  std::vector<float> params;
};
good make_good(const std::string& name) {
  good g;
  g.dir = fresh_dir(name);
  adam_trainer t{{.lr = 1e-3f}, {.seed = 5, .threads = 1}};
  t.fit(data(), options(6, g.dir));
  g.step = g.dir / "step-6";
  g.params = t.gather_parameters();
  REQUIRE(fs::is_directory(g.step));
  return g;
}

/// The message of loading `where` into a fresh trainer, which must throw loom::io_error and keep
/// its parameters and step as they were ("" when it loaded).
std::string load_error(const fs::path& where) {
  adam_trainer t{{.lr = 1e-3f}, {.seed = 9, .threads = 1}};
  const auto before = t.gather_parameters();
  try {
    t.load(where);
  } catch (const loom::io_error& e) {
    const bool unchanged = t.gather_parameters() == before && t.steps() == 0;
    CHECK(unchanged);
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("checkpoint bad input: no committed checkpoint", "[checkpoint][bad_input]") {
  const fs::path d = fresh_dir("none");
  CHECK_THAT(load_error(d), Contains(d.string()) && Contains("does not exist"));
  fs::create_directories(d / ".step-4.partial");  // a write that never committed
  CHECK_THAT(load_error(d), Contains("holds no committed checkpoint"));
  fs::remove_all(d);
}

TEST_CASE("checkpoint bad input: every kind of damage is named", "[checkpoint][bad_input]") {
  const good g = make_good("kinds");
  const fs::path model = g.step / "model-00001-of-00001.safetensors";
  const fs::path opt = g.step / "optimizer-00001-of-00001.safetensors";
  const std::string model_bytes = bytes_of(model), manifest = bytes_of(g.step / "checkpoint.json");
  auto restore = [&] {
    write(model, model_bytes);
    write(g.step / "checkpoint.json", manifest);
  };
  REQUIRE(load_error(g.step).empty());

  SECTION("a truncated file") {
    write(model, model_bytes.substr(0, model_bytes.size() / 2));
    CHECK_THAT(load_error(g.step), Contains(model.string()) && Contains("bytes; checkpoint.json says " +
                                                                        std::to_string(model_bytes.size())));
  }
  SECTION("a flipped byte inside a tensor") {
    std::string b = model_bytes;
    b[b.size() - 100] ^= 0x10;  // inside the data of 2.weight (2.bias is the last 40 bytes)
    write(model, b);
    CHECK_THAT(load_error(g.step), Contains(model.string()) && Contains("tensor 2.weight has CRC-32C") &&
                                       Contains("the data is damaged"));
  }
  SECTION("garbage JSON in a header") {
    std::string b = model_bytes;
    b.replace(8, 9, "{garbage!");
    write(model, b);
    CHECK_THAT(load_error(g.step), Contains(model.string()) && Contains("not valid JSON"));
  }
  SECTION("a header length past the end of the file") {
    std::string b = model_bytes;
    const std::uint64_t n = b.size();  // 8 + n > size
    std::memcpy(b.data(), &n, 8);
    write(model, b);
    CHECK_THAT(load_error(g.step), Contains(model.string()) && Contains("runs past the end of the file"));
  }
  SECTION("a wrong dtype") {
    std::string b = model_bytes;
    const auto at = b.find("\"F32\"");
    REQUIRE(at != std::string::npos);
    b.replace(at, 5, "\"I32\"");
    write(model, b);
    CHECK_THAT(load_error(g.step), Contains(model.string()) && Contains("is I32, expected F32"));
  }
  SECTION("checkpoint.json damaged") {
    std::string t = manifest;
    t[t.find("\"step\"") + 8] ^= 0x01;  // "step": 6 -> 7
    write(g.step / "checkpoint.json", t);
    CHECK_THAT(load_error(g.step), Contains("checkpoint.json has CRC-32C") && Contains("the file is damaged"));
  }
  SECTION("garbage in checkpoint.json") {
    write(g.step / "checkpoint.json", "{\"format\": \"loom-checkpoint\", ");
    CHECK_THAT(load_error(g.step), Contains("checkpoint.json has no manifest_crc32c field"));
  }
  SECTION("another format version") {
    edit_manifest(g.step, "\"format_version\": 1", "\"format_version\": 7");
    CHECK_THAT(load_error(g.step), Contains("checkpoint format version 7; this loom reads version 1"));
  }
  SECTION("a checkpoint of another network") {
    const fs::path d = fresh_dir("other_net");
    loom::trainer<other_net, loom::softmax_cross_entropy, loom::adam> t{{.lr = 1e-3f}, {.seed = 5, .threads = 1}};
    t.fit(data(), options(2, d));
    CHECK_THAT(load_error(d), Contains("is a checkpoint of network<input<784>,linear<16>,relu,linear<10>>, not of "
                                       "this trainer's network<input<784>,linear<32>,relu,linear<10>>"));
    fs::remove_all(d);
  }
  SECTION("a checkpoint of another optimizer") {
    const fs::path d = fresh_dir("other_opt");
    loom::trainer<net, loom::softmax_cross_entropy, loom::sgd> t{{.lr = 0.01f, .momentum = 0.9f}, {.seed = 5, .threads = 1}};
    t.fit(data(), options(2, d));
    CHECK_THAT(load_error(d), Contains("was saved with optimizer sgd, not this trainer's adam"));
    fs::remove_all(d);
  }
  SECTION("a missing optimizer file") {
    fs::remove(opt);
    CHECK_THAT(load_error(g.step), Contains(opt.string()) && Contains("is missing"));
  }
  restore();
  fs::remove_all(g.dir);
}

TEST_CASE("checkpoint bad input: a missing file of a sharded set", "[checkpoint][bad_input]") {
  const fs::path d = fresh_dir("sharded");
  loom::local_world(2).run([&](loom::local_comm& c) {
    loom::trainer<net, loom::softmax_cross_entropy, loom::adam, dp> t{c, {.lr = 1e-3f}, {.seed = 5, .threads = 1}};
    t.fit(data(), options(3, d));
  });
  const fs::path second = d / "step-3" / "model-00002-of-00002.safetensors";
  REQUIRE(fs::exists(second));
  fs::remove(second);
  std::string msg;
  loom::local_world(2).run([&](loom::local_comm& c) {
    loom::trainer<net, loom::softmax_cross_entropy, loom::adam, dp> t{c, {.lr = 1e-3f}, {.seed = 9, .threads = 1}};
    try {
      t.load(d);
    } catch (const loom::io_error& e) {
      if (c.rank() == 0) msg = e.what();
    }
  });
  CHECK_THAT(msg, Contains(second.string()) && Contains("is missing (checkpoint.json lists it)"));
  fs::remove_all(d);
}

TEST_CASE("checkpoint bad input: a damaged newest checkpoint is reported and the one before resumed", "[checkpoint][bad_input]") {
  const fs::path d = fresh_dir("fallback");
  {
    adam_trainer t{{.lr = 1e-3f}, {.seed = 5, .threads = 1}};
    auto o = options(8, d);
    o.checkpoint.every_steps = 4;
    t.fit(data(), o);
  }
  REQUIRE(fs::is_directory(d / "step-8"));
  fs::resize_file(d / "step-8" / "optimizer-00001-of-00001.safetensors", 100);
  adam_trainer t{{.lr = 1e-3f}, {.seed = 5, .threads = 1}};
  auto o = options(8, d);
  o.checkpoint.resume = true;
  // The refusal is a warning: it goes to fit_options::warnings, not the progress stream (which --quiet silences).
  std::ostringstream log, warnings;
  o.progress = &log;
  o.warnings = &warnings;
  o.progress_style = loom::progress_mode::lines;
  const auto r = t.fit(data(), o);
  CHECK(r.resumed_from_step == 4);
  CHECK_THAT(warnings.str(), Contains("step-8 cannot be used") && Contains("optimizer-00001-of-00001.safetensors is 100 bytes") &&
                                 Contains("trying the one before it") && Contains("resumed from"));
  CHECK_THAT(log.str(), !Contains("cannot be used"));
  fs::remove_all(d);
}

TEST_CASE("checkpoint bad input: the disk filling during a write", "[checkpoint][bad_input]") {
  const fs::path d = fresh_dir("full");
  adam_trainer t{{.lr = 1e-3f}, {.seed = 5, .threads = 1}};
  auto o = options(4, d);
  t.fit(data(), o);  // step-4, committed
  REQUIRE(fs::is_directory(d / "step-4"));
  // Files over 64 KiB now fail with EFBIG (and no SIGXFSZ): the next checkpoint cannot be written.
  struct sigaction ignore {}, old {};
  ignore.sa_handler = SIG_IGN;
  ::sigaction(SIGXFSZ, &ignore, &old);
  rlimit before{};
  ::getrlimit(RLIMIT_FSIZE, &before);
  rlimit small = before;
  small.rlim_cur = 64 * 1024;
  ::setrlimit(RLIMIT_FSIZE, &small);
  std::string msg;
  try {
    t.fit(data(), options(8, d));
  } catch (const loom::io_error& e) {
    msg = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &before);
  ::sigaction(SIGXFSZ, &old, nullptr);
  CHECK_THAT(msg, Contains("step-8 failed, and the previous checkpoint stays the newest") && Contains("size limit"));
  const auto all = loom::io::list_checkpoints(d);
  REQUIRE(all.size() == 1);
  CHECK(all[0].step == 4);
  for (const auto& e : fs::directory_iterator(d)) CHECK(e.path().filename() == "step-4");  // no partial left
  adam_trainer u{{.lr = 1e-3f}, {.seed = 5, .threads = 1}};
  CHECK(u.load(d) == d / "step-4");
  CHECK(u.steps() == 4);
  fs::remove_all(d);
}

TEST_CASE("checkpoint bad input: 1,000 random corruptions are refused or load correctly", "[checkpoint][bad_input][fuzz]") {
  const good g = make_good("fuzz");
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(g.step)) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  std::vector<std::string> originals;
  for (const auto& f : files) originals.push_back(bytes_of(f));
  std::mt19937_64 rng(2026);
  int refused = 0, loaded = 0;
  for (int trial = 0; trial < 1000; ++trial) {
    const std::size_t which = rng() % files.size();
    std::string b = originals[which];
    switch (rng() % 5) {
      case 0:  // flip a few bits anywhere
        for (int k = 0; k < 1 + static_cast<int>(rng() % 3); ++k) b[rng() % b.size()] ^= static_cast<char>(1u << (rng() % 8));
        break;
      case 1:  // truncate
        b.resize(rng() % b.size());
        break;
      case 2:  // a flip within the first 600 bytes: headers, JSON, lengths
        b[rng() % std::min<std::size_t>(600, b.size())] ^= static_cast<char>(1u << (rng() % 8));
        break;
      case 3: {  // random bytes over a span
        const std::size_t at = rng() % b.size(), n = std::min<std::size_t>(1 + rng() % 64, b.size() - at);
        for (std::size_t i = 0; i < n; ++i) b[at + i] = static_cast<char>(rng());
        break;
      }
      default:  // junk appended
        b += std::string(1 + rng() % 32, static_cast<char>(rng()));
    }
    write(files[which], b);
    adam_trainer t{{.lr = 1e-3f}, {.seed = 9, .threads = 1}};
    const auto before = t.gather_parameters();
    try {
      t.load(g.step);
      ++loaded;
      const bool correct = t.gather_parameters() == g.params && t.steps() == 6;
      REQUIRE(correct);
    } catch (const loom::error& e) {
      ++refused;
      REQUIRE(std::string(e.what()).find(g.step.string()) != std::string::npos);  // names where
      const bool unchanged = t.gather_parameters() == before && t.steps() == 0;
      REQUIRE(unchanged);
    }
    write(files[which], originals[which]);
  }
  CHECK(refused + loaded == 1000);
  CHECK(refused > 900);  // almost every corruption touches checked bytes
  fs::remove_all(g.dir);
}
