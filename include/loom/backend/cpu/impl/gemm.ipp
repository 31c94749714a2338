// SPDX-License-Identifier: Apache-2.0
#pragma once
// The definitions of gemm.hpp's non-template functions: included at the end of the header
// (header-only), or compiled once in src/loom.cpp (LOOM_SEPARATE_COMPILATION; see
// loom/core/config.hpp).

#include "loom/backend/cpu/gemm.hpp"
#include "loom/backend/cpu/impl/onednn.hpp"

namespace loom::detail {

LOOM_DECL std::string cpu_bf16_unsupported(const char* what) {
  return std::string("loom: math_mode::bf16 needs a CPU with bf16 support in oneDNN (AVX-512: avx512_core, fast with "
                     "avx512_bf16 or amx_bf16; see /proc/cpuinfo), but oneDNN has no bf16 ") +
         what + " on this CPU: use math_mode::fp32 (trainer_options::math), or check loom::cpu::supports(math_mode::bf16) first";
}

struct bf16_gemm::entry {
  key k;
  dnnl::memory::desc a32, a16, b32, b16, c;
  dnnl::reorder ra, rb;
  dnnl::matmul mm;
};

LOOM_DECL bf16_gemm::bf16_gemm() = default;
LOOM_DECL bf16_gemm::~bf16_gemm() = default;

LOOM_DECL bf16_gemm& bf16_gemm::this_thread() {
  thread_local bf16_gemm g;
  return g;
}

LOOM_DECL void cpu_sgemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, float alpha,
                         const float* a, std::size_t lda, const float* b, std::size_t ldb, float beta, float* c,
                         std::size_t ldc, math_mode math) {
  if (math == math_mode::bf16 && k > 0) {
    bf16_gemm::this_thread().run(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  signal_shield shield;  // oneDNN's sgemm kernels point the stack pointer into the heap (signals.hpp)
  const auto st = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', static_cast<dnnl_dim_t>(m),
                             static_cast<dnnl_dim_t>(n), static_cast<dnnl_dim_t>(k), alpha, a,
                             static_cast<dnnl_dim_t>(lda), b, static_cast<dnnl_dim_t>(ldb), beta, c,
                             static_cast<dnnl_dim_t>(ldc));
  if (st != dnnl_success)
    throw backend_error("loom: oneDNN sgemm failed (status " + std::to_string(static_cast<int>(st)) + ") for m=" +
                        std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k));
}

LOOM_DECL void bf16_gemm::run(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, float alpha,
                              const float* a, std::size_t lda, const float* b, std::size_t ldb, float beta, float* c, std::size_t ldc) {
  const key kk{trans_a, trans_b, m, n, k, lda, ldb, ldc, alpha, beta};
  entry* e = nullptr;
  for (auto& x : entries_)
    if (x->k == kk) e = x.get();
  if (!e) e = &make(kk);
  auto& eng = dnnl_engine();
  a16_.reserve_discard(m * k);
  b16_.reserve_discard(k * n);
  dnnl::memory ma32(e->a32, eng, const_cast<float*>(a)), ma16(e->a16, eng, a16_.data());
  dnnl::memory mb32(e->b32, eng, const_cast<float*>(b)), mb16(e->b16, eng, b16_.data());
  dnnl::memory mc(e->c, eng, c);
  dnnl_checked("running a bf16 matrix product", [&] {
    e->ra.execute(dnnl_stream(), ma32, ma16);
    e->rb.execute(dnnl_stream(), mb32, mb16);
    e->mm.execute(dnnl_stream(), {{DNNL_ARG_SRC, ma16}, {DNNL_ARG_WEIGHTS, mb16}, {DNNL_ARG_DST, mc}});
    dnnl_stream().wait();
  });
}

LOOM_DECL bool bf16_gemm::available() {
  static const bool ok = [] {
    try {
      using dt = dnnl::memory::data_type;
      dnnl::memory::desc a({2, 2}, dt::bf16, {2, 1}), c({2, 2}, dt::f32, {2, 1});
      dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, a, c), dnnl_engine());
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return ok;
}

LOOM_DECL bf16_gemm::entry& bf16_gemm::make(const key& kk) {
  using dt = dnnl::memory::data_type;
  using dims = dnnl::memory::dims;
  const auto d = [](std::size_t v) { return static_cast<dnnl::memory::dim>(v); };
  auto e = std::make_unique<entry>();
  e->k = kk;
  // op(A) is (m, k): stored (m, k) with row stride lda, or (k, m) with row stride lda.
  e->a32 = {{d(kk.m), d(kk.k)}, dt::f32, kk.ta ? dims{1, d(kk.lda)} : dims{d(kk.lda), 1}};
  e->a16 = {{d(kk.m), d(kk.k)}, dt::bf16, kk.ta ? dims{1, d(kk.m)} : dims{d(kk.k), 1}};
  e->b32 = {{d(kk.k), d(kk.n)}, dt::f32, kk.tb ? dims{1, d(kk.ldb)} : dims{d(kk.ldb), 1}};
  e->b16 = {{d(kk.k), d(kk.n)}, dt::bf16, kk.tb ? dims{1, d(kk.k)} : dims{d(kk.n), 1}};
  e->c = {{d(kk.m), d(kk.n)}, dt::f32, dims{d(kk.ldc), 1}};
  auto& eng = dnnl_engine();
  dnnl::primitive_attr attr;
  if (kk.alpha != 1.0f) attr.set_output_scales(0, {kk.alpha});
  if (kk.beta != 0.0f) {
    dnnl::post_ops ops;
    ops.append_sum(kk.beta);
    attr.set_post_ops(ops);
  }
  try {
    e->mm = dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(e->a16, e->b16, e->c), attr, eng));
  } catch (const dnnl::error& err) {
    if (err.status == dnnl_unimplemented) throw invalid_argument(cpu_bf16_unsupported("matrix product"));
    throw backend_error(std::string("loom: oneDNN failed while creating a bf16 matrix product: ") + err.what());
  }
  dnnl_checked("creating the bf16 conversions of a matrix product", [&] {
    e->ra = dnnl::reorder(dnnl::reorder::primitive_desc(eng, e->a32, eng, e->a16));
    e->rb = dnnl::reorder(dnnl::reorder::primitive_desc(eng, e->b32, eng, e->b16));
  });
  entries_.push_back(std::move(e));
  return *entries_.back();
}

}  // namespace loom::detail
