// SPDX-License-Identifier: Apache-2.0
// float (oneDNN, with the blocked layouts it picks kept between layers) against double (the
// plain reference loops) on whole networks: same parameters, same input, same output gradient;
// the outputs and every layer's parameter gradients must agree. And float runs must repeat
// bit for bit.

#include <catch2/catch.hpp>
#include <dnnl.hpp>
#include <omp.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "gradient_check.hpp"
#include "loom/backend/cpu.hpp"
#include "loom/backend/cpu/features.hpp"
#include "loom/layers/activation.hpp"
#include "loom/layers/batch_norm.hpp"
#include "loom/layers/conv2d.hpp"
#include "loom/layers/flatten.hpp"
#include "loom/layers/layer_norm.hpp"
#include "loom/layers/linear.hpp"
#include "loom/layers/pool2d.hpp"
#include "loom/nn/residual.hpp"
#include "loom/nn/residual_with.hpp"
#include "loom/nn/model.hpp"
#include "loom/nn/network.hpp"
#include "relative_error.hpp"

using namespace loom;
using loom::testing::compare_relative;
using loom::testing::max_abs;

namespace {

/// The network of the main example.
using cnn = network<input<1, 28, 28>, conv2d<32, 3, 1, 1>, relu, max_pool2d<2>, conv2d<64, 3, 1, 1>, relu, max_pool2d<2>,
                    flatten, linear<128>, relu, linear<10>>;
/// Layout conversions: conv2d's blocked output into a residual (relu keeps the layout, the
/// inner conv2d may pick another), avg_pool2d on it, layer_norm and flatten back to plain.
using mixed = network<input<3, 12, 12>, conv2d<16, 3, 1, 1>, residual<relu, conv2d<16, 3, 1, 1>>, avg_pool2d<2>, layer_norm,
                      flatten, linear<10>>;
/// The other way round: layer_norm's plain output into a residual whose inner conv2d answers
/// in a blocked layout (so the residual converts its sum and its gradient), then max_pool2d.
using mixed_plain_into_residual = network<input<3, 8, 8>, conv2d<16, 3, 1, 1>, layer_norm, residual<relu, conv2d<16, 3, 1, 1>>,
                                          max_pool2d<2>, flatten, linear<6>>;

/// A ResNet in small: batch norm (oneDNN's, on the blocked layouts convolutions leave, with the
/// ReLU fused in) against loom's kernel bodies in double; padded max pooling; a downsampling
/// block whose shortcut's layout may differ from its main branch's; global average pooling.
using small_resnet =
    network<input<3, 12, 12>, conv2d<16, 3, 1, 1, no_bias>, batch_norm, relu, max_pool2d<3, 2, 1>,
            residual_with<layers<conv2d<32, 3, 2, 1, no_bias>, batch_norm, relu, conv2d<32, 3, 1, 1, no_bias>, batch_norm>,
                          shortcut<conv2d<32, 1, 2, 0, no_bias>, batch_norm>>,
            relu, residual_with<layers<conv2d<32, 3, 1, 1, no_bias>, batch_norm>>, relu, global_avg_pool2d, linear<10>>;

/// Values rounded to float, so that the float and double runs start from the same numbers.
std::vector<double> float_representable(std::vector<double> v) {
  for (double& x : v) x = static_cast<double>(static_cast<float>(x));
  return v;
}

/// Largest relative error allowed between float and double results, per element, with values
/// below `floor_fraction` of the span's largest magnitude compared against that floor (see
/// relative_error.hpp): float sums of hundreds of terms cancel to values far smaller than
/// their terms, and those carry float's absolute error, not a relative one.
constexpr double tolerance = 1e-4;
constexpr double floor_fraction = 1e-2;

/// One forward and backward of Network in double and float from the same parameters, input
/// and output gradient; checks output and per-layer parameter gradients agree.
template <class Network>
void check_agreement(std::size_t batch, std::uint64_t seed) {
  model<Network, double> md(seed);
  model<Network, float> mf(seed);
  // Biases start at zero and layer_norm at gain 1: move every parameter a little so all of
  // them matter, then round to float and give both models the same values.
  {
    auto pd = md.parameters();
    const auto jitter = loom::testing::random_values(pd.size(), seed + 1, 0.05, 0.0);
    for (std::size_t i = 0; i < pd.size(); ++i) pd[i] = static_cast<double>(static_cast<float>(pd[i] + jitter[i]));
    auto pf = mf.parameters();
    for (std::size_t i = 0; i < pd.size(); ++i) pf[i] = static_cast<float>(pd[i]);
  }
  const auto xd = float_representable(loom::testing::random_values(batch * Network::input_shape::size, seed + 2, 1.0, 0.0));
  const std::vector<float> xf(xd.begin(), xd.end());
  const std::size_t out = batch * Network::output_shape::size;
  const auto dyd = float_representable(loom::testing::random_values(out, seed + 3, 1.0 / static_cast<double>(batch), 0.0));
  const std::vector<float> dyf(dyd.begin(), dyd.end());

  run_context ctx;
  const double* yd = md.forward(ctx, xd.data(), batch);
  const float* yf = mf.forward(ctx, xf.data(), batch);
  {
    const std::span<const double> expected(yd, out);
    const auto c = compare_relative(std::span<const float>(yf, out), expected, floor_fraction * max_abs(expected));
    INFO("output: " << c.str());
    CHECK(c.max_error < tolerance);
  }
  md.backward(ctx, dyd.data(), batch);
  mf.backward(ctx, dyf.data(), batch);
  const auto gd = md.gradients();
  const auto gf = mf.gradients();
  for (std::size_t l = 0; l < Network::layer_count; ++l) {
    const std::size_t at = Network::parameter_offsets[l], n = Network::parameter_counts[l];
    if (n == 0) continue;
    const std::span<const double> expected(gd.data() + at, n);
    const auto c = compare_relative(std::span<const float>(gf.data() + at, n), expected, floor_fraction * max_abs(expected));
    INFO("gradients of layer " << l << ": " << c.str() << ", max |gradient| " << max_abs(expected));
    CHECK(max_abs(expected) > 0);
    CHECK(c.max_error < tolerance);
  }
}

/// Whether the float run of Network's first layer leaves its output in a oneDNN layout.
template <class Network>
bool first_layer_output_is_blocked(std::size_t batch) {
  using first = network<input<Network::input_shape::dims[0], Network::input_shape::dims[1], Network::input_shape::dims[2]>,
                        at<0, typename Network::layers>>;
  typename first::template sequence_type<float, cpu> seq;
  std::vector<float> params(first::parameter_count, 0.1f), x(batch * first::input_shape::size, 1.0f);
  return !seq.forward(run_context{}, params.data(), activation<const float, cpu>{x.data()}, batch).format.plain();
}

/// Everything a float training step produces, to compare runs bit for bit.
template <class Network>
std::vector<float> float_step(model<Network, float>& m, std::size_t batch, std::uint64_t seed) {
  const auto xd = loom::testing::random_values(batch * Network::input_shape::size, seed, 1.0, 0.0);
  const std::vector<float> x(xd.begin(), xd.end());
  const auto dyd = loom::testing::random_values(batch * Network::output_shape::size, seed + 1, 0.1, 0.0);
  const std::vector<float> dy(dyd.begin(), dyd.end());
  const float* y = m.forward(run_context{}, x.data(), batch);
  std::vector<float> out(y, y + batch * Network::output_shape::size);
  m.backward(run_context{}, dy.data(), batch);
  const auto g = m.gradients();
  out.insert(out.end(), g.begin(), g.end());
  return out;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("float and double agree on the example cnn at batch 8", "[layers][backend]") {
  if (!first_layer_output_is_blocked<cnn>(8)) WARN("oneDNN keeps conv2d's output plain here: no layout conversion is exercised");
  check_agreement<cnn>(8, 21);
}

TEST_CASE("float and double agree on a small ResNet: batch norm, padded pooling, residual_with, global pooling",
          "[layers][backend][batch_norm]") {
  if (!first_layer_output_is_blocked<small_resnet>(4)) WARN("oneDNN keeps conv2d's output plain here");
  check_agreement<small_resnet>(4, 31);
}

TEST_CASE("float and double agree on the example cnn at an odd batch", "[layers][backend]") {
  check_agreement<cnn>(5, 22);
}

TEST_CASE("float and double agree through residual, avg_pool2d, layer_norm and flatten", "[layers][backend]") {
  if (!first_layer_output_is_blocked<mixed>(4)) WARN("oneDNN keeps conv2d's output plain here: no layout conversion is exercised");
  check_agreement<mixed>(4, 23);
  check_agreement<mixed>(3, 24);
  check_agreement<mixed_plain_into_residual>(4, 25);
}

TEST_CASE("float runs repeat bit for bit with the same seed", "[layers][backend]") {
  model<cnn, float> a(5), b(5);
  const auto first = float_step(a, 8, 100);
  CHECK(bitwise_equal(first, float_step(b, 8, 100)));  // another model, same seed
  CHECK(bitwise_equal(first, float_step(a, 8, 100)));  // the same model again (cached primitives)
  // A different batch size in between (new primitives) changes nothing either.
  float_step(a, 5, 7);
  CHECK(bitwise_equal(first, float_step(a, 8, 100)));

  model<mixed, float> c(6), d(6);
  const auto second = float_step(c, 4, 200);
  CHECK(bitwise_equal(second, float_step(d, 4, 200)));
  CHECK(bitwise_equal(second, float_step(c, 4, 200)));

  model<mixed_plain_into_residual, float> e(7), f(7);
  const auto third = float_step(e, 3, 300);
  CHECK(bitwise_equal(third, float_step(f, 3, 300)));
  CHECK(bitwise_equal(third, float_step(e, 3, 300)));
}

TEST_CASE("float convolutions with few output pixels take each batch's own input, also from the same buffer",
          "[layers][backend]") {
  // small_resnet's 3x3-pixel convolutions run their weight gradient as a matmul over x's
  // columns, made from a channels-last copy of x: a second batch in the same memory must not
  // find the first batch's copy or columns.
  const std::size_t batch = 4;
  model<small_resnet, float> reused(41), fresh(41);
  const auto a = loom::testing::random_values(batch * small_resnet::input_shape::size, 42, 1.0, 0.0);
  const auto b = loom::testing::random_values(batch * small_resnet::input_shape::size, 43, 1.0, 0.0);
  const auto dyd = loom::testing::random_values(batch * small_resnet::output_shape::size, 44, 0.1, 0.0);
  const std::vector<float> dy(dyd.begin(), dyd.end());
  std::vector<float> x(a.begin(), a.end());
  auto step = [&](model<small_resnet, float>& m) {
    m.forward(run_context{}, x.data(), batch);
    m.backward(run_context{}, dy.data(), batch);
    const auto g = m.gradients();
    return std::vector<float>(g.begin(), g.end());
  };
  const auto first = step(reused);
  std::copy(b.begin(), b.end(), x.begin());  // the same buffer
  const auto second = step(reused);
  CHECK(bitwise_equal(second, step(fresh)));
  CHECK(!bitwise_equal(first, second));
}

namespace {

/// A convolution of at most 16 output pixels (its float weight gradient a matmul over x's
/// columns) given x in layout `xf`: the weight and bias gradients against the reference loops in
/// double, overwritten and accumulated.
template <std::size_t C, std::size_t HW, std::size_t OC, std::size_t K, std::size_t S, std::size_t P>
void check_weight_gradient_by_matmul(const cpu_format& xf, std::uint64_t seed) {
  constexpr std::size_t n = 4, ohw = (HW + 2 * P - K) / S + 1;
  static_assert(ohw * ohw <= 16, "the weight gradient runs as a matmul only for at most 16 output pixels");
  using in_shape = shape<C, HW, HW>;
  using out_shape = shape<OC, ohw, ohw>;
  const conv2d_geometry g{C, HW, HW, OC, K, S, P};
  const auto xd = loom::testing::random_values(n * in_shape::size, seed, 1.0, 0.0);
  const auto wd = loom::testing::random_values(g.weight_count(), seed + 1, 0.5, 0.0);
  const auto dyd = loom::testing::random_values(n * out_shape::size, seed + 2, 1.0, 0.0);
  // The float values, and the reference taking exactly them.
  const std::vector<float> x(xd.begin(), xd.end()), w(wd.begin(), wd.end()), dy_plain(dyd.begin(), dyd.end()),
      b(OC, 0.0f);
  const std::vector<double> xr(x.begin(), x.end()), wr(w.begin(), w.end()), dyr(dy_plain.begin(), dy_plain.end());
  std::vector<double> dw_ref(g.weight_count()), db_ref(OC);
  detail::conv2d_reference<double>::backward(g, n, xr.data(), wr.data(), dyr.data(), nullptr, dw_ref.data(),
                                             db_ref.data(), false);

  cpu::layout_converter conv;
  std::vector<float> x_in(x.size()), y(n * out_shape::size), dy(y.size());
  conv.from_plain<float, in_shape>(x.data(), xf, x_in.data(), n);
  cpu_conv2d_plan<float> plan(g);
  const cpu_format yf = plan.forward(x_in.data(), xf, w.data(), b.data(), y.data(), n);
  conv.from_plain<float, out_shape>(dy_plain.data(), yf, dy.data(), n);
  // Within float rounding of the reference's sums (64 products each), relative to the largest.
  auto agree = [](const std::vector<float>& actual, const std::vector<double>& expected) {
    const auto c = compare_relative(std::span<const float>(actual), std::span<const double>(expected),
                                    max_abs(std::span<const double>(expected)));
    INFO(c.str());
    CHECK(c.max_error < 1e-5);
  };
  std::vector<float> dw(g.weight_count(), 7.0f), db(OC, 7.0f);
  plan.backward(x_in.data(), xf, w.data(), dy.data(), nullptr, dw.data(), db.data(), n, false);
  agree(dw, dw_ref);
  agree(db, db_ref);
  // Accumulated: the same gradient added to what dw and db hold.
  plan.backward(x_in.data(), xf, w.data(), dy.data(), nullptr, dw.data(), db.data(), n, true);
  for (double& v : dw_ref) v *= 2;
  for (double& v : db_ref) v *= 2;
  agree(dw, dw_ref);
  agree(db, db_ref);
}

cpu_format layout_of(std::size_t n, std::size_t c, std::size_t hw, dnnl::memory::format_tag t) {
  using dt = dnnl::memory::dim;
  return {detail::interned_layout(dnnl::memory::desc({static_cast<dt>(n), static_cast<dt>(c), static_cast<dt>(hw),
                                                      static_cast<dt>(hw)},
                                                     dnnl::memory::data_type::f32, t))};
}

}  // namespace

TEST_CASE("a float weight gradient of few output pixels is the reference's by either order of x's columns, "
          "from x in any layout", "[layers][backend]") {
  using tag = dnnl::memory::format_tag;
  // Fewer rows (batch x output pixels) than output channels: columns channel first, read from x
  // in its own layout (another one brought to channels-last first), the product loom's layout.
  SECTION("channel first: 3x3, stride 1, 2x2 pixels (16 rows, 32 outputs); plain, nChw16c, nChw8c, channels-last, "
          "nChw4c") {
    check_weight_gradient_by_matmul<16, 2, 32, 3, 1, 1>(cpu_format{}, 51);
    check_weight_gradient_by_matmul<16, 2, 32, 3, 1, 1>(detail::blocked_nchw(4, 16, 2, 2, 16), 52);
    check_weight_gradient_by_matmul<16, 2, 32, 3, 1, 1>(detail::blocked_nchw(4, 16, 2, 2, 8), 53);
    check_weight_gradient_by_matmul<16, 2, 32, 3, 1, 1>(detail::channels_last_nchw(4, 16, 2, 2), 54);
    check_weight_gradient_by_matmul<16, 2, 32, 3, 1, 1>(layout_of(4, 16, 2, tag::nChw4c), 55);
  }
  SECTION("channel first: 3x3, stride 2, 5x5 in, 3x3 pixels, 3 channels, padding on every side") {
    check_weight_gradient_by_matmul<3, 5, 64, 3, 2, 1>(cpu_format{}, 61);
    check_weight_gradient_by_matmul<3, 5, 64, 3, 2, 1>(detail::channels_last_nchw(4, 3, 5, 5), 62);
  }
  SECTION("channel first: 1x1, stride 2, 32 channels, nChw16c") {
    check_weight_gradient_by_matmul<32, 8, 128, 1, 2, 0>(detail::blocked_nchw(4, 32, 8, 8, 16), 71);
  }
  // As many rows as outputs or more: columns (ky, kx, ic), the product reordered after.
  SECTION("(ky, kx, ic) columns: 3x3, stride 1, 4x4 pixels (64 rows, 32 outputs); plain, nChw16c, nChw4c") {
    check_weight_gradient_by_matmul<16, 4, 32, 3, 1, 1>(cpu_format{}, 81);
    check_weight_gradient_by_matmul<16, 4, 32, 3, 1, 1>(detail::blocked_nchw(4, 16, 4, 4, 16), 82);
    check_weight_gradient_by_matmul<16, 4, 32, 3, 1, 1>(layout_of(4, 16, 4, tag::nChw4c), 83);
  }
}

TEST_CASE("CPU formats: one object per oneDNN layout, pooling reads the blocked ones, reorders round-trip",
          "[layers][backend]") {
  // The blocked layouts pooling hands on: the same layout twice is one object (a format is a
  // pointer to it), another block size or shape another.
  const cpu_format b16 = detail::blocked_nchw(4, 16, 8, 8, 16), b8 = detail::blocked_nchw(4, 16, 8, 8, 8);
  REQUIRE_FALSE(b16.plain());
  CHECK(b16 == detail::blocked_nchw(4, 16, 8, 8, 16));
  CHECK(b16.layout == detail::blocked_nchw(4, 16, 8, 8, 16).layout);
  CHECK_FALSE(b16 == b8);
  CHECK_FALSE(b16 == detail::blocked_nchw(2, 16, 8, 8, 16));
  CHECK_FALSE(b16 == cpu_format{});
  CHECK(detail::channel_block(b16, 4, 16, 8, 8) == 16);
  CHECK(detail::channel_block(b8, 4, 16, 8, 8) == 8);
  CHECK(detail::channel_block(cpu_format{}, 4, 16, 8, 8) == 1);
  CHECK(detail::channel_block(b16, 2, 16, 8, 8) == 0);  // another batch: not a layout pooling reads

  // Two convolutions of one geometry hand on the same format object for the same batch.
  const conv2d_geometry g{3, 8, 8, 16, 3, 1, 1};
  cpu_conv2d_plan<float> p1(g), p2(g);
  std::vector<float> x(4 * 3 * 8 * 8, 0.5f), w(g.weight_count(), 0.25f), b(16, 0.0f), y1(4 * 16 * 8 * 8), y2(y1.size());
  const cpu_format f1 = p1.forward(x.data(), {}, w.data(), b.data(), y1.data(), 4);
  const cpu_format f2 = p2.forward(x.data(), {}, w.data(), b.data(), y2.data(), 4);
  CHECK(f1 == f2);
  CHECK(f1.layout == f2.layout);
  CHECK(y1 == y2);

  // plain -> blocked -> plain gives the values back, through a converter and through the one
  // it is moved into (which takes its reorder primitives along).
  std::vector<float> plain(4 * 16 * 8 * 8), blocked(plain.size()), back(plain.size());
  for (std::size_t i = 0; i < plain.size(); ++i) plain[i] = static_cast<float>(i % 97) - 48.0f;
  cpu::layout_converter conv;
  conv.from_plain<float, shape<16, 8, 8>>(plain.data(), b16, blocked.data(), 4);
  CHECK_FALSE(blocked == plain);  // the channel blocks moved the values
  CHECK(conv.to_plain<float, shape<16, 8, 8>>(blocked.data(), b16, 4) != blocked.data());
  std::memcpy(back.data(), conv.to_plain<float, shape<16, 8, 8>>(blocked.data(), b16, 4), back.size() * sizeof(float));
  CHECK(back == plain);
  cpu::layout_converter moved(std::move(conv));
  std::fill(back.begin(), back.end(), 0.0f);
  moved.convert<float, shape<16, 8, 8>>(blocked.data(), b16, back.data(), b8, 4);
  std::vector<float> again(plain.size());
  std::memcpy(again.data(), moved.to_plain<float, shape<16, 8, 8>>(back.data(), b8, 4), again.size() * sizeof(float));
  CHECK(again == plain);
}

TEST_CASE("max pooling on plain, channel-blocked and channels-last layouts: each window's first maximum, "
          "ties included, gets its gradient, bit for bit as a scalar reference",
          "[layers][backend]") {
  // Overlapping padded windows (k 3, stride 2, pad 1) over values with many ties (0, 1, 2), so
  // which maximum wins matters, and gradients of several windows add up in one place.
  constexpr std::size_t n = 2, c = 32, h = 9, w = 9;
  const pool2d_geometry g{c, h, w, 3, 2, 1};
  const std::size_t oh = g.oh(), ow = g.ow();
  std::vector<float> x(n * c * h * w), dy(n * c * oh * ow);
  std::uint32_t state = 12345;
  const auto next = [&] { return state = state * 1664525u + 1013904223u; };
  for (auto& v : x) v = static_cast<float>((next() >> 16) % 3u);
  for (auto& v : dy) v = static_cast<float>(static_cast<int>(next() >> 16 & 1023u) - 512) / 64.0f;

  // The reference, plain NCHW: windows in row-major order, the first strictly greater value wins.
  std::vector<float> y_ref(dy.size()), dx_ref(x.size(), 0.0f);
  for (std::size_t s = 0; s < n * c; ++s)
    for (std::size_t i = 0; i < oh; ++i)
      for (std::size_t j = 0; j < ow; ++j) {
        std::size_t at = x.size();
        for (std::size_t p = 0; p < g.k; ++p)
          for (std::size_t q = 0; q < g.k; ++q) {
            const std::ptrdiff_t r = static_cast<std::ptrdiff_t>(i * g.stride + p) - static_cast<std::ptrdiff_t>(g.pad);
            const std::ptrdiff_t t = static_cast<std::ptrdiff_t>(j * g.stride + q) - static_cast<std::ptrdiff_t>(g.pad);
            if (r < 0 || t < 0 || r >= static_cast<std::ptrdiff_t>(h) || t >= static_cast<std::ptrdiff_t>(w)) continue;
            const std::size_t e = (s * h + static_cast<std::size_t>(r)) * w + static_cast<std::size_t>(t);
            if (at == x.size() || x[e] > x[at]) at = e;
          }
        y_ref[(s * oh + i) * ow + j] = x[at];
        dx_ref[at] += dy[(s * oh + i) * ow + j];
      }

  // Where (sample, channel, row, column) sits in each layout.
  struct layout {
    const char* name;
    cpu_format format;
    std::size_t (*at)(std::size_t, std::size_t, std::size_t, std::size_t, std::size_t, std::size_t, std::size_t);
  };
  const layout layouts[] = {
      {"plain", cpu_format{},
       [](std::size_t s, std::size_t ch, std::size_t r, std::size_t t, std::size_t C, std::size_t H, std::size_t W) {
         return ((s * C + ch) * H + r) * W + t;
       }},
      {"nChw16c", detail::blocked_nchw(n, c, h, w, 16),
       [](std::size_t s, std::size_t ch, std::size_t r, std::size_t t, std::size_t C, std::size_t H, std::size_t W) {
         return (((s * (C / 16) + ch / 16) * H + r) * W + t) * 16 + ch % 16;
       }},
      {"nhwc", detail::channels_last_nchw(n, c, h, w),
       [](std::size_t s, std::size_t ch, std::size_t r, std::size_t t, std::size_t C, std::size_t H, std::size_t W) {
         return ((s * H + r) * W + t) * C + ch;
       }},
  };
  for (const layout& l : layouts) {
    INFO("layout " << l.name);
    std::vector<float> xl(x.size()), dyl(dy.size()), yl(dy.size()), dxl(x.size(), -1.0f);
    for (std::size_t s = 0; s < n; ++s)
      for (std::size_t ch = 0; ch < c; ++ch) {
        for (std::size_t r = 0; r < h; ++r)
          for (std::size_t t = 0; t < w; ++t) xl[l.at(s, ch, r, t, c, h, w)] = x[((s * c + ch) * h + r) * w + t];
        for (std::size_t r = 0; r < oh; ++r)
          for (std::size_t t = 0; t < ow; ++t) dyl[l.at(s, ch, r, t, c, oh, ow)] = dy[((s * c + ch) * oh + r) * ow + t];
      }
    cpu_pool2d_plan<float> plan(g, pool_kind::max);
    plan.forward(xl.data(), l.format, yl.data(), n);
    plan.backward(xl.data(), l.format, dyl.data(), dxl.data(), n);
    std::size_t wrong_y = 0, wrong_dx = 0;
    for (std::size_t s = 0; s < n; ++s)
      for (std::size_t ch = 0; ch < c; ++ch) {
        for (std::size_t r = 0; r < oh; ++r)
          for (std::size_t t = 0; t < ow; ++t)
            wrong_y += yl[l.at(s, ch, r, t, c, oh, ow)] != y_ref[((s * c + ch) * oh + r) * ow + t];
        for (std::size_t r = 0; r < h; ++r)
          for (std::size_t t = 0; t < w; ++t)
            wrong_dx += std::memcmp(&dxl[l.at(s, ch, r, t, c, h, w)], &dx_ref[((s * c + ch) * h + r) * w + t],
                                    sizeof(float)) != 0;
      }
    CHECK(wrong_y == 0);
    CHECK(wrong_dx == 0);
  }
  // The data has the ties the test is about: some window holds its maximum more than once.
  std::size_t tied = 0;
  for (std::size_t i = 0; i < oh; ++i)
    for (std::size_t j = 0; j < ow; ++j) {
      int count = 0;
      for (std::size_t p = 0; p < g.k; ++p)
        for (std::size_t q = 0; q < g.k; ++q) {
          const std::size_t r = i * g.stride + p, t = j * g.stride + q;
          if (r < g.pad || t < g.pad || r - g.pad >= h || t - g.pad >= w) continue;
          count += x[(r - g.pad) * w + t - g.pad] == y_ref[i * ow + j];
        }
      tied += count > 1;
    }
  CHECK(tied > 0);
}

TEST_CASE("x's columns in oneDNN's BA16a64b are the plain columns' values block by block, zeros in the padding",
          "[layers][backend]") {
  // 3 samples at 3x3 output pixels: 27 rows (padded to 32); 5 channels by 3x3: 45 columns
  // (padded to 64). And 24 channels, 3x3: 216 columns, four bands, the last part padding.
  for (std::size_t c : {std::size_t{5}, std::size_t{24}}) {
    INFO("channels " << c);
    const conv2d_geometry g{c, 5, 5, 8, 3, 2, 1};
    const std::size_t batch = 3, rows = batch * g.oh() * g.ow(), width = 9 * c;
    using dt = dnnl::memory::dim;
    const dnnl::memory::desc packed_desc({static_cast<dt>(rows), static_cast<dt>(width)}, dnnl::memory::data_type::f32,
                                         dnnl::memory::format_tag::BA16a64b);
    const detail::conv2d_column_layout packed = detail::conv2d_column_layout_of(packed_desc);
    REQUIRE(packed.packed_rows == 32);
    CHECK(detail::conv2d_column_layout_of(dnnl::memory::desc({static_cast<dt>(rows), static_cast<dt>(width)},
                                                             dnnl::memory::data_type::f32,
                                                             dnnl::memory::format_tag::ab))
              .packed_rows == 0);
    const std::size_t room = packed_desc.get_size() / sizeof(float);
    REQUIRE(room == 32 * ((width + 63) / 64 * 64));
    // x plain (for the channel-first columns) and channels-last (for the (ky, kx, c) ones).
    std::vector<float> x(batch * c * 25), x_nhwc(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i) + 1.0f;  // no zeros: padding tells
    for (std::size_t s = 0; s < batch; ++s)
      for (std::size_t ch = 0; ch < c; ++ch)
        for (std::size_t p = 0; p < 25; ++p) x_nhwc[(s * 25 + p) * c + ch] = x[(s * c + ch) * 25 + p];
    for (int channel_first = 0; channel_first < 2; ++channel_first) {
      INFO((channel_first ? "channel-first columns" : "(ky, kx, c) columns"));
      std::vector<float> plain(rows * width, -1.0f), blocked(room, -1.0f);  // -1: never written
      if (channel_first) {
        detail::conv2d_channel_major_columns(g, batch, x.data(), 1, plain.data());
        detail::conv2d_channel_major_columns(g, batch, x.data(), 1, blocked.data(), packed);
      } else {
        detail::conv2d_columns(g, batch, x_nhwc.data(), plain.data());
        detail::conv2d_columns(g, batch, x_nhwc.data(), blocked.data(), packed);
      }
      std::vector<bool> seen(room, false);
      std::size_t wrong = 0, zeros = 0;
      for (std::size_t r = 0; r < rows; ++r)
        for (std::size_t n = 0; n < width; ++n) {
          // BA16a64b by its definition: band n / 64, block r / 16, then r % 16 rows of 64.
          const std::size_t at = (n / 64) * 32 * 64 + (r / 16) * 16 * 64 + (r % 16) * 64 + n % 64;
          wrong += blocked[at] != plain[r * width + n];
          zeros += plain[r * width + n] == 0.0f;  // x's padding
          seen[at] = true;
        }
      CHECK(wrong == 0);
      CHECK(zeros > 0);
      CHECK(std::count(plain.begin(), plain.end(), -1.0f) == 0);
      std::size_t padding = 0, padding_not_zero = 0;
      for (std::size_t i = 0; i < room; ++i)
        if (!seen[i]) ++padding, padding_not_zero += blocked[i] != 0.0f;
      CHECK(padding == room - rows * width);
      CHECK(padding_not_zero == 0);
    }
  }
  // The layout oneDNN's f32 matmul picks for B given the choice, where its AVX-512 kernels run
  // (oneDNN 2.6): the one loom writes, so the weight gradient's matmul reads its columns blocked.
  if (detail::cpu_vector_level() == 2) {
    const dnnl::memory::desc a({32, 27}, dnnl::memory::data_type::f32, dnnl::memory::format_tag::ba),
        b({27, 216}, dnnl::memory::data_type::f32, dnnl::memory::format_tag::any),
        c({32, 216}, dnnl::memory::data_type::f32, dnnl::memory::format_tag::ab);
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), detail::dnnl_engine());
    CHECK(detail::conv2d_column_layout_of(pd.weights_desc()).packed_rows == 32);
  }
}

TEST_CASE("conv_algorithm: automatic runs oneDNN's Winograd kernels where they pay, winograd where they suit, direct "
          "nowhere; Winograd agrees with the reference",
          "[layers][backend]") {
  struct restore {  // the setting is the process's: put the default back whatever happens
    ~restore() { set_conv_algorithm(conv_algorithm::automatic); }
  } guard;
  CHECK(get_conv_algorithm() == conv_algorithm::automatic);  // the default
  const bool avx512 = detail::cpu_vector_level() == 2;  // where oneDNN 2.6 has them (jit_wino_4x3:avx512_core)
  constexpr std::size_t n = 4;
  const conv2d_geometry suits{32, 8, 8, 48, 3, 1, 1}, too_few_channels{16, 8, 8, 48, 3, 1, 1},
      strided{32, 8, 8, 48, 3, 2, 1};
  CHECK(detail::conv2d_winograd_suits(suits));
  CHECK_FALSE(detail::conv2d_winograd_suits(too_few_channels));
  CHECK_FALSE(detail::conv2d_winograd_suits(strided));
  CHECK_FALSE(detail::conv2d_winograd_suits({32, 3, 3, 48, 3, 1, 1}));  // 3x3 output pixels

  // Where it pays (automatic): enough channels, and enough 4x4 tiles per thread (64 at 1 or 2).
  const conv2d_geometry c64_16{64, 16, 16, 64, 3, 1, 1}, c512_7{512, 7, 7, 512, 3, 1, 1},
      c32_14{32, 14, 14, 32, 3, 1, 1}, c32_28{32, 28, 28, 32, 3, 1, 1}, c48_14{48, 14, 14, 48, 3, 1, 1};
  CHECK(detail::conv2d_winograd_pays(c64_16, 4, 1));        // 64 tiles
  CHECK(detail::conv2d_winograd_pays(c64_16, 4, 2));
  CHECK_FALSE(detail::conv2d_winograd_pays(c64_16, 3, 1));  // 48
  CHECK_FALSE(detail::conv2d_winograd_pays(c64_16, 4, 4));  // 16 a thread
  CHECK(detail::conv2d_winograd_pays(c64_16, 8, 4));
  CHECK(detail::conv2d_winograd_pays(c512_7, 16, 1));       // 4 tiles a sample
  CHECK_FALSE(detail::conv2d_winograd_pays(c512_7, 8, 1));
  CHECK_FALSE(detail::conv2d_winograd_pays(c32_14, 64, 1));  // 32 channels at 14x14: no gain
  CHECK(detail::conv2d_winograd_pays(c32_28, 4, 1));         // at 28x28: a gain
  CHECK(detail::conv2d_winograd_pays(c48_14, 32, 1));
  CHECK_FALSE(detail::conv2d_winograd_pays(too_few_channels, 64, 1));
  CHECK_FALSE(detail::conv2d_winograd_pays(strided, 64, 1));
  CHECK_FALSE(detail::conv2d_winograd_pays({512, 2, 2, 512, 3, 1, 1}, 256, 1));  // 2x2 output pixels

  auto implementations = [](const conv2d_geometry& g, std::size_t batch) {
    cpu_conv2d_plan<float> plan(g);
    return plan.implementations(batch, {});
  };
  {  // automatic: by the batch (16 samples of 8x8: 64 tiles; 4: 16)
    const std::string pays = implementations({64, 8, 8, 64, 3, 1, 1}, 16),
                      not_yet = implementations({64, 8, 8, 64, 3, 1, 1}, 4);
    INFO(pays << " / " << not_yet);
    const bool few_threads = omp_get_max_threads() <= 2;  // 64 tiles are enough for 1 or 2
    CHECK((pays.find("fwd jit_wino") != std::string::npos) == (avx512 && few_threads));
    CHECK((pays.find("bwd_w jit_wino") != std::string::npos) == (avx512 && few_threads));
    CHECK(not_yet.find("wino") == std::string::npos);
  }
  set_conv_algorithm(conv_algorithm::direct);
  CHECK(get_conv_algorithm() == conv_algorithm::direct);
  {  // direct: nowhere
    const std::string impl = implementations({64, 8, 8, 64, 3, 1, 1}, 16);
    INFO(impl);
    CHECK(impl.find("wino") == std::string::npos);
  }
  set_conv_algorithm(conv_algorithm::winograd);
  CHECK(get_conv_algorithm() == conv_algorithm::winograd);
  for (const conv2d_geometry& g : {too_few_channels, strided}) {
    const std::string impl = implementations(g, n);
    INFO(impl);
    CHECK(impl.find("wino") == std::string::npos);
  }
  // In bf16 math nothing changes (oneDNN has no bf16 Winograd).
  if (detect_cpu_features().bf16) {
    cpu_conv2d_plan<float> plan(suits);
    const std::string impl = plan.implementations(n, {}, math_mode::bf16);
    INFO(impl);
    CHECK(impl.find("wino") == std::string::npos);
  }

  // Forward and both gradients against the double reference, within a few times float
  // rounding of sums of 288 products (Winograd's transforms round more than a direct sum does).
  const conv2d_geometry& g = suits;
  cpu_conv2d_plan<float> plan(g);
  const std::string impl = plan.implementations(n, {});
  INFO(impl);
  CHECK((impl.find("fwd jit_wino") != std::string::npos) == avx512);
  CHECK((impl.find("bwd_d jit_wino") != std::string::npos) == avx512);
  CHECK((impl.find("bwd_w jit_wino") != std::string::npos) == avx512);
  const std::size_t xs = n * g.c * g.h * g.w, ys = n * g.oc * g.oh() * g.ow();
  const auto xd = loom::testing::random_values(xs, 91, 1.0, 0.0);
  const auto wd = loom::testing::random_values(g.weight_count(), 92, 0.1, 0.0);
  const auto bd = loom::testing::random_values(g.oc, 93, 0.1, 0.0);
  const auto dyd = loom::testing::random_values(ys, 94, 1.0, 0.0);
  const std::vector<float> x(xd.begin(), xd.end()), w(wd.begin(), wd.end()), b(bd.begin(), bd.end()),
      dy(dyd.begin(), dyd.end());
  const std::vector<double> xr(x.begin(), x.end()), wr(w.begin(), w.end()), br(b.begin(), b.end()),
      dyr(dy.begin(), dy.end());
  std::vector<double> y_ref(ys), dx_ref(xs), dw_ref(g.weight_count()), db_ref(g.oc);
  detail::conv2d_reference<double>::forward(g, n, xr.data(), wr.data(), br.data(), y_ref.data());
  detail::conv2d_reference<double>::backward(g, n, xr.data(), wr.data(), dyr.data(), dx_ref.data(), dw_ref.data(),
                                             db_ref.data(), false);
  auto agree = [](const char* what, const std::vector<float>& actual, const std::vector<double>& expected) {
    const auto c = compare_relative(std::span<const float>(actual), std::span<const double>(expected),
                                    max_abs(std::span<const double>(expected)));
    INFO(what << ": " << c.str());
    CHECK(c.max_error < 1e-5);
  };
  cpu::layout_converter conv;
  std::vector<float> y(ys), dx(xs), dw(g.weight_count()), db(g.oc);
  const cpu_format yf = plan.forward(x.data(), {}, w.data(), b.data(), y.data(), n);
  std::vector<float> y_plain(ys), dy_in(ys);
  std::memcpy(y_plain.data(), conv.to_plain<float, shape<48, 8, 8>>(y.data(), yf, n), ys * sizeof(float));
  agree("y", y_plain, y_ref);
  conv.from_plain<float, shape<48, 8, 8>>(dy.data(), yf, dy_in.data(), n);
  plan.backward(x.data(), {}, w.data(), dy_in.data(), dx.data(), dw.data(), db.data(), n, false);
  agree("dx", dx, dx_ref);
  agree("dw", dw, dw_ref);
  agree("db", db, db_ref);
}

namespace {
// Two blocks, each after a ReLU: in `relu_into_block` each block applies that ReLU's gradient in
// its own backward (detail::backward_fused_into_next: the ReLU runs none); in `relu_cut` an
// identity pooling between the ReLU and the block keeps the ReLU's own backward.
using basic_block = residual_with<layers<conv2d<16, 3, 1, 1, no_bias>, batch_norm, relu, conv2d<16, 3, 1, 1, no_bias>, batch_norm>>;
using down_block = residual_with<layers<conv2d<32, 3, 2, 1, no_bias>, batch_norm, relu, conv2d<32, 3, 1, 1, no_bias>, batch_norm>,
                                 shortcut<conv2d<32, 1, 2, 0, no_bias>, batch_norm>>;
using relu_into_block = network<input<3, 8, 8>, conv2d<16, 3, 1, 1>, relu, basic_block, relu, down_block, relu,
                                global_avg_pool2d, flatten, linear<5>>;
using relu_cut = network<input<3, 8, 8>, conv2d<16, 3, 1, 1>, relu, avg_pool2d<1>, basic_block, relu, avg_pool2d<1>,
                         down_block, relu, global_avg_pool2d, flatten, linear<5>>;
}  // namespace

TEST_CASE("A residual block applies the gradient of the ReLU before it, bit for bit the ReLU's own backward",
          "[layers][backend][residual]") {
  using chain = relu_into_block::chain;
  // The ReLUs before the blocks run no backward (the one after the convolution is fused into it;
  // its gradient is the block's to apply), the one after the last block does.
  static_assert(detail::backward_skipped_in_sequence<chain, 1, cpu>());
  static_assert(detail::backward_skipped_in_sequence<chain, 3, cpu>());
  static_assert(!detail::backward_skipped_in_sequence<chain, 5, cpu>());
  static_assert(!detail::backward_skipped_in_sequence<relu_cut::chain, 1, cpu>());
  static_assert(!detail::backward_skipped_in_sequence<relu_cut::chain, 4, cpu>());
  static_assert(relu_into_block::parameter_count == relu_cut::parameter_count);
  const std::size_t batch = 4;
  model<relu_into_block, float> fused(5);
  model<relu_cut, float> cut(5);
  std::copy(fused.parameters().begin(), fused.parameters().end(), cut.parameters().begin());
  const auto xd = loom::testing::random_values(batch * relu_into_block::input_shape::size, 131, 1.0, 0.0);
  const auto dyd = loom::testing::random_values(batch * relu_into_block::output_shape::size, 132, 1.0, 0.0);
  const std::vector<float> x(xd.begin(), xd.end()), dy(dyd.begin(), dyd.end());
  run_context ctx;
  for (int step = 0; step < 2; ++step) {
    const float* ya = fused.forward(ctx, x.data(), batch);
    const std::vector<float> a(ya, ya + batch * relu_into_block::output_shape::size);
    const float* yb = cut.forward(ctx, x.data(), batch);
    CHECK(bitwise_equal(a, std::vector<float>(yb, yb + a.size())));
    fused.backward(ctx, dy.data(), batch);
    cut.backward(ctx, dy.data(), batch);
    const auto ga = fused.copy_gradients_to_host(), gb = cut.copy_gradients_to_host();
    CHECK(bitwise_equal(ga, gb));
    // The ReLUs zero part of the gradient: a mask left out would show in the first layers'.
    CHECK(max_abs(std::span<const float>(ga.data(), 16 * 27)) > 0);
  }
}
