// SPDX-License-Identifier: Apache-2.0
#pragma once
// A numerical gradient checker for loom networks, in double on the CPU (the reference loops).
//
// Given a network's parameters, an input batch x and a scalar objective f(y) of the network's
// output y, it computes the analytic gradients df/dparams and df/dx with one backward pass and
// compares every component with the central finite difference
//
//     n_i = (f(v + h e_i) - f(v - h e_i)) / ((v_i + h) - (v_i - h))
//
// (the denominator is the step actually taken, after rounding). v is a parameter or an input
// element; all parameters and all input elements are checked. The objective is accumulated in
// long double, so its rounding does not swamp the difference quotient.
//
// The error of one component is the relative error of relative_error.hpp,
//
//     rel(a, n) = |a - n| / max(|a| + |n|, floor),
//
// and a check reports the largest one. The floor is the scale below which a gradient counts as
// zero. It cannot be much smaller than the noise of the quotient: with h = 1e-6 in double, n_i
// carries an absolute error of about eps * |terms of f| / h ~ 1e-10 for objectives of order 1,
// so a gradient of 1e-5 can only be checked to ~1e-5 relative. The default floor, 1e-4, keeps
// that noise below 1e-6 relative; gradients that are exactly zero (a ReLU below its kink, a
// max-pool input that is not the maximum) also give an exactly zero quotient, since the output
// does not change at all.
//
// Inputs must be away from kinks: no ReLU input within h of 0, no max-pool window with two
// values within h of each other. random_values() gives distinct values at least `min_abs`
// from zero.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <stdexcept>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "loom/backend/cpu.hpp"
#include "loom/core/random.hpp"
#include "loom/layers/layer.hpp"
#include "loom/nn/loss.hpp"
#include "loom/nn/model.hpp"
#include "relative_error.hpp"

namespace loom::testing {

/// n values uniform in [-scale, -min_abs] u [min_abs, scale], all distinct (a shuffled lattice
/// with jitter, at least (scale - min_abs) / n apart), from seed.
inline std::vector<double> random_values(std::size_t n, std::uint64_t seed, double scale = 1.0, double min_abs = 0.05) {
  std::vector<std::size_t> order(n);
  for (std::size_t i = 0; i < n; ++i) order[i] = i;
  splitmix64 rng(seed);
  for (std::size_t i = n; i > 1; --i) std::swap(order[i - 1], order[rng.below(i)]);
  std::vector<double> v(n);
  const double span = scale - min_abs;
  for (std::size_t i = 0; i < n; ++i) {
    // slot k of n in [0, 1): (k + 0.25 + 0.5 u) / n keeps neighbours at least 0.5 / n apart.
    const double u = (static_cast<double>(order[i]) + 0.25 + 0.5 * uniform01(rng())) / static_cast<double>(n);
    const double t = 2 * u - 1;  // in (-1, 1)
    v[i] = (t < 0 ? -1.0 : 1.0) * (min_abs + span * std::abs(t));
  }
  return v;
}

/// Overwrites a span (parameters, say) with random_values.
template <class T>
void randomize(std::span<T> s, std::uint64_t seed, double scale = 1.0, double min_abs = 0.05) {
  const auto v = random_values(s.size(), seed, scale, min_abs);
  for (std::size_t i = 0; i < s.size(); ++i) s[i] = static_cast<T>(v[i]);
}

// ---------------------------------------------------------------------------------------------
// Objectives: f(y) for a (batch, Width) output. value() in long double, gradient() df/dy.

/// f(y) = sum_i w_i y_i with fixed random weights w in [-1, 1]: every output gets its own
/// sensitivity, so errors in one element cannot cancel against another.
class weighted_sum {
 public:
  weighted_sum() = default;
  explicit weighted_sum(std::uint64_t seed) : seed_(seed) {}
  long double value(const double* y, std::size_t n) {
    fit(n);
    long double s = 0;
    for (std::size_t i = 0; i < n; ++i) s += static_cast<long double>(w_[i]) * y[i];
    return s;
  }
  void gradient(const double*, double* dy, std::size_t n) {
    fit(n);
    std::copy(w_.begin(), w_.begin() + static_cast<std::ptrdiff_t>(n), dy);
  }

 private:
  void fit(std::size_t n) {
    if (w_.size() != n) w_ = random_values(n, seed_, 1.0, 0.1);
  }
  std::uint64_t seed_ = 7;
  std::vector<double> w_;
};

/// The mean loss over a batch in long double, written out independently of loom's kernels:
/// softmax_cross_entropy: log-sum-exp(z) - z[label]; mse: sum_j (y_j - [j == label])^2 / Width.
template <class Loss, std::size_t Classes>
long double reference_mean_loss(const double* y, const std::int32_t* labels, std::size_t batch) {
  long double s = 0;
  for (std::size_t n = 0; n < batch; ++n) {
    const double* z = y + n * Classes;
    const auto label = static_cast<std::size_t>(labels[n]);
    if constexpr (std::is_same_v<Loss, softmax_cross_entropy>) {
      long double m = z[0], e = 0;
      for (std::size_t j = 1; j < Classes; ++j) m = std::max(m, static_cast<long double>(z[j]));
      for (std::size_t j = 0; j < Classes; ++j) e += std::exp(static_cast<long double>(z[j]) - m);
      s += m + std::log(e) - static_cast<long double>(z[label]);
    } else {
      static_assert(std::is_same_v<Loss, mse>, "reference_mean_loss knows softmax_cross_entropy and mse");
      for (std::size_t j = 0; j < Classes; ++j) {
        const long double d = static_cast<long double>(z[j]) - (j == label ? 1.0L : 0.0L);
        s += d * d / static_cast<long double>(Classes);
      }
    }
  }
  return s / static_cast<long double>(batch);
}

/// A loom loss as objective: the mean loss over the batch, its gradient computed by the loss
/// (Loss::compute with grad_scale = 1 / batch). The value is reference_mean_loss, in long
/// double: loom's own loss value is a double sum, whose rounding divided by 2h (~1e-10) would
/// swamp gradients of 1e-5. (check_loss_gradients checks loom's value itself.)
template <class Loss, std::size_t Classes>
class loss_objective {
 public:
  explicit loss_objective(std::vector<std::int32_t> labels) : labels_(std::move(labels)) {}
  long double value(const double* y, std::size_t n) {
    return reference_mean_loss<Loss, Classes>(y, labels_.data(), n / Classes);
  }
  void gradient(const double* y, double* dy, std::size_t n) {
    const std::size_t batch = n / Classes;
    Loss::template compute<cpu, Classes>(y, labels_.data(), dy, batch, 1.0 / static_cast<double>(batch), ws_);
  }

 private:
  std::vector<std::int32_t> labels_;
  loss_workspace<cpu> ws_;
};

// ---------------------------------------------------------------------------------------------

struct gradient_check_options {
  /// Finite-difference step h.
  double step = 1e-6;
  /// The floor of rel(a, n): gradients below it count as zero (see the top of this file).
  double floor = 1e-4;
  /// The context of every forward and backward (training, dropout seed and step).
  run_context ctx{};
  bool check_parameters = true;
  bool check_inputs = true;
};

/// What a check found. max_error() is the number to compare with the tolerance.
struct gradient_check_report {
  double parameter_error = 0;  // the largest rel over the parameters
  double input_error = 0;      // the largest rel over the input elements
  std::size_t parameters_checked = 0, inputs_checked = 0;
  std::string worst;  // where the largest error is, with both values
  double max_abs_gradient = 0;  // the largest |analytic gradient| seen (0 hints at a dead check)
  /// check_gradients: the largest |difference| between model::backward's gradients and the
  /// checker's own backward through the sequence (0 expected: the same code runs).
  /// check_loss_gradients: the relative difference of loom's mean loss and the reference.
  double model_mismatch = 0;
  /// The analytic parameter gradients the check compared (df/dparams).
  std::vector<double> parameter_gradients;

  double max_error() const { return std::max(parameter_error, input_error); }
  std::string str() const {
    std::ostringstream os;
    os.precision(6);
    os << "gradient check: max rel error " << max_error() << " (parameters " << parameter_error << " over "
       << parameters_checked << ", inputs " << input_error << " over " << inputs_checked << "), worst " << worst
       << ", max |gradient| " << max_abs_gradient << ", model mismatch " << model_mismatch;
    return os.str();
  }
};

namespace detail {
/// For every i: the central difference of f() in v[i] (v[i] restored exactly afterwards)
/// against analytic[i]; the largest rel goes into `field` and, if the largest so far, into
/// r.worst (worst_error tracks that).
template <class F>
void compare_with_differences(std::span<double> v, std::span<const double> analytic, F&& f,
                              const gradient_check_options& opt, const char* what, gradient_check_report& r,
                              double& field, double& worst_error) {
  for (std::size_t i = 0; i < v.size(); ++i) {
    const double saved = v[i], up = saved + opt.step, down = saved - opt.step;
    v[i] = up;
    const long double fu = f();
    v[i] = down;
    const long double fd = f();
    v[i] = saved;
    const double n = static_cast<double>((fu - fd) / static_cast<long double>(up - down));
    const double a = analytic[i];
    const double e = std::isfinite(a) && std::isfinite(n) ? relative_error(a, n, opt.floor)
                                                           : std::numeric_limits<double>::infinity();
    r.max_abs_gradient = std::max(r.max_abs_gradient, std::abs(a));
    field = std::max(field, e);
    if (e > worst_error) {
      worst_error = e;
      std::ostringstream os;
      os.precision(12);
      os << what << "[" << i << "]: analytic " << a << ", numeric " << n;
      r.worst = os.str();
    }
  }
}
}  // namespace detail

/// Checks df/dparams and df/dx of Network at params (modified during the check, restored
/// exactly) and input x (batch samples, plain row-major). Objective: see weighted_sum.
template <class Network, class Objective>
gradient_check_report check_network_gradients(std::span<double> params, std::span<const double> x, std::size_t batch,
                                              Objective& objective, const gradient_check_options& opt = {}) {
  using seq_t = typename Network::template sequence_type<double, cpu>;
  using act = activation<const double, cpu>;
  constexpr std::size_t in_size = Network::input_shape::size, out_size = Network::output_shape::size;
  if (params.size() != Network::parameter_count || x.size() != batch * in_size)
    throw std::invalid_argument("check_network_gradients: parameter or input sizes do not match the network");

  seq_t seq;
  // Layers with buffers (batch norm's running statistics) run bound to some; training-mode
  // forwards update them but do not read them.
  std::vector<double> buffers(Network::buffer_count);
  seq.initialize_buffers(buffers.data());
  seq.bind_buffers(buffers.data());
  std::vector<double> xv(x.begin(), x.end());
  const std::size_t n_out = batch * out_size;
  auto f = [&]() -> long double {
    auto y = seq.forward(opt.ctx, params.data(), act{xv.data()}, batch);
    if (!y.format.plain()) throw std::logic_error("check_network_gradients: a double activation is not plain");
    return objective.value(y.data, n_out);
  };

  // Analytic gradients: one forward, one backward with dx requested. NaN-filled so a layer
  // that leaves part of a gradient unwritten fails the check.
  auto y = seq.forward(opt.ctx, params.data(), act{xv.data()}, batch);
  std::vector<double> dy(n_out), dx(batch * in_size, std::numeric_limits<double>::quiet_NaN()),
      dp(params.size(), std::numeric_limits<double>::quiet_NaN());
  objective.gradient(y.data, dy.data(), n_out);
  seq.backward(opt.ctx, params.data(), act{xv.data()}, dy.data(), dx.data(), dp.data());

  gradient_check_report r;
  r.parameter_gradients = dp;
  double worst_error = -1;
  if (opt.check_parameters) {
    detail::compare_with_differences(params, dp, f, opt, "parameter", r, r.parameter_error, worst_error);
    r.parameters_checked = params.size();
  }
  if (opt.check_inputs) {
    detail::compare_with_differences(std::span<double>(xv), dx, f, opt, "input", r, r.input_error, worst_error);
    r.inputs_checked = xv.size();
  }
  return r;
}

/// Checks a loss's gradient of the logits: Loss::compute<cpu, Classes> with grad_scale =
/// 1 / batch against finite differences of loom's own mean loss (its sum / batch). Reported as
/// inputs. The loss value itself must match reference_mean_loss (report.model_mismatch holds
/// the relative difference).
template <class Loss, std::size_t Classes>
gradient_check_report check_loss_gradients(std::span<const double> logits, const std::vector<std::int32_t>& labels,
                                           const gradient_check_options& opt = {}) {
  const std::size_t batch = labels.size();
  if (logits.size() != batch * Classes) throw std::invalid_argument("check_loss_gradients: logits and labels differ in batch");
  std::vector<double> z(logits.begin(), logits.end()), grad(z.size(), std::numeric_limits<double>::quiet_NaN());
  loss_workspace<cpu> ws;
  auto mean_loss = [&]() -> long double {
    const auto v = Loss::template compute<cpu, Classes>(z.data(), labels.data(), static_cast<double*>(nullptr), batch, 1.0, ws);
    return static_cast<long double>(v.sum) / static_cast<long double>(batch);
  };
  Loss::template compute<cpu, Classes>(z.data(), labels.data(), grad.data(), batch, 1.0 / static_cast<double>(batch), ws);
  gradient_check_report r;
  r.model_mismatch = relative_error(static_cast<double>(mean_loss()),
                                    static_cast<double>(reference_mean_loss<Loss, Classes>(z.data(), labels.data(), batch)));
  double worst_error = -1;
  detail::compare_with_differences(std::span<double>(z), grad, mean_loss, opt, "logit", r, r.input_error, worst_error);
  r.inputs_checked = z.size();
  return r;
}

/// The same on a model: its parameters, and in addition model::backward's parameter gradients
/// must equal the checker's (report.model_mismatch).
template <class Network, class Objective>
gradient_check_report check_gradients(model<Network, double, cpu>& m, std::span<const double> x, std::size_t batch,
                                      Objective& objective, const gradient_check_options& opt = {}) {
  auto r = check_network_gradients<Network>(m.parameters(), x, batch, objective, opt);
  // Parameter gradients the model's own way.
  const double* y = m.forward(opt.ctx, x.data(), batch);
  std::vector<double> dy(batch * Network::output_shape::size);
  objective.gradient(y, dy.data(), dy.size());
  m.backward(opt.ctx, dy.data(), batch);
  const auto g = m.gradients();
  for (std::size_t i = 0; i < g.size(); ++i)
    r.model_mismatch = std::max(r.model_mismatch, std::abs(g[i] - r.parameter_gradients[i]));
  return r;
}

}  // namespace loom::testing
