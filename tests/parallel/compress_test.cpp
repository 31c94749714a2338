// SPDX-License-Identifier: Apache-2.0
// Compressed gradients (loom::compress<bf16>, loom::compress<fp16>): the 16-bit conversions
// against their definitions (every fp16 bit pattern, rounding ties, range, NaN, subnormals; the
// F16C path against the scalar one), and data parallelism with compression on local_comm —
// half the bytes, training that follows uncompressed training closely but not bitwise, and
// the refusals.

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "../../examples/common/networks.hpp"
#include "loom/comm/local.hpp"
#include "loom/core/half.hpp"
#include "loom/loom.hpp"

namespace {

float from_bits(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

/// The binary16 value of bits, by the definition (sign, 5-bit exponent, 10-bit fraction).
double fp16_value(std::uint16_t bits) {
  const int sign = bits >> 15 ? -1 : 1, e = (bits >> 10) & 0x1f, m = bits & 0x3ff;
  if (e == 0x1f) return m ? std::numeric_limits<double>::quiet_NaN() : sign * std::numeric_limits<double>::infinity();
  if (e == 0) return sign * std::ldexp(m, -24);
  return sign * std::ldexp(1024 + m, e - 25);
}

const loom::data::fashion_mnist_set& small_set() {
  static const auto s = loom::data::fashion_mnist(loom::data::split::train).first(1280);
  return s;
}

template <class Policy>
std::pair<std::vector<float>, loom::rank_figures> train_two_ranks(std::size_t steps) {
  std::vector<float> params;
  loom::rank_figures fig;
  loom::local_world(2).run([&](loom::local_comm& c) {
    loom::trainer<example::mlp, loom::softmax_cross_entropy, loom::sgd, Policy> t{c, {.lr = 0.05f}, {.seed = 3, .threads = 1}};
    loom::fit_options o;
    o.batch = 64;
    o.max_steps = steps;
    o.progress = nullptr;
    const auto r = t.fit(small_set(), o);
    if (c.rank() == 0) {
      params = t.model().copy_parameters_to_host();
      fig = r.figures[0];
    }
  });
  return {params, fig};
}

// The option is found wherever it stands among data_parallel's options.
static_assert(std::is_void_v<loom::data_parallel<loom::local_comm, loom::bucket_bytes<1024>>::wire_type>);
static_assert(std::is_same_v<loom::data_parallel<loom::local_comm, loom::bucket_bytes<1024>, loom::compress<loom::fp16>>::wire_type,
                             loom::fp16>);
static_assert(std::is_same_v<loom::data_parallel<loom::local_comm, loom::compress<loom::bf16>, loom::bucket_bytes<1024>>::wire_type,
                             loom::bf16>);
static_assert(loom::data_parallel<loom::local_comm, loom::compress<loom::bf16>, loom::bucket_bytes<1024>>::bucket_cap_bytes == 1024);

}  // namespace

TEST_CASE("fp16 conversion: every bit pattern back and forth, and rounding by the definition", "[parallel][compress]") {
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    const loom::fp16 h{static_cast<std::uint16_t>(b)};
    const double want = fp16_value(h.bits);
    const float got = h.to_float();
    if (std::isnan(want)) {
      REQUIRE(std::isnan(got));
      REQUIRE(std::isnan(loom::fp16::from_float(got).to_float()));
      continue;
    }
    REQUIRE(static_cast<double>(got) == want);
    REQUIRE(loom::fp16::from_float(got).bits == h.bits);  // exact values come back as they were
  }
  using loom::fp16;
  CHECK(fp16::from_float(1.0f).bits == 0x3c00);
  CHECK(fp16::from_float(65504.0f).bits == 0x7bff);
  CHECK(fp16::from_float(65519.0f).bits == 0x7bff);  // below the midpoint to infinity
  CHECK(fp16::from_float(65520.0f).bits == 0x7c00);  // the midpoint: ties to even, which is infinity
  CHECK(fp16::from_float(1e10f).bits == 0x7c00);
  CHECK(fp16::from_float(-std::numeric_limits<float>::infinity()).bits == 0xfc00);
  CHECK(fp16::from_float(std::ldexp(1.0f, -24)).bits == 0x0001);   // the smallest subnormal
  CHECK(fp16::from_float(std::ldexp(1.0f, -25)).bits == 0x0000);   // half of it: ties to even, zero
  CHECK(fp16::from_float(std::ldexp(3.0f, -26)).bits == 0x0001);   // 0.75 of it: up
  CHECK(fp16::from_float(std::ldexp(3.0f, -25)).bits == 0x0002);   // 1.5: ties to even, 2
  CHECK(fp16::from_float(1.0f + std::ldexp(1.0f, -11)).bits == 0x3c00);  // tie between 1 and 1+2^-10: even
  CHECK(fp16::from_float(1.0f + std::ldexp(3.0f, -11)).bits == 0x3c02);  // tie between 1+2^-10 and 1+2^-9: even
  CHECK(fp16::from_float(std::ldexp(1.0f, -14) * (1.0f - std::ldexp(1.0f, -12))).bits == 0x0400);  // rounds up to the smallest normal
}

TEST_CASE("bf16 and fp16 conversions of many floats agree on every path (F16C and scalar)", "[parallel][compress]") {
  std::mt19937 g(7);
  std::vector<float> x(100003);
  for (auto& v : x) {
    const std::uint32_t u = g();
    v = from_bits(u);  // every kind of float, NaNs, infinities and subnormals included
  }
  for (std::size_t i = 0; i < 1000; ++i) x[i] = std::ldexp(static_cast<float>(g() % 4096) / 4096.0f, -static_cast<int>(g() % 30));
  std::vector<loom::fp16> h(x.size());
  loom::to_half(x.data(), h.data(), x.size());
  std::vector<float> back(x.size());
  loom::from_half(h.data(), back.data(), x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const loom::fp16 s = loom::fp16::from_float(x[i]);
    INFO("x = " << x[i] << " (bits " << std::hex << [&] { std::uint32_t u; std::memcpy(&u, &x[i], 4); return u; }() << ")");
    if (std::isnan(x[i])) {
      REQUIRE(std::isnan(back[i]));
      continue;
    }
    REQUIRE(h[i].bits == s.bits);
    REQUIRE(back[i] == s.to_float());
  }
  // Sums: the vector path against the scalar one.
  std::vector<loom::fp16> a(h), b(h.rbegin(), h.rend()), c(b);
  loom::add_half(a.data(), b.data(), a.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    const float want = (a[i] + c[i]).to_float(), got = b[i].to_float();
    if (std::isnan(want)) REQUIRE(std::isnan(got));
    else REQUIRE(got == want);
  }
  std::vector<loom::bf16> hb(x.size());
  loom::to_half(x.data(), hb.data(), x.size());
  for (std::size_t i = 0; i < x.size(); ++i) REQUIRE(hb[i].bits == loom::detail::bf16_bits(x[i]));  // NaNs too: kept quiet alike
  std::vector<float> backb(x.size());
  loom::from_half(hb.data(), backb.data(), x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float want = loom::detail::bf16_to_float(hb[i].bits);
    REQUIRE(std::memcmp(&backb[i], &want, sizeof want) == 0);
  }
  std::vector<loom::bf16> ab(hb), bb(hb.rbegin(), hb.rend()), cb(bb);
  loom::add_half(ab.data(), bb.data(), ab.size());
  for (std::size_t i = 0; i < ab.size(); ++i) REQUIRE(bb[i].bits == (ab[i] + cb[i]).bits);
  INFO("F16C on this CPU: " << loom::detail::has_f16c() << ", AVX2: " << loom::detail::has_avx2());
  SUCCEED();
}

TEST_CASE("Compressed gradients send half the bytes and train close to float", "[parallel][compress]") {
  using plain = loom::data_parallel<loom::local_comm>;
  const auto [p32, f32] = train_two_ranks<plain>(20);
  const auto [pbf, fbf] = train_two_ranks<loom::data_parallel<loom::local_comm, loom::compress<loom::bf16>>>(20);
  const auto [pfp, ffp] = train_two_ranks<loom::data_parallel<loom::local_comm, loom::compress<loom::fp16>>>(20);
  CHECK(fbf.comm_bytes == f32.comm_bytes / 2);
  CHECK(ffp.comm_bytes == f32.comm_bytes / 2);
  CHECK(fbf.bytes_sent == f32.bytes_sent / 2);
  CHECK(f32.comm_bytes == 20.0 * example::mlp::parameter_count * 4);
  // Close to float training after 20 steps, and not equal (the rounding is real); fp16 keeps
  // 3 more bits than bf16 and lands closer.
  auto rel = [&](const std::vector<float>& p) {
    double d = 0, n = 0;
    for (std::size_t i = 0; i < p.size(); ++i) d += (p[i] - p32[i]) * double(p[i] - p32[i]), n += double(p32[i]) * p32[i];
    return std::sqrt(d / n);
  };
  const double dbf = rel(pbf), dfp = rel(pfp);
  INFO("relative parameter distance after 20 steps: bf16 " << dbf << ", fp16 " << dfp);
  CHECK(dbf > 0);
  CHECK(dfp > 0);
  CHECK(dbf < 1e-2);
  CHECK(dfp < dbf);
}

TEST_CASE("Compression and the split-invariant mode are refused together, on every rank", "[parallel][compress]") {
  std::vector<std::string> errors(2);
  loom::local_world(2).run([&](loom::local_comm& c) {
    loom::trainer<example::mlp, loom::softmax_cross_entropy, loom::sgd,
                  loom::data_parallel<loom::local_comm, loom::compress<loom::bf16>>>
        t{c, {.lr = 0.05f}, {.seed = 3, .threads = 1}};
    loom::fit_options o;
    o.batch = 64;
    o.max_steps = 2;
    o.progress = nullptr;
    o.deterministic_chunk = 16;
    try {
      t.fit(small_set(), o);
    } catch (const loom::invalid_argument& e) {
      errors[static_cast<std::size_t>(c.rank())] = e.what();
    }
  });
  for (const auto& e : errors) CHECK_THAT(e, Catch::Contains("loom::compress<>") && Catch::Contains("deterministic_chunk=16"));
}

TEST_CASE("The memory plan counts compression's 16-bit copy of the gradients", "[parallel][compress]") {
  using net = example::mlp;
  using plain = loom::memory_plan<net, loom::sgd, loom::data_parallel<loom::local_comm>>;
  using bf = loom::memory_plan<net, loom::sgd, loom::data_parallel<loom::local_comm, loom::compress<loom::bf16>>>;
  STATIC_REQUIRE(bf::communication_bytes == plain::communication_bytes + net::parameter_count * 2);
  STATIC_REQUIRE(bf::bytes_per_rank(64) == plain::bytes_per_rank(64) + net::parameter_count * 2);
  // Measured: the bytes loom's host buffers hold at their peak in a compressed fit grow by the copy.
  auto peak_of = [](auto policy_tag) {
    using policy = typename decltype(policy_tag)::type;
    std::size_t peak = 0;
    loom::local_world(1).run([&](loom::local_comm& c) {
      loom::trainer<net, loom::softmax_cross_entropy, loom::sgd, policy> t{c, {.lr = 0.05f}, {.seed = 3, .threads = 1}};
      loom::fit_options o;
      o.batch = 64;
      o.max_steps = 3;
      o.progress = nullptr;
      loom::reset_host_memory_peak();
      t.fit(small_set(), o);
      peak = loom::host_memory().peak_bytes;
    });
    return peak;
  };
  const std::size_t a = peak_of(std::type_identity<loom::data_parallel<loom::local_comm>>{});
  const std::size_t b = peak_of(std::type_identity<loom::data_parallel<loom::local_comm, loom::compress<loom::bf16>>>{});
  INFO("peak host bytes: " << a << " without, " << b << " with compression");
  CHECK(b - a == net::parameter_count * 2);
}
