// SPDX-License-Identifier: Apache-2.0
// The shard loader on real ranks (mpirun -np 1, 2, 3): every sample of an epoch exactly once
// over the ranks, with its label, on uneven shards; each rank's share of every global batch
// exactly the part of the one-rank batch at its offset (so the batches do not depend on the
// world size); the bytes each rank reads (/proc/self/io rchar, and the loader's count) those of
// its own streams' shards; and a lost rank's streams taken over mid-epoch by the survivors
// (reshard), nothing read twice or lost. Prints "all checks passed" on rank 0.

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "loom/comm/mpi.hpp"
#include "loom/data/shard_loader.hpp"
#include "mpi_check.hpp"
#include "shard_files.hpp"

namespace {

using loom_test::check;
using pipeline = loom_test::gray_png<8, 8>;
using set_type = loom::data::image_shards<pipeline, 10>;
using loader_type = set_type::loader_type;
namespace fs = std::filesystem;

const std::vector<std::uint64_t> counts{13, 5, 21, 8, 1, 17, 9, 30, 40, 12, 3, 25};  // 184 samples
constexpr std::size_t total = 184, batch = 16, streams = 6;
constexpr std::uint64_t seed = 11;

std::uint64_t total_bytes_of(const std::vector<loom::data::shard_info>& shards) {
  std::uint64_t t = 0;
  for (const auto& s : shards) t += s.bytes;
  return t;
}

/// This process's bytes read through read(2)/pread(2) so far (/proc/self/io "rchar").
std::uint64_t rchar() {
  std::ifstream in("/proc/self/io");
  std::string key;
  std::uint64_t v = 0;
  while (in >> key >> v)
    if (key == "rchar:") return v;
  return 0;
}

struct sample {
  std::int64_t index;
  std::int32_t label;
};

/// The next `steps` batches of `l` (all of the epoch's rest by default).
std::vector<std::vector<sample>> take(loader_type& l, std::size_t steps = 1000) {
  std::vector<std::vector<sample>> out;
  std::vector<float> x(batch * 64);
  std::vector<std::int32_t> labels(batch);
  for (std::size_t k = 0; k < steps; ++k) {
    const auto s = l.next(x.data(), labels.data());
    if (!s) break;
    out.emplace_back();
    for (std::size_t i = 0; i < s.local; ++i) out.back().push_back({loom_test::decoded_index(x.data() + i * 64), labels[i]});
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  loom::mpi::environment env{argc, argv};
  auto comm = loom::mpi_comm::world();
  const int rank = comm.rank(), world = comm.size();
  // Rank 0 writes the shards in a directory every rank sees (one host).
  char dir_name[256] = {};
  if (rank == 0) {
    std::snprintf(dir_name, sizeof dir_name, "%s/loom-mpi-shards-%d", fs::temp_directory_path().c_str(),
                  static_cast<int>(::getpid()));
    fs::create_directories(dir_name);
    loom_test::write_index_shards(dir_name, "train", counts);
  }
  comm.broadcast(dir_name, sizeof dir_name, 0);
  const fs::path dir = dir_name;
  try {
    loom::data::shard_options o;
    o.streams = streams;
    o.shuffle_window = 9;
    o.decode_threads = 1;
    o.use_cache = false;
    const set_type set(dir.string(), "train", o);
    const auto& shards = set.manifest().shards;

    for (std::size_t epoch : {0, 1}) {
      // This rank's part of the epoch, and the bytes it reads for it.
      const std::uint64_t before = rchar();
      std::vector<std::vector<sample>> mine;
      std::uint64_t loader_bytes = 0;
      {
        loader_type l(set, batch, seed, rank, world);
        l.start_epoch(epoch);
        mine = take(l);
        loader_bytes = l.bytes_read();
      }
      const std::uint64_t read = rchar() - before;
      // The bytes of this rank's streams' shards in this epoch's dealing.
      const auto layout = loom::data::detail::deal_shards(std::vector<std::uint64_t>(counts), streams, seed, epoch, true);
      std::uint64_t own = 0;
      for (std::size_t v = streams * rank / world; v < streams * (rank + 1) / world; ++v)
        for (std::uint32_t s : layout.shards[v]) own += shards[s].bytes;
      check(loader_bytes == own, "epoch " + std::to_string(epoch) + ": the loader read " + std::to_string(loader_bytes) +
                                     " bytes, its streams' shards hold " + std::to_string(own));
      check(read >= own && read <= own + 65536,
            "epoch " + std::to_string(epoch) + ": rchar grew by " + std::to_string(read) + ", expected about " +
                std::to_string(own));
      std::printf("rank %d of %d, epoch %zu: read %llu bytes (rchar %llu) of the %llu of all shards\n", rank, world,
                  epoch, static_cast<unsigned long long>(loader_bytes), static_cast<unsigned long long>(read),
                  static_cast<unsigned long long>(total_bytes_of(shards)));

      // Every sample once over the ranks, with its label.
      std::vector<int> seen(total, 0);
      for (const auto& b : mine)
        for (const sample& s : b) {
          check(s.index >= 0 && s.index < static_cast<std::int64_t>(total), "a sample decodes to a bad index");
          if (s.index < 0 || s.index >= static_cast<std::int64_t>(total)) continue;
          ++seen[static_cast<std::size_t>(s.index)];
          check(s.label == loom_test::test_label(static_cast<std::uint64_t>(s.index)),
                "sample " + std::to_string(s.index) + " has label " + std::to_string(s.label));
        }
      comm.allreduce(seen.data(), seen.size(), loom::reduce_op::sum);
      for (std::size_t i = 0; i < total; ++i)
        check(seen[i] == 1, "epoch " + std::to_string(epoch) + ": sample " + std::to_string(i) + " came " +
                                std::to_string(seen[i]) + " times over the ranks");

      // The same global batches as one rank reads: this rank's share is the one-rank batch's
      // samples [offset, offset + local).
      loader_type alone(set, batch, seed, 0, 1);
      alone.start_epoch(epoch);
      loader_type again(set, batch, seed, rank, world);
      again.start_epoch(epoch);
      std::vector<float> x(batch * 64), xa(batch * 64);
      std::vector<std::int32_t> l(batch), la(batch);
      for (std::size_t k = 0;; ++k) {
        const auto whole = alone.next(xa.data(), la.data());
        const auto share = again.next(x.data(), l.data());
        check(static_cast<bool>(whole) == static_cast<bool>(share), "the epochs end at different steps");
        if (!whole || !share) break;
        check(share.global == whole.global, "step " + std::to_string(k) + ": global sizes differ");
        for (std::size_t i = 0; i < share.local; ++i)
          check(std::memcmp(x.data() + i * 64, xa.data() + (share.offset + i) * 64, 64 * sizeof(float)) == 0 &&
                    l[i] == la[share.offset + i],
                "step " + std::to_string(k) + ": sample " + std::to_string(i) + " of rank " + std::to_string(rank) +
                    " is not the one-rank batch's sample " + std::to_string(share.offset + i));
      }
    }

    // A recovery mid-epoch: after 4 steps the last rank is lost; the others reshard over
    // world - 1 ranks and finish the epoch. Every sample still comes exactly once.
    if (world > 1) {
      std::vector<int> seen(total, 0);
      loader_type l(set, batch, seed, rank, world);
      l.start_epoch(2);
      auto count = [&](const std::vector<std::vector<sample>>& bs) {
        for (const auto& b : bs)
          for (const sample& s : b)
            if (s.index >= 0 && s.index < static_cast<std::int64_t>(total)) ++seen[static_cast<std::size_t>(s.index)];
      };
      count(take(l, 4));
      if (rank < world - 1) {
        l.reshard(rank, world - 1);
        count(take(l));
      }
      comm.allreduce(seen.data(), seen.size(), loom::reduce_op::sum);
      for (std::size_t i = 0; i < total; ++i)
        check(seen[i] == 1, "after the reshard: sample " + std::to_string(i) + " came " + std::to_string(seen[i]) +
                                " times over the ranks");
    }
  } catch (const std::exception& e) {
    check(false, std::string("exception: ") + e.what());
  }
  comm.barrier();
  if (rank == 0) {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  return loom_test::finish(comm);
}
