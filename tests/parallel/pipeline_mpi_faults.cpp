// SPDX-License-Identifier: Apache-2.0
// Failure cases of a 2-stage pipeline over real processes, run by run_fault.cmake under mpirun:
//   mismatch   rank 1 builds another pipeline (4 micro-batches, not 2): every rank must stop
//              with the message, before any stage waits on the other.
//   dead-peer  rank 1 dies (_Exit) between two fits: rank 0, waiting for its gradients, must
//              not wait forever.
//   throw      the last stage cannot read a label mid-step: it ends the whole job with its
//              message (the first stage is waiting for it).

#include <cstdio>
#include <cstdlib>
#include <string>

#include "loom/comm/mpi.hpp"
#include "pipeline_common.hpp"

using namespace loom_test;

namespace {

template <std::size_t M>
using mpi_pipeline = loom::model_parallel<loom::pipeline<2, loom::micro_batches<M>>, loom::mpi_comm>;

/// The training set, except that label `bad` cannot be read (only the last stage reads labels).
struct failing_labels {
  using sample_shape = loom::data::fashion_mnist_set::sample_shape;
  static constexpr std::size_t classes = 10;
  const loom::data::fashion_mnist_set* data;
  std::size_t bad;
  std::size_t size() const { return data->size(); }
  const std::uint8_t* pixels(std::size_t i) const { return data->pixels(i); }
  std::int32_t label(std::size_t i) const {
    if (i == bad) throw loom::data_error("loom: simulated failure: label 1234 is unreadable");
    return static_cast<std::int32_t>(data->label(i));
  }
};

}  // namespace

int main(int argc, char** argv) {
  loom::mpi::environment env{argc, argv};
  auto comm = loom::mpi_comm::world();
  const std::string mode = argc > 1 ? argv[1] : "";
  try {
    if (mode == "mismatch") {
      if (comm.rank() == 0) {
        loom::trainer<mlp, loom::softmax_cross_entropy, loom::sgd, mpi_pipeline<2>> t{pipeline_sgd, {.seed = 1, .threads = 1}};
      } else {
        loom::trainer<mlp, loom::softmax_cross_entropy, loom::sgd, mpi_pipeline<4>> t{pipeline_sgd, {.seed = 1, .threads = 1}};
      }
      std::printf("rank %d: the trainer was built although the ranks disagree\n", comm.rank());
      return 0;
    }
    loom::trainer<mlp, loom::softmax_cross_entropy, loom::sgd, mpi_pipeline<2>> t{pipeline_sgd, {.seed = 1, .threads = 1}};
    t.fit(train_set(), steps(3, 64));
    if (mode == "dead-peer") {
      if (comm.rank() == 1) std::_Exit(9);
      t.fit(train_set(), steps(6, 64));  // stage 1 is gone: this must not hang
      std::printf("rank %d: second fit returned without its peer\n", comm.rank());
      return 0;
    }
    if (mode == "throw") {
      t.fit(failing_labels{&train_set(), 1234}, steps(100, 64));  // one epoch reads every label
      std::printf("rank %d: fit returned although label 1234 is unreadable\n", comm.rank());
      return 0;
    }
    std::fprintf(stderr, "usage: pipeline_mpi_faults mismatch|dead-peer|throw\n");
    return 2;
  } catch (const loom::error& e) {
    std::printf("rank %d caught: %s\n", comm.rank(), e.what());
    std::fflush(stdout);
    if (mode == "throw") comm.abort(3, e.what());  // the other stage may be waiting on this one
    return 3;
  }
}
