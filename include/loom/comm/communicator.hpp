// SPDX-License-Identifier: Apache-2.0
#pragma once
// The `communicator` concept that data, pipeline and tensor parallelism are written against,
// and the reduction operators it offers. No MPI here: loom/comm/mpi.hpp (processes, Open MPI)
// and loom/comm/local.hpp (threads of one process) are the implementations.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "loom/core/half.hpp"

namespace loom {

/// How a reduction (allreduce, reduce_scatter) combines the ranks' elements.
enum class reduce_op { sum, max };

/// The name of a reduction operator, for messages: "sum" or "max".
constexpr const char* to_string(reduce_op op) noexcept {
  return op == reduce_op::sum ? "sum" : "max";
}

namespace detail {

/// An element type a communicator moves: an arithmetic type other than bool (float, double,
/// std::int32_t, std::int64_t, std::uint64_t, char, ...) or a 16-bit wire float (loom::bf16,
/// loom::fp16: reduced in float at each step, loom/core/half.hpp). Every rank must pass the
/// same type.
template <class T>
concept comm_value = (std::is_arithmetic_v<T> && !std::same_as<std::remove_cv_t<T>, bool>) || is_half_v<T>;

/// An element type a communicator can also reduce (sum, max): a comm_value other than plain
/// char, which MPI treats as text and does not add.
template <class T>
concept comm_reducible = comm_value<T> && !std::same_as<std::remove_cv_t<T>, char>;

/// What a non-blocking operation returns: movable; wait() blocks until the operation is
/// complete, test() says whether it is (and helps it along); both are no-ops on a
/// default-constructed or completed request.
template <class R>
concept comm_request = std::movable<R> && std::default_initializable<R> && requires(R& r) {
  r.wait();
  { r.test() } -> std::same_as<bool>;
};

}  // namespace detail

/// A group of `size()` ranks that exchange elements. Every data operation is a template over
/// the element type T (detail::comm_value; sums and maxima need detail::comm_reducible); the
/// concept checks it with T = float. Counts are elements, not bytes.
///
/// - `rank()`, `size()`: this rank's index in [0, size()) and the number of ranks.
/// - `split(colour, key)`: collective; the ranks passing the same colour (>= 0) form a new
///   communicator, ranked by (key, old rank) — MPI_Comm_split.
/// - `barrier()`: returns once every rank has entered it.
/// - `broadcast(p, n, root)`: the root's p[0, n) is copied to every rank's p.
/// - `allreduce(p, n, op)`: in place: every rank's p[i] becomes op over all ranks' p[i].
/// - `reduce_scatter(in, out, n, op)`: in holds size() blocks of n; out (n elements) gets the
///   reduction of every rank's block rank(). in and out must not overlap.
/// - `allgather(in, out, n)`: out (size() * n) gets every rank's in (n), block r from rank r.
///   in and out must not overlap.
/// - `send(p, n, peer, tag)`, `recv(p, n, peer, tag)`: point to point; messages between two
///   ranks with one tag arrive in the order they were sent; recv throws if the message holds
///   a different count. A blocking send may wait until the receiver takes the message, so a
///   rank sending to itself must use isend.
/// - `iallreduce`, `isend`, `irecv`: the same, non-blocking; the buffer must stay alive and
///   untouched until the returned `C::request` completes (wait() or test() returning true).
///   A request destroyed while pending waits in its destructor.
/// - `name()`: the implementation, "mpi" or "local".
///
/// Collectives match by order: every rank of a communicator calls the same collectives
/// (blocking or not) in the same order, with the same count, root and operator. Failures
/// throw loom::communication_error naming the operation, the rank and the cause.
template <class C>
concept communicator =
    std::movable<C> && detail::comm_request<typename C::request> &&
    requires(C& c, const C& cc, float* p, const float* cp, std::size_t n, int r) {
      { cc.rank() } -> std::same_as<int>;
      { cc.size() } -> std::same_as<int>;
      { c.split(r, r) } -> std::same_as<C>;
      c.barrier();
      c.broadcast(p, n, r);
      c.allreduce(p, n, reduce_op::sum);
      c.reduce_scatter(cp, p, n, reduce_op::sum);
      c.allgather(cp, p, n);
      c.send(cp, n, r, r);
      c.recv(p, n, r, r);
      { c.iallreduce(p, n, reduce_op::sum) } -> std::same_as<typename C::request>;
      { c.isend(cp, n, r, r) } -> std::same_as<typename C::request>;
      { c.irecv(p, n, r, r) } -> std::same_as<typename C::request>;
      { cc.name() } -> std::convertible_to<std::string>;
    };

}  // namespace loom
