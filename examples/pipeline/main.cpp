// SPDX-License-Identifier: Apache-2.0
// Pipeline model parallelism: the main example's networks cut into stages, one MPI rank each
// (`mpirun -np S`, S = 2 or 4), every step's batch split into micro-batches that flow through
// the stages under the GPipe or the 1F1B schedule. Takes the main example's flags plus
// --micro-batches and --schedule, and ends with the same `result:` line; with the same seed,
// batch and steps its params_l2 (over the whole model) equals the main example's one-rank
// figure. Rank 0 prints each stage's figures: compute, bubble (waiting on its neighbours),
// peak activation bytes and parameter bytes.

#include "../common/example.hpp"

#if !LOOM_HAS_MPI
#error "examples/pipeline needs MPI (configure with LOOM_WITH_MPI=ON)"
#endif

namespace {

constexpr const char* program = "pipeline";

constexpr const char* usage_head = R"(usage: mpirun -np S pipeline [flags]      (S = 2 or 4 stages, one rank each)
  --micro-batches M      micro-batches per step: 1, 2, 4 or 8 (default 4)
  --schedule gpipe|1f1b  (default 1f1b)
)";

struct pipeline_flags {
  std::size_t micro_batches = 4;
  std::string schedule = "1f1b";
};

template <class Net, class Pipeline, class Optimizer>
int train(const example::flags& f, const pipeline_flags& p, typename Optimizer::options opt) {
  using policy = loom::model_parallel<Pipeline, loom::mpi_comm>;
  auto train_set = example::load(f, loom::data::split::train);
  auto test_set = example::load(f, loom::data::split::test);
  loom::trainer<Net, loom::softmax_cross_entropy, Optimizer, policy> t{opt, {.seed = f.seed, .threads = f.threads}};
  const bool lead = t.rank() == 0;
  using plan = typename policy::template partition<Net>;
  if (!f.quiet && lead) {
    std::cerr << program << ": " << f.model << " (" << Net::parameter_count << " parameters) in " << policy::stages
              << " stages (first layers:";
    for (std::size_t s = 0; s < policy::stages; ++s) std::cerr << ' ' << plan::bounds[s];
    std::cerr << "), " << p.micro_batches << " micro-batches, " << p.schedule << ", " << train_set.size()
              << " training images, " << loom::threads() << " thread(s) per rank\n";
  }
  example::load_weights(f, t);
  const auto fit = t.fit(train_set, example::fit_options_of(f));
  if (example::after_fit(program, f, t, fit)) return 0;
  const auto eval = t.evaluate(test_set);
  const double l2 = t.parameters_l2();  // collective
  if (!lead) return 0;
  if (!f.quiet) std::cerr << loom::stage_figures_table(fit.figures);
  example::print_result(f, fit, eval, l2,
                        " stages=" + std::to_string(policy::stages) + " micro_batches=" + std::to_string(p.micro_batches) +
                            " schedule=" + p.schedule);
  return 0;
}

template <class Net, std::size_t S, std::size_t M, class Schedule>
int with_optimizer(const example::flags& f, const pipeline_flags& p) {
  using pipe = loom::pipeline<S, loom::micro_batches<M>, Schedule>;
  if (f.optimizer == "adam") return train<Net, pipe, loom::adam>(f, p, {.lr = f.lr});
  return train<Net, pipe, loom::sgd>(f, p, {.lr = f.lr, .momentum = f.momentum});
}

template <class Net, std::size_t S>
int with_stages(const example::flags& f, const pipeline_flags& p) {
  auto pick = [&]<std::size_t M>(std::integral_constant<std::size_t, M>) {
    return p.schedule == "gpipe" ? with_optimizer<Net, S, M, loom::gpipe>(f, p)
                                 : with_optimizer<Net, S, M, loom::one_f_one_b>(f, p);
  };
  switch (p.micro_batches) {
    case 1: return pick(std::integral_constant<std::size_t, 1>{});
    case 2: return pick(std::integral_constant<std::size_t, 2>{});
    case 4: return pick(std::integral_constant<std::size_t, 4>{});
    default: return pick(std::integral_constant<std::size_t, 8>{});
  }
}

/// The world sizes of the stage counts this program builds (2 and 4) that train the job.
template <class Net>
std::vector<std::size_t> valid_world_sizes(const example::flags& f) {
  std::vector<std::size_t> out;
  auto add = [&]<std::size_t S>(std::integral_constant<std::size_t, S>) {
    using rules = loom::world_size_rules<Net, loom::model_parallel<loom::pipeline<S>, loom::mpi_comm>>;
    for (std::size_t w : rules::list(f.batch, f.deterministic_chunk)) out.push_back(w);
  };
  add(std::integral_constant<std::size_t, 2>{});
  add(std::integral_constant<std::size_t, 4>{});
  return out;
}

template <class Net>
int with_model(const example::flags& f, const pipeline_flags& p) {
  const int ranks = loom::mpi_comm::world().size();
  if (ranks == 2) return with_stages<Net, 2>(f, p);
  if (ranks == 4) return with_stages<Net, 4>(f, p);
  throw loom::invalid_argument("pipeline: the number of stages is the number of ranks and must be 2 or 4, got " +
                               std::to_string(ranks) + " (start it with mpirun -np 2 or -np 4)");
}

}  // namespace

int main(int argc, char** argv) {
  loom::mpi::environment env{argc, argv};
  pipeline_flags p;
  const example::parser parser(program, std::string(usage_head) + example::common_usage);
  const example::flags f = parser.parse(argc, argv, [&](std::string_view name, std::string_view value) {
    if (name == "micro-batches") {
      p.micro_batches = parser.number<std::size_t>(name, value);
      if (p.micro_batches != 1 && p.micro_batches != 2 && p.micro_batches != 4 && p.micro_batches != 8)
        parser.fail("--micro-batches must be 1, 2, 4 or 8, got " + std::string(value));
    } else if (name == "schedule") {
      p.schedule = value;
      if (p.schedule != "gpipe" && p.schedule != "1f1b") parser.fail("--schedule must be gpipe or 1f1b, got '" + p.schedule + "'");
    } else {
      return false;
    }
    return true;
  });
  if (f.print_valid_world_sizes) {
    // The stage count, micro-batches and schedule do not change which worlds train: one rank a stage.
    example::print_valid_world_sizes(f.model == "cnn" ? valid_world_sizes<example::cnn>(f) : valid_world_sizes<example::mlp>(f));
    return 0;
  }
  return example::guarded(program, [&] {
    return f.model == "cnn" ? with_model<example::cnn>(f, p) : with_model<example::mlp>(f, p);
  });
}
