// SPDX-License-Identifier: Apache-2.0
// The weights file in C++: PyTorch's names and shapes for every layer kind, the byte layout,
// round trips, every bad input refused with a message that names the file, the tensor, what was
// expected and what was found, crash-safe writes, and a fuzz of the reader. The real readers
// (PyTorch, the safetensors package) check the same files in check_torch.py.

#include <sys/resource.h>

#include <catch2/catch.hpp>

#include <csignal>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cases.hpp"
#include "error_message.hpp"
#include "loom/io/safetensors.hpp"
#include "test_files.hpp"

using Catch::Matchers::Contains;

namespace {

using io_test::read_bytes;
using io_test::write_bytes;

template <class F>
std::string io_error_of(F&& f) {
  return loom::testing::error_message<loom::io_error>(f, "loom::io_error");
}

/// Network's tensors as named_tensors over params, with `edit` applied to the list.
template <class Network, class Edit>
void write_edited(const std::filesystem::path& p, const std::vector<float>& params, Edit&& edit) {
  std::vector<loom::io::named_tensor<float>> t;
  for (const auto& d : loom::io::describe<Network>().tensors())
    t.push_back({d.name, d.shape, std::span<const float>(params).subspan(d.offset, d.count)});
  edit(t);
  loom::io::write_safetensors<float>(p, t);
}

using small = loom::network<loom::input<20>, loom::linear<7>, loom::relu, loom::linear<3>>;

}  // namespace

TEST_CASE("Every parameter tensor is named and shaped as torch.nn.Sequential of the same layers has it",
          "[io][safetensors]") {
  const auto d = loom::io::describe<io_cases::res_ln>();
  struct expected {
    const char* name;
    std::vector<std::size_t> shape;
  };
  const std::vector<expected> want{
      {"0.weight", {4, 1, 3, 3}}, {"0.bias", {4}},        {"1.0.weight", {4, 12, 12}}, {"1.0.bias", {4, 12, 12}},
      {"1.1.weight", {4, 4, 3, 3}}, {"1.1.bias", {4}},    {"4.weight", {32, 144}},      {"4.bias", {32}},
      {"5.weight", {32}},         {"5.bias", {32}},       {"6.0.weight", {32, 32}},     {"6.0.bias", {32}},
      {"6.3.weight", {32, 32}},   {"6.3.bias", {32}},     {"9.weight", {10, 32}},       {"9.bias", {10}}};
  const auto got = d.tensors();
  REQUIRE(got.size() == want.size());
  std::size_t at = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("tensor " << i);
    CHECK(got[i].name == want[i].name);
    CHECK(got[i].shape == want[i].shape);
    CHECK(got[i].offset == at);  // the tensors tile the flat buffer in order
    at += got[i].count;
  }
  CHECK(at == io_cases::res_ln::parameter_count);
  CHECK(d.text() ==
        "network<input<1,12,12>,conv2d<4,3,1,1>,residual<layer_norm,conv2d<4,3,1,1>,gelu>,max_pool2d<2,2>,flatten,"
        "linear<32>,layer_norm,residual<linear<32>,relu,dropout_rate<50>,linear<32>>,leaky_relu_slope<10>,sigmoid,"
        "linear<10>>");
}

TEST_CASE("Tensor-parallel layers are named, shaped and fingerprinted as the plain linear they are whole",
          "[io][safetensors]") {
  using split = loom::network<loom::input<6>, loom::column_parallel<loom::linear<8>>, loom::relu,
                              loom::row_parallel<loom::linear<4>>>;
  using whole = loom::network<loom::input<6>, loom::linear<8>, loom::relu, loom::linear<4>>;
  const auto a = loom::io::describe<split>(), b = loom::io::describe<whole>();
  CHECK(a.text() == b.text());
  CHECK(a.fingerprint() == b.fingerprint());
  REQUIRE(a.tensors().size() == 4);
  CHECK(a.tensors()[2].name == "2.weight");
  CHECK(a.tensors()[2].shape == std::vector<std::size_t>{4, 8});
  CHECK(loom::io::describe<small>().fingerprint() != b.fingerprint());
}

TEST_CASE("The weights file is an 8-byte header length, the JSON header, then the flat parameter buffer",
          "[io][safetensors]") {
  io_test::scratch_dir dir("layout");
  const auto params = io_cases::parameters<io_cases::mlp>(3);
  const auto path = dir / "mlp.safetensors";
  loom::save_weights<io_cases::mlp, float>(params, path);  // a whole flat buffer, as trainer::gather_parameters() gives
  const std::string bytes = read_bytes(path);
  REQUIRE(bytes.size() > 8);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[static_cast<std::size_t>(i)]);
  CHECK(n % 8 == 0);  // the data starts 8-byte aligned
  REQUIRE(bytes.size() == 8 + n + params.size() * sizeof(float));
  CHECK(std::memcmp(bytes.data() + 8 + n, params.data(), params.size() * sizeof(float)) == 0);
  const auto h = loom::io::json::parse(std::string_view(bytes).substr(8, n));
  const auto* w = h.find("2.weight");
  REQUIRE(w);
  CHECK(w->find("dtype")->text == "F32");
  REQUIRE(w->find("shape")->items.size() == 2);
  CHECK(w->find("shape")->items[0].text == "128");
  CHECK(w->find("shape")->items[1].text == "256");
  const auto* meta = h.find("__metadata__");
  REQUIRE(meta);
  CHECK(meta->find("loom.fingerprint")->text == loom::io::describe<io_cases::mlp>().fingerprint());
  CHECK(meta->find("format")->text == "pt");
}

TEST_CASE("Weights saved from a model load into another model bit for bit", "[io][safetensors]") {
  io_test::scratch_dir dir("roundtrip");
  loom::model<io_cases::res_ln> a(5), b(6);
  REQUIRE(a.copy_parameters_to_host() != b.copy_parameters_to_host());
  loom::save_weights(a, dir / "w.safetensors");
  loom::load_weights(b, dir / "w.safetensors");
  CHECK(a.copy_parameters_to_host() == b.copy_parameters_to_host());
  CHECK(dir.files() == std::vector<std::string>{"w.safetensors"});  // no temporary file left
}

TEST_CASE("A bad weights file is refused with a message naming the file, the tensor, expected and found",
          "[io][safetensors]") {
  io_test::scratch_dir dir("bad");
  const auto params = io_cases::parameters<small>(2);
  const auto good = dir / "good.safetensors";
  loom::save_weights<small, float>(std::span<const float>(params), good);
  const std::string bytes = read_bytes(good);
  const auto bad = dir / "bad.safetensors";
  loom::model<small> m(9);
  const auto before = m.copy_parameters_to_host();
  std::string msg;

  SECTION("a missing file") {
    msg = io_error_of([&] { loom::load_weights(m, dir / "none.safetensors"); });
    CHECK_THAT(msg, Contains("none.safetensors") && Contains("no such file"));
  }
  SECTION("a file shorter than the header length") {
    write_bytes(bad, bytes.substr(0, 5));
    msg = io_error_of([&] { loom::load_weights(m, bad); });
    CHECK_THAT(msg, Contains("bad.safetensors is truncated") && Contains("5 bytes"));
  }
  SECTION("a file cut inside its header") {
    write_bytes(bad, bytes.substr(0, 40));
    msg = io_error_of([&] { loom::load_weights(m, bad); });
    CHECK_THAT(msg, Contains("truncated") && Contains("runs past the end of the file (40 bytes)"));
  }
  SECTION("a file cut inside its data") {
    write_bytes(bad, bytes.substr(0, bytes.size() - 10));
    msg = io_error_of([&] { loom::load_weights(m, bad); });
    CHECK_THAT(msg, Contains("truncated: tensor 2.bias ends at byte"));
  }
  SECTION("a header length past the end of the file") {
    std::string b = bytes;
    b[6] = 1;  // 2^48 + ...
    write_bytes(bad, b);
    msg = io_error_of([&] { loom::load_weights(m, bad); });
    CHECK_THAT(msg, Contains("bad.safetensors") && Contains("header length"));
  }
  SECTION("garbage in the header JSON") {
    std::string b = bytes;
    b[8 + 16] = '%';  // where the __metadata__ object's value starts
    write_bytes(bad, b);
    msg = io_error_of([&] { loom::load_weights(m, bad); });
    CHECK_THAT(msg, Contains("bad.safetensors: the safetensors header is not valid JSON") &&
                        Contains("unexpected character '%' at byte 16"));
  }
  SECTION("a missing tensor") {
    write_edited<small>(bad, params, [](auto& t) { t.pop_back(); });
    msg = io_error_of([&] { loom::load_weights(m, bad); });
    CHECK_THAT(msg, Contains("bad.safetensors does not hold this model's tensors: missing 2.bias (3)"));
  }
  SECTION("an extra tensor") {
    const std::vector<float> extra(4, 1.0f);
    write_edited<small>(bad, params, [&](auto& t) { t.push_back({"3.weight", {2, 2}, extra}); });
    msg = io_error_of([&] { loom::load_weights(m, bad); });
    CHECK_THAT(msg, Contains("unexpected 3.weight (2, 2)"));
  }
  SECTION("names with a stray module. prefix") {
    write_edited<small>(bad, params, [](auto& t) {
      for (auto& x : t) x.name = "module." + x.name;
    });
    msg = io_error_of([&] { loom::load_weights(m, bad); });
    CHECK_THAT(msg, Contains("missing 0.weight (7, 20)") && Contains("stray \"module.\" prefix"));
  }
  SECTION("a tensor of the wrong shape") {
    write_edited<small>(bad, params, [](auto& t) { t[0].shape = {20, 7}; });
    msg = io_error_of([&] { loom::load_weights(m, bad); });
    CHECK_THAT(msg, Contains("bad.safetensors: tensor 0.weight has shape (20, 7) but this model expects (7, 20)"));
  }
  SECTION("a tensor of the wrong dtype") {
    const std::vector<double> wide(params.begin(), params.end());
    std::vector<loom::io::named_tensor<double>> t;
    for (const auto& d : loom::io::describe<small>().tensors())
      t.push_back({d.name, d.shape, std::span<const double>(wide).subspan(d.offset, d.count)});
    loom::io::write_safetensors<double>(bad, t);
    msg = io_error_of([&] { loom::load_weights(m, bad); });
    CHECK_THAT(msg, Contains("tensor 0.weight is F64 but this model reads F32"));
  }
  SECTION("the weights of another network with the same tensors") {
    using other = loom::network<loom::input<20>, loom::linear<7>, loom::tanh, loom::linear<3>>;
    loom::save_weights<other, float>(std::span<const float>(params), bad);
    msg = io_error_of([&] { loom::load_weights(m, bad); });
    CHECK_THAT(msg, Contains("holds the weights of network<input<20>,linear<7>,tanh,linear<3>>") &&
                        Contains("not of this model's network<input<20>,linear<7>,relu,linear<3>>"));
  }
  SECTION("tensors whose data overlap") {
    std::string b = bytes;
    const std::string from = "\"data_offsets\":[560,588]";  // 0.bias after 0.weight's 140 floats
    const auto at = b.find(from);
    REQUIRE(at != std::string::npos);
    b.replace(at, from.size(), "\"data_offsets\":[556,584]");
    write_bytes(bad, b);
    msg = io_error_of([&] { loom::load_weights(m, bad); });
    CHECK_THAT(msg, Contains("tensor 0.bias starts at byte 556") && Contains("overlap"));
  }
  INFO(msg);
  CHECK_THAT(msg, !Contains("no loom::io_error"));
  CHECK(m.copy_parameters_to_host() == before);  // nothing half-loaded
}

TEST_CASE("A write that fails leaves the previous file as it was and no temporary file", "[io][safetensors]") {
  io_test::scratch_dir dir("crash");
  const auto path = dir / "w.safetensors";
  loom::model<io_cases::mlp> a(1), b(2);
  loom::save_weights(a, path);
  const std::string good = read_bytes(path);
  // The file size limit makes write() fail part way (EFBIG) as a full disk would.
  rlimit old{};
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &old) == 0);
  auto* previous = std::signal(SIGXFSZ, SIG_IGN);
  rlimit small_limit = old;
  small_limit.rlim_cur = 4096;
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &small_limit) == 0);
  const std::string msg = io_error_of([&] { loom::save_weights(b, path); });
  ::setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, previous);
  CHECK_THAT(msg, Contains("cannot write") && Contains("w.safetensors") && Contains("nothing was written in its place"));
  CHECK(read_bytes(path) == good);
  CHECK(dir.files() == std::vector<std::string>{"w.safetensors"});
  loom::model<io_cases::mlp> c(3);
  loom::load_weights(c, path);
  CHECK(c.copy_parameters_to_host() == a.copy_parameters_to_host());
}

TEST_CASE("Writing weights into a directory that does not exist fails with a sentence", "[io][safetensors]") {
  io_test::scratch_dir dir("nodir");
  loom::model<small> m(1);
  const std::string msg = io_error_of([&] { loom::save_weights(m, dir / "missing" / "w.safetensors"); });
  CHECK_THAT(msg, Contains("cannot write") && Contains("missing/w.safetensors") && Contains("does not exist"));
  CHECK(dir.files().empty());
}

TEST_CASE("A thousand random corruptions of a weights file are each refused with a loom error or loaded as written",
          "[io][safetensors][fuzz]") {
  io_test::scratch_dir dir("fuzz");
  const auto params = io_cases::parameters<io_cases::residual>(4);
  const auto good = dir / "good.safetensors";
  loom::save_weights<io_cases::residual, float>(std::span<const float>(params), good);
  const std::string bytes = read_bytes(good);
  std::uint64_t header = 0;
  for (int i = 7; i >= 0; --i) header = (header << 8) | static_cast<unsigned char>(bytes[static_cast<std::size_t>(i)]);
  std::mt19937_64 rng(12345);
  const auto bad = dir / "bad.safetensors";
  int refused = 0, loaded = 0;
  for (int k = 0; k < 1000; ++k) {
    std::string b = bytes;
    const int kind = static_cast<int>(rng() % 10);
    if (kind < 6) {  // a byte of the length or the header
      b[rng() % (8 + header)] = static_cast<char>(rng());
    } else if (kind < 8) {  // cut anywhere
      b.resize(rng() % b.size());
    } else {  // a byte of the data: it loads, with that value changed
      b[8 + header + rng() % (b.size() - 8 - header)] ^= static_cast<char>(1 + rng() % 255);
    }
    write_bytes(bad, b);
    try {
      const auto p = loom::load_weights<io_cases::residual>(bad);
      // Loaded: what the file holds after its header, exactly.
      REQUIRE(p.size() == params.size());
      std::uint64_t n = 0;
      for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(b[static_cast<std::size_t>(i)]);
      REQUIRE(std::memcmp(b.data() + 8 + n, p.data(), p.size() * sizeof(float)) == 0);
      ++loaded;
    } catch (const loom::error& e) {
      REQUIRE(std::string(e.what()).find("bad.safetensors") != std::string::npos);
      ++refused;
    }
  }
  CHECK(refused > 500);
  CHECK(loaded > 100);
}

TEST_CASE("The JSON reader refuses what is not JSON, with the byte, and reads escapes", "[io][json]") {
  using loom::io::json::parse;
  using loom::io::json::parse_error;
  CHECK_THROWS_WITH(parse("{\"a\":1,}"), Contains("at byte 7"));
  CHECK_THROWS_AS(parse("[1 2]"), parse_error);
  CHECK_THROWS_AS(parse("\"abc"), parse_error);
  CHECK_THROWS_AS(parse("{} x"), parse_error);
  CHECK_THROWS_WITH(parse(std::string(100, '[') + std::string(100, ']')), Contains("nesting deeper than 64"));
  const auto v = parse(R"({"k\"\u00e9\ud83d\ude00":[0, 18446744073709551615, -1]})");
  REQUIRE(v.members.size() == 1);
  CHECK(v.members[0].first == "k\"\xc3\xa9\xf0\x9f\x98\x80");
  std::uint64_t x = 0;
  CHECK(v.members[0].second.items[1].to_u64(x));
  CHECK(x == 18446744073709551615ull);
  CHECK_FALSE(v.members[0].second.items[2].to_u64(x));
  CHECK(parse(loom::io::json::quote("a\"b\\c\n\x01")).text == "a\"b\\c\n\x01");
}
