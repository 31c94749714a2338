// SPDX-License-Identifier: Apache-2.0
#pragma once
// The definitions of batch_norm.hpp's oneDNN batch normalisation (detail::dnnl_batch_norm):
// included at the end of the header (header-only), or compiled once in src/loom.cpp
// (LOOM_SEPARATE_COMPILATION; see loom/core/config.hpp).

#include <memory>
#include <string>
#include <unordered_map>
#include <utility>

#include "loom/backend/cpu/batch_norm.hpp"
#include "loom/backend/cpu/impl/dnnl_support.ipp"
#include "loom/backend/cpu/impl/onednn.hpp"

namespace loom::detail {

struct dnnl_batch_norm::entry {
  std::size_t batch;
  dnnl::memory::desc data;  // the layout x (and y, dy, dx) come in
  dnnl::batch_normalization_forward::primitive_desc train_pd;
  dnnl::batch_normalization_forward train;
  dnnl::batch_normalization_forward::primitive_desc infer_pd;
  dnnl::batch_normalization_forward infer;
  dnnl::batch_normalization_backward::primitive_desc bwd_pd;
  dnnl::batch_normalization_backward bwd;
  // Training with given statistics (a synchronized batch norm's): made on first use.
  std::unique_ptr<dnnl::batch_normalization_forward::primitive_desc> given_pd;
  dnnl::batch_normalization_forward given;
};

/// One value per channel: the statistics, scale and shift (and their gradients).
inline dnnl::memory::desc batch_norm_channels_desc(std::size_t c) {
  return {{static_cast<dnnl::memory::dim>(c)}, dnnl::memory::data_type::f32, dnnl::memory::format_tag::x};
}

/// A forward's arguments: x and y in layout `data`, the statistics (read, or written by a
/// training forward without given ones), the scale and shift, c values each.
inline std::unordered_map<int, dnnl::memory> batch_norm_forward_args(const dnnl::memory::desc& data, std::size_t c,
                                                                     const float* x, float* y, const float* mean,
                                                                     const float* var, const float* w, const float* b) {
  auto& eng = dnnl_engine();
  const dnnl::memory::desc stat = batch_norm_channels_desc(c);
  auto of = [&](const dnnl::memory::desc& d, const float* p) { return dnnl::memory(d, eng, const_cast<float*>(p)); };
  return {{DNNL_ARG_SRC, of(data, x)},      {DNNL_ARG_DST, of(data, y)},  {DNNL_ARG_MEAN, of(stat, mean)},
          {DNNL_ARG_VARIANCE, of(stat, var)}, {DNNL_ARG_SCALE, of(stat, w)}, {DNNL_ARG_SHIFT, of(stat, b)}};
}

LOOM_DECL dnnl_batch_norm::dnnl_batch_norm(batch_norm_geometry g) : g_(g) {}
LOOM_DECL dnnl_batch_norm::dnnl_batch_norm(dnnl_batch_norm&&) noexcept = default;
LOOM_DECL dnnl_batch_norm& dnnl_batch_norm::operator=(dnnl_batch_norm&&) noexcept = default;
LOOM_DECL dnnl_batch_norm::~dnnl_batch_norm() = default;

LOOM_DECL void dnnl_batch_norm::fuse_relu() {
  relu_ = true;
  entries_.clear();
}

LOOM_DECL void dnnl_batch_norm::forward_training(const float* x, const cpu_format& xf, const float* w, const float* b,
                                                 float* y, float* mean, float* var, void* workspace, std::size_t batch) {
  entry& e = get(batch, xf);
  auto args = batch_norm_forward_args(e.data, g_.c, x, y, mean, var, w, b);
  if (relu_) args.insert({DNNL_ARG_WORKSPACE, dnnl::memory(e.train_pd.workspace_desc(), dnnl_engine(), workspace)});
  dnnl_checked("running a batch normalization forward", [&] {
    e.train.execute(dnnl_stream(), args);
    dnnl_stream().wait();
  });
}

LOOM_DECL void dnnl_batch_norm::forward_training_given(const float* x, const cpu_format& xf, const float* w,
                                                       const float* b, float* y, const float* mean, const float* var,
                                                       void* workspace, std::size_t batch) {
  entry& e = get(batch, xf);
  auto& eng = dnnl_engine();
  if (!e.given_pd) {
    try {
      using flags = dnnl::normalization_flags;
      const flags f = flags::use_scale | flags::use_shift | flags::use_global_stats |
                      (relu_ ? flags::fuse_norm_relu : flags::none);
      auto pd = dnnl::batch_normalization_forward::primitive_desc(
          dnnl::batch_normalization_forward::desc(dnnl::prop_kind::forward_training, e.data,
                                                  static_cast<float>(g_.eps), f),
          eng);
      if (pd.dst_desc() != e.data || pd.workspace_desc() != e.train_pd.workspace_desc())
        throw backend_error("loom: oneDNN's batch normalization with given statistics does not keep its input's "
                            "layout or its ReLU mask here");
      e.given = dnnl::batch_normalization_forward(pd);
      e.given_pd = std::make_unique<dnnl::batch_normalization_forward::primitive_desc>(std::move(pd));
    } catch (const dnnl::error& err) {
      throw backend_error(std::string("loom: oneDNN failed while creating a batch normalization with given "
                                      "statistics: ") + err.what() + " (status " +
                          std::to_string(static_cast<int>(err.status)) + ")");
    }
  }
  auto args = batch_norm_forward_args(e.data, g_.c, x, y, mean, var, w, b);
  if (relu_) args.insert({DNNL_ARG_WORKSPACE, dnnl::memory(e.given_pd->workspace_desc(), eng, workspace)});
  dnnl_checked("running a batch normalization forward with given statistics", [&] {
    e.given.execute(dnnl_stream(), args);
    dnnl_stream().wait();
  });
}

LOOM_DECL void dnnl_batch_norm::forward_inference(const float* x, const cpu_format& xf, const float* w, const float* b,
                                                  const float* mean, const float* var, float* y, std::size_t batch) {
  entry& e = get(batch, xf);
  const auto args = batch_norm_forward_args(e.data, g_.c, x, y, mean, var, w, b);
  dnnl_checked("running a batch normalization forward (inference)", [&] {
    e.infer.execute(dnnl_stream(), args);
    dnnl_stream().wait();
  });
}

LOOM_DECL void dnnl_batch_norm::backward(const float* x, const cpu_format& xf, const float* w, const float* b,
                                         const float* mean, const float* var, const void* workspace, const float* dy,
                                         float* dx, float* dw, float* db, std::size_t batch) {
  entry& e = get(batch, xf);
  auto& eng = dnnl_engine();
  const dnnl::memory::desc stat = batch_norm_channels_desc(g_.c), param = stat;
  dnnl::memory ms(e.data, eng, const_cast<float*>(x)), mdd(e.data, eng, const_cast<float*>(dy)), mds(e.data, eng, dx);
  dnnl::memory mm(stat, eng, const_cast<float*>(mean)), mv(stat, eng, const_cast<float*>(var));
  dnnl::memory mw(param, eng, const_cast<float*>(w)), mb(param, eng, const_cast<float*>(b));
  dnnl::memory mdw(param, eng, dw), mdb(param, eng, db);
  // (The shift is an argument of backward too, though the gradients do not depend on it.)
  std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, ms},      {DNNL_ARG_DIFF_DST, mdd},  {DNNL_ARG_MEAN, mm},
                                             {DNNL_ARG_VARIANCE, mv}, {DNNL_ARG_SCALE, mw},      {DNNL_ARG_SHIFT, mb},
                                             {DNNL_ARG_DIFF_SRC, mds}, {DNNL_ARG_DIFF_SCALE, mdw}, {DNNL_ARG_DIFF_SHIFT, mdb}};
  if (relu_)
    args.insert({DNNL_ARG_WORKSPACE, dnnl::memory(e.bwd_pd.workspace_desc(), eng, const_cast<void*>(workspace))});
  dnnl_checked("running a batch normalization backward", [&] {
    e.bwd.execute(dnnl_stream(), args);
    dnnl_stream().wait();
  });
}

LOOM_DECL dnnl_batch_norm::entry& dnnl_batch_norm::get(std::size_t batch, const cpu_format& xf) {
  using dt = dnnl::memory::dim;
  // Channels-last of 16 or 8 channels is nChw16c / nChw8c byte for byte: described so, oneDNN
  // runs its blocked kernels, which took 60% of the time of its nhwc ones here (forward and
  // backward of 64 x 16 x 28 x 28, one thread).
  const bool as_blocked = (g_.c == 16 || g_.c == 8) && is_channels_last(xf, batch, g_.c, g_.h, g_.w);
  const dnnl::memory::desc data =
      g_.rank == 1 ? dnnl::memory::desc({static_cast<dt>(batch), static_cast<dt>(g_.c)}, dnnl::memory::data_type::f32,
                                        dnnl::memory::format_tag::nc)
      : as_blocked ? blocked_nchw_desc(batch, g_.c, g_.h, g_.w, g_.c)
                   : desc_of(xf, batch, g_.c, g_.h, g_.w);
  for (auto& e : entries_)
    if (e->batch == batch && e->data == data) return *e;
  try {
    using flags = dnnl::normalization_flags;
    const float eps = static_cast<float>(g_.eps);
    const flags affine = flags::use_scale | flags::use_shift;
    const flags relu = relu_ ? flags::fuse_norm_relu : flags::none;
    auto& eng = dnnl_engine();
    auto train_pd = dnnl::batch_normalization_forward::primitive_desc(
        dnnl::batch_normalization_forward::desc(dnnl::prop_kind::forward_training, data, eps, affine | relu), eng);
    auto infer_pd = dnnl::batch_normalization_forward::primitive_desc(
        dnnl::batch_normalization_forward::desc(dnnl::prop_kind::forward_inference, data, eps,
                                                affine | relu | flags::use_global_stats),
        eng);
    auto bwd_pd = dnnl::batch_normalization_backward::primitive_desc(
        dnnl::batch_normalization_backward::desc(dnnl::prop_kind::backward, data, data, eps, affine | relu), eng,
        train_pd);
    if (train_pd.dst_desc() != data || bwd_pd.diff_src_desc() != data)
      throw backend_error("loom: oneDNN's batch normalization does not keep its input's layout here");
    if (train_pd.workspace_desc().get_size() > workspace_bytes(batch))
      throw backend_error("loom: oneDNN's batch normalization wants a workspace of " +
                          std::to_string(train_pd.workspace_desc().get_size()) + " bytes, more than the " +
                          std::to_string(workspace_bytes(batch)) + " loom plans for it");
    entries_.push_back(std::make_unique<entry>(entry{batch, data, train_pd, dnnl::batch_normalization_forward(train_pd),
                                                     infer_pd, dnnl::batch_normalization_forward(infer_pd), bwd_pd,
                                                     dnnl::batch_normalization_backward(bwd_pd), nullptr, {}}));
    return *entries_.back();
  } catch (const dnnl::error& err) {
    throw backend_error(std::string("loom: oneDNN failed while creating batch normalization primitives: ") + err.what() +
                        " (status " + std::to_string(static_cast<int>(err.status)) + ")");
  }
}

}  // namespace loom::detail
