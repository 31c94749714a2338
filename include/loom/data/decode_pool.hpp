// SPDX-License-Identifier: Apache-2.0
#pragma once
// Threads that decode samples ahead of the training step: a pool that runs n independent jobs
// on its threads and the caller's (decode_pool), a bounded queue that blocks its producer when
// full and its consumer when empty (bounded_queue), and both put together for pipelines
// (batch_prefetch: per-step work in, decoded float batches out, in order, a bounded number
// ahead). Knows nothing of images or their libraries: a pipeline is anything callable as
// pipeline(bytes, sample_key, float*).

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "loom/backend/cpu/runtime.hpp"
#include "loom/backend/cpu/signals.hpp"
#include "loom/core/error.hpp"
#include "loom/data/sample_key.hpp"

namespace loom::data {

namespace detail {
/// The bytes of decoding scratch the calling thread holds, as the last pipeline call on it left
/// them (image_pipeline keeps it up to date): what the pools report as their threads' scratch.
inline std::size_t& decode_scratch_bytes() noexcept {
  thread_local std::size_t bytes = 0;
  return bytes;
}
}  // namespace detail

/// The default number of decoding threads of one rank: the cores of this host that the compute
/// pools of its ranks leave free (available_cores() - local_ranks() x threads()), shared among
/// its ranks, at least 1. With the compute pool at its own default (all cores shared among the
/// ranks) nothing is free, and each rank decodes with 1 thread.
inline int default_decode_threads() {
  const int ranks = std::max(1, local_ranks());
  const int free = available_cores() - ranks * std::max(1, threads());
  return std::max(1, free / ranks);
}

/// Options of decode_pool.
struct decode_pool_options {
  /// Threads in all, the calling thread of run() included; 0: default_decode_threads().
  int threads = 0;
};

/// A fixed set of threads that run batches of independent jobs: run(n, job) calls job(0) ..
/// job(n - 1), each once, spread over the pool's threads and the calling thread, and returns
/// when all have returned. The threads block asynchronous signals (they go to the process's
/// other threads, as for the compute pool: backend/cpu/signals.hpp). The destructor joins them.
/// run() is for one thread at a time.
class decode_pool {
 public:
  /// Throws: loom::invalid_argument when options.threads is negative.
  explicit decode_pool(decode_pool_options options = {}) {
    if (options.threads < 0)
      throw invalid_argument("loom::data::decode_pool: expected a thread count >= 0 (0: the default), found " +
                             std::to_string(options.threads));
    threads_ = options.threads ? options.threads : default_decode_threads();
    scratch_ = std::make_unique<std::atomic<std::size_t>[]>(static_cast<std::size_t>(threads_));
    for (int t = 0; t < threads_; ++t) scratch_[static_cast<std::size_t>(t)] = 0;
    workers_.reserve(static_cast<std::size_t>(threads_ - 1));
    for (int t = 1; t < threads_; ++t) workers_.emplace_back([this, t] { work(t); });
  }
  decode_pool(const decode_pool&) = delete;
  decode_pool& operator=(const decode_pool&) = delete;
  ~decode_pool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    for (std::thread& t : workers_) t.join();
  }

  /// Calls job(i) for every i in [0, n), on the pool's threads and the caller's, and returns
  /// when all calls have returned. Throws: what the job of the lowest index that threw threw,
  /// after all jobs ran (a failing job stops none of the others).
  template <class Job>
  void run(std::size_t n, Job&& job) {
    if (n == 0) return;
    auto call = [](void* f, std::size_t i) { (*static_cast<std::remove_reference_t<Job>*>(f))(i); };
    {
      std::lock_guard<std::mutex> lock(mutex_);
      call_ = call;
      job_ = const_cast<void*>(static_cast<const void*>(std::addressof(job)));
      n_ = n;
      next_.store(0, std::memory_order_relaxed);
      done_ = 0;
      error_ = nullptr;
      error_index_ = n;
      ++generation_;
    }
    wake_.notify_all();
    take_jobs(0);
    std::unique_lock<std::mutex> lock(mutex_);
    finished_.wait(lock, [&] { return done_ == n_ && busy_ == 0; });
    job_ = nullptr;
    if (error_) {
      std::exception_ptr e = std::exchange(error_, nullptr);
      lock.unlock();
      std::rethrow_exception(e);
    }
  }

  /// Threads in all, the caller of run() included.
  int threads() const noexcept { return threads_; }

  /// Bytes of decoding scratch the pool's threads (and run()'s last caller) hold, as measured
  /// after their last job.
  std::size_t scratch_bytes() const noexcept {
    std::size_t sum = 0;
    for (int t = 0; t < threads_; ++t) sum += scratch_[static_cast<std::size_t>(t)].load(std::memory_order_relaxed);
    return sum;
  }

 private:
  // Takes jobs until none is left; thread `slot` records its scratch.
  void take_jobs(int slot) {
    for (;;) {
      const std::size_t i = next_.fetch_add(1, std::memory_order_relaxed);
      if (i >= n_) break;
      std::exception_ptr failure;
      try {
        call_(job_, i);
      } catch (...) {
        failure = std::current_exception();
      }
      scratch_[static_cast<std::size_t>(slot)].store(detail::decode_scratch_bytes(), std::memory_order_relaxed);
      std::lock_guard<std::mutex> lock(mutex_);
      if (failure && i < error_index_) error_ = failure, error_index_ = i;
      if (++done_ == n_) finished_.notify_all();
    }
  }

  void work(int slot) {
    loom::detail::shield_this_thread_for_good();
    std::uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      ++busy_;
      lock.unlock();
      take_jobs(slot);
      lock.lock();
      if (--busy_ == 0) finished_.notify_all();
    }
  }

  int threads_ = 1;
  std::vector<std::thread> workers_;
  std::unique_ptr<std::atomic<std::size_t>[]> scratch_;
  std::mutex mutex_;
  std::condition_variable wake_, finished_;
  bool stop_ = false;
  std::uint64_t generation_ = 0;
  int busy_ = 0;
  // The current batch of jobs (set under mutex_ before generation_ moves on).
  void (*call_)(void*, std::size_t) = nullptr;
  void* job_ = nullptr;
  std::size_t n_ = 0;
  std::atomic<std::size_t> next_{0};
  std::size_t done_ = 0;
  std::exception_ptr error_;
  std::size_t error_index_ = 0;
};

/// A first-in first-out queue of at most capacity() items: push() blocks while it is full,
/// pop() while it is empty. close() wakes both: push() then refuses, pop() hands out what is
/// left and then nothing. reopen() empties it and lets it run again. wait_seconds() is the time
/// pop() spent blocked, summed: how long the consumer starved.
template <class T>
class bounded_queue {
 public:
  /// Throws: loom::invalid_argument when capacity is 0.
  explicit bounded_queue(std::size_t capacity) : capacity_(capacity) {
    if (capacity == 0) throw invalid_argument("loom::data::bounded_queue: expected a capacity of at least 1, found 0");
  }

  /// Appends v, waiting while the queue is full. Returns false (v dropped) once it is closed.
  bool push(T v) {
    std::unique_lock<std::mutex> lock(mutex_);
    not_full_.wait(lock, [&] { return closed_ || items_.size() < capacity_; });
    if (closed_) return false;
    items_.push_back(std::move(v));
    not_empty_.notify_one();
    return true;
  }

  /// The oldest item, waiting while the queue is empty and open; nothing once it is closed and empty.
  std::optional<T> pop() {
    std::unique_lock<std::mutex> lock(mutex_);
    if (items_.empty() && !closed_) {
      const auto t0 = std::chrono::steady_clock::now();
      not_empty_.wait(lock, [&] { return closed_ || !items_.empty(); });
      wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    if (items_.empty()) return std::nullopt;
    std::optional<T> v(std::move(items_.front()));
    items_.pop_front();
    not_full_.notify_one();
    return v;
  }

  /// Wakes every waiting push() (which return false) and pop() (which return what is left, then nothing).
  void close() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      closed_ = true;
    }
    not_full_.notify_all();
    not_empty_.notify_all();
  }

  /// Drops every item and opens the queue again.
  void reopen() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      items_.clear();
      closed_ = false;
    }
    not_full_.notify_all();
  }

  std::size_t size() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return items_.size();
  }
  std::size_t capacity() const noexcept { return capacity_; }
  bool closed() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return closed_;
  }
  /// Seconds pop() spent waiting for an item, summed over all calls.
  double wait_seconds() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return wait_s_;
  }

 private:
  std::size_t capacity_;
  mutable std::mutex mutex_;
  std::condition_variable not_full_, not_empty_;
  std::deque<T> items_;
  bool closed_ = false;
  double wait_s_ = 0;
};

/// A sample that failed in a batch_prefetch step: a bad_image whose message starts with the
/// sample (index, epoch, seed), its slot and its step, and that carries them.
struct bad_sample : bad_image {
  bad_sample(const std::string& what, const sample_key& k, std::size_t slot_in_batch, std::size_t step_number)
      : bad_image(what), key(k), slot(slot_in_batch), step(step_number) {}
  sample_key key;
  std::size_t slot = 0, step = 0;
};

/// One sample of a step: its encoded bytes, its key, and its slot in the batch (the batch holds
/// the sample at slot s at floats [s * sample_size, (s + 1) * sample_size)).
struct decode_item {
  std::span<const std::byte> encoded;
  sample_key key;
  std::size_t slot = 0;
};

/// Options of batch_prefetch.
struct prefetch_options {
  /// Samples a batch holds at most (the slots 0 .. batch - 1).
  std::size_t batch = 64;
  /// Batches decoded ahead of the one the consumer holds (in progress or ready): the memory
  /// is (ahead + 1) batches.
  std::size_t ahead = 2;
  /// Decoding threads in all (the coordinating thread is one of them); 0: default_decode_threads().
  int threads = 0;
};

/// Decodes the work of training steps ahead of them, in order: submit() queues one step's
/// samples, a coordinating thread decodes them (with the pool's other threads) into one of
/// ahead + 1 batch buffers, and next() hands out the batches in the order of submission,
/// waiting only when the next one is not ready. The float values of a batch depend only on
/// its items (each sample's on its bytes and key), never on the thread count.
///
/// Pipeline: callable as `void(std::span<const std::byte>, const sample_key&, float*) const`,
/// with `Pipeline::output_shape` (a loom::shape); loom::data::image_pipeline is one.
template <class Pipeline>
class batch_prefetch {
 public:
  static constexpr std::size_t sample_size = Pipeline::output_shape::size;

  /// A decoded batch: `samples` samples of sample_size floats each (those of slots never
  /// given are left as they were), valid until the next call of next() or the destruction.
  struct batch {
    const float* data = nullptr;
    std::size_t samples = 0;
    std::size_t step = 0;  // 0 for the first submit()
  };

  /// Throws: loom::invalid_argument when options.batch or options.ahead is 0 or threads < 0.
  explicit batch_prefetch(Pipeline pipeline, prefetch_options options = {})
      : pipeline_(std::move(pipeline)),
        options_(checked(options)),
        pool_({options.threads}),
        free_(options_.ahead + 1),
        ready_(options_.ahead + 1) {
    buffers_.reserve(options_.ahead + 1);
    for (std::size_t b = 0; b <= options_.ahead; ++b) {
      buffers_.emplace_back(new float[options_.batch * sample_size]());
      free_.push(buffers_.back().get());
    }
    coordinator_ = std::thread([this] { coordinate(); });
  }
  batch_prefetch(const batch_prefetch&) = delete;
  batch_prefetch& operator=(const batch_prefetch&) = delete;
  /// Stops after the step in progress (if any) and joins the threads; steps not taken are dropped.
  ~batch_prefetch() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    work_ready_.notify_all();
    free_.close();
    ready_.close();
    coordinator_.join();
  }

  /// Queues one step: `items` (slots below options.batch, each at most once) are decoded into
  /// one batch of `samples` samples (default: the number of items). The bytes must stay
  /// valid until that batch is handed out by next(); `keep` (if any) is held until then.
  /// Never blocks: memory is bounded by the batch buffers, not by the steps queued.
  /// Throws: loom::invalid_argument when a slot is out of range.
  void submit(std::vector<decode_item> items, std::shared_ptr<const void> keep = {}, std::size_t samples = 0) {
    for (const decode_item& it : items)
      if (it.slot >= options_.batch)
        throw invalid_argument("loom::data::batch_prefetch::submit: slot " + std::to_string(it.slot) +
                               " is out of range: expected slots below the batch size " + std::to_string(options_.batch));
    const std::size_t n = samples ? samples : items.size();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      work_.push_back({std::move(items), std::move(keep), std::min(n, options_.batch), submitted_++});
    }
    work_ready_.notify_one();
  }

  /// The next step's batch, in submission order, waiting until it is decoded. The previous
  /// batch returned is given back to be filled again.
  /// Throws: bad_sample (a bad_image) for the first sample of the step that failed, naming it;
  /// what else a pipeline threw, as it threw it; loom::invalid_argument when no step is
  /// queued (more next() than submit()).
  batch next() {
    if (held_) {
      free_.push(held_);
      held_ = nullptr;
      held_keep_.reset();
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (taken_ == submitted_)
        throw invalid_argument("loom::data::batch_prefetch::next: no step queued: expected a submit() for step " +
                               std::to_string(taken_) + " first");
      ++taken_;
    }
    std::optional<result> r = ready_.pop();
    if (!r) throw invalid_argument("loom::data::batch_prefetch::next: the prefetcher is shutting down");
    if (r->error) {
      free_.push(r->buffer);
      std::rethrow_exception(r->error);
    }
    held_ = r->buffer;
    held_keep_ = std::move(r->keep);
    return {r->buffer, r->samples, r->step};
  }

  /// Seconds next() spent waiting for a batch, summed: the consumer's starvation.
  double wait_seconds() const { return ready_.wait_seconds(); }

  /// Bytes the prefetcher holds: its ahead + 1 batch buffers and its threads' decoding scratch.
  std::size_t memory_bytes() const noexcept {
    return buffers_.size() * options_.batch * sample_size * sizeof(float) + pool_.scratch_bytes();
  }

  /// Decoding threads in all.
  int threads() const noexcept { return pool_.threads(); }
  const prefetch_options& options() const noexcept { return options_; }

 private:
  struct step_work {
    std::vector<decode_item> items;
    std::shared_ptr<const void> keep;
    std::size_t samples = 0, step = 0;
  };
  struct result {
    float* buffer = nullptr;
    std::size_t samples = 0, step = 0;
    std::shared_ptr<const void> keep;
    std::exception_ptr error;
  };

  static prefetch_options checked(prefetch_options o) {
    if (o.batch == 0 || o.ahead == 0)
      throw invalid_argument("loom::data::batch_prefetch: expected a batch and an `ahead` of at least 1, found batch " +
                             std::to_string(o.batch) + ", ahead " + std::to_string(o.ahead));
    return o;
  }

  void coordinate() {
    loom::detail::shield_this_thread_for_good();
    for (;;) {
      step_work w;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        work_ready_.wait(lock, [&] { return stop_ || !work_.empty(); });
        if (stop_) return;
        w = std::move(work_.front());
        work_.pop_front();
      }
      std::optional<float*> buffer = free_.pop();
      if (!buffer) return;  // closed: shutting down
      result r{*buffer, w.samples, w.step, std::move(w.keep), nullptr};
      try {
        pool_.run(w.items.size(), [&](std::size_t i) {
          const decode_item& it = w.items[i];
          try {
            pipeline_(it.encoded, it.key, r.buffer + it.slot * sample_size);
          } catch (const bad_image& e) {
            throw bad_sample("loom: sample " + std::to_string(it.key.index) + " (epoch " + std::to_string(it.key.epoch) +
                                 ", seed " + std::to_string(it.key.seed) + ") in slot " + std::to_string(it.slot) +
                                 " of step " + std::to_string(w.step) + ": " + e.what(),
                             it.key, it.slot, w.step);
          }
        });
      } catch (...) {
        r.error = std::current_exception();
      }
      if (!ready_.push(std::move(r))) return;
    }
  }

  Pipeline pipeline_;
  prefetch_options options_;
  decode_pool pool_;
  std::vector<std::unique_ptr<float[]>> buffers_;
  bounded_queue<float*> free_;
  bounded_queue<result> ready_;
  std::mutex mutex_;
  std::condition_variable work_ready_;
  std::deque<step_work> work_;
  bool stop_ = false;
  std::size_t submitted_ = 0, taken_ = 0;
  float* held_ = nullptr;
  std::shared_ptr<const void> held_keep_;
  std::thread coordinator_;
};

}  // namespace loom::data
