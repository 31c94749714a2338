// SPDX-License-Identifier: Apache-2.0
#pragma once
// Global-norm gradient clipping over one flat gradient buffer, as torch.nn.utils.clip_grad_norm_
// with the L2 norm. The sum of squares and the scaling are bodies in backend/kernels/optim.hpp.

#include <cmath>
#include <cstddef>

#include "loom/backend/kernels/optim.hpp"
#include "loom/optim/validate.hpp"

namespace loom {

/// The scaling half of clip_grad_norm, for a norm computed elsewhere (the whole model's, when
/// grads[0, n) is one rank's part of it): scales grads by max_norm / (norm + 1e-6) when that
/// factor is below 1 and norm is finite; otherwise leaves them. grads live in Backend's memory.
template <class Backend, class T>
void scale_to_norm(T* grads, std::size_t n, double norm, double max_norm) {
  if (!std::isfinite(norm)) return;
  const double factor = max_norm / (norm + 1e-6);
  if (factor < 1.0) Backend::for_each(n, detail::scale_by<T>{grads, static_cast<T>(factor)});
}

/// Computes the L2 norm of grads[0, n) (accumulated in double) and, when it is too large,
/// scales grads in place by max_norm / (norm + 1e-6) — exactly when that factor is below 1, as
/// torch.nn.utils.clip_grad_norm_ does (so a norm within 1e-6 under max_norm is scaled by a
/// factor just below 1). grads live in Backend's memory space. A non-finite norm (an inf or NaN
/// gradient) is returned and the gradients are left as they are, for the caller to act on.
/// Returns: the norm before clipping.
/// Requires: max_norm finite and > 0. Throws: loom::invalid_argument otherwise.
template <class Backend, class T>
double clip_grad_norm(T* grads, std::size_t n, double max_norm) {
  detail::require_in_range(detail::positive_finite(max_norm), "loom::clip_grad_norm", "max_norm", "finite and > 0",
                           max_norm);
  const double norm = std::sqrt(Backend::sum(n, detail::squared_term<T>{grads}));
  scale_to_norm<Backend>(grads, n, norm, max_norm);
  return norm;
}

}  // namespace loom
