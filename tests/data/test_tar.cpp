// SPDX-License-Identifier: Apache-2.0
// Tests of the tar reader and writer: ustar written by loom and read back (and listed by GNU
// tar), GNU long names and pax headers (hand-made and made by GNU tar itself), non-regular
// entries, checksums, truncation, and the grouping of members into samples.

#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "loom/data/tar.hpp"
#include "shard_files.hpp"
#include "test_files.hpp"

namespace {

using Catch::Matchers::Contains;
using loom::data::tar_entry;
using loom::data::tar_reader;
using loom::data::tar_sample;
using loom::data::tar_sample_reader;
using loom_test::bytes;
using loom_test::temp_dir;
using loom_test::to_bytes;

/// Every regular file of an archive: (name, data as text).
std::vector<std::pair<std::string, std::string>> members_of(const std::filesystem::path& file,
                                                            std::size_t read_size = 4 << 20) {
  tar_reader r(file, read_size);
  std::vector<std::pair<std::string, std::string>> out;
  while (auto e = r.next()) {
    bytes d;
    r.read_data(d);
    out.emplace_back(e->name, std::string(reinterpret_cast<const char*>(d.data()), d.size()));
  }
  return out;
}

/// A hand-made archive: blocks appended one by one.
struct raw_tar {
  bytes b;
  void header(const std::string& name, std::uint64_t size, char type = '0', bool gnu = false) {
    const auto h = loom::data::detail::tar_header_block(name, size, type, 0, gnu);
    for (char c : h) b.push_back(static_cast<std::byte>(c));
  }
  void data(const std::string& text) {
    for (char c : text) b.push_back(static_cast<std::byte>(c));
    while (b.size() % 512) b.push_back(std::byte{0});
  }
  void member(const std::string& name, const std::string& text) {
    header(name, text.size());
    data(text);
  }
  void end() { b.resize(b.size() + 1024, std::byte{0}); }
  std::filesystem::path write(const std::filesystem::path& p) const {
    loom_test::write_file(p, b);
    return p;
  }
};

std::string pax_record(const std::string& key, const std::string& value) {
  // LEN counts itself: find the fixed point.
  std::string body = " " + key + "=" + value + "\n";
  std::size_t len = body.size() + 1;
  while (std::to_string(len).size() + body.size() != len) ++len;
  return std::to_string(len) + body;
}

int run(const std::string& command) { return std::system(command.c_str()); }

}  // namespace

TEST_CASE("Member names split into webdataset's key and extension", "[data][tar]") {
  using loom::data::split_member_name;
  CHECK(split_member_name("000123.png").key == "000123");
  CHECK(split_member_name("000123.png").extension == "png");
  CHECK(split_member_name("dir/000123.JPG").key == "dir/000123");
  CHECK(split_member_name("dir/000123.JPG").extension == "jpg");
  CHECK(split_member_name("a.b/c.seg.png").key == "a.b/c");
  CHECK(split_member_name("a.b/c.seg.png").extension == "seg.png");
  CHECK(split_member_name("README").key.empty());
  CHECK(split_member_name("dir/.hidden.png").key.empty());
  CHECK(loom::data::kind_of_extension("jpeg") == loom::data::member_kind::image);
  CHECK(loom::data::kind_of_extension("cls") == loom::data::member_kind::label);
  CHECK(loom::data::kind_of_extension("seg.png") == loom::data::member_kind::ignored);
  CHECK(loom::data::parse_class_index("7") == 7);
  CHECK(loom::data::parse_class_index(" 12\n") == 12);
  CHECK(loom::data::parse_class_index("-1") == -1);
  CHECK_FALSE(loom::data::parse_class_index("7a"));
  CHECK_FALSE(loom::data::parse_class_index(""));
  CHECK_FALSE(loom::data::parse_class_index("99999999999999999999"));
}

TEST_CASE("loom's ustar archives read back, and GNU tar lists them", "[data][tar]") {
  temp_dir dir;
  const auto file = dir / "a.tar";
  const std::string long_dir(120, 'd');
  {
    loom::data::tar_writer w(file);
    w.add("000001.png", to_bytes("PNGDATA"));
    w.add("000001.cls", to_bytes("3"));
    w.add("empty.txt", {});
    w.add(long_dir + "/000002.png", to_bytes(std::string(513, 'x')));  // the ustar prefix field
    w.close();
  }
  CHECK(std::filesystem::file_size(file) % 10240 == 0);
  const auto m = members_of(file);
  REQUIRE(m.size() == 4);
  CHECK(m[0] == std::pair<std::string, std::string>{"000001.png", "PNGDATA"});
  CHECK(m[1].second == "3");
  CHECK(m[2].second.empty());
  CHECK(m[3].first == long_dir + "/000002.png");
  CHECK(m[3].second == std::string(513, 'x'));
  // Small reads (one block at a time) give the same.
  CHECK(members_of(file, 512) == m);
  const auto listing = dir / "listing";
  REQUIRE(run("tar -tvf " + file.string() + " > " + listing.string() + " 2>&1") == 0);
  std::ifstream in(listing);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK_THAT(all, Contains("000001.png"));
  CHECK_THAT(all, Contains(long_dir + "/000002.png"));
  CHECK_THAT(all, Contains("-rw-r--r--"));
  CHECK_THROWS_WITH(loom::data::detail::tar_header_block(std::string(101, 'n'), 1),
                    Contains("does not fit a ustar header"));
}

TEST_CASE("GNU long names, pax path and size records and global headers are honoured", "[data][tar]") {
  temp_dir dir;
  raw_tar t;
  const std::string long_name = std::string(150, 'L') + "/" + std::string(120, 'n') + ".png";
  t.header("././@LongLink", long_name.size() + 1, 'L', true);
  t.data(long_name + '\0');
  t.header("truncated-name.png", 4, '0', true);
  t.data("AAAA");
  const std::string pax = pax_record("path", "pax/very/" + std::string(200, 'p') + ".cls") + pax_record("mtime", "1.5");
  t.header("PaxHeaders/x", pax.size(), 'x');
  t.data(pax);
  t.header("short.cls", 2);
  t.data("42");
  const std::string global = pax_record("comment", "made by hand");
  t.header("GlobalHead", global.size(), 'g');
  t.data(global);
  // pax size overrides the header's size field.
  const std::string sized = pax_record("size", "5");
  t.header("PaxHeaders/y", sized.size(), 'x');
  t.data(sized);
  t.header("sized.txt", 0);
  t.data("12345");
  t.header("a-directory/", 0, '5');
  t.header("a-link", 0, '2');
  t.member("last.cls", "9");
  t.end();
  const auto file = t.write(dir / "gnu-pax.tar");
  const auto m = members_of(file);
  REQUIRE(m.size() == 4);
  CHECK(m[0] == std::pair<std::string, std::string>{long_name, "AAAA"});
  CHECK(m[1].first == "pax/very/" + std::string(200, 'p') + ".cls");
  CHECK(m[1].second == "42");
  CHECK(m[2] == std::pair<std::string, std::string>{"sized.txt", "12345"});
  CHECK(m[3] == std::pair<std::string, std::string>{"last.cls", "9"});
  // Python's tarfile reads the hand-made archive the same way.
  const auto py = dir / "py.txt";
  if (run("python3 -c \"import tarfile,sys; t=tarfile.open(sys.argv[1]); "
          "print('\\n'.join(m.name for m in t if m.isfile()))\" " +
          file.string() + " > " + py.string() + " 2>&1") == 0) {
    std::ifstream in(py);
    std::vector<std::string> names;
    for (std::string line; std::getline(in, line);) names.push_back(line);
    CHECK(names == std::vector<std::string>{long_name, m[1].first, "sized.txt", "last.cls"});
  }
}

TEST_CASE("Archives GNU tar writes (gnu, pax, ustar, v7 formats) read with their long names", "[data][tar]") {
  temp_dir dir;
  const std::string deep = "a/" + std::string(90, 'b') + "/" + std::string(80, 'c');
  std::filesystem::create_directories(dir / deep);
  loom_test::write_file(dir / deep / "000007.png", to_bytes("image-7"));
  loom_test::write_file(dir / deep / "000007.cls", to_bytes("7"));
  loom_test::write_file(dir / "short.cls", to_bytes("1"));
  std::filesystem::create_symlink("short.cls", dir / "link.cls");
  for (const std::string format : {"gnu", "pax", "ustar", "posix"}) {
    const auto file = dir / (format + ".tar");
    REQUIRE(run("cd " + dir.path().string() + " && tar --format=" + format + " -cf " + file.string() +
                " short.cls link.cls a > /dev/null 2>&1") == 0);
    const auto m = members_of(file);
    INFO(format);
    REQUIRE(m.size() == 3);  // the directories and the symbolic link are skipped
    CHECK(m[0] == std::pair<std::string, std::string>{"short.cls", "1"});
    std::vector<std::string> names{m[1].first, m[2].first};
    std::sort(names.begin(), names.end());
    CHECK(names == std::vector<std::string>{deep + "/000007.cls", deep + "/000007.png"});
  }
}

TEST_CASE("Damaged archives are refused with the shard, the byte offset and what was found", "[data][tar]") {
  temp_dir dir;
  raw_tar t;
  t.member("000001.png", "one");
  t.member("000001.cls", "1");
  t.member("000002.png", "two");
  t.end();
  SECTION("a flipped byte in a header") {
    bytes b = t.b;
    b[512 * 2 + 3] ^= std::byte{0x20};  // the second member's header starts at 1024
    const auto f = dir / "flip.tar";
    loom_test::write_file(f, b);
    tar_reader r(f);
    REQUIRE(r.next());
    try {
      (void)r.next();
      FAIL("no error");
    } catch (const loom::data_error& e) {
      CHECK_THAT(e.what(), Contains("loom: shard " + f.string() + ": at byte 1024: bad header checksum"));
    }
  }
  SECTION("an archive cut in a member's data") {
    bytes b(t.b.begin(), t.b.begin() + 512 * 5 + 1);
    const auto f = dir / "cut.tar";
    loom_test::write_file(f, b);
    tar_reader r(f);
    REQUIRE(r.next());
    REQUIRE(r.next());
    try {
      (void)r.next();
      FAIL("no error");
    } catch (const loom::data_error& e) {
      CHECK_THAT(e.what(), Contains("at byte 2048: member '000002.png' promises 3 bytes of data from byte 2560"));
      CHECK_THAT(e.what(), Contains("truncated"));
    }
  }
  SECTION("an archive cut in a header") {
    bytes b(t.b.begin(), t.b.begin() + 512 * 2 + 100);
    const auto f = dir / "cut-header.tar";
    loom_test::write_file(f, b);
    tar_reader r(f);
    REQUIRE(r.next());
    CHECK_THROWS_WITH(r.next(), Contains("at byte 1024: the file ends 100 bytes into a 512-byte header block"));
  }
  SECTION("no tar at all") {
    const auto f = dir / "text.tar";
    loom_test::write_file(f, to_bytes(std::string(2000, 'x')));
    tar_reader r(f);
    CHECK_THROWS_WITH(r.next(), Contains("header checksum field holds") && Contains("is this a tar file?"));
  }
  SECTION("a lone zero block before more data") {
    raw_tar z;
    z.member("a.cls", "1");
    z.b.resize(z.b.size() + 512, std::byte{0});
    z.member("b.cls", "2");
    const auto f = z.write(dir / "zero.tar");
    tar_reader r(f);
    REQUIRE(r.next());
    CHECK_THROWS_WITH(r.next(), Contains("a lone zero block is followed by more data"));
  }
  SECTION("a missing file") {
    CHECK_THROWS_AS(tar_reader(dir / "none.tar"), loom::io_error);
    CHECK_THROWS_WITH(tar_reader(dir / "none.tar"), Contains("cannot open: No such file or directory"));
  }
  SECTION("an archive without its end blocks ends after its last member") {
    raw_tar n;
    n.member("a.cls", "1");
    const auto f = n.write(dir / "noend.tar");
    CHECK(members_of(f).size() == 1);
  }
}

TEST_CASE("Members group into samples by key, with a sentence for every bad sample", "[data][tar]") {
  temp_dir dir;
  raw_tar t;
  t.member("000000.png", "img0");
  t.member("000000.cls", "3");
  t.member("000000.json", "{}");
  t.member("000001.jpg", "img1");
  t.member("000001.txt", "4\n");  // a .txt label
  t.member("000002.png", "img2");  // no label
  t.member("000003.png", "img3");
  t.member("000003.cls", "12");  // out of range for 10 classes
  t.member("000004.cls", "1");   // no image
  t.member("000005.png", "img5");
  t.member("000005.cls", "x");  // not a number
  t.member("000006.png", "img6");
  t.member("000006.cls", "-2");  // negative
  t.member("000007.png", "a");
  t.member("000007.jpg", "b");  // two images
  t.member("000007.cls", "1");
  t.member("000000.cls", "5");  // key 000000 again: not consecutive
  t.member("000008.png", "img8");
  t.member("000008.txt", "a caption");  // .txt ignored when there is a .cls
  t.member("000008.cls", "6");
  t.member("README", "no key");  // no dot: no sample
  t.end();
  const auto file = t.write(dir / "groups.tar");
  tar_sample_reader r(file, 10);
  std::vector<tar_sample> got;
  for (tar_sample s; r.next(s, true);) got.push_back(s);
  REQUIRE(got.size() == 10);
  CHECK(got[0].key == "000000");
  CHECK(got[0].problem.empty());
  CHECK(got[0].label == 3);
  CHECK(std::string(reinterpret_cast<const char*>(got[0].image.data()), got[0].image.size()) == "img0");
  CHECK(got[0].offset == 0);
  CHECK(got[1].label == 4);
  CHECK(got[1].problem.empty());
  CHECK(got[1].image_member == "000001.jpg");
  using loom::data::sample_problem;
  CHECK(got[2].kind == sample_problem::no_label);
  CHECK_THAT(got[2].problem, Contains("loom: shard " + file.string() + ": sample 000002 at byte") &&
                                 Contains("has no label"));
  CHECK(got[3].kind == sample_problem::label_out_of_range);
  CHECK_THAT(got[3].problem, Contains("label member 000003.cls at byte") && Contains("holds class 12, out of range: expected 0..9"));
  CHECK(got[4].kind == sample_problem::no_image);
  CHECK(got[5].kind == sample_problem::label_not_a_number);
  CHECK_THAT(got[5].problem, Contains("holds 'x': expected a decimal class index"));
  CHECK(got[6].kind == sample_problem::label_out_of_range);
  CHECK(got[7].kind == sample_problem::two_images);
  CHECK(got[8].kind == sample_problem::not_consecutive);
  CHECK_THAT(got[8].problem, Contains("sample 000000") && Contains("the key appeared before, at byte 0"));
  CHECK(got[9].problem.empty());
  CHECK(got[9].label == 6);
  for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i].index == i);
  // Without images, nothing of them is read but their size.
  tar_sample_reader labels_only(file, 10);
  tar_sample s;
  REQUIRE(labels_only.next(s, false));
  CHECK(s.image.empty());
  CHECK(s.image_size == 4);
  CHECK(s.label == 3);
}
