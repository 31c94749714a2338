// SPDX-License-Identifier: Apache-2.0
// Pipeline model parallelism: the main example's networks cut into stages, one MPI rank each
// (`mpirun -np S`, S = 2 or 4), every step's batch split into micro-batches that flow through
// the stages under the GPipe or the 1F1B schedule; with --stages 2 on an even number of ranks
// from 4, a hybrid: that many / 2 data-parallel replicas of a 2-stage pipeline (with --zero,
// each stage's optimizer state sharded over its replicas). Takes the main example's flags plus
// --micro-batches, --schedule, --stages and --zero, and ends with the same `result:` line; with
// the same seed,
// batch and steps its params_l2 (over the whole model) equals the main example's one-rank
// figure. Rank 0 prints each stage's figures: compute, bubble (waiting on its neighbours),
// peak activation bytes and parameter bytes.

#include <algorithm>
#include <type_traits>

#include "../common/example.hpp"

#if !LOOM_HAS_MPI
#error "examples/pipeline needs MPI (configure with LOOM_WITH_MPI=ON)"
#endif

namespace {

constexpr const char* program = "pipeline";

constexpr const char* usage_head = R"(usage: mpirun -np S pipeline [flags]      (S = 2 or 4 stages, one rank each)
  --micro-batches M      micro-batches per step: 1, 2, 4 or 8 (default 4)
  --schedule gpipe|1f1b  (default 1f1b)
  --stages 2|4           stages (default: one per rank); --stages 2 on 4, 6, ... ranks trains
                         that many / 2 replicas of a 2-stage pipeline (loom::hybrid)
)";

struct pipeline_flags {
  std::size_t micro_batches = 4;
  std::string schedule = "1f1b";
  std::size_t stages = 0;  // 0: one stage per rank
};

/// The hybrid's data parallelism: with ZeRO stage 1 (--zero) or without.
template <bool Zero>
using replicas_policy = std::conditional_t<Zero, loom::data_parallel<loom::mpi_comm, loom::shard_optimizer_state>,
                                           loom::data_parallel<loom::mpi_comm>>;

template <class Net, class Pipeline, class Optimizer, bool Hybrid, bool Zero>
int train(const example::flags& f, const pipeline_flags& p, typename Optimizer::options opt) {
  using pipeline_policy = loom::model_parallel<Pipeline, loom::mpi_comm>;
  using policy = std::conditional_t<Hybrid, loom::hybrid<replicas_policy<Zero>, Pipeline>, pipeline_policy>;
  constexpr std::size_t stages = pipeline_policy::stages;
  auto train_set = example::load(f, loom::data::split::train);
  auto test_set = example::load(f, loom::data::split::test);
  loom::trainer<Net, loom::softmax_cross_entropy, Optimizer, policy> t{opt, {.seed = f.seed, .threads = f.threads}};
  const bool lead = t.rank() == 0;
  using plan = typename pipeline_policy::template partition<Net>;
  if (!f.quiet && lead) {
    std::cerr << program << ": " << f.model << " (" << Net::parameter_count << " parameters) in " << stages
              << " stages (first layers:";
    for (std::size_t s = 0; s < stages; ++s) std::cerr << ' ' << plan::bounds[s];
    std::cerr << "), " << p.micro_batches << " micro-batches, " << p.schedule << ", ";
    if (Hybrid) std::cerr << t.ranks() / static_cast<int>(stages) << " data-parallel replicas" << (Zero ? " (ZeRO)" : "") << ", ";
    std::cerr << train_set.size() << " training images, " << loom::threads() << " thread(s) per rank\n";
  }
  example::load_weights(f, t);
  const auto fit = t.fit(train_set, example::fit_options_of(f));
  if (example::after_fit(program, f, t, fit)) return 0;
  const auto eval = t.evaluate(test_set);
  const double l2 = t.parameters_l2();  // collective
  // After a recovery (a hybrid: a replica lost a rank and left) the lead may be another process.
  if (t.rank() != 0) return 0;
  if (!f.quiet) std::cerr << loom::stage_figures_table(fit.figures);
  example::print_result(f, fit, eval, l2,
                        " stages=" + std::to_string(stages) + " micro_batches=" + std::to_string(p.micro_batches) +
                            " schedule=" + p.schedule);
  return 0;
}

template <class Net, std::size_t S, std::size_t M, class Schedule, bool Hybrid, bool Zero>
int with_optimizer(const example::flags& f, const pipeline_flags& p) {
  using pipe = loom::pipeline<S, loom::micro_batches<M>, Schedule>;
  if (f.optimizer == "adam") return train<Net, pipe, loom::adam, Hybrid, Zero>(f, p, {.lr = f.lr});
  return train<Net, pipe, loom::sgd, Hybrid, Zero>(f, p, {.lr = f.lr, .momentum = f.momentum});
}

template <class Net, std::size_t S, bool Hybrid = false, bool Zero = false>
int with_stages(const example::flags& f, const pipeline_flags& p) {
  auto pick = [&]<std::size_t M>(std::integral_constant<std::size_t, M>) {
    return p.schedule == "gpipe" ? with_optimizer<Net, S, M, loom::gpipe, Hybrid, Zero>(f, p)
                                 : with_optimizer<Net, S, M, loom::one_f_one_b, Hybrid, Zero>(f, p);
  };
  switch (p.micro_batches) {
    case 1: return pick(std::integral_constant<std::size_t, 1>{});
    case 2: return pick(std::integral_constant<std::size_t, 2>{});
    case 4: return pick(std::integral_constant<std::size_t, 4>{});
    default: return pick(std::integral_constant<std::size_t, 8>{});
  }
}

/// The world sizes this program trains the job on: one rank per stage for 2 and 4 stages, or
/// with --stages 2 the 2-stage pipeline and its hybrids (every even size; with --zero only the
/// hybrids, from 4).
template <class Net>
std::vector<std::size_t> valid_world_sizes(const example::flags& f, const pipeline_flags& p) {
  std::vector<std::size_t> out;
  auto add = [&]<class Policy>(std::type_identity<Policy>) {
    for (std::size_t w : loom::world_size_rules<Net, Policy>::list(f.batch, f.deterministic_chunk))
      if (std::find(out.begin(), out.end(), w) == out.end()) out.push_back(w);
  };
  if (p.stages == 2 && f.zero) {
    add(std::type_identity<loom::hybrid<replicas_policy<true>, loom::pipeline<2>>>{});
    std::erase_if(out, [](std::size_t w) { return w < 4; });  // 2 ranks: no replicas to shard over
  } else if (p.stages == 2) {
    add(std::type_identity<loom::hybrid<loom::data_parallel<loom::mpi_comm>, loom::pipeline<2>>>{});
  } else if (!f.zero) {
    add(std::type_identity<loom::model_parallel<loom::pipeline<2>, loom::mpi_comm>>{});
    add(std::type_identity<loom::model_parallel<loom::pipeline<4>, loom::mpi_comm>>{});
  }
  std::sort(out.begin(), out.end());
  return out;
}

template <class Net>
int with_model(const example::flags& f, const pipeline_flags& p) {
  const int ranks = loom::mpi_comm::world().size();
  const std::size_t stages = p.stages ? p.stages : static_cast<std::size_t>(ranks);
  const bool hybrid = stages == 2 && ranks >= 4 && ranks % 2 == 0;
  if (f.zero && !hybrid)
    throw loom::invalid_argument("--zero shards each stage's optimizer state over its data-parallel replicas: it "
                                 "needs --stages 2 on 4, 6, ... ranks (this run: " + std::to_string(stages) +
                                 " stages on " + std::to_string(ranks) + " ranks, no replicas)");
  if (hybrid && f.zero) {
    // Built for the mlp only, to keep this program's compile time near its 30 s target (each
    // policy compiles a trainer per micro-batch count, schedule and optimizer); the library's
    // ZeRO pipeline hybrid takes any network (tests/parallel/mpi_zero_pipeline.cpp: a cnn too).
    if constexpr (std::is_same_v<Net, example::mlp>) return with_stages<Net, 2, /*Hybrid=*/true, /*Zero=*/true>(f, p);
    throw loom::invalid_argument("--zero with --stages 2 is built for --model mlp in this example");
  }
  if (stages == static_cast<std::size_t>(ranks) && ranks == 2) return with_stages<Net, 2>(f, p);
  if (stages == static_cast<std::size_t>(ranks) && ranks == 4) return with_stages<Net, 4>(f, p);
  if (stages == 2 && ranks >= 4 && ranks % 2 == 0) return with_stages<Net, 2, /*Hybrid=*/true>(f, p);
  throw loom::invalid_argument(std::to_string(stages) + " stages on " + std::to_string(ranks) +
                               " ranks: it runs one rank per stage on 2 or 4 ranks, or --stages 2 on an even number of "
                               "ranks from 4 (data-parallel replicas of 2 stages)");
}

}  // namespace

int main(int argc, char** argv) {
  loom::mpi::environment env{argc, argv};
  pipeline_flags p;
  example::parser parser(program, std::string(usage_head) + example::model_usage + example::common_usage);
  parser.with_zero_flag();
  const example::flags f = parser.parse(argc, argv, [&](std::string_view name, std::string_view value) {
    if (name == "micro-batches") {
      p.micro_batches = parser.number<std::size_t>(name, value);
      if (p.micro_batches != 1 && p.micro_batches != 2 && p.micro_batches != 4 && p.micro_batches != 8)
        parser.fail("--micro-batches must be 1, 2, 4 or 8, got " + std::string(value));
    } else if (name == "stages") {
      p.stages = parser.number<std::size_t>(name, value);
      if (p.stages != 2 && p.stages != 4) parser.fail("--stages must be 2 or 4, got " + std::string(value));
    } else if (name == "schedule") {
      p.schedule = value;
      if (p.schedule != "gpipe" && p.schedule != "1f1b") parser.fail("--schedule must be gpipe or 1f1b, got '" + p.schedule + "'");
    } else {
      return false;
    }
    return true;
  });
  if (f.print_valid_world_sizes) {
    // Micro-batches and the schedule do not change which worlds train; --stages does.
    example::print_valid_world_sizes(f.model == "cnn" ? valid_world_sizes<example::cnn>(f, p) : valid_world_sizes<example::mlp>(f, p));
    return 0;
  }
  return example::guarded(program, [&] {
    return f.model == "cnn" ? with_model<example::cnn>(f, p) : with_model<example::mlp>(f, p);
  });
}
