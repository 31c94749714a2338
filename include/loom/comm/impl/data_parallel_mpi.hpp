// SPDX-License-Identifier: Apache-2.0
// No include guard: included at the end of loom/parallel/data/data_parallel.hpp and of
// loom/comm/mpi.hpp, it names (once, after the second of them) the instantiations of
// data_parallel's gradient communication over loom::mpi_comm that loom::compiled_mpi holds
// (LOOM_INSTANTIATE_MPI, loom/core/config.hpp): those of data_parallel<mpi_comm> (native wire, no
// ZeRO) and data_parallel<mpi_comm, choose_at_run_time>, for every network. It needs both
// headers' classes complete, hence the order-independent pair of guards. It lies in comm/ with
// mpi.hpp's own instantiation list: comm/ includes nothing of parallel/ (it only names
// parallel/'s class where data_parallel.hpp is already included).
#if defined(LOOM_PARALLEL_DATA_PARALLEL_HPP) && defined(LOOM_COMM_MPI_HPP) && !defined(LOOM_DATA_PARALLEL_MPI_NAMED)
#define LOOM_DATA_PARALLEL_MPI_NAMED 1
namespace loom {
LOOM_INSTANTIATE_MPI(class detail::bucket_allreduce<float, mpi_comm, void, false, false>)
LOOM_INSTANTIATE_MPI(class detail::bucket_allreduce<float, mpi_comm, void, true, false>)
}  // namespace loom
#endif
