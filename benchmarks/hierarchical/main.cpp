// SPDX-License-Identifier: Apache-2.0
// loom::hierarchical_comm's allreduce against a flat MPI_Allreduce (float, sum, in place), per
// message size, under mpirun (benchmarks/hierarchical/run.sh runs it on 2 hosts x 2 ranks of
// the multi-host harness, links limited with tc tbf). Variants, interleaved batch by batch in
// one process (the order reversed every other batch):
//   raw       MPI_Allreduce(MPI_IN_PLACE, ...) on MPI_COMM_WORLD
//   slice     hierarchical_comm::allreduce, slice variant (reduce-scatter in the host, each
//             local rank allreduces its slice across hosts, allgather in the host)
//   leader    hierarchical_comm::allreduce, leader variant (reduce to local rank 0, leaders
//             allreduce across hosts, broadcast in the host)
//   slice-i   hierarchical_comm::iallreduce + wait, slice variant (what data_parallel uses)
// and ZeRO's collectives (blocks of size/N elements; data_parallel<..., shard_optimizer_state>):
//   rs-flat   mpi_comm::reduce_scatter_v (MPI_Reduce_scatter on MPI_COMM_WORLD)
//   rs-flat-i mpi_comm::ireduce_scatter_v + wait (its direct exchange: what ZeRO's buckets use)
//   rs-slice  hierarchical_comm::reduce_scatter_v (inside the host, then across hosts)
//   rs-slice-i hierarchical_comm::ireduce_scatter_v + wait
//   ag-flat   mpi_comm::allgather_v (MPI_Allgatherv in place)
//   ag-flat-i mpi_comm::iallgather_v + wait
//   ag-slice  hierarchical_comm::allgather_v (across hosts, then inside the host)
//   ag-slice-i hierarchical_comm::iallgather_v + wait
// Hosts: by shared memory (MPI_COMM_TYPE_SHARED), or LOOM_HIER_HOST_SIZE ranks each.
// Prints per (variant, size):
//   row: impl=V bytes=B ranks=N hosts=H mode=M latency_us=T busbw_gbs=G runs_us=t1,t2,...
// (median over --repeats batches of a fixed number of calls; bus bandwidth = size / time * 2(n-1)/n
// for the allreduces, size / time * (n-1)/n for the reduce-scatters and allgathers).

#include <mpi.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "../common/bench.hpp"
#include "loom/comm/hierarchical.hpp"

namespace {

std::size_t bytes_value(std::string_view text) {
  std::size_t mult = 1;
  if (!text.empty() && (text.back() == 'K' || text.back() == 'k')) mult = 1 << 10, text.remove_suffix(1);
  else if (!text.empty() && (text.back() == 'M' || text.back() == 'm')) mult = 1 << 20, text.remove_suffix(1);
  std::size_t v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc{} || p != text.data() + text.size() || v == 0 || (v * mult) % 4) {
    std::fprintf(stderr, "bench_hierarchical: '%.*s' is not a positive size in bytes (multiple of 4; K, M)\n",
                 static_cast<int>(text.size()), text.data());
    std::exit(2);
  }
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

double max_over_ranks(double v) {
  double out = 0;
  MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  loom::mpi::environment env{argc, argv};
  std::vector<std::size_t> sizes;
  std::vector<std::string> variants{"raw", "slice", "leader", "slice-i"};
  const std::vector<std::string> zero_variants{"rs-flat", "rs-flat-i", "rs-slice", "rs-slice-i",
                                               "ag-flat", "ag-flat-i", "ag-slice", "ag-slice-i"};
  std::size_t repeats = 5;
  double seconds = 0.2;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string_view a = argv[i], v = argv[i + 1];
    if (a == "--sizes") for (const auto& s : split_list(v)) sizes.push_back(bytes_value(s));
    else if (a == "--variants") variants = split_list(v);
    else if (a == "--repeats") repeats = std::max<std::size_t>(1, std::strtoul(argv[i + 1], nullptr, 10));
    else if (a == "--seconds") seconds = std::strtod(argv[i + 1], nullptr);
    else {
      std::fprintf(stderr, "usage: mpirun -np N bench_hierarchical [--sizes 64K,1M,...] [--variants raw,slice,leader,slice-i,"
                           "rs-flat,rs-flat-i,rs-slice,rs-slice-i,ag-flat,ag-flat-i,ag-slice,ag-slice-i | all]"
                           " [--repeats 5] [--seconds 0.2]\n");
      return 2;
    }
  }
  if (variants.size() == 1 && variants[0] == "all") {
    variants = {"raw", "slice", "leader", "slice-i"};
    variants.insert(variants.end(), zero_variants.begin(), zero_variants.end());
  }
  if (sizes.empty())
    for (std::size_t b = std::size_t(64) << 10; b <= std::size_t(64) << 20; b *= 4) sizes.push_back(b);
  auto world = loom::mpi_comm::world();
  auto opts = loom::hierarchical_options::from_environment();
  opts.variant = loom::hierarchical_variant::slice;
  loom::hierarchical_comm slice(world, opts);
  opts.variant = loom::hierarchical_variant::leader;
  loom::hierarchical_comm leader(world, opts);
  const int rank = world.rank(), ranks = world.size();
  const double bus = ranks > 1 ? 2.0 * (ranks - 1) / ranks : 1.0;
  const std::size_t max_bytes = *std::max_element(sizes.begin(), sizes.end());
  std::vector<float> buf(max_bytes / sizeof(float), 0.0f), out(max_bytes / sizeof(float), 0.0f);
  // ZeRO's blocks: n / ranks each, the remainder on the first ones.
  std::vector<std::size_t> blocks(static_cast<std::size_t>(ranks));
  auto block_counts = [&](std::size_t n) {
    for (std::size_t j = 0; j < blocks.size(); ++j) blocks[j] = n / blocks.size() + (j < n % blocks.size() ? 1 : 0);
  };
  auto mine_at = [&] {
    std::size_t a = 0;
    for (int j = 0; j < rank; ++j) a += blocks[static_cast<std::size_t>(j)];
    return a;
  };

  auto run = [&](const std::string& v, float* p, std::size_t n) {
    if (v == "raw") MPI_Allreduce(MPI_IN_PLACE, p, static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    else if (v == "slice") slice.allreduce(p, n, loom::reduce_op::sum);
    else if (v == "leader") leader.allreduce(p, n, loom::reduce_op::sum);
    else if (v == "slice-i") slice.iallreduce(p, n, loom::reduce_op::sum).wait();
    else if (v == "rs-flat") world.reduce_scatter_v(p, out.data(), blocks.data(), loom::reduce_op::sum);
    else if (v == "rs-flat-i") world.ireduce_scatter_v(p, out.data(), blocks.data(), loom::reduce_op::sum).wait();
    else if (v == "rs-slice") slice.reduce_scatter_v(p, out.data(), blocks.data(), loom::reduce_op::sum);
    else if (v == "rs-slice-i") slice.ireduce_scatter_v(p, out.data(), blocks.data(), loom::reduce_op::sum).wait();
    else if (v == "ag-flat") world.allgather_v(p, blocks.data());
    else if (v == "ag-flat-i") world.iallgather_v(p, blocks.data()).wait();
    else if (v == "ag-slice") slice.allgather_v(p, blocks.data());
    else if (v == "ag-slice-i") slice.iallgather_v(p, blocks.data()).wait();
    else loom::mpi::abort(2, "bench_hierarchical: unknown variant " + v);
  };
  auto mode_of = [&](const std::string& v) {
    return v == "raw" || v.find("flat") != std::string::npos ? "flat"
           : v == "leader"                                    ? loom::to_string(leader.mode())
                                                              : loom::to_string(slice.mode());
  };

  for (const std::size_t bytes : sizes) {
    const std::size_t n = bytes / sizeof(float);
    block_counts(n);
    // Each variant once, checked: an allreduce's every element and a reduce-scatter's block
    // become the sum of (rank + 1); an allgather's block j becomes j + 1.
    const float want = float(ranks) * float(ranks + 1) / 2;
    for (const auto& v : variants) {
      std::fill(buf.begin(), buf.begin() + std::ptrdiff_t(n), float(rank + 1));
      if (v.starts_with("ag-")) std::fill(buf.begin(), buf.begin() + std::ptrdiff_t(n), -1.0f);
      if (v.starts_with("ag-"))
        std::fill_n(buf.begin() + std::ptrdiff_t(mine_at()), blocks[static_cast<std::size_t>(rank)], float(rank + 1));
      std::fill(out.begin(), out.end(), 0.0f);
      run(v, buf.data(), n);
      std::size_t bad = 0;
      if (v.starts_with("rs-")) {
        for (std::size_t i = 0; i < blocks[static_cast<std::size_t>(rank)]; ++i) bad += out[i] != want;
      } else if (v.starts_with("ag-")) {
        for (std::size_t j = 0, at = 0; j < blocks.size(); at += blocks[j], ++j)
          for (std::size_t i = 0; i < blocks[j]; ++i) bad += buf[at + i] != float(j + 1);
      } else {
        for (std::size_t i = 0; i < n; ++i) bad += buf[i] != want;
      }
      if (max_over_ranks(double(bad)) > 0) loom::mpi::abort(1, "bench_hierarchical: " + v + " gave wrong results");
    }
    // Calls per batch from the size alone (the same on every rank): ~--seconds at 50 us + 0.1 GB/s.
    const std::size_t calls = std::clamp<std::size_t>(std::size_t(seconds / (50e-6 + double(bytes) / 1e8)), 2, 10000);
    std::fill(buf.begin(), buf.begin() + std::ptrdiff_t(n), 0.0f);
    std::vector<std::vector<double>> runs(variants.size());
    for (std::size_t r = 0; r < repeats; ++r)
      for (std::size_t k = 0; k < variants.size(); ++k) {
        const std::size_t vi = r % 2 ? variants.size() - 1 - k : k;
        run(variants[vi], buf.data(), n);  // untimed: scratch memory in place
        MPI_Barrier(MPI_COMM_WORLD);
        const auto t0 = bench::clock_type::now();
        for (std::size_t i = 0; i < calls; ++i) run(variants[vi], buf.data(), n);
        runs[vi].push_back(max_over_ranks(bench::since(t0)) / double(calls));
      }
    if (rank == 0) {
      for (std::size_t vi = 0; vi < variants.size(); ++vi) {
        std::string list;
        for (double x : runs[vi]) list += (list.empty() ? "" : ",") + std::to_string(x * 1e6);
        const double t = bench::median(runs[vi]);
        const bool allreduce = !variants[vi].starts_with("rs-") && !variants[vi].starts_with("ag-");
        std::printf("row: impl=%s bytes=%zu ranks=%d hosts=%d mode=%s latency_us=%.1f busbw_gbs=%.4f runs_us=%s calls=%zu\n",
                    variants[vi].c_str(), bytes, ranks, slice.hosts(), mode_of(variants[vi]), t * 1e6,
                    double(bytes) / t / 1e9 * (allreduce ? bus : bus / 2), list.c_str(), calls);
      }
      std::fflush(stdout);
    }
  }
  return 0;
}
