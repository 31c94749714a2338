// SPDX-License-Identifier: Apache-2.0
// Decoding threads (loom/data/decode_pool.hpp): decode_pool runs every job once and reports the
// lowest failing one; bounded_queue blocks, closes, reopens and measures the consumer's wait;
// batch_prefetch hands out batches in submission order, bit for bit the same with 1, 2 or 4
// threads, within its memory bound, names a bad sample, and shuts down cleanly whatever its
// threads are doing.

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "error_message.hpp"
#include "image_files.hpp"
#include "loom/data/decode_pool.hpp"
#include "loom/data/image_pipeline.hpp"

using namespace loom::data;
using loom::testing::error_message;
using loom_test::bytes;
using loom_test::view;
using Catch::Matchers::Contains;
using namespace std::chrono_literals;

TEST_CASE("decode_pool runs every job once, on its threads and the caller's", "[data][image][pool]") {
  for (int threads : {1, 2, 4}) {
    decode_pool pool({threads});
    CHECK(pool.threads() == threads);
    for (std::size_t n : {0u, 1u, 3u, 100u}) {
      std::vector<std::atomic<int>> hits(n);
      pool.run(n, [&](std::size_t i) { ++hits[i]; });
      for (std::size_t i = 0; i < n; ++i) REQUIRE(hits[i] == 1);
    }
  }
  decode_pool pool({3});
  std::mutex m;
  std::set<std::thread::id> seen;
  pool.run(60, [&](std::size_t) {
    std::this_thread::sleep_for(1ms);
    std::lock_guard<std::mutex> lock(m);
    seen.insert(std::this_thread::get_id());
  });
  CHECK(seen.size() >= 2);
  CHECK(seen.size() <= 3);
}

TEST_CASE("decode_pool rethrows the lowest failing job's exception after all jobs ran, and goes on", "[data][image][pool]") {
  decode_pool pool({4});
  std::atomic<int> ran{0};
  CHECK_THAT(error_message<std::runtime_error>([&] {
               pool.run(50, [&](std::size_t i) {
                 ++ran;
                 if (i == 31 || i == 7 || i == 44) throw std::runtime_error("job " + std::to_string(i));
               });
             }),
             Contains("job 7"));
  CHECK(ran == 50);
  ran = 0;
  pool.run(10, [&](std::size_t) { ++ran; });
  CHECK(ran == 10);
  CHECK_THROWS_AS(decode_pool({-1}), loom::invalid_argument);
}

TEST_CASE("The default decoding threads are the cores the ranks' compute pools leave free, at least 1", "[data][image][pool]") {
  const int d = default_decode_threads();
  CHECK(d >= 1);
  CHECK(d == std::max(1, (loom::available_cores() - loom::local_ranks() * loom::threads()) / loom::local_ranks()));
  decode_pool pool;
  CHECK(pool.threads() == d);
}

TEST_CASE("bounded_queue blocks when full and empty, closes, reopens and measures the consumer's wait", "[data][image][pool]") {
  bounded_queue<int> q(2);
  CHECK(q.push(1));
  CHECK(q.push(2));
  std::atomic<bool> pushed{false};
  std::thread producer([&] {
    q.push(3);  // blocks until a pop makes room
    pushed = true;
  });
  std::this_thread::sleep_for(30ms);
  CHECK_FALSE(pushed);
  CHECK(q.pop() == 1);
  producer.join();
  CHECK(pushed);
  CHECK(q.pop() == 2);
  CHECK(q.pop() == 3);
  const double before = q.wait_seconds();
  std::thread late([&] {
    std::this_thread::sleep_for(50ms);
    q.push(4);
  });
  CHECK(q.pop() == 4);  // waits about 50 ms
  late.join();
  CHECK(q.wait_seconds() - before > 0.03);
  q.push(5);
  q.close();
  CHECK_FALSE(q.push(6));
  CHECK(q.pop() == 5);  // what is left, then nothing
  CHECK_FALSE(q.pop().has_value());
  q.reopen();
  CHECK(q.size() == 0);
  CHECK(q.push(7));
  CHECK(q.pop() == 7);
  // close() wakes a consumer waiting on an empty queue.
  std::thread closer([&] {
    std::this_thread::sleep_for(20ms);
    q.close();
  });
  CHECK_FALSE(q.pop().has_value());
  closer.join();
}

namespace {

// A pipeline for the pool's tests: writes (index, epoch) to its sample after a delay that
// varies by sample, counts the calls under way, and fails on request.
struct slow_pipeline {
  using output_shape = loom::shape<2>;
  std::atomic<int>* active = nullptr;
  std::atomic<int>* most = nullptr;
  void operator()(std::span<const std::byte> b, const sample_key& k, float* out) const {
    if (active) {
      const int now = ++*active;
      int m = most->load();
      while (now > m && !most->compare_exchange_weak(m, now)) {
      }
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100 * ((k.index * 7919) % 13)));
    if (active) --*active;
    if (!b.empty() && b[0] == std::byte{'!'}) throw bad_image("the bytes start with '!'");
    if (!b.empty() && b[0] == std::byte{'?'}) throw std::logic_error("not an image error");
    out[0] = static_cast<float>(k.index);
    out[1] = static_cast<float>(k.epoch);
  }
};

std::vector<decode_item> step_items(std::size_t step, std::size_t batch, const bytes& b) {
  std::vector<decode_item> items;
  for (std::size_t s = 0; s < batch; ++s) items.push_back({view(b), {1, step, step * batch + s}, batch - 1 - s});
  return items;
}

}  // namespace

TEST_CASE("batch_prefetch hands out batches in submission order, each sample in its slot", "[data][image][pool]") {
  const bytes ok = {std::byte{'o'}};
  for (int threads : {1, 3}) {
    batch_prefetch<slow_pipeline> pf(slow_pipeline{}, {.batch = 8, .ahead = 2, .threads = threads});
    CHECK(pf.threads() == threads);
    for (std::size_t step = 0; step < 3; ++step) pf.submit(step_items(step, 8, ok));
    for (std::size_t step = 0; step < 12; ++step) {
      if (step + 3 < 12) pf.submit(step_items(step + 3, 8, ok));
      const auto b = pf.next();
      REQUIRE(b.step == step);
      REQUIRE(b.samples == 8);
      for (std::size_t s = 0; s < 8; ++s) {
        REQUIRE(b.data[2 * (7 - s)] == static_cast<float>(step * 8 + s));  // slot 7 - s
        REQUIRE(b.data[2 * (7 - s) + 1] == static_cast<float>(step));
      }
    }
    CHECK_THROWS_AS(pf.next(), loom::invalid_argument);  // more next() than submit()
  }
}

TEST_CASE("batch_prefetch's memory is bounded: its buffers, and at most `ahead` steps decoded ahead", "[data][image][pool]") {
  std::atomic<int> active{0}, most{0};
  const bytes ok = {std::byte{'o'}};
  batch_prefetch<slow_pipeline> pf(slow_pipeline{&active, &most}, {.batch = 4, .ahead = 2, .threads = 2});
  // 20 steps queued at once: only the batch buffers are filled, the rest waits.
  for (std::size_t step = 0; step < 20; ++step) pf.submit(step_items(step, 4, ok));
  std::this_thread::sleep_for(100ms);
  // ahead + 1 = 3 buffers: no more than 3 steps can be decoded before the consumer takes one.
  CHECK(pf.memory_bytes() >= 3 * 4 * 2 * sizeof(float));
  CHECK(pf.memory_bytes() == 3 * 4 * 2 * sizeof(float) + 0);  // this pipeline keeps no scratch
  for (std::size_t step = 0; step < 20; ++step) CHECK(pf.next().step == step);
  CHECK(most <= 2);  // never more calls at once than threads
  CHECK(pf.wait_seconds() > 0);  // the consumer outran the decoding: its wait is measured
}

TEST_CASE("A real pipeline's batches are bit for bit the same with 1, 2 and 4 threads", "[data][image][pool]") {
  std::vector<bytes> files;
  for (std::uint64_t i = 0; i < 24; ++i)
    files.push_back(i % 3 == 2 ? loom_test::png_of(loom_test::photo_pixels(90 + i, 70, 3, i), 90 + i, 70, 3)
                               : loom_test::photo_jpeg(120 + 3 * i, 100 + 2 * i, 100 + i));
  using P = image_pipeline<rgb, random_resized_crop<48>, flip, imagenet_normalize>;
  auto run = [&](int threads) {
    batch_prefetch<P> pf(P{}, {.batch = 8, .ahead = 2, .threads = threads});
    std::vector<float> all;
    for (std::size_t step = 0; step < 6; ++step) {
      std::vector<decode_item> items;
      for (std::size_t s = 0; s < 8; ++s) {
        const std::size_t idx = (step * 5 + s * 3) % files.size();
        items.push_back({view(files[idx]), {42, step / 3, idx}, s});
      }
      pf.submit(std::move(items));
    }
    for (std::size_t step = 0; step < 6; ++step) {
      const auto b = pf.next();
      all.insert(all.end(), b.data, b.data + 8 * P::output_shape::size);
    }
    CHECK(pf.memory_bytes() > 3 * 8 * P::output_shape::size * sizeof(float));  // the scratch counts
    return all;
  };
  const auto one = run(1), two = run(2), four = run(4);
  CHECK(std::memcmp(one.data(), two.data(), one.size() * sizeof(float)) == 0);
  CHECK(std::memcmp(one.data(), four.data(), one.size() * sizeof(float)) == 0);
}

TEST_CASE("A bad sample reaches the consumer as a bad_sample naming it, other errors as thrown, and no thread dies",
          "[data][image][pool][errors]") {
  const bytes ok = {std::byte{'o'}}, bad = {std::byte{'!'}}, odd = {std::byte{'?'}};
  batch_prefetch<slow_pipeline> pf(slow_pipeline{}, {.batch = 4, .ahead = 2, .threads = 3});
  auto items = step_items(0, 4, ok);
  items[2].encoded = view(bad);
  pf.submit(items);
  auto other = step_items(1, 4, ok);
  other[0].encoded = view(odd);
  pf.submit(other);
  pf.submit(step_items(2, 4, ok));
  try {
    pf.next();
    FAIL("no exception");
  } catch (const bad_sample& e) {
    CHECK(e.key.index == 2);
    CHECK(e.slot == 1);
    CHECK(e.step == 0);
    CHECK_THAT(std::string(e.what()), Contains("loom: sample 2 (epoch 0, seed 1) in slot 1 of step 0: the bytes start with '!'"));
  }
  CHECK_THROWS_AS(pf.next(), std::logic_error);
  CHECK(pf.next().step == 2);  // and on it goes
}

TEST_CASE("batch_prefetch shuts down cleanly with steps queued, in progress or failed", "[data][image][pool]") {
  const bytes ok = {std::byte{'o'}}, odd = {std::byte{'?'}};
  for (int round = 0; round < 5; ++round) {
    batch_prefetch<slow_pipeline> pf(slow_pipeline{}, {.batch = 16, .ahead = 1, .threads = 2});
    for (std::size_t step = 0; step < 8; ++step) {
      auto items = step_items(step, 16, ok);
      if (step == 1) items[3].encoded = view(odd);
      pf.submit(items);
    }
    if (round % 2) pf.next();
    std::this_thread::sleep_for(std::chrono::milliseconds(round * 3));
  }  // destroyed while decoding, with a failed step queued: joins, nothing terminates
  SUCCEED();
}
