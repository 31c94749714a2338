// SPDX-License-Identifier: Apache-2.0
#pragma once
// Checkpoints of a training run: a directory `step-<n>/` per checkpoint, committed whole.
//
//   step-<n>/model-00001-of-0000N.safetensors       the weights and buffers (running statistics), in
//   step-<n>/model.safetensors.index.json           the whole network's layout, with PyTorch's names
//   step-<n>/optimizer-00001-of-0000N.safetensors   (Hugging Face's sharded layout); the optimizer state likewise
//   step-<n>/optimizer.safetensors.index.json       ("<name>.exp_avg", "<name>.momentum_buffer")
//   step-<n>/ema-00001-of-0000N.safetensors         an EMA of the weights and buffers, when the run keeps
//   step-<n>/ema.safetensors.index.json             one (trainer_options::ema): the model's names and files
//   step-<n>/checkpoint.json                        the trainer's state and every file's size and CRC
//
// Every rank writes the whole tensors it is assigned (a tensor held whole by several replicas is
// written by one of them, in turn, so replicas share the writing; a tensor split over tensor-
// parallel slices is assembled on one slice from its parts, one tensor at a time): no rank
// gathers the whole model. Each tensor's CRC-32C is in its file's header (__metadata__
// "loom.crc32c"), each file's in checkpoint.json; both are checked on load.
//
// Commit: the ranks write into `.step-<n>.partial/` (every file fsynced), each rank then leaves a
// `rank-<r>.json` note there with its files' sizes and checksums (not fsynced: it is read only
// before the commit); rank 0, once every note is there, writes the indexes and checkpoint.json,
// fsyncs the partial directory once, renames it to `step-<n>` and fsyncs the parent. A reader
// never sees half a checkpoint: only `step-<n>` directories are read. The directory must be one
// every rank sees (shared storage, as the data set is).
//
// Writing is asynchronous: at a step boundary the state is copied to host memory, and a thread
// writes it while training goes on; the next checkpoint (and the end of fit) waits for it and
// reports a failure on every rank.
//
// Loading reads, on each rank, only the tensors that overlap what the rank holds (its
// loom::shard_map) — so a checkpoint saved under any policy and world size loads under any other
// for the same network — into temporary buffers; nothing is applied until every rank has read
// and checked its part. The code here is not templated on the network or the trainer: each
// program compiles it once.

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "loom/core/config.hpp"
#include "loom/core/crc32c.hpp"
#include "loom/core/error.hpp"
#include "loom/io/file.hpp"
#include "loom/io/json.hpp"
#include "loom/io/layer_description.hpp"
#include "loom/io/safetensors.hpp"
#include "loom/parallel/collectives.hpp"
#include "loom/parallel/shard_map.hpp"

namespace loom {

/// When and where fit() writes checkpoints (fit_options::checkpoint; docs/checkpoints.md).
struct checkpoint_options {
  /// The directory of the run's checkpoints (`step-<n>/` inside); empty: no checkpoints. Every
  /// rank must see the same directory (shared storage).
  std::string directory;
  /// A checkpoint after every this many optimizer steps (0: not by steps).
  std::size_t every_steps = 0;
  /// A checkpoint when this many seconds have passed since the last one (0: not by time;
  /// rank 0's clock decides, for every rank).
  double every_s = 0;
  /// Committed checkpoints kept: an older one is deleted only after a newer one is committed
  /// (0: keep all).
  std::size_t keep = 3;
  /// Before training, continue from the newest valid checkpoint in `directory` (a damaged one
  /// is reported and the one before it taken); none there: start from step 0. Also on when
  /// loomrun restarted the job after a failure (LOOM_RESTART >= 1 in the environment).
  bool resume = false;
  /// A checkpoint when fit ends (unless its last step just made one).
  bool at_end = true;
  /// On SIGUSR1 or SIGTERM, every rank finishes its step, a checkpoint is committed, and fit
  /// returns with fit_result::preempted set (ranks agree on the step: one small allreduce per
  /// step while this is on).
  bool on_signal = true;
  /// Write in a background thread while training goes on (false: fit waits for each write).
  bool async = true;
  /// How long rank 0 waits for the other ranks' files before it gives up on a checkpoint.
  double commit_timeout_s = 600;
};

namespace io {

/// The checkpoint format this loom writes and reads (checkpoint.json's "format_version").
inline constexpr int checkpoint_format_version = 1;

/// The trainer's state in a checkpoint (checkpoint.json), besides the tensors.
struct trainer_record {
  std::size_t step = 0;            ///< optimizer steps taken
  std::size_t epoch = 0;           ///< the epoch in progress (0-based)
  std::size_t batch_in_epoch = 0;  ///< global batches of that epoch already taken
  double epoch_sums[3] = {0, 0, 0};  ///< loss sum, correct, samples of the epoch so far (all replicas)
  std::uint64_t seed = 1;
  std::size_t batch = 0, accumulation = 1, epochs = 0, max_steps = 0, deterministic_chunk = 0, samples = 0;
  std::string data;  ///< what identifies the training data beyond its size (data::identity_of; "" for IDX sets)
  double clip_grad_norm = 0;
  double lr = 0;  ///< the learning rate of the last step
  double label_smoothing = 0;  ///< trainer_options::label_smoothing (absent before it: 0)
  std::string math, loss, optimizer, optimizer_options, policy;
  std::string network, fingerprint;
  std::size_t parameter_count = 0;
  std::size_t optimizer_steps = 0;
  std::vector<std::string> optimizer_buffers;
  int ranks = 1, replicas = 1, stages = 1, slices = 1;
  /// The checkpoint holds an EMA of the weights (the ema-* files), with these options and
  /// updates since its last copy of the weights (torchvision's n_averaged).
  bool ema = false;
  double ema_decay = 0;
  std::size_t ema_every = 1, ema_warmup_steps = 0, ema_updates = 0;
};

/// One rank's part of a checkpoint, in host memory: its parameters (map.local_count values), its
/// buffers (running statistics) and optimizer buffers, and what it holds of each: map for the parameters, and for the buffers
/// state_map where the optimizer state is sharded differently from the parameters
/// (loom::shard_optimizer_state; own_state_map set), else map. The values live in `owner` (a
/// host copy, or the trainer's page-locked staging buffer on a GPU backend), which must stay
/// untouched until the checkpoint's files are written.
struct rank_snapshot {
  shard_map map;
  std::span<const float> params;
  /// Its buffers (running statistics; map.local_buffer_count values, laid out as
  /// map.buffer_pieces say), written beside the parameters under their PyTorch names.
  std::span<const float> model_buffers;
  std::vector<std::span<const float>> buffers;
  /// The EMA of the parameters then of the buffers, laid out as params and model_buffers
  /// together (empty: none; written as ema-*.safetensors with the model's names).
  std::span<const float> ema;
  std::shared_ptr<const void> owner;
  shard_map state_map;
  bool own_state_map = false;

  /// What the rank holds of the optimizer buffers.
  const shard_map& buffers_map() const noexcept { return own_state_map ? state_map : map; }
};

/// A checkpoint found in a directory: its path and step.
struct checkpoint_entry {
  std::filesystem::path path;
  std::size_t step = 0;
};

namespace detail {

LOOM_DECL std::string fmt_double(double v);
LOOM_DECL double parse_double(const std::string& s);

LOOM_DECL std::string shard_name(const char* kind, std::size_t k, std::size_t n);

/// Calls f(local_index, whole_index, count) for every run of `pieces` inside [begin, begin + n)
/// of the whole layout, in piece order.
template <class F>
void for_each_overlap(std::span<const shard_piece> pieces, std::size_t begin, std::size_t n, F&& f) {
  const std::size_t end = begin + n;
  for (const shard_piece& p : pieces)
    for (std::size_t i = 0; i < p.rows; ++i) {
      const std::size_t w = p.whole_offset + i * p.whole_stride;
      const std::size_t lo = std::max(w, begin), hi = std::min(w + p.count, end);
      if (lo < hi) f(p.local_offset + i * p.local_stride + (lo - w), lo, hi - lo);
    }
}
LOOM_DECL std::size_t covered(std::span<const shard_piece> pieces, std::size_t begin, std::size_t n);

/// What every rank holds, as every rank learns it (one allgather).
struct world_map {
  struct rank_entry {
    int replica = 0, replicas = 1, stage = 0, slice = 0;
    std::vector<shard_piece> pieces;
  };
  std::vector<rank_entry> ranks;
};

LOOM_DECL world_map gather_world_map(collectives& c, const shard_map& m);

/// Who writes each tensor: a rank that holds it whole (the replicas sharing the bytes), or — for
/// a tensor split over ranks — one rank of a replica's group, which receives the others' parts.
struct write_plan {
  struct tensor_entry {
    int writer = -1;
    std::vector<int> senders;  // ranks that send their parts to writer (split tensors)
  };
  std::vector<tensor_entry> tensors;
  std::vector<int> writers;  // ranks writing at least one tensor, ascending
  int file_of(int rank) const {
    for (std::size_t k = 0; k < writers.size(); ++k)
      if (writers[k] == rank) return static_cast<int>(k);
    return -1;
  }
};

LOOM_DECL write_plan plan_writes(const world_map& w, const std::vector<tensor_description>& tensors);

/// A whole tensor one rank writes, per buffer (0: the parameters, 1..: optimizer buffers): a
/// view of the rank's snapshot where the rank holds the tensor in one contiguous run (no copy:
/// the snapshot lives as long as the write), else its values assembled into an own copy.
struct tensor_values {
  std::size_t tensor = 0;
  std::vector<std::vector<float>> values;     // own copies (split or strided tensors only)
  std::vector<std::span<const float>> views;  // what is written: into the snapshot or `values`
};

/// Where [begin, begin + n) of the whole layout lies in a rank's local layout when the rank
/// holds all of it in one contiguous run; npos otherwise.
LOOM_DECL std::size_t contiguous_at(std::span<const shard_piece> pieces, std::size_t begin, std::size_t n);

/// The whole tensors this rank writes, assembled from its snapshot and (for split tensors) the
/// parts other ranks send. Collective (point-to-point between the ranks of split tensors).
/// `sources`: the rank's buffers laid out as `held` says (the parameters, or the optimizer's
/// buffers), one view per source in each tensor_values.
LOOM_DECL std::vector<tensor_values> assemble(collectives& c, const world_map& w, const write_plan& plan,
                                              const std::vector<tensor_description>& tensors, const shard_map& held,
                                              const std::vector<const float*>& sources);

/// The model's tensors as a checkpoint lays them out: the parameters, then the buffers (running
/// statistics) as if they followed the parameters in one flat layout, whole and local — so that
/// every rank's buffers go through the same plan, assembly and reading as its parameters. map
/// points into pieces: a model_layout is used where it is made, or moved whole.
struct model_layout {
  std::vector<tensor_description> tensors;        // parameters, then buffers (offsets after the parameters)
  std::vector<tensor_description> parameters;     // the parameters alone (the optimizer state's tensors)
  std::vector<shard_piece> pieces;
  shard_map map;
};
LOOM_DECL model_layout model_layout_of(const std::vector<tensor_description>& tensors, const shard_map& map);

/// A file of a `.step-<n>.partial` directory: written under a temporary name and renamed into
/// place (so that rank 0, polling for another rank's note, never reads half of one), fsynced
/// when `durable` — but with no fsync of the directory per file, as atomic_file does: nobody
/// reads the partial directory as a checkpoint, and the commit fsyncs it once before renaming
/// it to step-<n> (7 fsyncs a checkpoint instead of 14 for one rank with an optimizer state).
/// Throws loom::io_error as atomic_file does; the temporary file is then removed.
class partial_file {
 public:
  explicit partial_file(std::filesystem::path target);
  partial_file(const partial_file&) = delete;
  partial_file& operator=(const partial_file&) = delete;
  ~partial_file() { discard(); }

  void write(const void* data, std::size_t n);
  void write(std::string_view s) { write(s.data(), s.size()); }
  std::uint64_t size() const noexcept { return written_; }

  void commit(bool durable);

 private:
  [[noreturn]] void fail(const char* doing, int e);
  void discard() noexcept;
  std::filesystem::path target_, temp_;
  int fd_ = -1;
  std::uint64_t written_ = 0;
};

/// Writes tensors as a safetensors file of a partial directory (fsynced), each tensor's CRC-32C in
/// __metadata__ "loom.crc32c"; returns the file's size and CRC-32C.
struct written_file {
  std::string name;
  std::uint64_t bytes = 0;
  std::uint32_t crc = 0;
};
LOOM_DECL written_file write_tensor_file(const std::filesystem::path& dir, const std::string& name,
                                         const std::vector<named_tensor<float>>& tensors,
                                         std::map<std::string, std::string> metadata);

/// The CRC-32C and size of a whole file.
LOOM_DECL std::pair<std::uint64_t, std::uint32_t> file_crc(const std::filesystem::path& p);

LOOM_DECL std::string read_text_file(const std::filesystem::path& p);

/// A text file of a partial directory; `durable`: fsynced (false: a rank's note, which only
/// rank 0 reads before the commit and which is gone from the committed checkpoint).
LOOM_DECL void write_text_file(const std::filesystem::path& p, const std::string& text, bool durable = true);

LOOM_DECL void fsync_directory(const std::filesystem::path& d);

LOOM_DECL json::value parse_json_file(const std::filesystem::path& p);

/// Field access on checkpoint.json with messages naming the file and the field.
struct json_fields {
  const json::value& v;
  std::string file;
  const json::value& need(std::string_view key) const;
  std::string str(std::string_view key) const;
  std::uint64_t u64(std::string_view key) const;
  double num(std::string_view key) const;
};

LOOM_DECL std::string record_json(const trainer_record& r, const std::vector<written_file>& files, std::size_t writers);

/// Checks checkpoint.json's own checksum (its last field covers every byte before it).
LOOM_DECL void check_manifest_crc(const std::string& text, const std::string& file);

LOOM_DECL trainer_record parse_record(const json::value& v, const std::string& file);

LOOM_DECL std::string index_json(const std::vector<tensor_description>& tensors, const write_plan& plan, const char* kind,
                                 const std::vector<std::string>& suffixes);

/// The committed checkpoints in dir (`step-<n>` directories), newest first.
LOOM_DECL std::vector<checkpoint_entry> list_checkpoints(const std::filesystem::path& dir);

}  // namespace detail

/// The committed checkpoints in `dir`, newest first (no check of their contents).
LOOM_DECL std::vector<checkpoint_entry> list_checkpoints(const std::filesystem::path& dir);

/// Writes and commits a run's checkpoints (see the file comment). One per trainer; its
/// collective members are called by every rank alike.
class checkpointer {
 public:
  checkpointer() = default;
  checkpointer(const checkpointer&) = delete;
  checkpointer& operator=(const checkpointer&) = delete;
  ~checkpointer();

  /// Starts checkpoint `record.step` of this rank's snapshot into dir: waits for the previous
  /// one (see wait), prepares the directory, assembles the tensors this rank writes, and writes
  /// them in the background (or now, when !async). Collective. Throws loom::io_error on every
  /// rank when this or the previous checkpoint failed on any (the previous committed one stays).
  void start(collectives& c, const std::filesystem::path& dir, const std::vector<tensor_description>& tensors,
             rank_snapshot snapshot, const trainer_record& record, const std::vector<std::string>& buffer_names,
             bool async, std::size_t keep, double commit_timeout_s);

  /// Waits for the checkpoint in progress: this rank's files, then (rank 0) its commit.
  /// Collective. Throws loom::io_error on every rank, with every failing rank's message, when it
  /// failed anywhere; the previous committed checkpoint is then untouched.
  void wait(collectives& c);

  /// Gives up the checkpoint in progress without a collective (a peer failed: the others'
  /// files may never come): this rank's writer finishes its files, rank 0 does not commit and
  /// removes the partial directory. Not collective. Returns the step given up, or -1.
  long long abandon();

  /// Whether a checkpoint is being written.
  bool busy() const noexcept { return static_cast<bool>(state_); }
  /// The path of the last checkpoint this rank saw committed (rank 0; empty elsewhere).
  const std::filesystem::path& last_committed() const noexcept { return last_committed_; }
  /// How long the last checkpoint that wait() completed took, the same on every rank: the
  /// longest any rank's writer took from its start to its files written (rank 0's: to the
  /// commit, which waits for every rank's files). 0 before one completed. What the peers of
  /// the slowest writer may wait in a checkpoint's collectives (fit's checkpoint deadline).
  double last_seconds() const noexcept { return last_seconds_; }

 private:
  struct shared_state {
    std::atomic<bool> files_done{false}, abort{false};
    std::string files_error, commit_error;
    std::filesystem::path committed;
    double seconds = 0;  // this rank's writer: start to files written (rank 0: to the commit)
  };
  struct job {
    std::filesystem::path dir, partial;
    std::vector<tensor_description> tensors;        // the model's: parameters, then buffers (model_layout)
    std::vector<tensor_description> state_tensors;  // the parameters': the optimizer state's
    detail::write_plan plan, state_plan;  // who writes each tensor's parameters, and its optimizer state
    std::shared_ptr<const rank_snapshot> snapshot;  // what the views of `mine` and `mine_state` point into
    std::shared_ptr<std::vector<detail::tensor_values>> mine, mine_state;
    trainer_record record;
    std::vector<std::string> buffer_names;
    int rank = 0, world = 1;
    std::size_t keep = 0;
    double timeout_s = 600;
    std::shared_ptr<shared_state> state;
  };

  static void run(job& j);

  /// This rank's tensor files and its note rank-<r>.json.
  static void write_files(job& j);

  /// Rank 0: once every rank's note is there, the indexes and checkpoint.json, then the rename.
  static std::filesystem::path commit(job& j);

  /// Deletes committed checkpoints beyond the newest `keep`, and partial ones older than step.
  static void prune(const std::filesystem::path& dir, std::size_t step, std::size_t keep);

  std::thread thread_;
  std::shared_ptr<shared_state> state_;
  std::size_t pending_step_ = 0;
  std::optional<detail::world_map> map_, state_map_;
  detail::write_plan plan_, state_plan_;
  std::filesystem::path last_committed_;
  double last_seconds_ = 0;
};

/// What a rank read of a checkpoint: its parameters and optimizer buffers (laid out as it holds
/// them) and the trainer's record. Nothing is applied by the reader.
struct loaded_checkpoint {
  std::filesystem::path path;
  trainer_record record;
  std::vector<float> params;
  std::vector<float> model_buffers;  // laid out as the map's buffer_pieces say
  std::vector<std::vector<float>> buffers;
  /// The EMA of the weights, the parameters then the buffers as params and model_buffers lay
  /// them (read when the loader asks for it and record.ema; else empty).
  std::vector<float> ema;
  /// Newer checkpoints refused (damaged or not this run's) before this one was taken.
  std::size_t refused = 0;
};

/// What the loading trainer is: checked against the checkpoint before anything is read.
struct load_expectation {
  std::string network, optimizer;
  std::size_t parameter_count = 0;
  std::vector<std::string> buffer_names;
  /// Read the EMA of the weights where the checkpoint holds one.
  bool ema = false;
};

namespace detail {

/// Reads this rank's part of the checkpoint at path (one step-<n> directory). Throws
/// loom::io_error naming the file, the tensor or field, what was expected and what was found.
LOOM_DECL loaded_checkpoint read_part(const std::filesystem::path& path, const std::vector<tensor_description>& tensors,
                                      const shard_map& map, const shard_map& state_map, const load_expectation& want,
                                      int rank, int world);

}  // namespace detail

/// Reads this rank's part of a checkpoint: `where` is one checkpoint (a `step-<n>` directory)
/// or a run's directory, of which the newest valid checkpoint is taken (a damaged one is
/// reported on `log`, a warning stream, and the one before it tried). Collective: every rank takes the same
/// checkpoint, or every rank throws loom::io_error saying what is wrong with each.
/// Returns nothing when `where` holds no checkpoint at all and none_ok.
/// `state_map`: what this rank holds of the optimizer state, where it differs from `map`
/// (loom::shard_optimizer_state); null: as map.
LOOM_DECL std::optional<loaded_checkpoint> read_checkpoint(collectives& c, const std::filesystem::path& where,
                                                           const std::vector<tensor_description>& tensors,
                                                           const shard_map& map, const load_expectation& want,
                                                           bool none_ok, std::ostream* log,
                                                           const shard_map* state_map = nullptr);

}  // namespace io
}  // namespace loom

#if defined(LOOM_DEFINITIONS_VISIBLE)
#include "loom/io/impl/checkpoint.ipp"
#endif
