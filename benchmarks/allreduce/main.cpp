// SPDX-License-Identifier: Apache-2.0
// loom's mpi_comm allreduce against raw MPI_Allreduce on the same buffers (float, sum, in place),
// for each message size, under mpirun. The variants given run in one process on one buffer,
// interleaved repeat by repeat (the order reversed every other repeat), the same calls each:
//   raw        MPI_Allreduce(MPI_IN_PLACE, ...) on MPI_COMM_WORLD
//   loom       loom::mpi_comm::allreduce (one MPI_Allreduce per call: what the library does now)
//   loom-i     loom::mpi_comm::iallreduce + wait (what data_parallel does for each bucket)
//   chunked    the prototype of "loom's path": allreduce in pieces of at most --chunk bytes, issued
//              back to back (mpi_comm::with_max_count: the library's own chunking loop);
//              chunked:SIZE for another piece size (several can run side by side)
//   chunked-i  iallreduce in pieces of --chunk bytes, all in flight together, then wait
//   bf16, fp16 what data_parallel<Comm, loom::compress<H>> does with its last bucket: the floats
//              converted into a 16-bit copy (loom::to_half), one blocking allreduce of the copy
//              (summed in float by loom's MPI_Op, rounded to 16 bits at every step), converted
//              back (loom::from_half). Its bandwidth is counted on the float size, so that it
//              compares with the others as time for the same gradients.
//   rs-raw-b   MPI_Reduce_scatter of the buffer in size() equal blocks (out of place), blocking
//   rs-raw     MPI_Ireduce_scatter + wait, the same (Open MPI: libnbc)
//   rs-loom    loom::mpi_comm::ireduce_scatter_v + wait, the same (what ZeRO does with a bucket;
//              a direct exchange over point-to-point messages). A reduce-scatter moves half
//              what an allreduce does: "/raw" near 0.5 is what it should reach.
// A `row:` line per (variant, size) on stdout: median latency over --repeats timed batches (each
// a number of calls fixed by the size, about --seconds at 5 GB/s), the bus bandwidth
// algbw * 2(n-1)/n, and the page faults per call (minor faults: fresh memory touched).
//
// Open MPI allocates its scratch buffers with malloc on every call, so a variant's speed depends
// on what the process allocated and freed before (glibc reuses a free heap block, its pages
// already mapped, instead of mapping fresh ones). So that variants in one process do not
// influence each other, every timed batch starts the same way: malloc_trim(0) (free memory back
// to the system), the buffer refilled, one untimed call of the variant, a barrier.
//
// --memcpy instead times a plain memcpy, the reduction kernel (dst += src) and a memcpy into
// freshly malloc'd memory of each size on every rank at once: with -np 1 the memory bandwidth of
// one process, with -np 2 that of two processes at once. benchmarks/allreduce/run.sh runs both
// and prints the tables.

#include <malloc.h>
#include <mpi.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <numeric>
#include <string>
#include <string_view>
#include <vector>

#include "../common/bench.hpp"
#include "loom/comm/mpi.hpp"
#include "loom/core/half.hpp"

namespace {

using bench::clock_type;
using bench::cpu_snapshot;
using bench::median;
using bench::since;

struct flags {
  std::vector<std::size_t> sizes{std::size_t(4) << 10,  std::size_t(16) << 10, std::size_t(64) << 10,
                                 std::size_t(256) << 10, std::size_t(1) << 20,  std::size_t(2) << 20,
                                 std::size_t(4) << 20,  std::size_t(8) << 20,  std::size_t(16) << 20,
                                 std::size_t(32) << 20, std::size_t(64) << 20};
  std::vector<std::string> variants{"raw", "loom", "loom-i", "chunked", "chunked-i"};
  std::size_t chunk = std::size_t(8) << 20;  // bytes per piece of the chunked variants
  double seconds = 0.1;                      // per timed batch
  std::size_t repeats = 7;
  bool memcpy_mode = false;
};

constexpr const char* usage = R"(usage: mpirun -np 2 bench_allreduce [flags]
  --sizes LIST      message sizes in bytes, comma-separated; K and M suffixes (default
                    4K,16K,64K,256K,1M,2M,4M,8M,16M,32M,64M)
  --variants LIST   raw,loom,loom-i,chunked,chunked-i,bf16,fp16 (default the first five); chunked:SIZE and
                    chunked-i:SIZE give a piece size of their own (e.g. chunked:4M,chunked:16M)
  --chunk BYTES     piece size of chunked and chunked-i without :SIZE (default 8M)
  --seconds X       length of one timed batch (default 0.1)
  --repeats N       timed batches per (variant, size); the median is reported (default 7)
  --memcpy          time memcpy / dst += src / memcpy into fresh memory instead (every rank at once)
Prints per (variant, size) on stdout:
  row: impl=V bytes=B ranks=N latency_us=T (median) busbw_gbs=G algbw_gbs=A runs_us=.. calls=K
       faults_per_call=F others_cores=O chunk=C
and with --memcpy per size:
  mem: bytes=B procs=N copy_gbs=.. sum_gbs=.. fresh_copy_gbs=.. fresh_faults=.. (median per rank, min over ranks)
)";

[[noreturn]] void bad_flag(const std::string& msg) {
  std::cerr << "bench_allreduce: " << msg << "\n\n" << usage;
  std::exit(2);
}

std::size_t bytes_value(std::string_view flag, std::string_view text) {
  std::size_t mult = 1;
  if (!text.empty() && (text.back() == 'K' || text.back() == 'k')) mult = 1 << 10, text.remove_suffix(1);
  else if (!text.empty() && (text.back() == 'M' || text.back() == 'm')) mult = 1 << 20, text.remove_suffix(1);
  std::size_t v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc{} || p != text.data() + text.size() || v == 0)
    bad_flag("--" + std::string(flag) + " needs a positive size, got '" + std::string(text) + "'");
  return v * mult;
}

std::vector<std::string> split_list(std::string_view text) {
  std::vector<std::string> out;
  while (!text.empty()) {
    const auto comma = text.find(',');
    if (comma != 0) out.emplace_back(text.substr(0, comma));
    text = comma == std::string_view::npos ? std::string_view{} : text.substr(comma + 1);
  }
  return out;
}

flags parse(int argc, char** argv) {
  flags f;
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a == "--help" || a == "-h") {
      std::cout << usage;
      std::exit(0);
    }
    if (a == "--memcpy") {
      f.memcpy_mode = true;
      continue;
    }
    if (a.substr(0, 2) != "--") bad_flag("unexpected argument '" + std::string(a) + "'");
    std::string_view name = a.substr(2), value;
    if (auto eq = name.find('='); eq != std::string_view::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    } else {
      if (i + 1 >= argc) bad_flag("--" + std::string(name) + " needs a value");
      value = argv[++i];
    }
    if (name == "sizes") {
      f.sizes.clear();
      for (const auto& s : split_list(value)) f.sizes.push_back(bytes_value(name, s));
      if (f.sizes.empty()) bad_flag("--sizes needs at least one size");
    } else if (name == "variants") {
      f.variants = split_list(value);
      for (const auto& v : f.variants) {
        const std::string base = v.substr(0, v.find(':'));
        if (base != "raw" && base != "loom" && base != "loom-i" && base != "chunked" && base != "chunked-i" &&
            base != "bf16" && base != "fp16" && base != "rs-raw-b" && base != "rs-raw" && base != "rs-loom")
          bad_flag("--variants takes raw, loom, loom-i, chunked[:SIZE], chunked-i[:SIZE], bf16, fp16, rs-raw-b, rs-raw, "
                   "rs-loom; got '" + v + "'");
        if (v.find(':') != std::string::npos && base.rfind("chunked", 0) != 0)
          bad_flag("only chunked and chunked-i take a :SIZE, got '" + v + "'");
        if (v.find(':') != std::string::npos && bytes_value("variants", v.substr(v.find(':') + 1)) % sizeof(float))
          bad_flag("piece sizes must be multiples of 4 bytes, got '" + v + "'");
      }
      if (f.variants.empty()) bad_flag("--variants needs at least one variant");
    } else if (name == "chunk") {
      f.chunk = bytes_value(name, value);
    } else if (name == "seconds") {
      f.seconds = std::strtod(std::string(value).c_str(), nullptr);
      if (!(f.seconds > 0)) bad_flag("--seconds must be > 0");
    } else if (name == "repeats") {
      f.repeats = bytes_value(name, value);
    } else {
      bad_flag("unknown flag --" + std::string(name));
    }
  }
  for (std::size_t s : f.sizes)
    if (s % sizeof(float)) bad_flag("sizes must be multiples of 4 bytes (floats)");
  if (f.chunk % sizeof(float)) bad_flag("--chunk must be a multiple of 4 bytes");
  return f;
}


// Reductions of one double over the ranks, for the bookkeeping (MPI_COMM_WORLD returns errors
// here, as loom::mpi::environment sets MPI_ERRORS_RETURN: a failure ends the job).
double over_ranks(double v, MPI_Op op) {
  double out = 0;
  if (MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, op, MPI_COMM_WORLD) != MPI_SUCCESS) {
    std::fprintf(stderr, "bench_allreduce: MPI_Allreduce of the figures failed\n");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  return out;
}
double max_over_ranks(double v) { return over_ranks(v, MPI_MAX); }
double min_over_ranks(double v) { return over_ranks(v, MPI_MIN); }
double sum_over_ranks(double v) { return over_ranks(v, MPI_SUM); }

// A variant: how it reduces, and the communicator it uses (for the chunked ones, the world with
// counts above the piece size split into pieces: mpi_comm's own chunking loop).
struct variant {
  std::string name;  // as given: raw, loom, loom-i, chunked[:SIZE], chunked-i[:SIZE], bf16, fp16
  std::string kind;  // name without :SIZE
  std::size_t chunk = 0;
  loom::mpi_comm comm;
  std::vector<loom::bf16> wire_bf16;  // bf16, fp16: the 16-bit copy, allocated once (as data_parallel's)
  std::vector<loom::fp16> wire_fp16;
  std::vector<float> shard;             // rs-*: this rank's reduced block
  std::vector<int> counts;              // rs-raw*: MPI's receive counts
  std::vector<std::size_t> loom_counts;  // rs-loom
};

template <class H>
void compressed_allreduce(loom::mpi_comm& comm, std::vector<H>& wire, float* buf, std::size_t n) {
  if (wire.size() < n) wire.resize(n);
  loom::to_half(buf, wire.data(), n);
  comm.allreduce(wire.data(), n, loom::reduce_op::sum);
  loom::from_half(wire.data(), buf, n);
}

// One in-place float-sum allreduce of buf[0, n) the way v does it.
void run_variant(variant& v, float* buf, std::size_t n) {
  if (v.kind == "raw") {
    // What an MPI program writes: one call, in place, on MPI_COMM_WORLD.
    if (MPI_Allreduce(MPI_IN_PLACE, buf, static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD) != MPI_SUCCESS) {
      std::fprintf(stderr, "bench_allreduce: MPI_Allreduce failed\n");
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  } else if (v.kind == "loom" || v.kind == "chunked") {
    v.comm.allreduce(buf, n, loom::reduce_op::sum);
  } else if (v.kind.rfind("rs-", 0) == 0) {
    // Blocks of n / ranks (the last one takes the rest), as ZeRO cuts a bucket.
    const int ranks = v.comm.size();
    if (v.counts.size() != std::size_t(ranks) || std::accumulate(v.counts.begin(), v.counts.end(), std::size_t(0)) != n) {
      v.counts.assign(std::size_t(ranks), int(n / std::size_t(ranks)));
      v.counts.back() = int(n - (std::size_t(ranks) - 1) * (n / std::size_t(ranks)));
      v.loom_counts.assign(v.counts.begin(), v.counts.end());
      v.shard.assign(std::size_t(*std::max_element(v.counts.begin(), v.counts.end())), 0.0f);
    }
    int rc = MPI_SUCCESS;
    if (v.kind == "rs-raw-b") {
      rc = MPI_Reduce_scatter(buf, v.shard.data(), v.counts.data(), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    } else if (v.kind == "rs-raw") {
      MPI_Request q;
      rc = MPI_Ireduce_scatter(buf, v.shard.data(), v.counts.data(), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &q);
      if (rc == MPI_SUCCESS) rc = MPI_Wait(&q, MPI_STATUS_IGNORE);
    } else {
      v.comm.ireduce_scatter_v(buf, v.shard.data(), v.loom_counts.data(), loom::reduce_op::sum).wait();
    }
    if (rc != MPI_SUCCESS) {
      std::fprintf(stderr, "bench_allreduce: %s failed\n", v.kind.c_str());
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    // The reduced block back into its place, so that the check below sees an allreduce's
    // result in this rank's block. The copy (n / ranks floats) is timed with each of the three
    // alike.
    const int me = v.comm.rank();
    std::size_t at = 0;
    for (int j = 0; j < me; ++j) at += std::size_t(v.counts[std::size_t(j)]);
    std::copy(v.shard.begin(), v.shard.begin() + v.counts[std::size_t(me)], buf + at);
  } else if (v.kind == "bf16") {
    compressed_allreduce(v.comm, v.wire_bf16, buf, n);
  } else if (v.kind == "fp16") {
    compressed_allreduce(v.comm, v.wire_fp16, buf, n);
  } else {  // loom-i, chunked-i: what data_parallel does with a bucket
    v.comm.iallreduce(buf, n, loom::reduce_op::sum).wait();
  }
}

int allreduce_mode(const flags& f) {
  loom::mpi_comm world = loom::mpi_comm::world();
  const int rank = world.rank(), ranks = world.size();
  std::vector<variant> variants;
  for (const auto& name : f.variants) {
    variant v{name, name.substr(0, name.find(':')), 0, world, {}, {}, {}, {}, {}};
    if (v.kind.rfind("chunked", 0) == 0) {
      v.chunk = name.find(':') == std::string::npos ? f.chunk : bytes_value("variants", name.substr(name.find(':') + 1));
      v.comm = world.with_max_count(v.chunk / sizeof(float));
    }
    variants.push_back(std::move(v));
  }
  const double bus_factor = ranks > 1 ? 2.0 * (ranks - 1) / ranks : 1.0;
  const std::size_t max_bytes = *std::max_element(f.sizes.begin(), f.sizes.end());
  // One buffer for every size and variant, touched once here (no first-touch faults later).
  std::vector<float> buf(max_bytes / sizeof(float), 0.0f);

  for (std::size_t bytes : f.sizes) {
    const std::size_t n = bytes / sizeof(float);
    // Check each variant once: every element must become the sum over ranks of (rank + 1).
    const float want = float(ranks) * float(ranks + 1) / 2;
    for (auto& v : variants) {
      std::fill(buf.begin(), buf.begin() + std::ptrdiff_t(n), float(rank + 1));
      run_variant(v, buf.data(), n);
      std::size_t bad = 0, lo = 0, hi = n;
      if (v.kind.rfind("rs-", 0) == 0) {  // only this rank's block holds the reduction
        lo = std::size_t(rank) * (n / std::size_t(ranks));
        hi = rank + 1 == ranks ? n : lo + n / std::size_t(ranks);
      }
      for (std::size_t i = lo; i < hi; ++i) bad += buf[i] != want;
      if (max_over_ranks(double(bad)) > 0) {
        std::fprintf(stderr, "bench_allreduce: %s at %zu bytes gave wrong sums on rank %d (%zu elements)\n", v.name.c_str(),
                     bytes, rank, bad);
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
    }
    // Warm-up: 3 calls of every variant. Then the number of calls per timed batch, from the size
    // alone (not from a timing, which would differ from process to process): about --seconds at
    // 5 us + 5 GB/s, so that every variant, in this process or another, makes the same calls.
    std::fill(buf.begin(), buf.begin() + std::ptrdiff_t(n), 0.0f);
    for (auto& v : variants)
      for (int i = 0; i < 3; ++i) run_variant(v, buf.data(), n);
    const double nominal_s = 5e-6 + double(bytes) / 5e9;
    const std::size_t calls = std::clamp<std::size_t>(std::size_t(f.seconds / nominal_s), 3, 100000);

    std::vector<std::vector<double>> runs(variants.size()), faults(variants.size());
    double others_busy = 0, others_wall = 0;
    for (std::size_t r = 0; r < f.repeats; ++r) {
      for (std::size_t k = 0; k < variants.size(); ++k) {
        const std::size_t vi = r % 2 ? variants.size() - 1 - k : k;  // reverse every other repeat
        variant& v = variants[vi];
        // The same preparation for every variant: the heap handed back to the system (what other
        // variants freed would otherwise serve this one's scratch allocations without page
        // faults), zeros written (the buffer warm in cache as far as it fits), one untimed call
        // (the variant's own scratch memory in place, as in a loop of only this variant), and a
        // barrier.
        ::malloc_trim(0);
        std::fill(buf.begin(), buf.begin() + std::ptrdiff_t(n), 0.0f);
        run_variant(v, buf.data(), n);
        MPI_Barrier(MPI_COMM_WORLD);
        const cpu_snapshot c0 = cpu_snapshot::now();
        const auto t0 = clock_type::now();
        for (std::size_t i = 0; i < calls; ++i) run_variant(v, buf.data(), n);
        const double s = since(t0);
        const cpu_snapshot c1 = cpu_snapshot::now();
        runs[vi].push_back(max_over_ranks(s) / double(calls));
        faults[vi].push_back(max_over_ranks((c1.minflt - c0.minflt) / double(calls)));
        // Cores the rest of the machine kept busy: all CPU time less every rank's own.
        const double own = sum_over_ranks(c1.own_s - c0.own_s);
        if (rank == 0) {
          others_busy += std::max(0.0, (c1.machine_busy_s - c0.machine_busy_s) - own);
          others_wall += std::chrono::duration<double>(c1.at - c0.at).count();
        }
      }
    }
    if (rank == 0) {
      for (std::size_t vi = 0; vi < variants.size(); ++vi) {
        const double t = median(runs[vi]);
        std::string list;
        for (double x : runs[vi]) {
          char one[32];
          std::snprintf(one, sizeof one, "%s%.1f", list.empty() ? "" : ",", x * 1e6);
          list += one;
        }
        const double algbw = double(bytes) / t / 1e9;
        std::printf("row: impl=%s bytes=%zu ranks=%d latency_us=%.2f busbw_gbs=%.3f algbw_gbs=%.3f runs_us=%s calls=%zu "
                    "faults_per_call=%.1f others_cores=%.2f chunk=%zu\n",
                    variants[vi].name.c_str(), bytes, ranks, t * 1e6, algbw * bus_factor, algbw, list.c_str(), calls,
                    median(faults[vi]), others_wall > 0 ? others_busy / others_wall : 0.0, variants[vi].chunk);
      }
      std::fflush(stdout);
    }
  }
  return 0;
}

// Memory bandwidth of one size on every rank at once: memcpy between two warm buffers, the
// allreduce's local reduction (dst += src), and memcpy into memory malloc'd (and freed) for each
// copy, as an allreduce that allocates its scratch buffer per call does.
int memcpy_mode(const flags& f) {
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  const std::size_t max_bytes = *std::max_element(f.sizes.begin(), f.sizes.end());
  std::vector<float> src(max_bytes / sizeof(float), 1.0f), dst(max_bytes / sizeof(float), 0.0f);
  volatile float sink = 0;
  for (std::size_t bytes : f.sizes) {
    const std::size_t n = bytes / sizeof(float);
    auto timed = [&](auto&& op) {
      for (int i = 0; i < 2; ++i) op();
      MPI_Barrier(MPI_COMM_WORLD);
      double per = 0;
      for (std::size_t probe = 1;; probe *= 2) {
        const auto p0 = clock_type::now();
        for (std::size_t i = 0; i < probe; ++i) op();
        const double s = max_over_ranks(since(p0));
        per = s / double(probe);
        if (s >= 0.02 || probe >= 1024) break;
      }
      const std::size_t calls = std::clamp<std::size_t>(std::size_t(f.seconds / std::max(per, 1e-7)), 3, 200000);
      std::vector<double> rates, flts;
      for (std::size_t r = 0; r < f.repeats; ++r) {
        MPI_Barrier(MPI_COMM_WORLD);
        const cpu_snapshot c0 = cpu_snapshot::now();
        const auto t0 = clock_type::now();
        for (std::size_t i = 0; i < calls; ++i) op();
        const double s = since(t0);
        rates.push_back(double(bytes) * double(calls) / s / 1e9);
        flts.push_back((cpu_snapshot::now().minflt - c0.minflt) / double(calls));
      }
      return std::pair{min_over_ranks(median(rates)), max_over_ranks(median(flts))};
    };
    const auto copy = timed([&] {
      std::memcpy(dst.data(), src.data(), bytes);
      sink = dst[n / 2];
    });
    const auto sum = timed([&] {
      float* __restrict d = dst.data();
      const float* __restrict s = src.data();
      for (std::size_t i = 0; i < n; ++i) d[i] += s[i];
      sink = d[n / 2];
    });
    const auto fresh = timed([&] {
      void* p = std::malloc(bytes);
      std::memcpy(p, src.data(), bytes);
      sink = static_cast<float*>(p)[n / 2];
      std::free(p);
    });
    if (rank == 0) {
      std::printf("mem: bytes=%zu procs=%d copy_gbs=%.2f sum_gbs=%.2f fresh_copy_gbs=%.2f fresh_faults=%.0f\n", bytes,
                  ranks, copy.first, sum.first, fresh.first, fresh.second);
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  loom::mpi::environment env{argc, argv};
  const flags f = parse(argc, argv);
  try {
    if (loom::mpi_comm::world().rank() == 0) bench::print_cpu_line();
    return f.memcpy_mode ? memcpy_mode(f) : allreduce_mode(f);
  } catch (const loom::error& e) {
    loom::mpi::abort(1, std::string("bench_allreduce: ") + e.what());
  }
}
