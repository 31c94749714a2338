// SPDX-License-Identifier: Apache-2.0
#pragma once
// The instantiations that loom::compiled and loom::compiled_mpi hold of the templates the
// trainer uses with loom's own types (LOOM_INSTANTIATE, loom/core/config.hpp), named where all
// of those templates are visible: the split-invariant mode's chunk tree, exchange and
// micro-step, the optimizers' state, the checks of the math mode and the machine's peak on the
// CPU backend, and over loom::mpi_comm the trainer's collectives, job check, figures, timelines
// and recovery protocol. Included at the end of loom/train/trainer.hpp; it includes only the
// headers of the templates it names.

#include "loom/backend/default_backend.hpp"
#include "loom/core/config.hpp"
#include "loom/monitor/figures.hpp"
#include "loom/monitor/sampler.hpp"
#include "loom/monitor/timeline.hpp"
#include "loom/optim/adam.hpp"
#include "loom/optim/any.hpp"
#include "loom/optim/sgd.hpp"
#include "loom/parallel/data/chunk_tree.hpp"
#include "loom/parallel/data/chunked_steps.hpp"
#include "loom/parallel/collectives.hpp"
#include "loom/parallel/data/data_parallel.hpp"
#include "loom/parallel/engine.hpp"
#include "loom/train/recovery.hpp"

namespace loom {

// The instantiations of the trainer's parts that depend on neither the network nor the policy,
// for loom's own types: compiled once in loom_compiled (the CPU backend's float) and
// loom_compiled_mpi (loom::mpi_comm) under separate compilation, rather than in every program
// (LOOM_INSTANTIATE, loom/core/config.hpp). Where the CPU backend is not built, none.
#if LOOM_HAS_DNNL && !defined(LOOM_WITHOUT_CPU_BACKEND) && !defined(__CUDACC__)
LOOM_INSTANTIATE(class gradient_tree<float, cpu>)
LOOM_INSTANTIATE(class chunk_exchange<float, cpu>)
LOOM_INSTANTIATE(class detail::chunked_steps<float, cpu>)
LOOM_INSTANTIATE(loss_value detail::chunked_steps<float, cpu>::step<void>(
    const chunk_plan&, const batch_view<float>&, std::size_t, std::size_t, void*, std::size_t, std::size_t, float*,
    std::size_t, std::size_t, rank_figures&, detail::chunk_passes<float>&))
LOOM_INSTANTIATE(class sgd::state<float, cpu>)
LOOM_INSTANTIATE(class detail::adam_state<adam, float, cpu>)
LOOM_INSTANTIATE(class detail::adam_state<adamw, float, cpu>)
LOOM_INSTANTIATE(class any_optimizer::state<float, cpu>)
LOOM_INSTANTIATE(math_mode detail::checked_math<cpu>(math_mode))
LOOM_INSTANTIATE(double monitor::measure_peak_gflops<cpu>(std::size_t, double))
#if defined(LOOM_SEPARATE_COMPILATION_MPI)
class mpi_comm;
LOOM_INSTANTIATE_MPI(double chunk_exchange<float, cpu>::run<mpi_comm>(mpi_comm&, const chunk_plan&, std::size_t,
                                                                      const gradient_tree<float, cpu>&, float*, std::size_t))
LOOM_INSTANTIATE_MPI(loss_value detail::chunked_steps<float, cpu>::step<mpi_comm>(
    const chunk_plan&, const batch_view<float>&, std::size_t, std::size_t, mpi_comm*, std::size_t, std::size_t, float*,
    std::size_t, std::size_t, rank_figures&, detail::chunk_passes<float>&))
#endif
#endif
#if defined(LOOM_SEPARATE_COMPILATION_MPI)
class mpi_comm;
LOOM_INSTANTIATE_MPI(class comm_collectives<mpi_comm>)
LOOM_INSTANTIATE_MPI(void detail::check_same_job<mpi_comm>(mpi_comm&, const std::string&, const std::string&))
LOOM_INSTANTIATE_MPI(std::vector<rank_figures> gather_figures<mpi_comm>(mpi_comm&, const rank_figures&))
LOOM_INSTANTIATE_MPI(std::vector<std::vector<monitor::span_event>> monitor::gather_timelines<mpi_comm>(
    mpi_comm&, const monitor::timeline&, std::vector<std::size_t>&))
LOOM_INSTANTIATE_MPI(std::string detail::join_exchange<mpi_comm>(mpi_comm&, mpi_comm&, bool, const fault_options&,
                                                                 const std::string&))
LOOM_INSTANTIATE_MPI(void detail::broadcast_run<mpi_comm>(mpi_comm&, detail::erased_engine&, detail::run_state&, int))
LOOM_INSTANTIATE_MPI(void detail::bring_replacements<mpi_comm>(mpi_comm&, detail::erased_engine&, detail::run_state&,
                                                               const recovery_result&, const fault_options&, int,
                                                               std::string&))
LOOM_INSTANTIATE_MPI(detail::fit_position detail::survive<mpi_comm>(mpi_comm&, detail::erased_engine&, detail::run_state&,
                                                                    const rank_failure&, const fault_options&,
                                                                    const std::string&, int, io::checkpointer*,
                                                                    std::string&))
LOOM_INSTANTIATE_MPI(detail::fit_position detail::join_as_replacement<mpi_comm>(mpi_comm&, detail::erased_engine&,
                                                                                detail::run_state&, const fault_options&))
#endif

}  // namespace loom
