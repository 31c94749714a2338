// SPDX-License-Identifier: Apache-2.0
// ZeRO over the replicas of a pipeline hybrid, on a communicator without the collectives of
// blocks of different sizes that ZeRO's slices need (loom's own communicators all have them).
// expect: loom::shard_optimizer_state: this communicator has no ireduce_scatter_v / iallgather_v
// max-errors: 1
#include <cstddef>
#include <string>

#include "loom/parallel/hybrid.hpp"

/// A communicator with loom::communicator's operations only (declared: nothing runs here).
struct equal_blocks_comm {
  struct request {
    void wait();
    bool test();
  };
  int rank() const;
  int size() const;
  equal_blocks_comm split(int colour, int key);
  void barrier();
  template <class T>
  void broadcast(T* data, std::size_t n, int root);
  template <class T>
  void allreduce(T* data, std::size_t n, loom::reduce_op op);
  template <class T>
  void reduce_scatter(const T* in, T* out, std::size_t n, loom::reduce_op op);
  template <class T>
  void allgather(const T* in, T* out, std::size_t n);
  template <class T>
  void send(const T* data, std::size_t n, int to, int tag);
  template <class T>
  void recv(T* data, std::size_t n, int from, int tag);
  template <class T>
  request iallreduce(T* data, std::size_t n, loom::reduce_op op);
  template <class T>
  request isend(const T* data, std::size_t n, int to, int tag);
  template <class T>
  request irecv(T* data, std::size_t n, int from, int tag);
  std::string name() const;
};
static_assert(loom::communicator<equal_blocks_comm>);

using policy =
    loom::hybrid<loom::data_parallel<equal_blocks_comm, loom::shard_optimizer_state>, loom::pipeline<2, loom::micro_batches<4>>>;

int main() { return static_cast<int>(policy::group_size); }
