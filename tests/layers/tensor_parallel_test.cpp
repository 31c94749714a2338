// SPDX-License-Identifier: Apache-2.0
// Numerical gradient checks of the tensor-parallel slices (column_parallel_shard,
// row_parallel_shard) in double, their ranks as threads of a loom::local_comm group: every
// parameter of every rank's slice and every input element against central finite differences
// of the split network's own forward (collective: the rank owning a parameter perturbs it, all
// ranks evaluate), max relative error < 1e-6 (the measure: tests/support/gradient_check.hpp).
// The split forward and the gathered gradients must also equal the whole network's to 1e-12.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "gradient_check.hpp"
#include "loom/comm/local.hpp"
#include "loom/layers/activation.hpp"
#include "loom/layers/linear.hpp"
#include "loom/layers/tensor_parallel.hpp"
#include "loom/nn/model.hpp"
#include "loom/parallel/tensor/plan.hpp"
#include "loom/parallel/tensor/sync.hpp"

using namespace loom;

namespace {

constexpr double tolerance = 1e-6;

struct split_report {
  double parameter_error = 0, input_error = 0;  // largest rel over this rank's slice / the input
  double max_abs_gradient = 0;
  double output_vs_whole = 0;  // largest |y_split - y_whole|
  double gradient_vs_whole = 0;  // largest |gathered dparams - whole dparams|, and dx
  std::size_t parameters_checked = 0, inputs_checked = 0;
  std::string worst;
  std::string str() const {
    std::ostringstream os;
    os.precision(6);
    os << "parameters " << parameter_error << " over " << parameters_checked << ", inputs " << input_error << " over "
       << inputs_checked << ", worst " << worst << ", max |gradient| " << max_abs_gradient << ", output vs whole "
       << output_vs_whole << ", gradients vs whole " << gradient_vs_whole;
    return os.str();
  }
};

/// The gradient check of Net split Width ways, on `batch` random samples; one report per rank.
template <class Net, std::size_t Width>
std::vector<split_report> check_split(std::size_t batch) {
  using rank_net = tensor_parallel_network<Net, Width>;
  using layout = tensor_parallel_layout<Net, Width>;
  using act = activation<const double, cpu>;
  constexpr std::size_t in = Net::input_shape::size, out = Net::output_shape::size;
  constexpr std::size_t per_rank = rank_net::parameter_count;

  // The whole network: random parameters (biases not zero), its output and gradients.
  std::vector<double> whole(Net::parameter_count);
  testing::randomize(std::span<double>(whole), 11, 0.5, 0.01);
  const std::vector<double> x = testing::random_values(batch * in, 5, 1.0, 0.05);
  testing::weighted_sum whole_objective;
  typename Net::template sequence_type<double, cpu> whole_seq;
  const run_context plain{};
  auto y_whole = whole_seq.forward(plain, whole.data(), act{x.data()}, batch);
  const std::vector<double> y_ref(y_whole.data, y_whole.data + batch * out);
  std::vector<double> dy(batch * out), dx_ref(batch * in), dp_ref(Net::parameter_count);
  whole_objective.gradient(y_ref.data(), dy.data(), dy.size());
  whole_seq.backward(plain, whole.data(), act{x.data()}, dy.data(), dx_ref.data(), dp_ref.data());

  std::vector<split_report> reports(Width);
  std::vector<std::vector<double>> slices_dp(Width);
  local_world(static_cast<int>(Width)).run([&](local_comm& c) {
    const auto r = static_cast<std::size_t>(c.rank());
    split_report& rep = reports[r];
    comm_tensor_group<local_comm> group(c.split(0, c.rank()));
    run_context ctx{};
    ctx.tensor = &group;
    typename rank_net::template sequence_type<double, cpu> seq(0, 0, tensor_shard{r, Width});
    std::vector<double> p(per_rank), xv = x;
    layout::scatter(whole.data(), r, p.data());
    testing::weighted_sum objective;

    auto y = seq.forward(ctx, p.data(), act{xv.data()}, batch);
    for (std::size_t i = 0; i < batch * out; ++i) rep.output_vs_whole = std::max(rep.output_vs_whole, std::abs(y.data[i] - y_ref[i]));
    std::vector<double> g(batch * out), dx(batch * in, std::numeric_limits<double>::quiet_NaN()),
        dp(per_rank, std::numeric_limits<double>::quiet_NaN());
    objective.gradient(y.data, g.data(), g.size());
    seq.backward(ctx, p.data(), act{xv.data()}, g.data(), dx.data(), dp.data());
    for (std::size_t i = 0; i < dx.size(); ++i) rep.gradient_vs_whole = std::max(rep.gradient_vs_whole, std::abs(dx[i] - dx_ref[i]));
    slices_dp[r] = dp;

    auto f = [&]() -> long double {
      auto yy = seq.forward(ctx, p.data(), act{xv.data()}, batch);
      return objective.value(yy.data, batch * out);
    };
    double worst = -1;
    auto compare = [&](double& v, double analytic, double& field, const std::string& what) {
      const double saved = v, up = saved + 1e-6, down = saved - 1e-6;
      v = up;
      const long double fu = f();
      v = down;
      const long double fd = f();
      v = saved;
      const double n = static_cast<double>((fu - fd) / static_cast<long double>(up - down));
      const double e = std::isfinite(analytic) ? testing::relative_error(analytic, n, 1e-4) : 1e300;
      rep.max_abs_gradient = std::max(rep.max_abs_gradient, std::abs(analytic));
      field = std::max(field, e);
      if (e > worst) {
        worst = e;
        std::ostringstream os;
        os.precision(12);
        os << what << ": analytic " << analytic << ", numeric " << n;
        rep.worst = os.str();
      }
    };
    // Replicated values (whole layers, row_parallel biases) are perturbed on every rank at
    // once, as training changes them; split values by their owner alone, while the other ranks
    // run the two collective forwards unperturbed.
    std::vector<bool> split(per_rank, false);
    for (const auto& piece : layout::pieces) {
      using kind = typename layout::kind;
      const std::size_t n = piece.role == kind::column ? piece.rank_count
                            : piece.role == kind::row  ? piece.rank_count - piece.rows
                                                       : 0;
      std::fill_n(split.begin() + static_cast<std::ptrdiff_t>(piece.rank_offset), n, true);
    }
    for (std::size_t i = 0; i < per_rank; ++i)
      if (!split[i]) compare(p[i], dp[i], rep.parameter_error, "replicated parameter " + std::to_string(i));
    for (std::size_t q = 0; q < Width; ++q)
      for (std::size_t i = 0; i < per_rank; ++i) {
        if (!split[i]) continue;
        if (q == r) {
          compare(p[i], dp[i], rep.parameter_error, "rank " + std::to_string(r) + " parameter " + std::to_string(i));
        } else {
          f();
          f();
        }
      }
    rep.parameters_checked = per_rank;
    // The input is the same on every rank: all perturb it together.
    for (std::size_t i = 0; i < xv.size(); ++i) compare(xv[i], dx[i], rep.input_error, "input " + std::to_string(i));
    rep.inputs_checked = xv.size();
  });

  // The slices' gradients gathered into the whole layout equal the whole network's.
  std::vector<double> all(Width * per_rank), gathered(Net::parameter_count);
  for (std::size_t r = 0; r < Width; ++r) std::copy(slices_dp[r].begin(), slices_dp[r].end(), all.begin() + r * per_rank);
  layout::gather(all.data(), gathered.data());
  double d = 0;
  for (std::size_t i = 0; i < gathered.size(); ++i) d = std::max(d, std::abs(gathered[i] - dp_ref[i]));
  for (auto& rep : reports) rep.gradient_vs_whole = std::max(rep.gradient_vs_whole, d);
  return reports;
}

#define CHECK_SPLIT_GRADIENTS(reports)                 \
  do {                                                 \
    for (const auto& r_ : (reports)) {                 \
      INFO(r_.str());                                  \
      CHECK(r_.parameter_error < tolerance);           \
      CHECK(r_.input_error < tolerance);               \
      CHECK(r_.max_abs_gradient > 0);                  \
      CHECK(r_.parameters_checked > 0);                \
      CHECK(r_.output_vs_whole <= 1e-12);              \
      CHECK(r_.gradient_vs_whole <= 1e-12);            \
    }                                                  \
  } while (false)

}  // namespace

TEST_CASE("A column slice feeding a row slice has correct gradients, split 2 ways", "[layers][tensor][gradient]") {
  using net = network<input<6>, column_parallel<linear<4>>, loom::tanh, row_parallel<linear<3>>>;
  const auto r = check_split<net, 2>(3);
  CHECK(r[0].parameters_checked == 4 * 6 / 2 + 2 + 3 * 4 / 2 + 3);
  CHECK(r[0].inputs_checked == 3 * 6);  // the input gradient: the column layer's allreduce
  CHECK_SPLIT_GRADIENTS(r);
}

TEST_CASE("Column and row slices between whole layers have correct gradients, split 3 ways",
          "[layers][tensor][gradient]") {
  using net = network<input<5>, linear<4>, sigmoid, column_parallel<linear<6>>, loom::tanh,
                      row_parallel<linear<5, init::xavier>>, sigmoid, linear<3>>;
  CHECK_SPLIT_GRADIENTS((check_split<net, 3>(2)));
}

TEST_CASE("A row slice reading the whole input and a gathered column slice have correct gradients",
          "[layers][tensor][gradient]") {
  // No column_parallel before the row layer: it reads its columns of the whole input (and its
  // input gradient is summed over the group); no row_parallel after the column layer: its
  // output is gathered.
  using net = network<input<6>, row_parallel<linear<4>>, loom::tanh, column_parallel<linear<6>>>;
  CHECK_SPLIT_GRADIENTS((check_split<net, 2>(3)));
}

TEST_CASE("A width-1 split is the whole layer", "[layers][tensor][gradient]") {
  using net = network<input<6>, column_parallel<linear<4>>, loom::tanh, row_parallel<linear<3>>>;
  CHECK_SPLIT_GRADIENTS((check_split<net, 1>(3)));
}

TEST_CASE("A slice run without its group, or built for another width, says so", "[layers][tensor]") {
  using net = network<input<6>, column_parallel<linear<4>>, loom::tanh, row_parallel<linear<3>>>;
  using rank_net = tensor_parallel_network<net, 2>;
  CHECK_THROWS_WITH((model<rank_net, double>(1, 0, tensor_shard{0, 4})),
                    Catch::Contains("the model holds slice 0 of 4 but the network is split 2 ways"));
  model<rank_net, double> m(1, 0, tensor_shard{1, 2});
  std::vector<double> x(6, 0.5);
  CHECK_THROWS_WITH(m.forward(run_context{}, x.data(), 1),
                    Catch::Contains("row_parallel at layer 2") && Catch::Contains("run_context::tensor is null"));
}
