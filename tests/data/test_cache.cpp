// SPDX-License-Identifier: Apache-2.0
// Tests of loom's caches (loom/data/cache.hpp) as the IDX reader uses them: a copy is used only
// when its stamp matches the source and its own bytes, so a planted or stale copy is never
// trusted; a cache directory of another user, or one others can write, is refused with a
// warning and the data is read without it.

#include <catch2/catch.hpp>

#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "loom/data/cache.hpp"
#include "loom/data/mapped.hpp"
#include "shard_files.hpp"
#include "test_files.hpp"

namespace {

using Catch::Matchers::Contains;
using loom_test::idx_ubyte;
using loom_test::some_bytes;
using loom_test::temp_dir;
using loom_test::write_gz;
using loom_test::write_raw;
using mapped_set = loom::data::mapped_images<loom::shape<1, 5, 4>, 10>;
namespace fs = std::filesystem;

}  // namespace

TEST_CASE("A planted copy with a valid IDX header but other pixels is refused and made again",
          "[data][cache]") {
  temp_dir dir, cache;
  const auto pixels = some_bytes(4 * 20);
  const auto images = write_gz(dir / "images.gz", idx_ubyte({4, 5, 4}, pixels));
  const auto labels = write_raw(dir / "labels", idx_ubyte({4}, {1, 2, 3, 4}));
  const fs::path copy = mapped_set::from_idx(images, labels, {}, cache.path()).file();
  REQUIRE(copy.parent_path() == cache.path());
  const std::string stamp = loom_test::read_text(loom::data::detail::stamp_path(copy));
  CHECK_THAT(stamp, Contains("loom-cache-stamp 1\nsource_bytes " + std::to_string(fs::file_size(images))));
  CHECK((fs::status(copy).permissions() & fs::perms::all) == (fs::perms::owner_read | fs::perms::owner_write));

  // An IDX file of the same shape and size, other pixels: structurally valid, so the reader
  // before the stamps used it.
  const auto planted = some_bytes(4 * 20, 77);
  write_raw(copy, idx_ubyte({4, 5, 4}, planted));
  const auto set = mapped_set::from_idx(images, labels, {}, cache.path());
  CHECK(set.file() == copy);
  CHECK(std::memcmp(set.pixels(0), pixels.data(), 80) == 0);
  CHECK(loom_test::read_bytes(copy) == idx_ubyte({4, 5, 4}, pixels));

  // A planted stamp that does not describe the copy is refused too.
  write_raw(copy, idx_ubyte({4, 5, 4}, planted));
  loom::data::detail::write_stamp(copy, {loom::data::detail::checksum_file(images), {96, 12345}});
  CHECK(loom::data::detail::cached_copy_problem(copy, loom::data::detail::checksum_file(images)) != "");
  CHECK(std::memcmp(mapped_set::from_idx(images, labels, {}, cache.path()).pixels(3), pixels.data() + 60, 20) == 0);
}

TEST_CASE("A copy of a source that changed in place (same size, same mtime) is not used", "[data][cache]") {
  temp_dir dir, cache;
  const auto images = write_gz(dir / "images.gz", idx_ubyte({4, 5, 4}, some_bytes(80, 1)));
  const auto labels = write_raw(dir / "labels", idx_ubyte({4}, {1, 2, 3, 4}));
  const fs::path copy = mapped_set::from_idx(images, labels, {}, cache.path()).file();
  // Another source of the same compressed size, with the old modification time.
  const auto when = fs::last_write_time(images);
  const auto size = fs::file_size(images);
  std::vector<std::uint8_t> px2;
  for (std::uint32_t salt = 2;; ++salt) {
    px2 = some_bytes(80, salt);
    write_gz(images, idx_ubyte({4, 5, 4}, px2));
    if (fs::file_size(images) == size) break;
    REQUIRE(salt < 5000);
  }
  fs::last_write_time(images, when);
  const auto set = mapped_set::from_idx(images, labels, {}, cache.path());
  CHECK(set.file() == copy);  // the same name: path, size and mtime are the same
  CHECK(std::memcmp(set.pixels(0), px2.data(), 80) == 0);
}

TEST_CASE("A cache directory others can write is refused; the images are decompressed into memory",
          "[data][cache]") {
  temp_dir dir, parent;
  const auto pixels = some_bytes(60);
  const auto images = write_gz(dir / "images.gz", idx_ubyte({3, 5, 4}, pixels));
  const auto labels = write_raw(dir / "labels", idx_ubyte({3}, {1, 2, 3}));
  const fs::path cache = parent / "group-writable";
  fs::create_directory(cache);
  ::chmod(cache.c_str(), 0770);
  std::optional<mapped_set> set;
  const std::string err =
      loom_test::capture_stderr([&] { set.emplace(mapped_set::from_idx(images, labels, {}, cache)); });
  CHECK_THAT(err, Contains("not using the cache directory " + cache.string()) && Contains("has mode 0770"));
  CHECK(set->file() == images);
  CHECK(std::memcmp(set->pixels(0), pixels.data(), 60) == 0);
  CHECK(fs::is_empty(cache));
}

TEST_CASE("A cache directory owned by another user is refused, with what was planted in it", "[data][cache]") {
  if (::geteuid() != 0) {
    WARN("skipped: giving a directory to another user needs root");
    std::exit(77);
  }
  const ::passwd* nobody = ::getpwnam("nobody");
  const ::uid_t other = nobody ? nobody->pw_uid : 65534;
  temp_dir dir, parent;
  const auto pixels = some_bytes(60);
  const auto images = write_gz(dir / "images.gz", idx_ubyte({3, 5, 4}, pixels));
  const auto labels = write_raw(dir / "labels", idx_ubyte({3}, {1, 2, 3}));
  // The attacker's directory, with a copy and a stamp that match (they can compute both).
  const fs::path cache = parent / "loom-cache-0";
  fs::create_directory(cache);
  ::chmod(cache.c_str(), 0700);
  const fs::path honest = parent / "honest";
  const fs::path copy = cache / mapped_set::from_idx(images, labels, {}, honest).file().filename();
  const auto planted = idx_ubyte({3, 5, 4}, some_bytes(60, 99));
  write_raw(copy, planted);
  loom::data::detail::write_stamp(copy, {loom::data::detail::checksum_file(images),
                                         loom::data::detail::checksum_bytes(planted.data(), planted.size())});
  REQUIRE(::chown(copy.c_str(), other, other) == 0);
  REQUIRE(::chown(loom::data::detail::stamp_path(copy).c_str(), other, other) == 0);
  REQUIRE(::chown(cache.c_str(), other, other) == 0);
  std::optional<mapped_set> set;
  const std::string err =
      loom_test::capture_stderr([&] { set.emplace(mapped_set::from_idx(images, labels, {}, cache)); });
  CHECK_THAT(err, Contains("not using the cache directory " + cache.string()) &&
                      Contains("is owned by uid " + std::to_string(other) + ": expected uid 0"));
  CHECK(std::memcmp(set->pixels(0), pixels.data(), 60) == 0);  // not the planted pixels
  CHECK_THAT(set->description(), Contains("decompressed into memory"));
  // The same directory for scanned shard manifests.
  temp_dir shards;
  const auto files = loom_test::write_index_shards(shards.path(), "train", {4}, /*manifest=*/false);
  (void)loom_test::capture_stderr([&] {
    CHECK(loom::data::load_manifest(files, {.cache_dir = cache}).samples() == 4);
  });
  CHECK(fs::exists(copy));
  CHECK(std::distance(fs::directory_iterator(cache), fs::directory_iterator()) == 2);  // nothing added
}
