// SPDX-License-Identifier: Apache-2.0
#pragma once
// Image classification data in WebDataset tar shards, and the distributed loader over them:
// the shards are dealt into a fixed number of virtual streams, each read sequentially with a
// seeded window shuffle; a global batch takes samples from every stream in proportion to its
// size, so that its content depends on (seed, epoch, streams, window, batch) and not on the
// number of ranks; each rank reads only the shards of its own streams, ahead of the step, and
// decodes them in a pool of threads. Design and guarantees: docs/data.md. POSIX only.

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "loom/core/config.hpp"
#include "loom/core/error.hpp"
#include "loom/core/shape.hpp"
#include "loom/data/decode_pool.hpp"
#include "loom/data/distributed.hpp"
#include "loom/data/sample_key.hpp"
#include "loom/data/shard_schedule.hpp"
#include "loom/data/shards.hpp"
#include "loom/data/tar.hpp"

namespace loom::data {

/// How an image_shards set is read.
struct shard_options {
  /// V, the virtual streams the shards are dealt into: fixed for a job (a checkpoint records
  /// it), independent of the number of ranks, which may be at most V. 0: 16 (whatever the
  /// number of shards: with fewer shards than streams some streams stay empty, and a rank whose
  /// streams are all empty gets empty shares — so a small test set still evaluates on 16 ranks).
  std::size_t streams = 0;
  /// K, the shuffle window: each stream's samples are permuted within consecutive windows of K
  /// samples (the encoded bytes of one window per stream are held in memory). 1: no shuffle
  /// within a stream.
  std::size_t shuffle_window = 1000;
  /// What a bad sample does (see on_bad_sample).
  on_bad_sample on_bad = on_bad_sample::fail;
  /// Threads that decode (0: decode_pool's default, the cores this host's compute pools leave).
  std::size_t decode_threads = 0;
  /// Batches decoded ahead of the step (at least 1).
  std::size_t prefetch = 2;
  /// Bytes of each sequential read from a shard.
  std::size_t read_size = detail::tar_read_size;
  /// Where scanned manifests are cached, and whether (see load_manifest).
  std::filesystem::path cache_dir;
  bool use_cache = true;
};

/// The samples an image_shards set left out under on_bad_sample::skip, by reason.
struct skipped_samples {
  std::array<std::uint64_t, sample_problem_count> by_reason{};

  std::uint64_t total() const noexcept;
  /// "" when none, else e.g. "3 samples skipped: 1 without a label, 2 whose image does not decode".
  std::string summary() const;
};

namespace detail {

/// shard_options::streams when it is 0.
inline constexpr std::size_t default_streams = 16;

/// What the loaders of one image_shards set share: its manifest, options and the counts of
/// what they skipped and read.
struct shard_set_state {
  shard_manifest manifest;
  shard_options options;
  std::size_t streams = 0;
  std::string description;
  std::mutex mutex;
  skipped_samples skipped;
  std::size_t messages_shown = 0;
  std::atomic<std::uint64_t> bytes_read{0};

  /// Counts a skipped sample and shows its message on stderr (the first few of the set).
  LOOM_DECL void record_skip(sample_problem kind, const std::string& message);
};

LOOM_DECL std::shared_ptr<shard_set_state> open_shard_set(const std::vector<std::filesystem::path>& shards,
                                                         const shard_options& o, std::size_t classes,
                                                         std::string description);

}  // namespace detail

template <class Pipeline, std::size_t Classes>
class shard_loader;

/// What an image pipeline must offer the shard loader: an output shape and a const call that
/// decodes one encoded image into output_shape::size floats.
template <class P>
concept image_pipeline_for_shards = requires(const P& p, std::span<const std::byte> bytes, const sample_key& k, float* out) {
  requires shape_type<typename P::output_shape>;
  p(bytes, k, out);
};

/// A labelled image set in WebDataset tar shards: `size()` samples, each an image (.jpg, .jpeg
/// or .png) that `Pipeline` turns into Pipeline::output_shape floats, with a class index in
/// 0..Classes-1 (.cls, or .txt). The trainer takes it as it takes the IDX sets; its loader is
/// shard_loader (loader_for_t, loader_type), which each rank uses to read only its own shards.
///
/// Opening reads no shard when a manifest lies beside them (each is stat'ed and its size
/// checked); otherwise their headers are scanned once and the manifest cached (load_manifest).
/// Copies share the set's state (the manifest, and the counts of skipped samples and bytes read).
///
/// Requires: Pipeline satisfies image_pipeline_for_shards; 1 <= Classes.
template <class Pipeline, std::size_t Classes>
class image_shards {
  static_assert(image_pipeline_for_shards<Pipeline>,
                "loom::data::image_shards needs a pipeline with output_shape and a const operator()(std::span<const "
                "std::byte>, const sample_key&, float*), such as loom::data::decode_to<1, 28, 28>");
  static_assert(Classes >= 1, "loom::data::image_shards needs at least one class");

 public:
  using pipeline_type = Pipeline;
  using sample_shape = typename Pipeline::output_shape;
  static constexpr std::size_t classes = Classes;
  using loader_type = shard_loader<Pipeline, Classes>;

  /// The shards `source` names (resolve_shards(source, split): a directory, a brace pattern, a
  /// .tar file or a list file) and their manifest (load_manifest).
  ///
  /// Throws: what resolve_shards and load_manifest throw; loom::data_error when the manifest
  /// says the labels have more classes than Classes; loom::invalid_argument for a zero
  /// shuffle_window or prefetch.
  explicit image_shards(const std::string& source, const std::string& split = {}, shard_options o = {},
                        Pipeline p = Pipeline())
      : image_shards(resolve_shards(source, split), std::move(o), std::move(p),
                     source + (split.empty() ? "" : " (" + split + ")")) {}

  /// The given shards, in this order.
  image_shards(const std::vector<std::filesystem::path>& shards, shard_options o, Pipeline p = Pipeline(),
               std::string description = {})
      : state_(detail::open_shard_set(shards, o, Classes, std::move(description))), pipeline_(std::move(p)) {}

  /// The number of samples, bad ones included (the manifest's count).
  std::size_t size() const noexcept { return static_cast<std::size_t>(state_->manifest.samples()); }
  const shard_manifest& manifest() const noexcept { return state_->manifest; }
  const shard_options& options() const noexcept { return state_->options; }
  const Pipeline& pipeline() const noexcept { return pipeline_; }
  /// V: the streams the shards are dealt into.
  std::size_t streams() const noexcept { return state_->streams; }
  /// What identifies the data and its order for a checkpoint: the manifest's fingerprint, the
  /// sample count, V and K ("shards:FINGERPRINT;samples=N;streams=V;window=K").
  std::string identity() const {
    return "shards:" + state_->manifest.fingerprint() + ";samples=" + std::to_string(size()) +
           ";streams=" + std::to_string(streams()) + ";window=" + std::to_string(options().shuffle_window);
  }
  /// What the set is, for messages and logs.
  const std::string& description() const noexcept { return state_->description; }
  /// The samples skipped so far by this set's loaders (on_bad_sample::skip), by reason.
  skipped_samples skipped() const {
    const std::lock_guard<std::mutex> lock(state_->mutex);
    return state_->skipped;
  }
  /// Bytes this process's loaders of this set have read from shards so far.
  std::uint64_t bytes_read() const noexcept { return state_->bytes_read.load(); }

  /// The shared state (for the loader).
  const std::shared_ptr<detail::shard_set_state>& state() const noexcept { return state_; }

 private:
  std::shared_ptr<detail::shard_set_state> state_;
  Pipeline pipeline_;
};

/// Hands one rank of `world` its share of each global batch of an image_shards set: the
/// loader the trainer uses for it (image_shards::loader_type), with distributed_loader's
/// members.
///
/// Order (docs/data.md, "The loader"): epoch e deals the shards into V streams (deal_shards,
/// in a permutation drawn from (seed, e)); stream v's positions are its samples in shard order,
/// permuted within windows of K by (seed, e, v, window); global batch k takes, from each
/// stream in stream order, the next samples batch_split gives it. Rank r of world w owns the
/// streams [V r / w, V (r + 1) / w), reads only their shards, and gets their samples of every
/// batch: the ranks' shares concatenated in rank order are the global batch, whatever w is.
/// Without shuffle (evaluation) the shards keep the set's order and the windows their order.
///
/// Reading ahead: one thread per loader reads the next steps' samples (each stream's window
/// from its shards, sequentially) and decodes them in a decode_pool into a bounded queue of
/// `prefetch` ready batches while the step runs; start_epoch, skip and reshard start it again
/// from the new position. next() with x null reads labels only and decodes nothing; with both
/// null it reads nothing.
///
/// Bad samples: under on_bad_sample::fail, next() throws the sample's loom::data_error (or
/// io_error) when its batch is reached, naming the shard, the member and its byte offset;
/// under skip the sample is left out of its batch (local shrinks; global and offset still
/// count it, so the batch's other samples keep their positions), counted, shown on stderr, and
/// never given with a wrong label.
///
/// The loader keeps a reference to the data set, which must outlive it.
template <class Pipeline, std::size_t Classes>
class shard_loader {
 public:
  using dataset_type = image_shards<Pipeline, Classes>;
  using sample_shape = typename Pipeline::output_shape;

  /// The loader of rank `rank` of `world` over `data`, in global batches of `global_batch`
  /// samples, at the start of epoch 0.
  ///
  /// Throws: loom::invalid_argument when global_batch is 0, rank is outside 0..world-1, or
  /// world exceeds the set's streams (naming both and the remedy).
  shard_loader(const dataset_type& data, std::size_t global_batch, std::uint64_t seed, int rank, int world,
               bool shuffle = true)
      : data_(&data),
        state_(data.state()),
        seed_(seed),
        schedule_(counts(data), data.streams(), data.options().shuffle_window, check_batch(global_batch), seed, shuffle),
        pool_(decode_pool_options{.threads = static_cast<int>(data.options().decode_threads)}),
        queue_(std::max<std::size_t>(1, data.options().prefetch)) {
    reshard(rank, world);
    schedule_.set_epoch(0);
  }
  shard_loader(const dataset_type&&, std::size_t, std::uint64_t, int, int, bool = true) = delete;
  shard_loader(const shard_loader&) = delete;
  shard_loader& operator=(const shard_loader&) = delete;
  ~shard_loader() {
    stop();
    report();
  }

  /// Restarts at the first global batch of `epoch`.
  void start_epoch(std::size_t epoch) {
    stop();
    epoch_ = epoch;
    step_ = 0;
    last_ = {};
    resume();
  }

  /// Skips the next `batches` global batches of the epoch (at most to its end) without reading
  /// them: whole shards before the new position are not opened, the shard it falls in is read
  /// forward from its start (headers and labels; images only from the position's window on).
  void skip(std::size_t batches) {
    stop();
    step_ = std::min(batches_per_epoch(), step_ + std::min(batches, batches_per_epoch()));
    last_ = {};
    resume();
  }

  /// Steps in an epoch, the same on every rank: ceil(size / global_batch).
  std::size_t batches_per_epoch() const noexcept { return schedule_.steps_per_epoch(); }
  std::size_t global_batch() const noexcept { return schedule_.batch(); }
  /// The room next() needs: a rank never gets more than the global batch.
  std::size_t max_local_batch() const noexcept { return schedule_.batch(); }
  /// V, the streams.
  std::size_t streams() const noexcept { return schedule_.streams(); }
  /// The streams [first, second) this rank reads.
  std::pair<std::size_t, std::size_t> own_streams() const noexcept { return {first_, last_stream_}; }

  /// Blocks of ranks (the split-invariant mode, loom::chunk_plan) are not available over shards:
  /// 0 (the default) is accepted, anything else throws loom::invalid_argument.
  void set_rank_block(std::size_t block) {
    if (block != 0)
      throw invalid_argument("loom::data::shard_loader: deterministic_chunk (" + std::to_string(block) +
                             " samples per rank block) is not supported over tar shards: a rank reads whole streams, "
                             "not blocks of each batch; the batch is already the same for every world size, only "
                             "the summation order of the gradients differs — train with deterministic_chunk = 0");
  }

  /// Makes this the loader of rank `rank` of `world` from the next next() on, at the same place
  /// in the epoch: the streams are dealt to the ranks anew (after a recovery the survivors take
  /// the lost rank's streams; the rest of the epoch is read by them, nothing twice or lost).
  ///
  /// Throws: loom::invalid_argument for a rank outside 0..world-1 or world > streams().
  void reshard(int rank, int world) {
    const std::size_t v = schedule_.streams();
    if (world < 1 || rank < 0 || rank >= world)
      throw invalid_argument("loom::data::shard_loader: expected a rank in 0.." + std::to_string(world - 1) +
                             " for a world of " + std::to_string(world) + ", found rank " + std::to_string(rank));
    if (static_cast<std::size_t>(world) > v)
      throw invalid_argument("loom::data::shard_loader: " + std::to_string(world) + " ranks, but " +
                             data_->description() + " is dealt into " + std::to_string(v) +
                             " streams: expected at most one rank per stream; write more shards, or set "
                             "shard_options::streams to at least " + std::to_string(world) +
                             " (keep it fixed over a job's restarts)");
    stop();
    rank_ = rank;
    world_ = world;
    first_ = v * static_cast<std::size_t>(rank) / static_cast<std::size_t>(world);
    last_stream_ = v * static_cast<std::size_t>(rank + 1) / static_cast<std::size_t>(world);
    readers_.clear();
    for (std::size_t s = first_; s < last_stream_; ++s)
      readers_.emplace_back(state_->manifest, Classes, state_->options.read_size);
    resume();
  }

  int rank() const noexcept { return rank_; }
  int world() const noexcept { return world_; }
  std::size_t epoch() const noexcept { return epoch_; }

  /// Writes this rank's share of the next global batch: x as (local, sample_shape::size)
  /// values from the pipeline, labels as class indices. Returns {local, global, offset} as
  /// distributed_loader does ({0, 0, 0}, false, once the epoch is done). x null: labels only
  /// (nothing is decoded); both null: nothing is read.
  ///
  /// Requires: x has room for max_local_batch() * sample_shape::size values, labels for
  /// max_local_batch() values; T is float or constructible from float.
  /// Throws: the bad sample's error under on_bad_sample::fail (see the class).
  template <class T>
  batch_share next(T* x, std::int32_t* labels) {
    if (step_ >= batches_per_epoch()) {
      last_ = {};
      return last_;
    }
    const int mode = (x != nullptr ? 1 : 0) | (labels != nullptr ? 2 : 0);
    if (mode != mode_ || !running_) {
      stop();
      mode_ = mode;
      resume();
    }
    std::optional<ready_batch> b = queue_.pop();
    if (!b || b->epoch != epoch_ || b->step != step_)
      throw error("loom::data::shard_loader: internal error: the read-ahead thread handed step " +
                  (b ? std::to_string(b->step) : std::string("none")) + ", expected step " + std::to_string(step_));
    ++step_;
    if (b->error) {
      running_ = false;  // the thread stopped there; a later next() starts it again after it
      stop();
      std::rethrow_exception(b->error);
    }
    constexpr std::size_t s = sample_shape::size;
    if (x != nullptr) {
      if constexpr (std::is_same_v<T, float>) {
        if (b->n) std::memcpy(x, b->x.data(), b->n * s * sizeof(float));
      } else {
        for (std::size_t i = 0; i < b->n * s; ++i) x[i] = static_cast<T>(b->x[i]);
      }
    }
    if (labels != nullptr && b->n) std::memcpy(labels, b->labels.data(), b->n * sizeof(std::int32_t));
    last_ = b->share;
    last_.local = b->n;
    return last_;
  }

  /// next(x, labels) with the share unpacked, as distributed_loader's.
  template <class T>
  std::size_t next(T* x, std::int32_t* labels, std::size_t& global_n) {
    const batch_share share = next(x, labels);
    global_n = share.global;
    return share.local;
  }

  /// The position of this rank's first sample within the global batch next() returned last.
  std::size_t local_offset() const noexcept { return last_.offset; }

  /// Bytes this loader has read from shards so far (all epochs).
  std::uint64_t bytes_read() const noexcept { return bytes_read_.load(); }
  /// Samples this loader skipped (on_bad_sample::skip).
  std::uint64_t skipped() const noexcept { return skipped_.load(); }

 private:
  struct ready_batch {
    std::size_t epoch = 0, step = 0;
    batch_share share;
    std::size_t n = 0;
    std::vector<float> x;
    std::vector<std::int32_t> labels;
    std::exception_ptr error;
  };

  static std::vector<std::uint64_t> counts(const dataset_type& d) {
    std::vector<std::uint64_t> c;
    for (const shard_info& s : d.manifest().shards) c.push_back(s.samples);
    return c;
  }
  static std::size_t check_batch(std::size_t b) {
    if (b == 0) throw invalid_argument("loom::data::shard_loader: expected a global batch size of at least 1, found 0");
    return b;
  }

  // The read-ahead thread runs while running_; stop() ends it, resume() starts it at
  // (epoch_, step_) once a mode is known.
  void stop() {
    if (thread_.joinable()) {
      stop_requested_.store(true);
      queue_.close();
      thread_.join();
    }
    running_ = false;
    stop_requested_.store(false);
  }
  void resume() {
    if (mode_ < 0 || step_ >= batches_per_epoch()) return;
    queue_.reopen();
    for (detail::stream_reader& r : readers_) r.forget_window();
    running_ = true;
    thread_ = std::thread([this, e = epoch_, k = step_, m = mode_] { produce(e, k, m); });
  }

  void produce(std::size_t epoch, std::size_t from, int mode) {
    if (schedule_.epoch() != epoch) {
      schedule_.set_epoch(epoch);
      for (detail::stream_reader& r : readers_) r.reset();
    }
    for (std::size_t k = from; k < batches_per_epoch() && !stop_requested_.load(); ++k) {
      ready_batch b;
      b.epoch = epoch;
      b.step = k;
      try {
        make_batch(b, mode);
      } catch (...) {
        b.error = std::current_exception();
      }
      const bool failed = static_cast<bool>(b.error);
      if (!queue_.push(std::move(b)) || failed) return;
    }
  }

  void make_batch(ready_batch& b, int mode) {
    const bool want_x = mode & 1, want_labels = mode & 2;
    schedule_.step_ranges(b.step, ranges_);
    std::size_t global = 0, offset = 0, local = 0;
    for (std::size_t v = 0; v < ranges_.size(); ++v) {
      const std::size_t c = static_cast<std::size_t>(ranges_[v].second - ranges_[v].first);
      global += c;
      if (v < first_) offset += c;
      if (v >= first_ && v < last_stream_) local += c;
    }
    b.share = {local, global, offset};
    b.n = local;
    if (!want_x && !want_labels) return;
    std::vector<detail::fetched_sample> items;
    items.reserve(local);
    const std::uint64_t before = read_so_far();
    for (std::size_t v = first_; v < last_stream_; ++v)
      for (std::uint64_t p = ranges_[v].first; p < ranges_[v].second; ++p)
        items.push_back(readers_[v - first_].take(schedule_, v, schedule_.sample_at(v, p), want_x));
    const std::uint64_t read = read_so_far() - before;
    bytes_read_.fetch_add(read);
    state_->bytes_read.fetch_add(read);
    constexpr std::size_t s = sample_shape::size;
    if (want_x) b.x.resize(local * s);
    b.labels.resize(local);
    const Pipeline& pipeline = data_->pipeline();
    if (want_x) {
      pool_.run(items.size(), [&](std::size_t i) {
        detail::fetched_sample& f = items[i];
        if (f.kind != sample_problem::none) return;
        try {
          pipeline(std::span<const std::byte>(f.image), sample_key{seed_, epoch_of(b), f.index}, b.x.data() + i * s);
        } catch (const io_error& e) {
          f.problem = detail::describe_sample(state_->manifest, f) + ": " + e.what();
          f.kind = sample_problem::bad_image;
        }
        std::vector<std::byte>().swap(f.image);
      });
    }
    const bool skip = state_->options.on_bad == on_bad_sample::skip;
    std::size_t n = 0;
    for (std::size_t i = 0; i < items.size(); ++i) {
      detail::fetched_sample& f = items[i];
      if (f.kind != sample_problem::none) {
        if (!skip) {
          if (f.kind == sample_problem::unreadable_shard) throw io_error(f.problem);
          throw data_error(f.problem);
        }
        if (f.kind == sample_problem::bad_image && !want_labels)
          throw data_error(f.problem + "; under on_bad_sample::skip a sample whose image does not decode cannot be "
                                       "left out where the samples and the labels are read by different ranks (a "
                                       "pipeline's first and last stages): the last stage cannot know");
        state_->record_skip(f.kind, f.problem);
        skipped_.fetch_add(1);
        continue;
      }
      if (want_x && n != i) std::memmove(b.x.data() + n * s, b.x.data() + i * s, s * sizeof(float));
      b.labels[n] = f.label;
      ++n;
    }
    b.n = n;
  }

  static std::uint64_t epoch_of(const ready_batch& b) noexcept { return static_cast<std::uint64_t>(b.epoch); }

  std::uint64_t read_so_far() const noexcept {
    std::uint64_t t = 0;
    for (const detail::stream_reader& r : readers_) t += r.bytes_read();
    return t;
  }

  void report() const noexcept {
    if (skipped_.load() == 0) return;
    try {
      const std::string s = data_->skipped().summary();
      std::fprintf(stderr, "loom: %s (rank %d, %s; on_bad_sample::skip); the set's count so far: %s\n",
                   (std::to_string(skipped_.load()) + " bad samples left out by this loader").c_str(), rank_,
                   data_->description().c_str(), s.c_str());
      std::fflush(stderr);
    } catch (...) {
    }
  }

  const dataset_type* data_;
  std::shared_ptr<detail::shard_set_state> state_;
  std::uint64_t seed_;
  detail::shard_schedule schedule_;  // the read-ahead thread's (the consumer uses only its constants)
  decode_pool pool_;
  bounded_queue<ready_batch> queue_;
  std::vector<detail::stream_reader> readers_;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges_;
  std::thread thread_;
  std::atomic<bool> stop_requested_{false};
  bool running_ = false;
  int mode_ = -1;  // bit 0: samples, bit 1: labels; -1 before the first next()
  int rank_ = 0, world_ = 1;
  std::size_t first_ = 0, last_stream_ = 0;
  std::size_t epoch_ = 0, step_ = 0;
  batch_share last_{};
  std::atomic<std::uint64_t> bytes_read_{0}, skipped_{0};
};

/// The trainer's loader for an image_shards set (see loader_for in distributed.hpp).
template <class Pipeline, std::size_t Classes>
struct loader_for<image_shards<Pipeline, Classes>> {
  using type = shard_loader<Pipeline, Classes>;
};

}  // namespace loom::data

#if defined(LOOM_DEFINITIONS_VISIBLE)
#include "loom/data/impl/shard_loader.ipp"
#endif
