// SPDX-License-Identifier: Apache-2.0
#pragma once
// 2-D max and average pooling on the CPU (no padding). float runs oneDNN pooling on whatever
// layout the input arrives in and keeps oneDNN's output layout; double runs a reference loop.

#include <cstddef>
#include <cstring>
#include <limits>
#include <memory>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "loom/backend/cpu/dnnl_support.hpp"
#include "loom/core/geometry.hpp"

namespace loom {

template <class T>
class cpu_pool2d_plan {
 public:
  cpu_pool2d_plan(pool2d_geometry g, pool_kind kind) : g_(g), kind_(kind) {}

  /// y = pool(x); x in layout xf. Returns y's layout. training keeps what backward needs.
  cpu_format forward(const T* x, const cpu_format& xf, T* y, std::size_t batch, bool training) {
    if constexpr (!std::is_same_v<T, float>) {
      (void)xf;
      (void)training;
      reference_forward(x, y, batch);
      return {};
    } else {
      entry& e = get(batch, xf);
      auto& eng = detail::dnnl_engine();
      dnnl::memory ms(e.fwd_pd.src_desc(), eng, const_cast<float*>(x));
      dnnl::memory md(e.fwd_pd.dst_desc(), eng, y);
      std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, ms}, {DNNL_ARG_DST, md}};
      if (kind_ == pool_kind::max) {
        e.workspace.resize(e.fwd_pd.workspace_desc().get_size());
        args.insert({DNNL_ARG_WORKSPACE, dnnl::memory(e.fwd_pd.workspace_desc(), eng, e.workspace.data())});
      }
      detail::dnnl_checked("running a pooling forward", [&] {
        e.fwd.execute(detail::dnnl_stream(), args);
        detail::dnnl_stream().wait();
      });
      e.have_workspace = training;
      return e.dst_format;
    }
  }

  /// dx (layout xf) from dy (the layout forward returned). Needs the preceding forward of the
  /// same batch with training = true.
  void backward(const cpu_format& xf, const T* dy, T* dx, std::size_t batch) {
    if constexpr (!std::is_same_v<T, float>) {
      (void)xf;
      reference_backward(dy, dx, batch);
    } else {
      entry& e = get(batch, xf);
      auto& eng = detail::dnnl_engine();
      dnnl::memory mdd(e.bwd_pd.diff_dst_desc(), eng, const_cast<float*>(dy));
      dnnl::memory mds(e.bwd_pd.diff_src_desc(), eng, dx);
      std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_DIFF_DST, mdd}, {DNNL_ARG_DIFF_SRC, mds}};
      if (kind_ == pool_kind::max)
        args.insert({DNNL_ARG_WORKSPACE, dnnl::memory(e.fwd_pd.workspace_desc(), eng, e.workspace.data())});
      detail::dnnl_checked("running a pooling backward", [&] {
        e.bwd.execute(detail::dnnl_stream(), args);
        detail::dnnl_stream().wait();
      });
    }
  }

 private:
  struct entry {
    std::size_t batch;
    dnnl::memory::desc src;
    cpu_format dst_format;
    dnnl::pooling_forward::primitive_desc fwd_pd;
    dnnl::pooling_forward fwd;
    dnnl::pooling_backward::primitive_desc bwd_pd;
    dnnl::pooling_backward bwd;
    std::vector<unsigned char> workspace;
    bool have_workspace = false;
  };

  entry& get(std::size_t batch, const cpu_format& xf) {
    const auto src = detail::desc_of(xf, batch, g_.c, g_.h, g_.w);
    for (auto& e : entries_)
      if (e->batch == batch && e->src == src) return *e;
    return detail::dnnl_checked("creating pooling primitives", [&]() -> entry& {
      using dt = dnnl::memory::dim;
      const dnnl::memory::dims dst_dims{static_cast<dt>(batch), static_cast<dt>(g_.c), static_cast<dt>(g_.oh()),
                                        static_cast<dt>(g_.ow())};
      const dnnl::memory::dims k{static_cast<dt>(g_.k), static_cast<dt>(g_.k)};
      const dnnl::memory::dims s{static_cast<dt>(g_.stride), static_cast<dt>(g_.stride)};
      const dnnl::memory::dims p{0, 0};
      const auto algo = kind_ == pool_kind::max ? dnnl::algorithm::pooling_max : dnnl::algorithm::pooling_avg_exclude_padding;
      auto& eng = detail::dnnl_engine();
      auto make_fwd = [&](const dnnl::memory::desc& dst) {
        return dnnl::pooling_forward::primitive_desc(
            dnnl::pooling_forward::desc(dnnl::prop_kind::forward_training, algo, src, dst, s, k, p, p), eng);
      };
      auto fwd_pd = make_fwd(dnnl::memory::desc(dst_dims, dnnl::memory::data_type::f32, dnnl::memory::format_tag::any));
      const std::size_t out_elems = batch * g_.c * g_.oh() * g_.ow();
      const auto plain = detail::plain_nchw(batch, g_.c, g_.oh(), g_.ow());
      if (!detail::unpadded(fwd_pd.dst_desc(), out_elems)) fwd_pd = make_fwd(plain);
      cpu_format dst_format;
      if (!(fwd_pd.dst_desc() == plain)) dst_format.desc = fwd_pd.dst_desc();
      auto bwd_pd = dnnl::pooling_backward::primitive_desc(
          dnnl::pooling_backward::desc(algo, src, fwd_pd.dst_desc(), s, k, p, p), eng, fwd_pd);
      entries_.push_back(std::make_unique<entry>(
          entry{batch, src, dst_format, fwd_pd, dnnl::pooling_forward(fwd_pd), bwd_pd, dnnl::pooling_backward(bwd_pd), {}, false}));
      return *entries_.back();
    });
  }

  void reference_forward(const T* x, T* y, std::size_t batch) {
    const std::size_t oh = g_.oh(), ow = g_.ow();
    if (kind_ == pool_kind::max) argmax_.resize(batch * g_.c * oh * ow);
    for (std::size_t nc = 0; nc < batch * g_.c; ++nc)
      for (std::size_t i = 0; i < oh; ++i)
        for (std::size_t j = 0; j < ow; ++j) {
          const std::size_t out = (nc * oh + i) * ow + j;
          T best = -std::numeric_limits<T>::infinity(), sum = 0;
          std::size_t best_at = 0;
          for (std::size_t p = 0; p < g_.k; ++p)
            for (std::size_t q = 0; q < g_.k; ++q) {
              const std::size_t at = (nc * g_.h + i * g_.stride + p) * g_.w + j * g_.stride + q;
              sum += x[at];
              if (x[at] > best) best = x[at], best_at = at;
            }
          if (kind_ == pool_kind::max) {
            y[out] = best;
            argmax_[out] = best_at;
          } else {
            y[out] = sum / static_cast<T>(g_.k * g_.k);
          }
        }
  }
  void reference_backward(const T* dy, T* dx, std::size_t batch) {
    const std::size_t oh = g_.oh(), ow = g_.ow();
    std::memset(dx, 0, batch * g_.c * g_.h * g_.w * sizeof(T));
    for (std::size_t nc = 0; nc < batch * g_.c; ++nc)
      for (std::size_t i = 0; i < oh; ++i)
        for (std::size_t j = 0; j < ow; ++j) {
          const std::size_t out = (nc * oh + i) * ow + j;
          if (kind_ == pool_kind::max) {
            dx[argmax_[out]] += dy[out];
          } else {
            const T share = dy[out] / static_cast<T>(g_.k * g_.k);
            for (std::size_t p = 0; p < g_.k; ++p)
              for (std::size_t q = 0; q < g_.k; ++q) dx[(nc * g_.h + i * g_.stride + p) * g_.w + j * g_.stride + q] += share;
          }
        }
  }

  pool2d_geometry g_;
  pool_kind kind_;
  std::vector<std::unique_ptr<entry>> entries_;
  std::vector<std::size_t> argmax_;
};

}  // namespace loom
