// SPDX-License-Identifier: Apache-2.0
// Tests of shard sets: brace patterns, directories and list files; the manifest (format, its
// checks against the shards); scanning shards without a manifest and caching the result.

#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "loom/data/cache.hpp"
#include "loom/data/shards.hpp"
#include "shard_files.hpp"
#include "test_files.hpp"

namespace {

using Catch::Matchers::Contains;
using loom::data::expand_braces;
using loom::data::load_manifest;
using loom::data::resolve_shards;
using loom_test::temp_dir;
namespace fs = std::filesystem;

std::vector<std::string> names(const std::vector<fs::path>& v) {
  std::vector<std::string> out;
  for (const auto& p : v) out.push_back(p.filename().string());
  return out;
}

std::vector<std::string> files_in(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST_CASE("Brace patterns expand as webdataset's braceexpand does", "[data][shards]") {
  CHECK(expand_braces("train-{000000..000002}.tar") ==
        std::vector<std::string>{"train-000000.tar", "train-000001.tar", "train-000002.tar"});
  CHECK(expand_braces("s-{8..10}.tar") == std::vector<std::string>{"s-8.tar", "s-9.tar", "s-10.tar"});
  CHECK(expand_braces("{a,b}-{0..1}.tar") == std::vector<std::string>{"a-0.tar", "a-1.tar", "b-0.tar", "b-1.tar"});
  CHECK(expand_braces("{a,{b,c}}.tar") == std::vector<std::string>{"a.tar", "b.tar", "c.tar"});
  CHECK(expand_braces("plain.tar") == std::vector<std::string>{"plain.tar"});
  CHECK(expand_braces("{x}.tar") == std::vector<std::string>{"{x}.tar"});
  CHECK_THROWS_WITH(expand_braces("a-{0..3.tar"), Contains("has a '{' without its '}'"));
}

TEST_CASE("A directory, a pattern, a single shard and a list file name their shards in order", "[data][shards]") {
  temp_dir dir;
  loom_test::write_index_shards(dir.path(), "train", {3, 2, 4});
  loom_test::write_index_shards(dir.path(), "test", {2});
  const std::vector<std::string> train{"train-000000.tar", "train-000001.tar", "train-000002.tar"};
  CHECK(names(resolve_shards(dir.path().string(), "train")) == train);
  CHECK(names(resolve_shards(dir.path().string(), "test")) == std::vector<std::string>{"test-000000.tar"});
  CHECK(resolve_shards(dir.path().string()).size() == 4);
  CHECK(names(resolve_shards((dir / "train-{000000..000002}.tar").string())) == train);
  CHECK(names(resolve_shards((dir / "train-000001.tar").string())) == std::vector<std::string>{"train-000001.tar"});
  loom_test::write_file(dir / "list.txt",
                        loom_test::to_bytes("# shards\ntrain-000002.tar\n\n" + (dir / "train-000000.tar").string() + "\n"));
  CHECK(names(resolve_shards((dir / "list.txt").string())) ==
        std::vector<std::string>{"train-000002.tar", "train-000000.tar"});
  CHECK_THROWS_WITH(resolve_shards((dir / "train-{000000..000003}.tar").string()),
                    Contains("train-000003.tar (from the pattern") && Contains("does not exist"));
  CHECK_THROWS_WITH(resolve_shards(dir.path().string(), "val"), Contains("holds no val-*.tar shards"));
  CHECK_THROWS_WITH(resolve_shards((dir / "nowhere").string()), Contains("does not exist"));
  CHECK(loom::data::manifest_path_for(resolve_shards(dir.path().string(), "train")) == dir / "train.shards.json");
  CHECK(loom::data::manifest_path_for(resolve_shards(dir.path().string())).empty());  // train and test mixed
}

TEST_CASE("A manifest writes, reads back and checks its total", "[data][shards]") {
  temp_dir dir;
  loom::data::shard_manifest m;
  m.classes = 10;
  m.shards = {{dir / "train-000000.tar", 1234, 10}, {"/elsewhere/x \"y\".tar", 99, 5}};
  const std::string text = loom::data::manifest_json(m, dir.path());
  CHECK_THAT(text, Contains("{\"loom_shards\": 1, \"classes\": 10, \"samples\": 15, \"shards\": ["));
  CHECK_THAT(text, Contains("{\"file\": \"train-000000.tar\", \"bytes\": 1234, \"samples\": 10}"));
  CHECK_THAT(text, Contains("\"/elsewhere/x \\\"y\\\".tar\""));
  const auto back = loom::data::parse_manifest(text, dir.path(), dir / "m.json");
  REQUIRE(back.shards.size() == 2);
  CHECK(back.shards[0].path == dir / "train-000000.tar");
  CHECK(back.shards[1].path == "/elsewhere/x \"y\".tar");
  CHECK(back.shards[1].bytes == 99);
  CHECK(back.fingerprint() == m.fingerprint());
  auto other = m;
  other.shards[0].samples = 11;
  CHECK(other.fingerprint() != m.fingerprint());
  const auto bad = [&](const std::string& t) { return loom::data::parse_manifest(t, dir.path(), dir / "m.json"); };
  CHECK_THROWS_WITH(bad("{\"loom_shards\": 1, \"classes\": 10, \"samples\": 16, \"shards\": [{\"file\": \"a.tar\", "
                        "\"bytes\": 1, \"samples\": 15}]}"),
                    Contains("\"samples\" says 16, the shards' counts sum to 15"));
  CHECK_THROWS_WITH(bad("{\"loom_shards\": 2, \"classes\": 1, \"samples\": 0, \"shards\": []}"),
                    Contains("format version 2: this loom reads version 1"));
  CHECK_THROWS_WITH(bad("{\"loom_shards\": 1, \"classes\": 1, \"samples\": 0, \"shards\": [{\"file\": \"a.tar\"}]}"),
                    Contains("field \"bytes\" is missing"));
  CHECK_THROWS_WITH(bad("{\"loom_shards\": 1,"), Contains("malformed JSON at byte"));
  CHECK_THROWS_WITH(bad("{\"loom_shards\": 1, \"classes\": -1, \"samples\": 0, \"shards\": []}"),
                    Contains("field \"classes\" holds '-1': expected a non-negative integer"));
}

TEST_CASE("The manifest beside the shards gives their counts; one that disagrees is refused", "[data][shards]") {
  temp_dir dir;
  const auto shards = loom_test::write_index_shards(dir.path(), "train", {3, 2, 4});
  const auto m = load_manifest(shards);
  CHECK(m.samples() == 9);
  CHECK(m.classes == 10);
  CHECK(m.shards[1].samples == 2);
  // A subset of the listed shards is fine.
  CHECK(load_manifest({shards[2]}).samples() == 4);
  SECTION("a shard whose size changed") {
    loom_test::write_index_shard(shards[1], 100, 30);
    CHECK_THROWS_WITH(load_manifest(shards),
                      Contains("loom: manifest " + (dir / "train.shards.json").string()) &&
                          Contains("shard " + shards[1].string() + " has ") &&
                          Contains("bytes, the manifest says " + std::to_string(m.shards[1].bytes)));
  }
  SECTION("a shard the manifest does not list") {
    const auto extra = loom_test::write_index_shard(dir / "train-000009.tar", 9, 1);
    auto all = shards;
    all.push_back(extra);
    CHECK_THROWS_WITH(load_manifest(all), Contains("does not list shard " + extra.string()));
  }
  SECTION("a missing shard") {
    fs::remove(shards[2]);
    CHECK_THROWS_AS(load_manifest(shards), loom::io_error);
    CHECK_THROWS_WITH(load_manifest(shards), Contains(shards[2].string()) && Contains("the shard is missing"));
  }
}

TEST_CASE("Shards without a manifest are scanned once and the result cached, stamped", "[data][shards]") {
  temp_dir dir, parent;
  const fs::path cache = parent / "cache";
  const auto shards = loom_test::write_index_shards(dir.path(), "train", {5, 7}, /*manifest=*/false);
  const loom::data::manifest_options o{.cache_dir = cache};
  const auto m = load_manifest(shards, o);
  CHECK(m.samples() == 12);
  CHECK(m.shards[1].samples == 7);
  CHECK(m.classes == 0);  // a scan does not know
  const auto left = files_in(cache);
  REQUIRE(left.size() == 3);  // the manifest, its stamp, the lock
  const fs::path cached = cache / left[1];
  CHECK_THAT(cached.string(), Contains(".shards.json"));
  CHECK((fs::status(cache).permissions() & fs::perms::all) == fs::perms::owner_all);
  // The cached manifest is used: garble a shard, keeping its size and mtime (the cache's key),
  // and the counts stay (a scan would fail).
  const auto when = fs::last_write_time(shards[0]);
  const auto original = loom_test::file_bytes(shards[0]);
  loom_test::write_file(shards[0], loom_test::bytes(original.size(), std::byte{'x'}));
  fs::last_write_time(shards[0], when);
  CHECK(load_manifest(shards, o).fingerprint() == m.fingerprint());
  loom_test::write_file(shards[0], original);
  fs::last_write_time(shards[0], when);
  SECTION("a planted manifest (another count) fails its stamp and is scanned again") {
    auto planted = m;
    planted.shards[0].samples = 50;
    loom::data::write_manifest(cached, planted);
    const auto again = load_manifest(shards, o);
    CHECK(again.shards[0].samples == 5);
    CHECK(loom::data::read_manifest(cached).shards[0].samples == 5);  // replaced
  }
  SECTION("a shard that changed (size and mtime) gets another key") {
    loom_test::write_index_shard(shards[0], 0, 6);
    CHECK(load_manifest(shards, o).shards[0].samples == 6);
    CHECK(files_in(cache).size() == 6);
  }
}

TEST_CASE("Scanning reports damaged and empty shards, or counts what is readable under skip", "[data][shards]") {
  temp_dir dir, cache;
  auto shards = loom_test::write_index_shards(dir.path(), "train", {4, 4}, /*manifest=*/false);
  auto b = loom_test::file_bytes(shards[1]);
  // Damage the header of the third member of shard 1 (each sample: png, cls, and json for index % 5 == 0).
  b[512 * 4 + 10] ^= std::byte{1};
  loom_test::write_file(shards[1], b);
  const loom::data::manifest_options o{.cache_dir = cache.path()};
  CHECK_THROWS_WITH(load_manifest(shards, o),
                    Contains("loom: shard " + shards[1].string()) && Contains("bad header checksum") &&
                        Contains("found while scanning"));
  loom::data::manifest_options skip = o;
  skip.on_bad = loom::data::on_bad_sample::skip;
  loom::data::shard_manifest m;
  const std::string err = loom_test::capture_stderr([&] { m = load_manifest(shards, skip); });
  CHECK_THAT(err, Contains("loom: warning: loom: shard " + shards[1].string()) && Contains("counting the"));
  CHECK(m.shards[0].samples == 4);
  CHECK(m.shards[1].samples < 4);
  CHECK(files_in(cache.path()).size() == 1);  // only the lock: a partial scan is not cached
  const auto empty = dir / "empty-000000.tar";
  loom_test::write_file(empty, loom_test::bytes(10240, std::byte{0}));
  CHECK_THROWS_WITH(load_manifest({empty}, o), Contains("holds no samples (10240 bytes)"));
}

TEST_CASE("A cache directory that others can write is refused with a warning, and the scan still works",
          "[data][shards][cache]") {
  temp_dir dir, parent;
  const auto shards = loom_test::write_index_shards(dir.path(), "train", {3}, /*manifest=*/false);
  const fs::path open_dir = parent / "open";
  fs::create_directory(open_dir);
  ::chmod(open_dir.c_str(), 0777);
  loom::data::shard_manifest m;
  const std::string err =
      loom_test::capture_stderr([&] { m = load_manifest(shards, {.cache_dir = open_dir}); });
  CHECK(m.samples() == 3);
  CHECK_THAT(err, Contains("loom: warning: not using the cache directory " + open_dir.string()) &&
                      Contains("has mode 0777: expected no write permission for group or others"));
  CHECK(files_in(open_dir).empty());
  CHECK_THAT(loom::data::detail::open_private_dir(open_dir), Contains("mode 0777"));
  // A new cache directory is made private.
  CHECK(loom::data::detail::open_private_dir(parent / "fresh" / "loom").empty());
  CHECK((fs::status(parent / "fresh" / "loom").permissions() & fs::perms::all) == fs::perms::owner_all);
  // A symbolic link is not a directory of ours.
  fs::create_directory_symlink(parent / "fresh" / "loom", parent / "link");
  CHECK_THAT(loom::data::detail::open_private_dir(parent / "link"), Contains("is a symbolic link"));
}
