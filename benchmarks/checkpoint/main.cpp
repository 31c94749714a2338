// SPDX-License-Identifier: Apache-2.0
// What checkpoints cost, in three parts (--part save,overhead,reshard; all by default):
//  save     trainer::save (synchronous: every file fsynced, committed) and trainer::load of the
//           example's mlp, its cnn and a synthetic network of 100.7 M parameters (six 4096 x 4096
//           linear layers), SGD with momentum (so the checkpoint holds the weights and the
//           momentum buffers), in paired rounds against the disk's own rate on the same bytes:
//           one write() of that many bytes into a file and an fsync (and, for load, a pread of
//           that file); loads both from the page cache (right after the save) and cold (the
//           files dropped from the page cache with posix_fadvise(DONTNEED) first).
//  overhead the asynchronous checkpoint's cost on training: the mlp at --batch (64) on the real
//           Fashion-MNIST through trainer::fit, a checkpoint every 20, 100 and 500 steps, with
//           async (and at 100 and 500 steps synchronous), against no checkpoints; one trainer for all; every round runs one
//           fit of each configuration (the order rotating from round to round) of --steps
//           steps, and a configuration's figure is the median over rounds of its ratio to the
//           same round's no-checkpoint fit (samples per second, fit's own figure, which
//           includes the wait for the last write at fit's end).
//  reshard  trainer::load of a checkpoint saved under data_parallel on 2 ranks into 1 process
//           and of one saved by 1 process into data_parallel on 2 ranks (ranks as threads of a
//           loom::local_world), beside the same-world loads, for the mlp and the 100 M network;
//           checks the loaded parameters bitwise.
// Output: a `cpu:` line, then machine-readable `save:`, `load:`, `overhead:`, `reshard:` lines
// (run.sh makes the tables) and `round:` lines per overhead round.

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "../../examples/common/networks.hpp"
#include "../common/bench.hpp"
#include "loom/comm/local.hpp"
#include "loom/loom.hpp"

namespace {

namespace fs = std::filesystem;

/// 4096 wide, six layers: 6 x (4096 x 4096 + 4096) + 4096 x 10 + 10 = 100,728,842 parameters.
using big = loom::network<loom::input<4096>, loom::linear<4096>, loom::relu, loom::linear<4096>, loom::relu,
                          loom::linear<4096>, loom::relu, loom::linear<4096>, loom::relu, loom::linear<4096>,
                          loom::relu, loom::linear<4096>, loom::relu, loom::linear<10>>;

struct options {
  std::vector<std::string> parts{"save", "overhead", "reshard"};
  std::vector<std::string> models{"mlp", "cnn", "big"};
  std::size_t repeats = 5;       // save / load repetitions per model
  std::size_t big_repeats = 3;   // the same for the 100 M network
  std::size_t rounds = 7;        // overhead rounds
  std::size_t steps = 4000;      // steps per overhead fit (a multiple of 500)
  std::size_t batch = 64;
  fs::path dir;
};

[[noreturn]] void usage() {
  std::fprintf(stderr,
               "usage: bench_checkpoint [--part save,overhead,reshard] [--model mlp,cnn,big] [--repeats N]\n"
               "                        [--big-repeats N] [--rounds N] [--steps N] [--batch N] [--dir DIR]\n"
               "  --dir DIR  where checkpoints are written (default: $TMPDIR or /tmp); emptied afterwards\n");
  std::exit(2);
}

template <class N>
N number(std::string_view flag, std::string_view text) {
  N v{};
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc{} || p != text.data() + text.size()) {
    std::fprintf(stderr, "bench_checkpoint: --%s needs a number, got '%s'\n", std::string(flag).c_str(),
                 std::string(text).c_str());
    usage();
  }
  return v;
}

std::vector<std::string> list(std::string_view text) {
  std::vector<std::string> out;
  for (std::size_t at = 0; at <= text.size();) {
    std::size_t end = text.find(',', at);
    if (end == std::string_view::npos) end = text.size();
    if (end > at) out.emplace_back(text.substr(at, end - at));
    at = end + 1;
  }
  return out;
}

options parse(int argc, char** argv) {
  options o;
  o.dir = fs::temp_directory_path() / ("loom_bench_checkpoint_" + std::to_string(::getpid()));
  for (int i = 1; i < argc; i += 2) {
    const std::string_view a = argv[i];
    if (a.substr(0, 2) != "--" || i + 1 >= argc) usage();
    const std::string_view name = a.substr(2), value = argv[i + 1];
    if (name == "part") o.parts = list(value);
    else if (name == "model") o.models = list(value);
    else if (name == "repeats") o.repeats = number<std::size_t>(name, value);
    else if (name == "big-repeats") o.big_repeats = number<std::size_t>(name, value);
    else if (name == "rounds") o.rounds = number<std::size_t>(name, value);
    else if (name == "steps") o.steps = number<std::size_t>(name, value);
    else if (name == "batch") o.batch = number<std::size_t>(name, value);
    else if (name == "dir") o.dir = fs::path(value) / ("loom_bench_checkpoint_" + std::to_string(::getpid()));
    else usage();
  }
  for (const auto& p : o.parts)
    if (p != "save" && p != "overhead" && p != "reshard") usage();
  for (const auto& m : o.models)
    if (m != "mlp" && m != "cnn" && m != "big") usage();
  if (o.repeats == 0 || o.big_repeats == 0 || o.rounds == 0 || o.steps == 0 || o.batch == 0) usage();
  return o;
}

bool has(const std::vector<std::string>& v, std::string_view s) { return std::find(v.begin(), v.end(), s) != v.end(); }

template <class Net>
using solo_trainer = loom::trainer<Net, loom::softmax_cross_entropy, loom::sgd>;
template <class Net>
using dp_trainer = loom::trainer<Net, loom::softmax_cross_entropy, loom::sgd, loom::data_parallel<loom::local_comm>>;
constexpr loom::sgd::options sgd_options{.lr = 0.02f, .momentum = 0.9f};

/// The bytes of every file in a checkpoint directory.
std::uint64_t dir_bytes(const fs::path& d) {
  std::uint64_t n = 0;
  for (const auto& e : fs::directory_iterator(d))
    if (e.is_regular_file()) n += e.file_size();
  return n;
}

/// Drops a file's pages from the page cache (they are clean once fsynced), so that the next read
/// comes from the disk.
void drop_cached(const fs::path& p) {
  const int fd = ::open(p.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}
void drop_cached_dir(const fs::path& d) {
  for (const auto& e : fs::directory_iterator(d))
    if (e.is_regular_file()) drop_cached(e.path());
}

void die(const std::string& what) {
  std::fprintf(stderr, "bench_checkpoint: %s\n", what.c_str());
  std::exit(1);
}

/// The disk's own rate: `bytes` bytes of `data` in one write() (in 1 GiB calls, as loom's
/// atomic_file) into a new file, then fsync and close; seconds.
double raw_write(const fs::path& p, const std::vector<char>& data) {
  const auto t0 = bench::clock_type::now();
  const int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) die("cannot create " + p.string() + ": " + std::strerror(errno));
  const char* at = data.data();
  std::size_t left = data.size();
  while (left > 0) {
    const ssize_t w = ::write(fd, at, std::min<std::size_t>(left, std::size_t{1} << 30));
    if (w <= 0) die("cannot write " + p.string() + ": " + std::strerror(errno));
    at += w, left -= static_cast<std::size_t>(w);
  }
  if (::fsync(fd) != 0) die("cannot fsync " + p.string());
  ::close(fd);
  return bench::since(t0);
}

/// A pread of the whole file into `into` (sized to it); seconds.
double raw_read(const fs::path& p, std::vector<char>& into) {
  const auto t0 = bench::clock_type::now();
  const int fd = ::open(p.c_str(), O_RDONLY);
  if (fd < 0) die("cannot open " + p.string());
  std::size_t at = 0;
  while (at < into.size()) {
    const ssize_t r = ::pread(fd, into.data() + at, std::min<std::size_t>(into.size() - at, std::size_t{1} << 30),
                              static_cast<off_t>(at));
    if (r <= 0) die("cannot read " + p.string());
    at += static_cast<std::size_t>(r);
  }
  ::close(fd);
  return bench::since(t0);
}

double rate(double bytes, double s) { return s > 0 ? bytes / s : 0; }

// ---------------------------------------------------------------------------------------------
// Part 1: save and load, against the disk's own rate on the same bytes.

template <class Net>
void save_load(const char* name, std::size_t repeats, const fs::path& root) {
  const fs::path dir = root / (std::string("save_") + name);
  fs::create_directories(dir);
  const auto c0 = bench::cpu_snapshot::now();
  const auto t_make = bench::clock_type::now();
  solo_trainer<Net> t{sgd_options, {.seed = 1, .threads = 1}};
  const double make_s = bench::since(t_make);
  const std::vector<float> before = t.gather_parameters();
  std::vector<double> save_s, raw_w_s, load_warm_s, load_cold_s, raw_r_warm_s, raw_r_cold_s;
  std::uint64_t bytes = 0;
  std::vector<char> data, back;
  for (std::size_t i = 0; i < repeats; ++i) {
    const fs::path run = dir / ("run-" + std::to_string(i));
    const fs::path raw = dir / ("raw-" + std::to_string(i) + ".bin");
    // Each side: its save, then its load from the page cache (just written); the raw side
    // goes first in odd rounds (the size is known from the first save, so round 0 starts with
    // loom's). Then the cold loads (files dropped from the page cache), in the same order.
    fs::path step;
    auto loom_side = [&] {
      auto t0 = bench::clock_type::now();
      step = t.save(run);
      save_s.push_back(bench::since(t0));
      if (data.empty()) {
        bytes = dir_bytes(step);
        data.resize(bytes);
        std::uint64_t x = 88172645463325252ull;  // xorshift64: cheap bytes that do not compress
        for (std::size_t k = 0; k + 8 <= data.size(); k += 8) {
          x ^= x << 13, x ^= x >> 7, x ^= x << 17;
          std::memcpy(data.data() + k, &x, 8);
        }
        back.resize(bytes);
      }
      t0 = bench::clock_type::now();
      t.load(step);
      load_warm_s.push_back(bench::since(t0));
    };
    auto raw_side = [&] {
      raw_w_s.push_back(raw_write(raw, data));
      raw_r_warm_s.push_back(raw_read(raw, back));
    };
    auto loom_cold = [&] {
      drop_cached_dir(step);
      const auto t0 = bench::clock_type::now();
      t.load(step);
      load_cold_s.push_back(bench::since(t0));
    };
    auto raw_cold = [&] {
      drop_cached(raw);
      raw_r_cold_s.push_back(raw_read(raw, back));
    };
    if (i % 2 == 0) loom_side(), raw_side(), loom_cold(), raw_cold();
    else raw_side(), loom_side(), raw_cold(), loom_cold();
    fs::remove_all(run);
    fs::remove(raw);
  }
  if (t.gather_parameters() != before) die(std::string(name) + ": the loaded parameters differ from the saved ones");
  const auto c1 = bench::cpu_snapshot::now();
  std::vector<double> w_ratio, r_warm_ratio, r_cold_ratio;
  for (std::size_t i = 0; i < repeats; ++i) {
    w_ratio.push_back(raw_w_s[i] / save_s[i]);  // loom's bytes/s over the raw write's
    r_warm_ratio.push_back(raw_r_warm_s[i] / load_warm_s[i]);
    r_cold_ratio.push_back(raw_r_cold_s[i] / load_cold_s[i]);
  }
  const double b = static_cast<double>(bytes);
  std::printf("save: model=%s parameters=%zu bytes=%llu repeats=%zu make_s=%.3f save_s=%.4f save_mb_s=%.0f raw_write_s=%.4f "
              "raw_write_mb_s=%.0f ratio=%.3f min_save_s=%.4f max_save_s=%.4f others_cores=%.2f\n",
              name, Net::parameter_count, static_cast<unsigned long long>(bytes), repeats, make_s, bench::median(save_s),
              rate(b, bench::median(save_s)) / 1e6, bench::median(raw_w_s), rate(b, bench::median(raw_w_s)) / 1e6,
              bench::median(w_ratio), *std::min_element(save_s.begin(), save_s.end()),
              *std::max_element(save_s.begin(), save_s.end()), bench::cpu_snapshot::others_cores(c0, c1));
  std::printf("load: model=%s bytes=%llu repeats=%zu warm_s=%.4f warm_mb_s=%.0f raw_warm_s=%.4f raw_warm_mb_s=%.0f "
              "warm_ratio=%.3f cold_s=%.4f cold_mb_s=%.0f raw_cold_s=%.4f raw_cold_mb_s=%.0f cold_ratio=%.3f verified=bitwise\n",
              name, static_cast<unsigned long long>(bytes), repeats, bench::median(load_warm_s),
              rate(b, bench::median(load_warm_s)) / 1e6, bench::median(raw_r_warm_s), rate(b, bench::median(raw_r_warm_s)) / 1e6,
              bench::median(r_warm_ratio), bench::median(load_cold_s), rate(b, bench::median(load_cold_s)) / 1e6,
              bench::median(raw_r_cold_s), rate(b, bench::median(raw_r_cold_s)) / 1e6, bench::median(r_cold_ratio));
  std::fflush(stdout);
  fs::remove_all(dir);
}

/// What the pieces of the write and read paths cost in memory alone, on `bytes` bytes: a memcpy
/// (the copy to host, the assembly of the tensors a rank writes) and a CRC-32C pass.
void components(std::size_t bytes) {
  std::vector<char> a(bytes, 1), b(bytes, 0);
  std::vector<double> copy_s, crc_s;
  std::uint32_t crc = 0;
  for (int i = 0; i < 5; ++i) {
    auto t0 = bench::clock_type::now();
    std::memcpy(b.data(), a.data(), bytes);
    copy_s.push_back(bench::since(t0));
    t0 = bench::clock_type::now();
    crc ^= loom::crc32c(b.data(), bytes);
    crc_s.push_back(bench::since(t0));
  }
  std::printf("components: bytes=%zu memcpy_s=%.4f memcpy_mb_s=%.0f crc32c_s=%.4f crc32c_mb_s=%.0f (crc %08x)\n", bytes,
              bench::median(copy_s), rate(double(bytes), bench::median(copy_s)) / 1e6, bench::median(crc_s),
              rate(double(bytes), bench::median(crc_s)) / 1e6, crc);
}

// ---------------------------------------------------------------------------------------------
// Part 2: the asynchronous checkpoint's cost on training throughput.

struct config {
  std::string name;
  std::size_t every = 0;  // 0: no checkpoints
  bool async = true;
};

void overhead(const options& o) {
  const auto train = loom::data::fashion_mnist(loom::data::split::train);
  // (Not sync20: a synchronous checkpoint every 20 steps costs the mlp about 5x its training.)
  const std::vector<config> configs{{"off", 0, true},       {"async20", 20, true},   {"async100", 100, true},
                                    {"async500", 500, true}, {"sync100", 100, false}, {"sync500", 500, false}};
  solo_trainer<example::mlp> t{sgd_options, {.seed = 1, .threads = 1}};
  const fs::path root = o.dir / "overhead";
  struct run {
    double samples_per_s = 0, cpu_s = 0;
  };
  auto fit = [&](const config& c, std::size_t steps) {
    loom::fit_options fo;
    fo.batch = o.batch;
    fo.epochs = 100000;
    fo.max_steps = t.steps() + steps;
    fo.progress = nullptr;
    if (c.every) {
      fo.checkpoint.directory = (root / c.name).string();
      fo.checkpoint.every_steps = c.every;
      fo.checkpoint.async = c.async;
      fo.checkpoint.at_end = false;  // only the periodic ones
    }
    const auto c0 = bench::cpu_snapshot::now();
    const auto r = t.fit(train, fo);
    const auto c1 = bench::cpu_snapshot::now();
    return run{r.samples_per_s(), c1.own_s - c0.own_s};
  };
  // Warm-up: a checkpointed fit of each kind, then to step 250 (mod 500), so that every fit of
  // --steps (a multiple of 500 by default) ends between checkpoints of each interval rather than
  // on one (fit waits for the last write at its end).
  fit(configs[2], 100);
  fit(configs[4], 100);
  fit(configs[0], 250 - t.steps() % 500 + (t.steps() % 500 > 250 ? 500 : 0));
  std::vector<std::vector<double>> ratio(configs.size()), rate_of(configs.size()), cpu_ratio(configs.size());
  const auto c0 = bench::cpu_snapshot::now();
  for (std::size_t i = 0; i < o.rounds; ++i) {
    // Rotate the order, and reverse it every other round.
    std::vector<std::size_t> order(configs.size());
    for (std::size_t k = 0; k < order.size(); ++k) order[k] = (k + i) % order.size();
    if (i % 2) std::reverse(order.begin(), order.end());
    std::vector<run> got(configs.size());
    for (std::size_t k : order) got[k] = fit(configs[k], o.steps);
    std::printf("round: i=%zu", i + 1);
    for (std::size_t k = 0; k < configs.size(); ++k) {
      rate_of[k].push_back(got[k].samples_per_s);
      ratio[k].push_back(got[k].samples_per_s / got[0].samples_per_s);
      cpu_ratio[k].push_back(got[0].cpu_s / got[k].cpu_s);
      std::printf(" %s=%.0f", configs[k].name.c_str(), got[k].samples_per_s);
    }
    std::printf("\n");
    std::fflush(stdout);
  }
  const auto c1 = bench::cpu_snapshot::now();
  const double others = bench::cpu_snapshot::others_cores(c0, c1);
  for (std::size_t k = 1; k < configs.size(); ++k) {
    const double r = bench::median(ratio[k]);
    const double off_step_s = static_cast<double>(o.batch) / bench::median(rate_of[0]);
    const double on_step_s = static_cast<double>(o.batch) / bench::median(rate_of[k]);
    // Per checkpoint: the extra time a fit took, over its checkpoints.
    const double per_ckpt_ms = 1e3 * (on_step_s - off_step_s) * static_cast<double>(configs[k].every);
    std::printf("overhead: model=mlp batch=%zu config=%s every=%zu async=%s rounds=%zu steps=%zu off_samples_per_s=%.0f "
                "on_samples_per_s=%.0f median_ratio=%.4f min_ratio=%.4f max_ratio=%.4f median_cpu_ratio=%.4f "
                "per_checkpoint_ms=%.2f others_cores=%.2f%s\n",
                o.batch, configs[k].name.c_str(), configs[k].every, configs[k].async ? "yes" : "no", o.rounds, o.steps,
                bench::median(rate_of[0]), bench::median(rate_of[k]), r,
                *std::min_element(ratio[k].begin(), ratio[k].end()), *std::max_element(ratio[k].begin(), ratio[k].end()),
                bench::median(cpu_ratio[k]), per_ckpt_ms, others,
                configs[k].name == "async100" ? (r >= 0.99 ? " target=0.99 verdict=meets" : " target=0.99 verdict=misses") : "");
  }
  std::fflush(stdout);
  fs::remove_all(root);
}

// ---------------------------------------------------------------------------------------------
// Part 3: load + reshard between 1 process and data_parallel on 2 ranks.

template <class Net>
void reshard(const char* name, std::size_t repeats, const fs::path& root) {
  const fs::path dir = root / (std::string("reshard_") + name);
  fs::create_directories(dir);
  solo_trainer<Net> solo{sgd_options, {.seed = 1, .threads = 1}};
  const std::vector<float> want = solo.gather_parameters();  // seed 1: the same on both sides
  bool bitwise = true;
  std::vector<double> save1, save2, l11, l21, l12, l22;
  std::mutex m;
  const auto c0 = bench::cpu_snapshot::now();
  // One 2-rank world (threads) for all repetitions; its rank 0 also runs the one-process side
  // between barriers. Two-rank times: from a barrier to the barrier after the call.
  loom::local_world(2).run([&](loom::local_comm& c) {
    dp_trainer<Net> t{c, sgd_options, {.seed = 1, .threads = 1}};
    const bool zero = c.rank() == 0;
    auto on_both = [&](auto&& f, std::vector<double>& into) {
      c.barrier();
      const auto t0 = bench::clock_type::now();
      f();
      c.barrier();
      if (zero) into.push_back(bench::since(t0));
    };
    auto check = [&](auto& tr) {
      const bool same = tr.gather_parameters() == want;
      std::lock_guard<std::mutex> lock(m);
      if (!same && tr.rank() == 0) bitwise = false;
    };
    for (std::size_t i = 0; i < repeats; ++i) {
      const fs::path d1 = dir / ("one-" + std::to_string(i)), d2 = dir / ("two-" + std::to_string(i));
      fs::path s1;
      if (zero) {
        const auto t0 = bench::clock_type::now();
        s1 = solo.save(d1);
        save1.push_back(bench::since(t0));
      }
      c.barrier();
      s1 = d1 / ("step-" + std::to_string(solo.steps()));
      const fs::path s2 = d2 / s1.filename();
      on_both([&] { t.save(d2); }, save2);
      // Same world, then resharded; each from the page cache (just written).
      if (zero) {
        auto t0 = bench::clock_type::now();
        solo.load(s1);
        l11.push_back(bench::since(t0));
        t0 = bench::clock_type::now();
        solo.load(s2);
        l21.push_back(bench::since(t0));
        check(solo);
      }
      on_both([&] { t.load(s2); }, l22);
      check(t);
      on_both([&] { t.load(s1); }, l12);
      check(t);
      c.barrier();
      if (zero) fs::remove_all(d1), fs::remove_all(d2);
    }
  });
  const auto c1 = bench::cpu_snapshot::now();
  std::printf("reshard: model=%s parameters=%zu repeats=%zu save_1_s=%.4f save_2_s=%.4f load_1_to_1_s=%.4f "
              "load_2_to_1_s=%.4f load_2_to_2_s=%.4f load_1_to_2_s=%.4f verified=%s others_cores=%.2f\n",
              name, Net::parameter_count, repeats, bench::median(save1), bench::median(save2), bench::median(l11),
              bench::median(l21), bench::median(l22), bench::median(l12), bitwise ? "bitwise" : "DIFFERENT",
              bench::cpu_snapshot::others_cores(c0, c1));
  std::fflush(stdout);
  fs::remove_all(dir);
  if (!bitwise) die(std::string(name) + ": a resharded load gave other parameters than were saved");
}

}  // namespace

int main(int argc, char** argv) {
  const options o = parse(argc, argv);
  bench::print_cpu_line();
  std::printf("dir: %s\n", o.dir.c_str());
  std::fflush(stdout);
  fs::create_directories(o.dir);
  if (has(o.parts, "save")) {
    if (has(o.models, "mlp")) save_load<example::mlp>("mlp", o.repeats, o.dir);
    if (has(o.models, "cnn")) save_load<example::cnn>("cnn", o.repeats, o.dir);
    if (has(o.models, "big")) {
      save_load<big>("big", o.big_repeats, o.dir);
      components(big::parameter_count * 8);
    }
  }
  if (has(o.parts, "overhead")) overhead(o);
  if (has(o.parts, "reshard")) {
    if (has(o.models, "mlp")) reshard<example::mlp>("mlp", o.repeats, o.dir);
    if (has(o.models, "big")) reshard<big>("big", o.big_repeats, o.dir);
  }
  fs::remove_all(o.dir);
  return 0;
}
