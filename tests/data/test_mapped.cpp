// SPDX-License-Identifier: Apache-2.0
// Tests of loom::data::mapped_images: the same samples and the same error messages as
// labelled_images for the same files, the decompression cache (reuse, re-creation, concurrency,
// failures), and that a mapped set faults in only the pages of the samples it reads.

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <typeinfo>
#include <utility>
#include <vector>

#include "loom/data/dataset.hpp"
#include "loom/data/mapped.hpp"
#include "test_files.hpp"

using Catch::Matchers::Contains;
using loom_test::idx_bytes;
using loom_test::idx_ubyte;
using loom_test::some_bytes;
using loom_test::temp_dir;
using loom_test::write_gz;
using loom_test::write_raw;

namespace {

using memory_set = loom::data::labelled_images<loom::shape<1, 5, 4>, 10>;
using mapped_set = loom::data::mapped_images<loom::shape<1, 5, 4>, 10>;

/// How a call ended: "ok", or the exception's dynamic type and message.
struct outcome {
  std::string kind = "ok";
  std::string message;
  bool operator==(const outcome&) const = default;
};

template <class F>
outcome run(F&& f) {
  try {
    f();
    return {};
  } catch (const loom::error& e) {
    return {typeid(e).name(), e.what()};
  }
}

/// Opens (images, labels) both in memory and mapped; checks both fail alike (same exception
/// type, same message) or both succeed with the same samples. Returns the common outcome.
outcome check_same_as_in_memory(const std::filesystem::path& images,
                                const std::filesystem::path& labels,
                                const std::filesystem::path& cache) {
  std::optional<memory_set> a;
  std::optional<mapped_set> b;
  const outcome in_memory = run([&] { a.emplace(memory_set::from_idx(images, labels)); });
  const outcome mapped = run([&] { b.emplace(mapped_set::from_idx(images, labels, {}, cache)); });
  INFO("images " << images << ", labels " << labels);
  CHECK(mapped == in_memory);
  if (a && b) {
    REQUIRE(a->size() == b->size());
    for (std::size_t i = 0; i < a->size(); ++i) {
      CHECK(a->label(i) == b->label(i));
      CHECK(std::memcmp(a->pixels(i), b->pixels(i), 20) == 0);
    }
  }
  return mapped;
}

/// A fresh file name for every write: cached copies are keyed by name, size and mtime, and a
/// rewrite within one timestamp tick with the same size would not be noticed (as documented).
std::filesystem::path fresh(const temp_dir& dir, const std::string& name) {
  static int counter = 0;
  return dir / (name + "-" + std::to_string(++counter));
}

long long mtime_ns(const std::filesystem::path& file) {
  struct ::stat st {};
  REQUIRE(::stat(file.c_str(), &st) == 0);
  return static_cast<long long>(st.st_mtim.tv_sec) * 1000000000LL + st.st_mtim.tv_nsec;
}

/// The files of a directory, but the cache's stamps (COPY.stamp, checked in test_cache.cpp).
std::vector<std::string> files_in(const std::filesystem::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.size() > 6 && name.compare(name.size() - 6, 6, ".stamp") == 0) continue;
    out.push_back(name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

/// Sets an environment variable for one scope, restoring the old value after.
class scoped_env {
 public:
  scoped_env(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  scoped_env(const scoped_env&) = delete;
  scoped_env& operator=(const scoped_env&) = delete;
  ~scoped_env() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

}  // namespace

TEST_CASE("A mapped set reads the pixels and labels of raw and gzip'd files as labelled_images",
          "[data][mapped]") {
  temp_dir dir;
  temp_dir cache;
  const auto pixels = some_bytes(7 * 20);
  const std::vector<std::uint8_t> labels{4, 0, 9, 1, 1, 2, 3};
  for (bool gz_images : {false, true}) {
    for (bool gz_labels : {false, true}) {
      const auto images =
          (gz_images ? write_gz : write_raw)(fresh(dir, "img"), idx_ubyte({7, 5, 4}, pixels));
      const auto label_file =
          (gz_labels ? write_gz : write_raw)(fresh(dir, "lab"), idx_ubyte({7}, labels));
      CHECK(check_same_as_in_memory(images, label_file, cache.path()).kind == "ok");
      const auto set = mapped_set::from_idx(images, label_file, {}, cache.path());
      CHECK(set.size() == 7);
      CHECK_THAT(set.description(), Contains(images.string()) && Contains(label_file.string()));
      if (gz_images) {
        CHECK(set.file().parent_path() == cache.path());
        CHECK_THAT(set.description(), Contains("mapped from " + set.file().string()));
      } else {
        CHECK(set.file() == images);  // mapped where it lies, no copy
      }
    }
  }
  STATIC_REQUIRE(mapped_set::classes == 10);
  STATIC_REQUIRE(std::is_same_v<mapped_set::sample_shape, loom::shape<1, 5, 4>>);
  STATIC_REQUIRE_FALSE(std::is_copy_constructible_v<mapped_set>);
  STATIC_REQUIRE(std::is_nothrow_move_constructible_v<mapped_set>);
}

TEST_CASE("Every bad images file fails for mapped_images with labelled_images's message",
          "[data][mapped]") {
  temp_dir dir;
  temp_dir cache;
  const auto labels = write_raw(dir / "labels", idx_ubyte({3}, {1, 2, 3}));
  const auto check = [&](const std::vector<std::uint8_t>& bytes, bool gz) {
    const auto file = (gz ? write_gz : write_raw)(fresh(dir, "images"), bytes);
    const outcome o = check_same_as_in_memory(file, labels, cache.path());
    CHECK(o.kind != "ok");
    CHECK_THAT(o.message, Contains(file.string()));
    return o.message;
  };
  for (bool gz : {false, true}) {
    const std::string after = gz ? " after decompression" : "";
    CHECK_THAT(check(idx_bytes(0x12345678u, {1, 1, 1}, {0}), gz),
               Contains("wrong magic number: expected 0x00000802..0x000008FF (unsigned bytes, 2 "
                        "or more dimensions), found 0x12345678"));
    CHECK_THAT(check(idx_ubyte({3}, {1, 2, 3}), gz), Contains("found 0x00000801"));
    CHECK_THAT(check(idx_bytes(0x00000D02u, {1, 1}, {0, 0, 0, 0}), gz),
               Contains("found 0x00000D02 (32-bit floats, 2 dimensions)"));
    CHECK_THAT(check(idx_ubyte({60, 28, 28}, some_bytes(1234)), gz),
               Contains("file is truncated: header promises 60 x 28 x 28 = 47040 bytes of data, "
                        "found 1234" +
                        after));
    CHECK_THAT(check(idx_ubyte({0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu}, {1, 2}), gz),
               Contains("header promises 4294967295 x 4294967295 x 4294967295 bytes of data: "
                        "expected a size that fits in memory"));
    CHECK_THAT(check(idx_ubyte({0x7FFFFFFFu, 0xFFFFFFFFu}, {1, 2}), gz),
               Contains("= 9223372030412324865 bytes of data, found 2" + after));
    auto trailing = idx_ubyte({3, 5, 4}, some_bytes(60));
    trailing.insert(trailing.end(), 10, 0x42);
    CHECK_THAT(check(trailing, gz),
               Contains("10 unexpected bytes after the data" + after +
                        ": expected exactly 3 x 5 x 4 = 60 bytes after the 16-byte header"));
    CHECK_THAT(check({}, gz), Contains("file is empty: expected an IDX file starting with the "
                                       "magic number 0x00000802..0x000008FF") &&
                                  Contains("found 0 bytes" + after));
    const auto header = idx_ubyte({60000, 28, 28}, {});
    CHECK_THAT(check({header.begin(), header.begin() + 2}, gz),
               Contains("expected a 4-byte magic number") && Contains("found 2 bytes" + after));
    CHECK_THAT(check({header.begin(), header.begin() + 9}, gz),
               Contains("expected a 16-byte header (magic number and 3 dimensions), found 9 "
                        "bytes" +
                        after));
    CHECK_THAT(
        check(header, gz),
        Contains("header promises 60000 x 28 x 28 = 47040000 bytes of data, found 0" + after));
    CHECK_THAT(check(idx_ubyte({3, 4, 4}, some_bytes(48)), gz),
               Contains("wrong image size: expected 20 bytes per image for sample shape (1, 5, "
                        "4), found images of 4 x 4 = 16 bytes"));
    CHECK_THAT(check(idx_ubyte({2, 5, 4}, some_bytes(40)), gz),
               Contains("holds 2 images but labels file " + labels.string() + " holds 3 labels"));
  }
}

TEST_CASE("Missing, unreadable and corrupt gzip'd images fail as for labelled_images",
          "[data][mapped]") {
  temp_dir dir;
  temp_dir cache;
  const auto labels = write_raw(dir / "labels", idx_ubyte({3}, {1, 2, 3}));
  const auto missing = dir / "nowhere";
  CHECK_THAT(check_same_as_in_memory(missing, labels, cache.path()).message,
             Contains(missing.string()) && Contains("cannot open: No such file or directory"));
  CHECK_THAT(check_same_as_in_memory(dir.path(), labels, cache.path()).message,
             Contains(dir.path().string()) && Contains("Is a directory"));

  const auto good =
      loom_test::read_bytes(write_gz(dir / "good.gz", idx_ubyte({3, 5, 4}, some_bytes(60))));
  REQUIRE(good.size() > 18);
  auto block = good;
  block[10] = 0x07;
  auto crc = good;
  crc[crc.size() - 8] ^= 0xFF;
  const std::vector<std::uint8_t> cut(good.begin(), good.end() - 5);
  auto garbage = good;
  garbage.push_back(0x00);
  garbage.push_back(0x42);
  for (const auto& [bytes, text] :
       {std::pair{block, "corrupt gzip stream: invalid block type"},
        std::pair{crc, "corrupt gzip stream: incorrect data check"},
        std::pair{cut, "gzip stream is truncated"}, std::pair{garbage, "corrupt gzip stream"}}) {
    const auto file = write_raw(fresh(dir, "images.gz"), bytes);
    const outcome o = check_same_as_in_memory(file, labels, cache.path());
    CHECK(o.kind == typeid(loom::data_error).name());
    CHECK_THAT(o.message, Contains(file.string()) && Contains(text));
  }
  CHECK(files_in(cache.path()).empty());  // no copy and no temporary file is left behind
}

TEST_CASE("Bad labels files fail for mapped_images with labelled_images's message",
          "[data][mapped]") {
  temp_dir dir;
  temp_dir cache;
  const auto images = write_raw(dir / "images", idx_ubyte({3, 5, 4}, some_bytes(60)));
  const auto out_of_range = write_raw(dir / "l1", idx_ubyte({3}, {1, 12, 3}));
  CHECK_THAT(check_same_as_in_memory(images, out_of_range, cache.path()).message,
             Contains(out_of_range.string()) &&
                 Contains("label 12 at index 1 is out of range: expected 0..9"));
  const auto two_d = write_gz(dir / "l2.gz", idx_ubyte({3, 1}, {1, 2, 3}));
  CHECK_THAT(check_same_as_in_memory(images, two_d, cache.path()).message,
             Contains("expected 0x00000801 (unsigned bytes, 1 dimension), found 0x00000802"));
  const auto fewer = write_raw(dir / "l3", idx_ubyte({2}, {1, 2}));
  CHECK_THAT(check_same_as_in_memory(images, fewer, cache.path()).message,
             Contains("holds 3 images but labels file " + fewer.string() + " holds 2 labels"));
  const auto missing = dir / "l4";
  CHECK_THAT(check_same_as_in_memory(images, missing, cache.path()).message,
             Contains(missing.string()) && Contains("cannot open"));
}

TEST_CASE("Garbage, cut and mutated images files fail for mapped_images exactly as in memory",
          "[data][mapped]") {
  temp_dir dir;
  temp_dir cache;
  const auto labels = write_raw(dir / "labels", idx_ubyte({3}, {1, 2, 3}));
  const auto good_raw = idx_ubyte({3, 5, 4}, some_bytes(60, 3));
  const auto good_gz = loom_test::read_bytes(write_gz(dir / "good.gz", good_raw));
  std::vector<std::vector<std::uint8_t>> inputs;
  for (std::size_t n = 0; n <= good_raw.size() + 2; n += 3) {
    inputs.push_back(some_bytes(n, static_cast<std::uint32_t>(n) + 100));
    auto gz_magic = some_bytes(n, static_cast<std::uint32_t>(n) + 200);
    gz_magic.insert(gz_magic.begin(), {0x1F, 0x8B});
    inputs.push_back(gz_magic);
  }
  for (const auto* good : {&good_raw, &good_gz}) {
    for (std::size_t n = 0; n < good->size(); ++n)
      inputs.emplace_back(good->begin(), good->begin() + n);
    for (std::size_t i = 0; i < good->size(); ++i) {
      for (std::uint8_t flip : {0x01, 0x80, 0xFF}) {
        auto bad = *good;
        bad[i] ^= flip;
        inputs.push_back(bad);
      }
    }
  }
  std::size_t ok = 0;
  for (const auto& input : inputs) {
    ok +=
        check_same_as_in_memory(write_raw(fresh(dir, "fuzz"), input), labels, cache.path()).kind ==
        "ok";
  }
  CHECK(ok > 0);
  CHECK(ok < inputs.size());
}

TEST_CASE("A gzip'd source is decompressed once; later opens reuse the copy untouched",
          "[data][mapped]") {
  temp_dir dir;
  temp_dir cache;
  const auto pixels = some_bytes(4 * 20);
  const auto images = write_gz(dir / "train-images-idx3-ubyte.gz", idx_ubyte({4, 5, 4}, pixels));
  const auto labels = write_raw(dir / "labels", idx_ubyte({4}, {1, 2, 3, 4}));
  std::filesystem::path copy;
  long long stamp = 0;
  {
    const auto set = mapped_set::from_idx(images, labels, {}, cache.path());
    copy = set.file();
    stamp = mtime_ns(copy);
    CHECK(copy.parent_path() == cache.path());
    CHECK_THAT(copy.filename().string(), Catch::Matchers::StartsWith("train-images-idx3-ubyte."));
    CHECK(files_in(cache.path()) == std::vector<std::string>{copy.filename().string()});
    CHECK(std::filesystem::exists(loom::data::detail::stamp_path(copy)));
    CHECK(loom_test::read_bytes(copy) == idx_ubyte({4, 5, 4}, pixels));
  }
  for (int again = 0; again < 3; ++again) {
    const auto set = mapped_set::from_idx(images, labels, {}, cache.path());
    CHECK(set.file() == copy);
    CHECK(mtime_ns(copy) == stamp);  // not rewritten
    CHECK(std::memcmp(set.pixels(3), pixels.data() + 60, 20) == 0);
  }
  CHECK(files_in(cache.path()).size() == 1);

  // A changed source (another size, another mtime) gets a copy of its own.
  const auto pixels2 = some_bytes(5 * 20, 9);
  write_gz(images, idx_ubyte({5, 5, 4}, pixels2));
  const auto labels2 = write_raw(dir / "labels2", idx_ubyte({5}, {1, 2, 3, 4, 5}));
  const auto set2 = mapped_set::from_idx(images, labels2, {}, cache.path());
  CHECK(set2.file() != copy);
  CHECK(set2.size() == 5);
  CHECK(std::memcmp(set2.pixels(4), pixels2.data() + 80, 20) == 0);
  CHECK(files_in(cache.path()).size() == 2);
}

TEST_CASE("A bad copy left under the final name (a crash, a full disk) is re-created",
          "[data][mapped]") {
  temp_dir dir;
  temp_dir cache;
  const auto bytes = idx_ubyte({40, 5, 4}, some_bytes(800));
  const auto images = write_gz(dir / "images.gz", bytes);
  const auto labels = write_raw(dir / "labels", idx_ubyte({40}, std::vector<std::uint8_t>(40, 7)));
  const std::filesystem::path copy = mapped_set::from_idx(images, labels, {}, cache.path()).file();
  for (std::size_t keep : {std::size_t{0}, std::size_t{10}, std::size_t{16}, bytes.size() - 1}) {
    write_raw(copy, {bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(keep)});
    const auto set = mapped_set::from_idx(images, labels, {}, cache.path());
    CHECK(set.file() == copy);
    CHECK(loom_test::read_bytes(copy) == bytes);
    CHECK(std::memcmp(set.pixels(39), bytes.data() + 16 + 39 * 20, 20) == 0);
  }
  auto longer = bytes;
  longer.push_back(0);
  write_raw(copy, longer);
  CHECK(mapped_set::from_idx(images, labels, {}, cache.path()).size() == 40);
  CHECK(loom_test::read_bytes(copy) == bytes);
  CHECK(files_in(cache.path()).size() == 1);
}

TEST_CASE("Processes opening one gzip'd source at once all get a good copy, and one is kept",
          "[data][mapped]") {
  temp_dir dir;
  temp_dir cache;
  const auto bytes = idx_ubyte({3000, 5, 4}, some_bytes(60000, 5));
  const auto images = write_gz(dir / "images.gz", bytes);
  const auto labels =
      write_raw(dir / "labels", idx_ubyte({3000}, std::vector<std::uint8_t>(3000, 3)));
  std::vector<pid_t> children;
  for (int i = 0; i < 6; ++i) {
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      int status = 1;
      try {
        const auto set = mapped_set::from_idx(images, labels, {}, cache.path());
        status =
            set.size() == 3000 && std::memcmp(set.pixels(0), bytes.data() + 16, 60000) == 0 ? 0 : 2;
      } catch (...) {
        status = 3;
      }
      ::_exit(status);
    }
    children.push_back(pid);
  }
  for (const pid_t pid : children) {
    int status = -1;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
  const auto left = files_in(cache.path());
  REQUIRE(left.size() == 1);  // one copy, no temporary files
  CHECK(loom_test::read_bytes(cache.path() / left[0]) == bytes);
}

TEST_CASE("A cache directory that cannot be made is reported, and the images decompressed into memory",
          "[data][mapped]") {
  temp_dir dir;
  const auto pixels = some_bytes(60);
  const auto images = write_gz(dir / "images.gz", idx_ubyte({3, 5, 4}, pixels));
  const auto labels = write_raw(dir / "labels", idx_ubyte({3}, {1, 2, 3}));
  const auto blocker = write_raw(dir / "a-file", {1});
  const auto cache = blocker / "cache";
  std::fflush(stderr);
  char name[] = "/tmp/loom-test-stderr-XXXXXX";
  const int fd = ::mkstemp(name);
  const int saved = ::dup(2);
  ::dup2(fd, 2);
  std::optional<mapped_set> set;
  const outcome o = run([&] { set.emplace(mapped_set::from_idx(images, labels, {}, cache)); });
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  ::close(fd);
  std::string msg = loom_test::read_text(name);
  ::unlink(name);
  REQUIRE(o.kind == "ok");
  CHECK(set->file() == images);
  CHECK_THAT(set->description(), Contains("decompressed into memory"));
  CHECK(std::memcmp(set->pixels(2), pixels.data() + 40, 20) == 0);
  CHECK(set->label(2) == 3);
  CHECK_THAT(msg, Contains("loom: warning: not using the cache directory " + cache.string()));
  CHECK_THAT(msg, Contains("cannot create cache directory " + cache.string()));
  CHECK_THAT(msg, Contains(images.string()));
  CHECK_THAT(msg, Contains("LOOM_CACHE_DIR"));
}

TEST_CASE("The default cache directory follows LOOM_CACHE_DIR, XDG_CACHE_HOME, HOME, /tmp",
          "[data][mapped]") {
  {
    scoped_env a("LOOM_CACHE_DIR", "/c/loom");
    scoped_env b("XDG_CACHE_HOME", "/x");
    CHECK(loom::data::default_cache_dir() == "/c/loom");
  }
  {
    scoped_env a("LOOM_CACHE_DIR", "");
    scoped_env b("XDG_CACHE_HOME", "/x");
    CHECK(loom::data::default_cache_dir() == "/x/loom");
  }
  {
    scoped_env a("LOOM_CACHE_DIR", nullptr);
    scoped_env b("XDG_CACHE_HOME", nullptr);
    scoped_env c("HOME", "/home/u");
    CHECK(loom::data::default_cache_dir() == "/home/u/.cache/loom");
  }
  {
    scoped_env a("LOOM_CACHE_DIR", nullptr);
    scoped_env b("XDG_CACHE_HOME", nullptr);
    scoped_env c("HOME", nullptr);
    CHECK(loom::data::default_cache_dir() == "/tmp/loom-cache-" + std::to_string(::getuid()));
  }
  temp_dir dir;
  temp_dir cache;
  scoped_env env("LOOM_CACHE_DIR", cache.path().c_str());
  const auto images = write_gz(dir / "images.gz", idx_ubyte({3, 5, 4}, some_bytes(60)));
  const auto labels = write_raw(dir / "labels", idx_ubyte({3}, {1, 2, 3}));
  CHECK(mapped_set::from_idx(images, labels).file().parent_path() == cache.path());
}

TEST_CASE("first(n) is a view that shares the mapping and outlives its set", "[data][mapped]") {
  temp_dir dir;
  const auto pixels = some_bytes(4 * 20);
  const auto images = write_raw(dir / "images", idx_ubyte({4, 5, 4}, pixels));
  const auto labels = write_raw(dir / "labels", idx_ubyte({4}, {3, 1, 4, 1}));
  std::optional<mapped_set> set(mapped_set::from_idx(images, labels, "four"));
  const mapped_set two = set->first(2);
  CHECK(two.pixels(0) == set->pixels(0));  // nothing copied
  CHECK_THAT(two.description(), Contains("four") && Contains("first 2"));
  CHECK_THROWS_AS(set->first(5), loom::invalid_argument);
  CHECK_THROWS_WITH(set->first(5), Contains("first(5)") && Contains("at most 4"));
  CHECK(set->first(0).size() == 0);
  mapped_set moved = std::move(*set);
  CHECK(set->size() == 0);  // NOLINT(bugprone-use-after-move): a moved-from set is empty
  CHECK(moved.size() == 4);
  set.reset();
  { const mapped_set gone = std::move(moved); }
  REQUIRE(two.size() == 2);
  CHECK(two.label(1) == 1);
  CHECK(std::memcmp(two.pixels(1), pixels.data() + 20, 20) == 0);
}

TEST_CASE("The mapped Fashion-MNIST test split equals the one read into memory", "[data][mapped]") {
  const std::filesystem::path src = loom::data::default_fashion_mnist_dir;
  if (!std::filesystem::exists(src / "t10k-images-idx3-ubyte.gz")) {
    WARN("skipped: " << src << " holds no t10k-images-idx3-ubyte.gz");
    return;
  }
  temp_dir cache;
  const auto in_memory = loom::data::fashion_mnist(src, loom::data::split::test);
  std::filesystem::path copy;
  long long stamp = 0;
  {
    const auto mapped =
        loom::data::mapped_fashion_mnist(src, loom::data::split::test, cache.path());
    REQUIRE(mapped.size() == 10000);
    REQUIRE(mapped.size() == in_memory.size());
    for (std::size_t i = 0; i < mapped.size(); ++i) {
      if (mapped.label(i) != in_memory.label(i) ||
          std::memcmp(mapped.pixels(i), in_memory.pixels(i), 784) != 0) {
        FAIL("sample " << i << " differs");
      }
    }
    CHECK_THAT(mapped.description(), Contains("Fashion-MNIST test split") &&
                                         Contains("mapped from " + cache.path().string()));
    copy = mapped.file();
    stamp = mtime_ns(copy);
    CHECK(copy.parent_path() == cache.path());
    CHECK(std::filesystem::file_size(copy) == 16 + 10000 * 784);
  }
  const auto again = loom::data::mapped_fashion_mnist(src, loom::data::split::test, cache.path());
  CHECK(again.file() == copy);
  CHECK(mtime_ns(copy) == stamp);
  CHECK(files_in(cache.path()).size() == 1);
  CHECK(std::memcmp(again.pixels(9999), in_memory.pixels(9999), 784) == 0);

  // A directory holding the uncompressed files is mapped in place; the cache is not touched.
  temp_dir raw;
  std::filesystem::copy_file(copy, raw / "t10k-images-idx3-ubyte");
  std::filesystem::copy_file(src / "t10k-labels-idx1-ubyte.gz", raw / "t10k-labels-idx1-ubyte.gz");
  const auto unused_cache = raw / "no-cache-here";
  const auto in_place =
      loom::data::mapped_fashion_mnist(raw.path(), loom::data::split::test, unused_cache);
  CHECK(in_place.file() == raw / "t10k-images-idx3-ubyte");
  CHECK_FALSE(std::filesystem::exists(unused_cache));
  CHECK(std::memcmp(in_place.pixels(1234), in_memory.pixels(1234), 784) == 0);
  CHECK_THROWS_WITH(loom::data::mapped_fashion_mnist(raw.path(), loom::data::split::train),
                    Contains((raw / "train-images-idx3-ubyte").string()) &&
                        Contains((raw / "train-images-idx3-ubyte.gz").string()) &&
                        Contains("apt-get install dataset-fashion-mnist"));
}

TEST_CASE("A mapped set faults in only the pages of the samples it reads", "[data][mapped]") {
  temp_dir dir;
  using set_type = loom::data::mapped_fashion_mnist_set;
  const std::uint32_t n = 10000;  // 7.8 MB, about 1900 pages of 4 KiB
  const auto images =
      write_raw(dir / "images", idx_ubyte({n, 28, 28}, some_bytes(std::size_t{n} * 784)));
  const auto labels = write_raw(dir / "labels", idx_ubyte({n}, std::vector<std::uint8_t>(n, 1)));
  {
    const int fd = ::open(images.c_str(), O_RDONLY);
    REQUIRE(fd >= 0);
    REQUIRE(::fsync(fd) == 0);  // clean pages can be dropped
    REQUIRE(::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0);
    ::close(fd);
  }
  const auto set = set_type::from_idx(images, labels);
  const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<std::uintptr_t>(set.pixels(0)) & ~(page - 1);
  const auto end = reinterpret_cast<std::uintptr_t>(set.pixels(n - 1) + 784);
  const std::size_t pages = (end - begin + page - 1) / page;
  const auto resident = [&] {
    std::vector<unsigned char> vec(pages);
    REQUIRE(::mincore(reinterpret_cast<void*>(begin), end - begin, vec.data()) == 0);
    std::size_t count = 0;
    for (unsigned char v : vec) count += v & 1u;
    return count;
  };
  const std::size_t before = resident();
  if (before > pages / 10) {
    WARN(
        "skipped: " << before << " of " << pages
                    << " pages stayed cached after "
                       "POSIX_FADV_DONTNEED on this file system; residency cannot be checked here");
    return;
  }
  unsigned sum = 0;
  for (std::size_t i : {std::size_t{5000}, std::size_t{7000}, std::size_t{9000}}) {
    for (std::size_t j = 0; j < 784; ++j) sum += set.pixels(i)[j];
  }
  CHECK(sum > 0);
  const std::size_t after = resident();
  INFO(before << " pages resident before reading 3 samples, " << after << " after, of " << pages);
  CHECK(after >= before + 3);
  CHECK(after <= before + 3 * 2 + 4);  // each sample spans at most 2 pages; no read-ahead
}
