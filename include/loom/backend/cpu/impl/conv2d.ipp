// SPDX-License-Identifier: Apache-2.0
#pragma once
// The definitions of conv2d.hpp's oneDNN convolution (detail::dnnl_conv2d): included at the end
// of the header (header-only), or compiled once in src/loom.cpp (LOOM_SEPARATE_COMPILATION; see
// loom/core/config.hpp).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <omp.h>

#include "loom/backend/cpu/conv2d.hpp"
#include "loom/backend/cpu/gemm.hpp"
#include "loom/backend/cpu/impl/dnnl_support.ipp"
#include "loom/backend/cpu/impl/onednn.hpp"
#include "loom/backend/cpu/launch.hpp"

namespace loom::detail {

struct dnnl_conv2d::entry {
  std::size_t batch;
  math_mode math;
  dnnl::memory::desc src_given;  // the layout x arrives in (float)
  cpu_format dst_format;  // the layout y is handed on in
  dnnl::memory::desc y_desc;  // the same, as a desc (also when plain)
  dnnl::convolution_forward::primitive_desc fwd_pd;
  dnnl::convolution_forward fwd;
  dnnl::convolution_backward_data::primitive_desc bwd_data_pd;
  dnnl::convolution_backward_data bwd_data;
  dnnl::convolution_backward_weights::primitive_desc bwd_w_pd;
  dnnl::convolution_backward_weights bwd_w;
  reorder_cache reorders;
  scratch src_scratch, w_fwd_scratch, w_bwd_scratch, dst_scratch, ddst_scratch, ddst_w_scratch, dsrc_scratch,
      dw_scratch, dw_plain_scratch, db_scratch;
  // The x of which a reordered copy (bf16: its conversion) is at src_ready, in src_of_desc:
  // src_scratch, or the bf16 copy the layer that wrote x made (activation::bf16). Backward of
  // the same x uses it rather than converting x again (x, and its copy, are unchanged until its
  // backward); a forward of another x replaces it.
  const float* src_of = nullptr;
  dnnl::memory::desc src_of_desc;
  const void* src_ready = nullptr;
  /// x in layout `want` (reordered; in bf16, converted): forward's copy when reuse and it is of
  /// this x in this layout, else a reorder of x into src_scratch.
  const void* x_as(const float* x, const dnnl::memory::desc& want, bool reuse) {
    if (reuse && src_of == x && src_of_desc == want) return src_ready;
    void* p = room_for(src_scratch, want);
    src_of = nullptr;  // until the reorder has succeeded
    reorders.run(src_given, x, want, p);
    src_of = x;
    src_of_desc = want;
    src_ready = p;
    return p;
  }

  // Few output pixels (conv2d_weights_by_matmul): the weight gradient as one matmul, dy^T
  // (OC x N*OH*OW) by the columns of x (N*OH*OW x K*K*C), in the products' type (bf16 or f32),
  // instead of the primitive; with fewer still in bf16 (conv2d_by_matmul), forward (columns by
  // the weights as (K*K*C x OC)) and the input gradient (dy by the weights, then the columns'
  // gradient added back into place) too. x_rows, dy_rows_nhwc: x and dy channels-last in the
  // products' type.
  std::unique_ptr<dnnl::matmul> wgrad, fwd_mm, dgrad;
  dnnl::memory::desc x_rows, dy_rows_nhwc, wgrad_a, wgrad_b, wgrad_c;
  dnnl::memory::desc w_ohwi;  // the weights, bf16, (oc, ky, kx, ic): a row of K*K*C per output channel
  scratch cols_scratch, wgrad_scratch, dcols_scratch;
  const float* cols_of = nullptr;  // the x whose columns cols_scratch holds (forward's, for backward)

  // The matmuls' other operands (wgrad_b: the columns, rows x width).
  struct forward_descs {
    dnnl::memory::desc weights, bias, dst;
  };
  dnnl::memory::dim rows() const { return wgrad_b.dims()[0]; }
  dnnl::memory::dim width() const { return wgrad_b.dims()[1]; }
  dnnl::memory::dim outs() const { return wgrad_a.dims()[0]; }
  /// forward: the weights as (width x OC) (their ohwi rows, transposed), the bias, y as rows x OC.
  forward_descs fwd_mm_desc() const {
    using dt = dnnl::memory::data_type;
    using tag = dnnl::memory::format_tag;
    return {dnnl::memory::desc({width(), outs()}, dt::bf16, tag::ba), dnnl::memory::desc({1, outs()}, dt::f32, tag::ab),
            dnnl::memory::desc({rows(), outs()}, dt::f32, tag::ab)};
  }
  /// input gradient: dy as rows x OC, the weights as OC x width, the columns' gradient.
  dnnl::memory::desc dy_rows_desc() const {
    return {{rows(), outs()}, dnnl::memory::data_type::bf16, dnnl::memory::format_tag::ab};
  }
  dnnl::memory::desc w_rows_desc() const {
    return {{outs(), width()}, dnnl::memory::data_type::bf16, dnnl::memory::format_tag::ab};
  }
  dnnl::memory::desc dcols_desc() const {
    return {{rows(), width()}, dnnl::memory::data_type::f32, dnnl::memory::format_tag::ab};
  }
  /// x's shape, float, channels-last.
  dnnl::memory::desc x_f32_nhwc() const {
    return {x_rows.dims(), dnnl::memory::data_type::f32, dnnl::memory::format_tag::nhwc};
  }
};

/// Whether a bf16 convolution's forward and input gradient run as matmuls over x's columns
/// too: where its output has at most 4 pixels (oneDNN 2.6's AMX kernels at 2x2: 10.3 and 10.5 ms
/// a call for ResNet-18's 512-channel 3x3 convolution, batch 64, one thread, about 120 GFLOP/s;
/// at 4x4 they run 600-760 GFLOP/s and stay).
inline bool conv2d_by_matmul(const conv2d_geometry& g) { return g.oh() * g.ow() <= 4; }

/// Whether a convolution's weight gradient runs as a matmul over x's columns: where its output
/// has at most 16 pixels (in bf16: when its output is channels-last, as AMX writes it). oneDNN
/// 2.6's backward-weights kernels are slow there: ResNet-18's 512-channel 3x3 convolution at 2x2,
/// batch 64, one thread, took 26-29 ms a call in bf16 (AMX) and 36 ms in fp32 (AVX-512), against
/// 1.4 ms and 7.5 ms for the same products as one matmul (benchmarks/README.md, `resnet`). The
/// columns cost N*OH*OW*K*K*C values, few at these sizes.
inline bool conv2d_weights_by_matmul(const conv2d_geometry& g, math_mode math, const dnnl::memory::desc& y_desc,
                                     std::size_t batch) {
  using dt = dnnl::memory::dim;
  const dnnl::memory::desc nhwc({static_cast<dt>(batch), static_cast<dt>(g.oc), static_cast<dt>(g.oh()),
                                 static_cast<dt>(g.ow())},
                                dnnl::memory::data_type::f32, dnnl::memory::format_tag::nhwc);
  return batch > 0 && g.oh() * g.ow() <= 16 && (math == math_mode::fp32 || y_desc == nhwc);
}

/// Where the weight gradient's matmul reads x's columns (rows x width, the matmul's B): row
/// after row (plain), or oneDNN's BA16a64b — blocks of 16 rows by 64 columns, each block's
/// rows side by side, the blocks of a column band one after another — which oneDNN's f32 matmul
/// picks for B when asked (its brgemm kernel then reads B as it runs, without strides of a row:
/// ResNet-18's (512 x 256) by (256 x 4,608) product took 6.98 ms against 8.17 ms with plain B,
/// (256 x 1,024) by (1,024 x 2,304) 7.08 against 7.83, one thread). Padding (rows up to a
/// multiple of 16, columns of 64) holds zeros.
struct conv2d_column_layout {
  std::size_t width;
  std::size_t packed_rows = 0;  // rows rounded up to 16 when BA16a64b, 0 when plain

  /// Where row r's column 0 would be, and how far column n is from it.
  std::size_t row(std::size_t r) const { return packed_rows ? (r / 16) * 1024 + (r % 16) * 64 : r * width; }
  std::size_t col(std::size_t n) const { return packed_rows ? (n / 64) * packed_rows * 64 + n % 64 : n; }

  /// Copies `count` values to row r's columns [n, n + count) (zeros when from is null): one
  /// copy in the plain layout, one per 64-column band it crosses in BA16a64b.
  template <class Element>
  void put(Element* cols, std::size_t r, std::size_t n, const Element* from, std::size_t count) const {
    Element* at = cols + row(r);
    while (count > 0) {
      const std::size_t run = packed_rows ? std::min(count, 64 - n % 64) : count;
      if (from) {
        std::memcpy(at + col(n), from, run * sizeof(Element));
        from += run;
      } else {
        std::memset(at + col(n), 0, run * sizeof(Element));
      }
      n += run;
      count -= run;
    }
  }

  /// Zeros in BA16a64b's padding: the rows past `rows`, the columns past width.
  template <class Element>
  void zero_padding(Element* cols, std::size_t rows) const {
    if (!packed_rows) return;
    const std::size_t padded_width = (width + 63) / 64 * 64;
    for (std::size_t r = 0; r < packed_rows; ++r)
      if (r >= rows) put<Element>(cols, r, 0, nullptr, padded_width);
      else if (padded_width > width) put<Element>(cols, r, width, nullptr, padded_width - width);
  }
};

/// The layout of columns desc d (rows x width): BA16a64b or plain row-major.
inline conv2d_column_layout conv2d_column_layout_of(const dnnl::memory::desc& d) {
  const auto dims = d.dims();
  const auto rows = static_cast<std::size_t>(dims[0]), width = static_cast<std::size_t>(dims[1]);
  const dnnl::memory::desc packed(dims, d.data_type(), dnnl::memory::format_tag::BA16a64b);
  return {width, d == packed ? (rows + 15) / 16 * 16 : 0};
}

/// x's columns: row (n, oy, ox) holds, for each (ky, kx), the C values of x at
/// (n, oy * stride - pad + ky, ox * stride - pad + kx), zeros outside x. x is channels-last, of
/// Element (bf16's bits, or float); the columns in layout l (plain row-major unless given).
template <class Element>
void conv2d_columns(const conv2d_geometry& g, std::size_t batch, const Element* x, Element* cols,
                    conv2d_column_layout l = {}) {
  const std::size_t oh = g.oh(), ow = g.ow(), k = g.k, c = g.c, rows = batch * oh * ow, width = k * k * c;
  l.width = width;
  const auto n = static_cast<std::ptrdiff_t>(rows);
#pragma omp parallel for schedule(static) if (rows * width >= parallel_threshold)
  for (std::ptrdiff_t r = 0; r < n; ++r) {
    const std::size_t i = static_cast<std::size_t>(r) / (oh * ow), oy = static_cast<std::size_t>(r) / ow % oh,
                      ox = static_cast<std::size_t>(r) % ow;
    for (std::size_t ky = 0; ky < k; ++ky)
      for (std::size_t kx = 0; kx < k; ++kx) {
        const std::ptrdiff_t iy = static_cast<std::ptrdiff_t>(oy * g.stride + ky) - static_cast<std::ptrdiff_t>(g.pad);
        const std::ptrdiff_t ix = static_cast<std::ptrdiff_t>(ox * g.stride + kx) - static_cast<std::ptrdiff_t>(g.pad);
        const bool outside =
            iy < 0 || ix < 0 || iy >= static_cast<std::ptrdiff_t>(g.h) || ix >= static_cast<std::ptrdiff_t>(g.w);
        l.put(cols, static_cast<std::size_t>(r), (ky * k + kx) * c,
              outside ? nullptr
                      : x + ((i * g.h + static_cast<std::size_t>(iy)) * g.w + static_cast<std::size_t>(ix)) * c,
              c);
      }
  }
  l.zero_padding(cols, rows);
}

/// The channel block of a float (n, c, h, w) activation in layout d: 1 plain NCHW, 8 or 16
/// nChw8c / nChw16c, c channels-last (one block of every channel); 0 for any other layout.
inline std::size_t conv2d_channel_block(const dnnl::memory::desc& d, std::size_t n, std::size_t c, std::size_t h,
                                        std::size_t w) {
  if (d == plain_nchw(n, c, h, w)) return 1;
  for (std::size_t b : {16, 8})
    if (c % b == 0 && d == blocked_nchw_desc(n, c, h, w, b)) return b;
  return d == channels_last_desc(n, c, h, w) ? c : 0;
}

/// x's columns with the channel outermost: row (n, oy, ox) holds, at column (c * K + ky) * K + kx,
/// x at (n, c, oy * stride - pad + ky, ox * stride - pad + kx), zeros outside x — the order of
/// loom's (oc, ic, ky, kx) weights, so that dy^T by these columns is the weight gradient in
/// loom's layout with no reorder after it. x float, its channels in blocks of `block` (1: plain
/// NCHW; 8, 16: nChw8c, nChw16c; C: channels-last), read in place. The columns in layout l
/// (plain row-major unless given).
inline void conv2d_channel_major_columns(const conv2d_geometry& g, std::size_t batch, const float* x, std::size_t block,
                                         float* cols, conv2d_column_layout l = {}) {
  const std::size_t oh = g.oh(), ow = g.ow(), k = g.k, kk = k * k, c = g.c, rows = batch * oh * ow, width = kk * c;
  const std::size_t plane = g.h * g.w, blocks = c / block;
  l.width = width;
  const auto n = static_cast<std::ptrdiff_t>(rows);
  // A row's values go kk apart: written in place when the layout is plain; for BA16a64b into a
  // row of the thread's own, then copied a 64-column band at a time (writing them in place
  // there, 64 KB apart in ResNet-18, thrashed the cache: 1.6x slower).
#pragma omp parallel if (rows * width >= parallel_threshold)
  {
    std::vector<float> own(l.packed_rows ? width : 0);
#pragma omp for schedule(static)
    for (std::ptrdiff_t r = 0; r < n; ++r) {
      const std::size_t i = static_cast<std::size_t>(r) / (oh * ow), oy = static_cast<std::size_t>(r) / ow % oh,
                        ox = static_cast<std::size_t>(r) % ow;
      float* out = l.packed_rows ? own.data() : cols + l.row(static_cast<std::size_t>(r));
      for (std::size_t ky = 0; ky < k; ++ky)
        for (std::size_t kx = 0; kx < k; ++kx) {
          const std::ptrdiff_t iy = static_cast<std::ptrdiff_t>(oy * g.stride + ky) - static_cast<std::ptrdiff_t>(g.pad);
          const std::ptrdiff_t ix = static_cast<std::ptrdiff_t>(ox * g.stride + kx) - static_cast<std::ptrdiff_t>(g.pad);
          float* o = out + ky * k + kx;
          if (iy < 0 || ix < 0 || iy >= static_cast<std::ptrdiff_t>(g.h) || ix >= static_cast<std::ptrdiff_t>(g.w)) {
            for (std::size_t ch = 0; ch < c; ++ch) o[ch * kk] = 0;
            continue;
          }
          const std::size_t pixel = static_cast<std::size_t>(iy) * g.w + static_cast<std::size_t>(ix);
          for (std::size_t b = 0; b < blocks; ++b) {
            const float* px = x + (i * blocks + b) * plane * block + pixel * block;
            float* ob = o + b * block * kk;
            for (std::size_t j = 0; j < block; ++j) ob[j * kk] = px[j];
          }
        }
      if (l.packed_rows) l.put(cols, static_cast<std::size_t>(r), 0, own.data(), width);
    }
  }
  l.zero_padding(cols, rows);
}

/// The plain (oihw) layout of a convolution's weights, as loom stores them.
inline dnnl::memory::desc conv2d_plain_weights(const conv2d_geometry& g) {
  using dt = dnnl::memory::dim;
  return {{static_cast<dt>(g.oc), static_cast<dt>(g.c), static_cast<dt>(g.k), static_cast<dt>(g.k)},
          dnnl::memory::data_type::f32,
          dnnl::memory::format_tag::oihw};
}

/// Whether `label` is channels-last (nhwc) and `actual` the same bytes: nChw16c of 16 channels or
/// nChw8c of 8, of the same shape and type.
inline bool channels_last_alias(const dnnl::memory::desc& label, const dnnl::memory::desc& actual, std::size_t c) {
  using tag = dnnl::memory::format_tag;
  if (c != 16 && c != 8) return false;
  const auto dims = label.dims();
  if (dims.size() != 4 || static_cast<std::size_t>(dims[1]) != c) return false;
  const dnnl::memory::desc nhwc(dims, label.data_type(), tag::nhwc),
      blocked(dims, label.data_type(), c == 16 ? tag::nChw16c : tag::nChw8c);
  return label == nhwc && actual == blocked;
}

/// d[i] += s[i] for i < n.
inline void add_into(float* d, const float* s, std::size_t n) {
#pragma omp simd
  for (std::size_t i = 0; i < n; ++i) d[i] += s[i];
}

/// The weights w (plain) in the layout `want`: w itself, or a reordered copy in s.
inline const void* conv2d_weights_in(const conv2d_geometry& g, reorder_cache& reorders, const float* w,
                                     const dnnl::memory::desc& want, scratch& s) {
  const auto plain = conv2d_plain_weights(g);
  if (want == plain) return w;
  void* p = room_for(s, want);
  reorders.run(plain, w, want, p);
  return p;
}

LOOM_DECL dnnl_conv2d::dnnl_conv2d(conv2d_geometry g) : g_(g) {}
LOOM_DECL dnnl_conv2d::dnnl_conv2d(dnnl_conv2d&&) noexcept = default;
LOOM_DECL dnnl_conv2d& dnnl_conv2d::operator=(dnnl_conv2d&&) noexcept = default;
LOOM_DECL dnnl_conv2d::~dnnl_conv2d() = default;

LOOM_DECL void dnnl_conv2d::fuse_relu() {
  relu_ = true;
  entries_.clear();
}

LOOM_DECL cpu_format dnnl_conv2d::forward(const float* x, const cpu_format& xf, const float* w, const float* b, float* y,
                                          std::size_t batch, math_mode math, const std::uint16_t* x_bf16) {
  entry& e = get(batch, xf, math);
  // What backward may reuse is of this x from here on: none yet (the same buffer may hold a new
  // batch at the same address).
  e.src_of = nullptr;
  e.cols_of = nullptr;
  if (e.fwd_mm) return forward_by_matmul(e, x, w, b, y, batch);
  const void* src = x;
  if (!(e.src_given == e.fwd_pd.src_desc())) {
    // x's bf16 copy, made by the layer that wrote x, when the primitive takes x in x's own
    // layout (a bf16 convolution after another: channels-last) — else a conversion of x here.
    dnnl::memory::desc same_in_bf16 = e.src_given;
    same_in_bf16.data.data_type = dnnl_bf16;
    if (x_bf16 && math == math_mode::bf16 && same_in_bf16 == e.fwd_pd.src_desc()) {
      e.src_of = x;
      e.src_of_desc = e.fwd_pd.src_desc();
      e.src_ready = x_bf16;
      src = x_bf16;
    } else {
      src = e.x_as(x, e.fwd_pd.src_desc(), false);
    }
  }
  const void* wts = conv2d_weights_in(g_, e.reorders, w, e.fwd_pd.weights_desc(), e.w_fwd_scratch);
  auto& eng = dnnl_engine();
  dnnl::memory ms(e.fwd_pd.src_desc(), eng, const_cast<void*>(src));
  dnnl::memory mw(e.fwd_pd.weights_desc(), eng, const_cast<void*>(wts));
  dnnl::memory mb = g_.bias ? dnnl::memory(e.fwd_pd.bias_desc(), eng, const_cast<float*>(b)) : dnnl::memory();
  // The primitive writes y directly, or (bf16: its channels-last output) a scratch that a
  // reorder then brings into the layout loom's other layers read.
  const bool direct = e.y_desc == e.fwd_pd.dst_desc() || channels_last_alias(e.y_desc, e.fwd_pd.dst_desc(), g_.oc);
  float* dst = direct ? y : static_cast<float*>(room_for(e.dst_scratch, e.fwd_pd.dst_desc()));
  dnnl::memory md(e.fwd_pd.dst_desc(), eng, dst);
  dnnl_checked("running a convolution forward", [&] {
    if (g_.bias)
      e.fwd.execute(dnnl_stream(), {{DNNL_ARG_SRC, ms}, {DNNL_ARG_WEIGHTS, mw}, {DNNL_ARG_BIAS, mb}, {DNNL_ARG_DST, md}});
    else
      e.fwd.execute(dnnl_stream(), {{DNNL_ARG_SRC, ms}, {DNNL_ARG_WEIGHTS, mw}, {DNNL_ARG_DST, md}});
    dnnl_stream().wait();
  });
  if (!direct) e.reorders.run(e.fwd_pd.dst_desc(), dst, e.y_desc, y);
  return e.dst_format;
}

LOOM_DECL void dnnl_conv2d::backward(const float* x, const cpu_format& xf, const float* w, const float* dy, float* dx,
                                     float* dw, float* db, std::size_t batch, bool accumulate, math_mode math,
                                     const std::uint16_t* dy_bf16) {
  entry& e = get(batch, xf, math);
  auto& eng = dnnl_engine();
  // diff_dst arrives in the forward dst layout (float); the backward primitives may want
  // another layout, or bf16. Backward-data and backward-weights usually want the same.
  const void* ddst_converted = nullptr;
  dnnl::memory::desc ddst_converted_desc;
  // dy's bf16 copy, made by the layer after (activation::bf16), is dy converted in dy's layout.
  dnnl::memory::desc dy_in_bf16 = e.y_desc;
  dy_in_bf16.data.data_type = dnnl_bf16;
  const bool dy_copy = dy_bf16 && math == math_mode::bf16;
  auto diff_dst_for = [&](const dnnl::memory::desc& want, scratch& s) -> const void* {
    if (want == e.y_desc) return dy;
    if (dy_copy && want == dy_in_bf16) return dy_bf16;
    if (ddst_converted && want == ddst_converted_desc) return ddst_converted;
    void* p = room_for(s, want);
    e.reorders.run(e.y_desc, dy, want, p);
    ddst_converted = p;
    ddst_converted_desc = want;
    return p;
  };
  if (dx && e.dgrad) {
    input_gradient_by_matmul(e, w, diff_dst_for(e.dy_rows_nhwc, e.ddst_scratch), dx, batch);
  } else if (dx) {
    const void* wts = conv2d_weights_in(g_, e.reorders, w, e.bwd_data_pd.weights_desc(), e.w_bwd_scratch);
    const void* ddst = diff_dst_for(e.bwd_data_pd.diff_dst_desc(), e.ddst_scratch);
    const bool direct = e.bwd_data_pd.diff_src_desc() == e.src_given;
    float* dsrc = direct ? dx : static_cast<float*>(room_for(e.dsrc_scratch, e.bwd_data_pd.diff_src_desc()));
    dnnl::memory mdd(e.bwd_data_pd.diff_dst_desc(), eng, const_cast<void*>(ddst));
    dnnl::memory mw(e.bwd_data_pd.weights_desc(), eng, const_cast<void*>(wts));
    dnnl::memory mds(e.bwd_data_pd.diff_src_desc(), eng, dsrc);
    dnnl_checked("running a convolution backward-data", [&] {
      e.bwd_data.execute(dnnl_stream(), {{DNNL_ARG_DIFF_DST, mdd}, {DNNL_ARG_WEIGHTS, mw}, {DNNL_ARG_DIFF_SRC, mds}});
      dnnl_stream().wait();
    });
    if (!direct) e.reorders.run(e.bwd_data_pd.diff_src_desc(), dsrc, e.src_given, dx);
  }
  if (e.wgrad) return backward_weights_by_matmul(e, x, diff_dst_for(e.dy_rows_nhwc, e.ddst_scratch), dw, db,
                                                 batch, accumulate);
  // backward-weights
  const void* src = x;
  if (!(e.bwd_w_pd.src_desc() == e.src_given)) src = e.x_as(x, e.bwd_w_pd.src_desc(), true);  // forward's, if it made it
  // A second scratch when backward-weights wants dy differently from backward-data.
  const void* ddst = diff_dst_for(e.bwd_w_pd.diff_dst_desc(),
                                  ddst_converted && !(e.bwd_w_pd.diff_dst_desc() == ddst_converted_desc)
                                      ? e.ddst_w_scratch
                                      : e.ddst_scratch);
  const auto plain_w = conv2d_plain_weights(g_);
  const bool w_direct = !accumulate && e.bwd_w_pd.diff_weights_desc() == plain_w;
  float* dwts = w_direct ? dw : static_cast<float*>(room_for(e.dw_scratch, e.bwd_w_pd.diff_weights_desc()));
  float* dbias = !g_.bias ? nullptr : accumulate ? e.db_scratch.get(g_.oc) : db;
  dnnl::memory ms(e.bwd_w_pd.src_desc(), eng, const_cast<void*>(src));
  dnnl::memory mdd(e.bwd_w_pd.diff_dst_desc(), eng, const_cast<void*>(ddst));
  dnnl::memory mdw(e.bwd_w_pd.diff_weights_desc(), eng, dwts);
  dnnl_checked("running a convolution backward-weights", [&] {
    if (g_.bias)
      e.bwd_w.execute(dnnl_stream(), {{DNNL_ARG_SRC, ms}, {DNNL_ARG_DIFF_DST, mdd}, {DNNL_ARG_DIFF_WEIGHTS, mdw},
                                      {DNNL_ARG_DIFF_BIAS, dnnl::memory(e.bwd_w_pd.diff_bias_desc(), eng, dbias)}});
    else
      e.bwd_w.execute(dnnl_stream(), {{DNNL_ARG_SRC, ms}, {DNNL_ARG_DIFF_DST, mdd}, {DNNL_ARG_DIFF_WEIGHTS, mdw}});
    dnnl_stream().wait();
  });
  if (!w_direct) {
    if (accumulate) {
      float* tmp = e.dw_plain_scratch.get(g_.weight_count());
      if (e.bwd_w_pd.diff_weights_desc() == plain_w)
        std::memcpy(tmp, dwts, g_.weight_count() * sizeof(float));
      else
        e.reorders.run(e.bwd_w_pd.diff_weights_desc(), dwts, plain_w, tmp);
      add_into(dw, tmp, g_.weight_count());
    } else {
      e.reorders.run(e.bwd_w_pd.diff_weights_desc(), dwts, plain_w, dw);
    }
  }
  if (accumulate && db && g_.bias)
    for (std::size_t i = 0; i < g_.oc; ++i) db[i] += dbias[i];
}

LOOM_DECL void dnnl_conv2d::backward_weights_by_matmul(entry& e, const float* x, const void* dy_rows,
                                                       float* dw, float* db, std::size_t batch, bool accumulate) {
  // Columns in (ky, kx, ic) order (bf16's forward matmul shares them) make the product (oc, ky,
  // kx, ic), which a reorder brings to loom's (oc, ic, ky, kx) after it; columns channel first make
  // it loom's at once, at the cost of moving x's values apart as they are copied. Either way one
  // matrix of K*K*C columns is transposed: the columns (N*OH*OW rows) or the product (OC rows).
  // fp32 moves the smaller: channel first when N*OH*OW < OC (ResNet-18's 512-channel
  // convolutions at 2x2, batch 64: 256 rows against 512), read from x in its own layout (no
  // reorder of x to channels-last before them either). Measured on a ResNet-18 fp32 step (batch
  // 64, one thread): channel first everywhere, its reorders 28.8 -> 19.3 ms but the columns 11 ms
  // (the 256-channel convolutions at 4x4 have 1,024 rows); by this rule, 28.8 -> 23.5 ms and 3.4 ms.
  const bool channel_major = e.math == math_mode::fp32 && batch * g_.oh() * g_.ow() < g_.oc;
  const void* cols = nullptr;
  if (channel_major) {
    float* xc = static_cast<float*>(room_for(e.cols_scratch, e.wgrad_b));
    std::size_t block = conv2d_channel_block(e.src_given, batch, g_.c, g_.h, g_.w);
    const float* xs = x;
    if (block == 0) {
      xs = static_cast<const float*>(e.x_as(x, e.x_rows, true));
      block = g_.c;
    }
    e.cols_of = nullptr;  // cols_scratch holds these columns, not a forward's
    conv2d_channel_major_columns(g_, batch, xs, block, xc, conv2d_column_layout_of(e.wgrad_b));
    cols = xc;
  } else {
    cols = columns_of(e, x, batch, true);
  }
  float* c = channel_major && !accumulate ? dw : static_cast<float*>(room_for(e.wgrad_scratch, e.wgrad_c));
  auto& eng = dnnl_engine();
  dnnl::memory ma(e.wgrad_a, eng, const_cast<void*>(dy_rows)), mb(e.wgrad_b, eng, const_cast<void*>(cols)),
      mc(e.wgrad_c, eng, c);
  dnnl_checked("running a convolution's weight gradient as a matmul", [&] {
    e.wgrad->execute(dnnl_stream(), {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}});
    dnnl_stream().wait();
  });
  // Channel first: c is dw, or (accumulating) added to it. Otherwise c is (oc, ky, kx, ic), ohwi;
  // loom's weights are (oc, ic, ky, kx), oihw: oneDNN's reorder moves it (a scalar loop with the
  // reads ic apart took 2.4% of a ResNet-18 fp32 step), into dw or, accumulating, into a copy
  // added to dw.
  const std::size_t oc = g_.oc;
  using dt = dnnl::memory::dim;
  const dnnl::memory::desc ohwi({static_cast<dt>(oc), static_cast<dt>(g_.c), static_cast<dt>(g_.k), static_cast<dt>(g_.k)},
                                dnnl::memory::data_type::f32, dnnl::memory::format_tag::ohwi);
  if (channel_major || g_.k == 1) {  // (for k == 1, ohwi and oihw are the same bytes)
    if (accumulate) add_into(dw, c, g_.weight_count());
    else if (c != dw) std::memcpy(dw, c, g_.weight_count() * sizeof(float));
  } else if (!accumulate) {
    e.reorders.run(ohwi, c, conv2d_plain_weights(g_), dw);
  } else {
    float* tmp = e.dw_plain_scratch.get(g_.weight_count());
    e.reorders.run(ohwi, c, conv2d_plain_weights(g_), tmp);
    add_into(dw, tmp, g_.weight_count());
  }
  if (g_.bias) {  // the sums of dy_rows (channels-last: a row of OC values per output pixel)
    // In bf16 the sums of the bf16 dy the products took, as oneDNN's bf16 primitive sums them
    // (and as the GPU check's reference defines bf16 math).
    const std::size_t rows = batch * g_.oh() * g_.ow();
    for (std::size_t o = 0; o < oc; ++o) {
      double t = 0;
      if (e.math == math_mode::bf16) {
        const auto* d = static_cast<const std::uint16_t*>(dy_rows);
        for (std::size_t r = 0; r < rows; ++r) {
          const std::uint32_t bits = static_cast<std::uint32_t>(d[r * oc + o]) << 16;
          float v;
          std::memcpy(&v, &bits, sizeof v);
          t += v;
        }
      } else {
        const auto* d = static_cast<const float*>(dy_rows);
        for (std::size_t r = 0; r < rows; ++r) t += d[r * oc + o];
      }
      db[o] = accumulate ? db[o] + static_cast<float>(t) : static_cast<float>(t);
    }
  }
}

LOOM_DECL const void* dnnl_conv2d::columns_of(entry& e, const float* x, std::size_t batch, bool backward) {
  void* cols = room_for(e.cols_scratch, e.wgrad_b);
  // Backward reuses its forward's columns (x is unchanged until its backward); a forward makes
  // them anew, whatever x's address (the same buffer holds the next batch).
  if (backward && e.cols_of == x) return cols;
  // x channels-last in the products' type: forward's conversion when it made that one, else
  // made here.
  const void* xb = e.x_as(x, e.x_rows, backward);
  e.cols_of = nullptr;
  if (e.math == math_mode::bf16)
    conv2d_columns(g_, batch, static_cast<const std::uint16_t*>(xb), static_cast<std::uint16_t*>(cols));
  else
    conv2d_columns(g_, batch, static_cast<const float*>(xb), static_cast<float*>(cols), conv2d_column_layout_of(e.wgrad_b));
  e.cols_of = x;
  return cols;
}

LOOM_DECL cpu_format dnnl_conv2d::forward_by_matmul(entry& e, const float* x, const float* w, const float* b, float* y,
                                                   std::size_t batch) {
  const void* cols = columns_of(e, x, batch, false);
  const void* wts = conv2d_weights_in(g_, e.reorders, w, e.w_ohwi, e.w_fwd_scratch);
  const auto md = e.fwd_mm_desc();
  auto& eng = dnnl_engine();
  // y is (N*OH*OW) x OC: channels-last, the layout the primitive would have written.
  dnnl::memory ma(e.wgrad_b, eng, const_cast<void*>(cols)), mb(md.weights, eng, const_cast<void*>(wts)),
      mc(md.dst, eng, y);
  dnnl_checked("running a convolution forward as a matmul", [&] {
    if (g_.bias)
      e.fwd_mm->execute(dnnl_stream(), {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc},
                                        {DNNL_ARG_BIAS, dnnl::memory(md.bias, eng, const_cast<float*>(b))}});
    else
      e.fwd_mm->execute(dnnl_stream(), {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}});
    dnnl_stream().wait();
  });
  return e.dst_format;
}

LOOM_DECL void dnnl_conv2d::input_gradient_by_matmul(entry& e, const float* w, const void* dy_bf16, float* dx,
                                                     std::size_t batch) {
  const void* wts = conv2d_weights_in(g_, e.reorders, w, e.w_ohwi, e.w_bwd_scratch);
  const std::size_t oh = g_.oh(), ow = g_.ow(), k = g_.k, c = g_.c, width = k * k * c;
  const dnnl::memory::desc dcols_desc = e.dcols_desc();
  float* dcols = static_cast<float*>(room_for(e.dcols_scratch, dcols_desc));
  auto& eng = dnnl_engine();
  dnnl::memory ma(e.dy_rows_desc(), eng, const_cast<void*>(dy_bf16)), mb(e.w_rows_desc(), eng, const_cast<void*>(wts)),
      mc(dcols_desc, eng, dcols);
  dnnl_checked("running a convolution's input gradient as a matmul", [&] {
    e.dgrad->execute(dnnl_stream(), {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}});
    dnnl_stream().wait();
  });
  // The columns' gradient added back where each column came from: dx channels-last (x's own
  // layout when it is that, else a scratch reordered into it), one sample per iteration.
  const dnnl::memory::desc nhwc = e.x_f32_nhwc();
  const bool direct = e.src_given == nhwc;
  float* out = direct ? dx : static_cast<float*>(room_for(e.dsrc_scratch, nhwc));
  const auto samples = static_cast<std::ptrdiff_t>(batch);
#pragma omp parallel for schedule(static) if (batch * oh * ow * width >= parallel_threshold)
  for (std::ptrdiff_t i = 0; i < samples; ++i) {
    const std::size_t n = static_cast<std::size_t>(i);
    float* img = out + n * g_.h * g_.w * c;
    std::fill_n(img, g_.h * g_.w * c, 0.0f);
    for (std::size_t oy = 0; oy < oh; ++oy)
      for (std::size_t ox = 0; ox < ow; ++ox) {
        const float* row = dcols + ((n * oh + oy) * ow + ox) * width;
        for (std::size_t ky = 0; ky < k; ++ky)
          for (std::size_t kx = 0; kx < k; ++kx, row += c) {
            const std::ptrdiff_t iy = static_cast<std::ptrdiff_t>(oy * g_.stride + ky) - static_cast<std::ptrdiff_t>(g_.pad);
            const std::ptrdiff_t ix = static_cast<std::ptrdiff_t>(ox * g_.stride + kx) - static_cast<std::ptrdiff_t>(g_.pad);
            if (iy < 0 || ix < 0 || iy >= static_cast<std::ptrdiff_t>(g_.h) || ix >= static_cast<std::ptrdiff_t>(g_.w))
              continue;
            float* at = img + (static_cast<std::size_t>(iy) * g_.w + static_cast<std::size_t>(ix)) * c;
#pragma omp simd
            for (std::size_t j = 0; j < c; ++j) at[j] += row[j];
          }
      }
  }
  if (!direct) e.reorders.run(nhwc, out, e.src_given, dx);
}

LOOM_DECL dnnl_conv2d::entry& dnnl_conv2d::get(std::size_t batch, const cpu_format& xf, math_mode math) {
  const auto given = desc_of(xf, batch, g_.c, g_.h, g_.w);
  for (auto& e : entries_)
    if (e->batch == batch && e->math == math && e->src_given == given) return *e;
  try {
    using dt = dnnl::memory::dim;
    using tag = dnnl::memory::format_tag;
    using f32 = dnnl::memory::data_type;
    // What enters the products: bf16 in math_mode::bf16. Outputs and gradients stay f32.
    const f32 in_type = math == math_mode::bf16 ? f32::bf16 : f32::f32;
    const dt n = static_cast<dt>(batch), oh = static_cast<dt>(g_.oh()), ow = static_cast<dt>(g_.ow());
    dnnl::memory::desc src_any({n, static_cast<dt>(g_.c), static_cast<dt>(g_.h), static_cast<dt>(g_.w)}, in_type, tag::any);
    dnnl::memory::desc diff_src_any({n, static_cast<dt>(g_.c), static_cast<dt>(g_.h), static_cast<dt>(g_.w)}, f32::f32,
                                    tag::any);
    dnnl::memory::desc w_any({static_cast<dt>(g_.oc), static_cast<dt>(g_.c), static_cast<dt>(g_.k), static_cast<dt>(g_.k)},
                             in_type, tag::any);
    dnnl::memory::desc diff_w_any(
        {static_cast<dt>(g_.oc), static_cast<dt>(g_.c), static_cast<dt>(g_.k), static_cast<dt>(g_.k)}, f32::f32, tag::any);
    // No bias: an empty desc (a convolution without one).
    const dnnl::memory::desc b_md = g_.bias ? dnnl::memory::desc({static_cast<dt>(g_.oc)}, f32::f32, tag::x)
                                            : dnnl::memory::desc();
    dnnl::memory::desc dst_any({n, static_cast<dt>(g_.oc), oh, ow}, f32::f32, tag::any);
    const dnnl::memory::dims strides{static_cast<dt>(g_.stride), static_cast<dt>(g_.stride)};
    const dnnl::memory::dims pad{static_cast<dt>(g_.pad), static_cast<dt>(g_.pad)};
    auto& eng = dnnl_engine();
    dnnl::primitive_attr attr;
    if (relu_) {
      dnnl::post_ops ops;
      ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
      attr.set_post_ops(ops);
    }
    // Winograd where it is asked for and suits, or pays (conv_algorithm): each pass falls back
    // to the direct algorithm where oneDNN has no Winograd kernel for it (no AVX-512).
    const bool winograd = math == math_mode::fp32 &&
                          conv2d_winograd_wanted(get_conv_algorithm(), g_, batch,
                                                 static_cast<std::size_t>(std::max(1, omp_get_max_threads())));
    auto algorithm_for = [&](auto&& make) {
      if (winograd) try {
          return make(dnnl::algorithm::convolution_winograd);
        } catch (const dnnl::error& err) {
          if (err.status != dnnl_unimplemented) throw;
        }
      return make(dnnl::algorithm::convolution_direct);
    };
    auto make_fwd = [&](const dnnl::memory::desc& dst) {
      return algorithm_for([&](dnnl::algorithm a) {
        return dnnl::convolution_forward::primitive_desc(
            dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, a, src_any, w_any, b_md, dst, strides,
                                            pad, pad),
            attr, eng);
      });
    };
    auto fwd_pd = make_fwd(dst_any);
    const std::size_t out_elems = batch * g_.oc * g_.oh() * g_.ow();
    if (!unpadded(fwd_pd.dst_desc(), out_elems)) fwd_pd = make_fwd(plain_nchw(batch, g_.oc, g_.oh(), g_.ow()));
    const auto plain = plain_nchw(batch, g_.oc, g_.oh(), g_.ow());
    dnnl::memory::desc y_desc = fwd_pd.dst_desc();
    if (math == math_mode::bf16) {
      // bf16 (AMX) primitives write channels-last (nhwc), which loom's layers read as they are
      // (a block of every channel): y is handed on in it, so the batch norm, ReLU and
      // residual addition after the convolution and the next convolution's bf16 input read
      // it without a reorder. (Asking the primitive for nChw16c instead picks a kernel without
      // AMX, measured 4x slower here; reordering its output to nChw16c cost 14% of a
      // ResNet-20 step, and converting nChw16c back to channels-last bf16 another 19%.) Any
      // other layout is brought to a blocked or plain one by a reorder after the convolution.
      auto blocked = [&](tag t) { return dnnl::memory::desc({n, static_cast<dt>(g_.oc), oh, ow}, f32::f32, t); };
      if (!(y_desc == plain || y_desc == blocked(tag::nChw16c) || y_desc == blocked(tag::nChw8c) ||
            y_desc == blocked(tag::nhwc)))
        y_desc = g_.oc % 16 == 0 ? blocked(tag::nChw16c) : g_.oc % 8 == 0 ? blocked(tag::nChw8c) : plain;
      // A primitive without AMX (a first convolution of one input channel) writes nChw16c; with
      // 16 (or 8) channels that is channels-last byte for byte, and named so the layers after it
      // meet the layout the AMX convolutions write: a residual adding the two, and the gradient
      // coming back, then need no reorder between them (three a step in ResNet-20).
      if (channels_last_alias(blocked(tag::nhwc), y_desc, g_.oc)) y_desc = blocked(tag::nhwc);
    }
    cpu_format dst_format;
    if (!(y_desc == plain)) dst_format.layout = interned_layout(y_desc);
    // dy: in the forward output's layout for fp32 (no reorder); any layout of bf16 otherwise.
    const dnnl::memory::desc diff_dst =
        math == math_mode::bf16 ? dnnl::memory::desc({n, static_cast<dt>(g_.oc), oh, ow}, f32::bf16, tag::any)
                                : fwd_pd.dst_desc();
    auto bwd_data_pd = algorithm_for([&](dnnl::algorithm a) {
      return dnnl::convolution_backward_data::primitive_desc(
          dnnl::convolution_backward_data::desc(a, diff_src_any, w_any, diff_dst, strides, pad, pad), eng, fwd_pd);
    });
    auto bwd_w_pd = algorithm_for([&](dnnl::algorithm a) {
      return dnnl::convolution_backward_weights::primitive_desc(
          dnnl::convolution_backward_weights::desc(a, src_any, diff_w_any, b_md, diff_dst, strides, pad, pad), eng,
          fwd_pd);
    });
    const bool winograd_weights = std::string(bwd_w_pd.impl_info_str()).find("wino") != std::string::npos;
    entries_.push_back(std::make_unique<entry>(entry{batch, math, given, dst_format, y_desc, fwd_pd,
                                                     dnnl::convolution_forward(fwd_pd), bwd_data_pd,
                                                     dnnl::convolution_backward_data(bwd_data_pd), bwd_w_pd,
                                                     dnnl::convolution_backward_weights(bwd_w_pd), {}, {}, {}, {}, {},
                                                     {}, {}, {}, {}, {}, {}, nullptr, {}, nullptr, nullptr, nullptr,
                                                     nullptr, {}, {}, {}, {}, {}, {}, {}, {}, {}, nullptr}));
    entry& e = *entries_.back();
    if (!winograd_weights && conv2d_weights_by_matmul(g_, math, y_desc, batch)) {
      const dt rows = n * oh * ow, width = static_cast<dt>(g_.k * g_.k * g_.c), ocs = static_cast<dt>(g_.oc);
      e.x_rows = dnnl::memory::desc({n, static_cast<dt>(g_.c), static_cast<dt>(g_.h), static_cast<dt>(g_.w)},
                                         in_type, tag::nhwc);
      e.dy_rows_nhwc = dnnl::memory::desc({n, ocs, oh, ow}, in_type, tag::nhwc);
      e.wgrad_a = dnnl::memory::desc({ocs, rows}, in_type, tag::ba);  // dy^T: dy's rows of OC values
      e.wgrad_b = dnnl::memory::desc({rows, width}, in_type, tag::ab);
      e.wgrad_c = dnnl::memory::desc({ocs, width}, f32::f32, tag::ab);
      auto pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(e.wgrad_a, e.wgrad_b, e.wgrad_c), eng);
      if (math == math_mode::fp32) {
        // The columns in the layout the matmul picks, when it is one loom writes (BA16a64b,
        // conv2d_column_layout); else row after row.
        auto packed = dnnl::matmul::primitive_desc(
            dnnl::matmul::desc(e.wgrad_a, dnnl::memory::desc({rows, width}, f32::f32, tag::any), e.wgrad_c), eng);
        if (conv2d_column_layout_of(packed.weights_desc()).packed_rows) {
          e.wgrad_b = packed.weights_desc();
          pd = packed;
        }
      }
      e.wgrad = std::make_unique<dnnl::matmul>(pd);
      if (math == math_mode::bf16 && conv2d_by_matmul(g_)) {
        e.w_ohwi = dnnl::memory::desc({ocs, static_cast<dt>(g_.c), static_cast<dt>(g_.k), static_cast<dt>(g_.k)},
                                      f32::bf16, tag::ohwi);
        const auto md = e.fwd_mm_desc();
        dnnl::primitive_attr mm_attr;
        if (relu_) {
          dnnl::post_ops ops;
          ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
          mm_attr.set_post_ops(ops);
        }
        auto fpd = g_.bias ? dnnl::matmul::primitive_desc(dnnl::matmul::desc(e.wgrad_b, md.weights, md.bias, md.dst),
                                                          mm_attr, eng)
                           : dnnl::matmul::primitive_desc(dnnl::matmul::desc(e.wgrad_b, md.weights, md.dst), mm_attr, eng);
        e.fwd_mm = std::make_unique<dnnl::matmul>(fpd);
        auto dpd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(e.dy_rows_desc(), e.w_rows_desc(), e.dcols_desc()), eng);
        e.dgrad = std::make_unique<dnnl::matmul>(dpd);
      }
    }
    return e;
  } catch (const dnnl::error& err) {
    if (math == math_mode::bf16 && err.status == dnnl_unimplemented)
      throw invalid_argument(cpu_bf16_unsupported("convolution"));
    throw backend_error(std::string("loom: oneDNN failed while creating convolution primitives: ") + err.what() +
                        " (status " + std::to_string(static_cast<int>(err.status)) + ")");
  }
}

LOOM_DECL dnnl_conv2d::copy_reads dnnl_conv2d::reads_copies_only(std::size_t batch, const cpu_format& xf,
                                                                  math_mode math) {
  if (math != math_mode::bf16) return {};
  entry& e = get(batch, xf, math);
  // The conditions under which forward and backward above take the copies, for every read.
  dnnl::memory::desc x16 = e.src_given, dy16 = e.y_desc;
  x16.data.data_type = dnnl_bf16;
  dy16.data.data_type = dnnl_bf16;
  copy_reads r;
  // forward: the primitive on x's copy (the matmul path makes columns from x); the weight
  // gradient: forward's copy again (x_as reuses it), as the primitive's or the matmul's rows.
  if (!e.fwd_mm && !(e.src_given == e.fwd_pd.src_desc()) && x16 == e.fwd_pd.src_desc())
    r.input = e.wgrad ? e.x_rows == x16 : e.bwd_w_pd.src_desc() == x16;
  // the input gradient and the weight gradient each on dy's copy (diff_dst_for)
  const bool data = e.dgrad ? e.dy_rows_nhwc == dy16 : e.bwd_data_pd.diff_dst_desc() == dy16;
  const bool weights = e.wgrad ? e.dy_rows_nhwc == dy16 : e.bwd_w_pd.diff_dst_desc() == dy16;
  r.output_gradient = data && weights;
  return r;
}

LOOM_DECL std::string dnnl_conv2d::implementations(std::size_t batch, const cpu_format& xf, math_mode math) {
  entry& e = get(batch, xf, math);
  return std::string("fwd ") + (e.fwd_mm ? "loom matmul" : e.fwd_pd.impl_info_str()) + " bwd_d " +
         (e.dgrad ? "loom matmul" : e.bwd_data_pd.impl_info_str()) + " bwd_w " +
         (e.wgrad ? "loom matmul" : e.bwd_w_pd.impl_info_str());
}

}  // namespace loom::detail
