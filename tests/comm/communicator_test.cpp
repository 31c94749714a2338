// SPDX-License-Identifier: Apache-2.0
// Every communicator operation against a serial reference, on 1, 7 and 1,000,003 elements, on
// every rank. Written once over the communicator: test_comm runs it on local_comm (threads),
// test_comm_mpi on mpi_comm (processes started by mpirun); see harness.hpp.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "harness.hpp"
#include "loom/core/half.hpp"

using namespace comm_test;
using loom::reduce_op;

namespace {

std::string at(const std::string& what, std::size_t n) { return what + " of " + std::to_string(n); }

}  // namespace

TEST_CASE("A communicator knows its rank and size, names itself and passes a barrier", "[comm]") {
  on_every_world([]<loom::communicator C>(C& c, checker& k) {
    k.expect(c.size() >= 1 && c.rank() >= 0 && c.rank() < c.size(),
             "rank " + std::to_string(c.rank()) + " of size " + std::to_string(c.size()));
    const std::string name = c.name();
    k.expect(name == "mpi" || name == "local" || name == "hierarchical", "name() is '" + name + "'");
    c.barrier();
    c.barrier();
    // Every rank's index, gathered: 0, 1, ..., size-1.
    const std::int32_t me = c.rank();
    std::vector<std::int32_t> all(static_cast<std::size_t>(c.size()), -1), want(all.size());
    c.allgather(&me, all.data(), 1);
    std::iota(want.begin(), want.end(), 0);
    k.equal("allgather of the ranks", all, want);
  });
}

TEST_CASE("A communicator's broadcast copies the root's elements to every rank", "[comm]") {
  on_every_world([]<loom::communicator C>(C& c, checker& k) {
    for_types<float, double, std::int32_t, std::int64_t, std::uint64_t, char>([&]<class T>(std::type_identity<T>) {
      for (const std::size_t n : sizes) {
        for (const int root : {0, c.size() - 1, c.size() / 2}) {
          auto data = values<T>(c.rank(), n, 1);
          c.broadcast(data.data(), n, root);
          k.equal(at("broadcast of " + type_name<T>() + " from root " + std::to_string(root), n), data,
                  values<T>(root, n, 1));
        }
      }
    });
  });
}

TEST_CASE("A communicator's allreduce sums and takes maxima as a serial loop over the ranks does", "[comm]") {
  on_every_world([]<loom::communicator C>(C& c, checker& k) {
    for_types<float, double, std::int32_t, std::int64_t, std::uint64_t>([&]<class T>(std::type_identity<T>) {
      for (const reduce_op op : {reduce_op::sum, reduce_op::max}) {
        for (const std::size_t n : sizes) {
          auto data = values<T>(c.rank(), n);
          c.allreduce(data.data(), n, op);
          auto want = values<T>(0, n);
          for (int r = 1; r < c.size(); ++r)
            for (std::size_t i = 0; i < n; ++i) want[i] = reduce(want[i], value<T>(r, i), op);
          k.equal(at(std::string("allreduce ") + loom::to_string(op) + " of " + type_name<T>(), n), data, want);
        }
      }
    });
  });
}

TEST_CASE("A communicator sums 16-bit floats (bf16, fp16) in float at every step, blocking and not", "[comm]") {
  on_every_world([]<loom::communicator C>(C& c, checker& k) {
    for_types<loom::bf16, loom::fp16>([&]<class H>(std::type_identity<H>) {
      for (const std::size_t n : sizes) {
        // Small integers and halves: every partial sum is exact in 16 bits, so any order of the
        // reduction gives the serial sum exactly.
        auto v = [](int r, std::size_t i) { return static_cast<float>(static_cast<int>((i * 7 + static_cast<std::size_t>(r) * 3) % 9) - 4) * 0.5f; };
        std::vector<H> data(n), other(n);
        for (std::size_t i = 0; i < n; ++i) data[i] = other[i] = H::from_float(v(c.rank(), i));
        c.allreduce(data.data(), n, reduce_op::sum);
        auto r = c.iallreduce(other.data(), n, reduce_op::sum);
        r.wait();
        std::vector<float> got(n), got_nb(n), want(n, 0.0f);
        for (std::size_t i = 0; i < n; ++i) {
          got[i] = data[i].to_float();
          got_nb[i] = other[i].to_float();
          for (int q = 0; q < c.size(); ++q) want[i] += v(q, i);
        }
        k.equal(at(std::string("allreduce of ") + H::name, n), got, want);
        k.equal(at(std::string("iallreduce of ") + H::name, n), got_nb, want);
      }
      // A sum rounded to 16 bits once per step, not once in all: 1 + 2^-9 on every rank.
      // bf16 (8 significant bits) cannot hold 1 + 2^-9, so each rank's value is 1; fp16 (11) can.
      H one = H::from_float(1.0f + 1.0f / 512.0f);
      c.allreduce(&one, 1, reduce_op::sum);
      const float per_rank = H::from_float(1.0f + 1.0f / 512.0f).to_float();
      const float exact = per_rank * static_cast<float>(c.size());
      k.expect(std::abs(one.to_float() - exact) <= exact * (std::is_same_v<H, loom::bf16> ? 1.0f / 128 : 1.0f / 1024),
               std::string(H::name) + ": the sum of " + std::to_string(c.size()) + " ranks' " + std::to_string(per_rank) +
                   " is " + std::to_string(one.to_float()));
    });
  });
}

TEST_CASE("A communicator's reduce_scatter gives each rank the reduction of its own block", "[comm]") {
  on_every_world([]<loom::communicator C>(C& c, checker& k) {
    const auto ranks = static_cast<std::size_t>(c.size());
    const auto me = static_cast<std::size_t>(c.rank());
    for_types<float, double, std::int64_t>([&]<class T>(std::type_identity<T>) {
      for (const reduce_op op : {reduce_op::sum, reduce_op::max}) {
        for (const std::size_t n : sizes) {
          // Rank r's input: size() blocks of n, element j of the whole being value(r, j).
          const auto in = values<T>(c.rank(), ranks * n, 2);
          std::vector<T> out(n, T(7));
          c.reduce_scatter(in.data(), out.data(), n, op);
          std::vector<T> want(n);
          for (std::size_t i = 0; i < n; ++i) {
            T acc = value<T>(0, me * n + i, 2);
            for (int r = 1; r < c.size(); ++r) acc = reduce(acc, value<T>(r, me * n + i, 2), op);
            want[i] = acc;
          }
          k.equal(at(std::string("reduce_scatter ") + loom::to_string(op) + " of " + type_name<T>(), n), out, want);
        }
      }
    });
  });
}

TEST_CASE("ZeRO's collectives: reduce-scatter and in-place allgather of blocks of different sizes", "[comm]") {
  on_every_world([]<loom::communicator C>(C& c, checker& k) {
    if constexpr (requires(float* p, const std::size_t* n) { c.iallgather_v(p, n); }) {
      const auto ranks = static_cast<std::size_t>(c.size());
      const auto me = static_cast<std::size_t>(c.rank());
      for (const std::size_t n : sizes) {
        // Block j of about n / ranks elements, rank 0's one more, the last empty when ranks > 1.
        std::vector<std::size_t> counts(ranks);
        for (std::size_t j = 0; j < ranks; ++j) counts[j] = j + 1 == ranks && ranks > 1 ? 0 : n / ranks + (j == 0);
        std::size_t total = 0, mine_at = 0;
        for (std::size_t j = 0; j < ranks; ++j) {
          if (j < me) mine_at += counts[j];
          total += counts[j];
        }
        // Every reducible type and op, non-blocking and blocking; sums combined in rank order.
        for_types<float, double, std::int64_t>([&]<class T>(std::type_identity<T>) {
          for (const reduce_op op : {reduce_op::sum, reduce_op::max}) {
            const auto in = values<T>(c.rank(), total, 2);
            std::vector<T> want(counts[me]);
            for (std::size_t i = 0; i < counts[me]; ++i) {
              T acc = value<T>(0, mine_at + i, 2);
              for (int r = 1; r < c.size(); ++r) acc = reduce(acc, value<T>(r, mine_at + i, 2), op);
              want[i] = acc;
            }
            const std::string what = std::string(" ") + loom::to_string(op) + " of " + type_name<T>();
            std::vector<T> out(std::max<std::size_t>(1, counts[me]), T(7));
            c.ireduce_scatter_v(in.data(), out.data(), counts.data(), op).wait();
            out.resize(counts[me]);
            k.equal(at("ireduce_scatter_v" + what, n), out, want);
            std::vector<T> blocking(std::max<std::size_t>(1, counts[me]), T(7));
            c.reduce_scatter_v(in.data(), blocking.data(), counts.data(), op);
            blocking.resize(counts[me]);
            k.equal(at("reduce_scatter_v" + what, n), blocking, want);
          }
        });
        // Two in flight at once, completed in the other order (test() polled on the second, as
        // data_parallel does with its buckets): each gets its own blocks.
        {
          const auto in1 = values<float>(c.rank(), total, 2), in2 = values<float>(c.rank(), total, 3);
          std::vector<float> out1(std::max<std::size_t>(1, counts[me])), out2(out1.size());
          auto r1 = c.ireduce_scatter_v(in1.data(), out1.data(), counts.data(), reduce_op::sum);
          auto r2 = c.ireduce_scatter_v(in2.data(), out2.data(), counts.data(), reduce_op::sum);
          while (!r2.test()) {
          }
          r1.wait();
          std::vector<float> want1(counts[me]), want2(counts[me]);
          for (std::size_t i = 0; i < counts[me]; ++i) {
            float a1 = value<float>(0, mine_at + i, 2), a2 = value<float>(0, mine_at + i, 3);
            for (int r = 1; r < c.size(); ++r) {
              a1 = reduce(a1, value<float>(r, mine_at + i, 2), reduce_op::sum);
              a2 = reduce(a2, value<float>(r, mine_at + i, 3), reduce_op::sum);
            }
            want1[i] = a1;
            want2[i] = a2;
          }
          out1.resize(counts[me]);
          out2.resize(counts[me]);
          k.equal(at("two ireduce_scatter_v in flight, the first", n), out1, want1);
          k.equal(at("two ireduce_scatter_v in flight, the second", n), out2, want2);
        }
        // In place: every rank's own block, the others' overwritten.
        std::vector<float> data(total, -1.0f), whole(total);
        for (std::size_t j = 0, at_j = 0; j < ranks; at_j += counts[j], ++j) {
          const auto block = values<float>(static_cast<int>(j), counts[j], 5);
          std::copy(block.begin(), block.end(), whole.begin() + static_cast<std::ptrdiff_t>(at_j));
          if (j == me) std::copy(block.begin(), block.end(), data.begin() + static_cast<std::ptrdiff_t>(at_j));
        }
        c.iallgather_v(data.data(), counts.data()).wait();
        k.equal(at("iallgather_v", n), data, whole);
      }
    }
  });
}

TEST_CASE("A communicator's allgather collects every rank's block in rank order", "[comm]") {
  on_every_world([]<loom::communicator C>(C& c, checker& k) {
    const auto ranks = static_cast<std::size_t>(c.size());
    for_types<float, std::int64_t, char>([&]<class T>(std::type_identity<T>) {
      for (const std::size_t n : sizes) {
        const auto in = values<T>(c.rank(), n, 3);
        std::vector<T> out(ranks * n, T(1));
        c.allgather(in.data(), out.data(), n);
        std::vector<T> want;
        want.reserve(ranks * n);
        for (int r = 0; r < c.size(); ++r) {
          const auto block = values<T>(r, n, 3);
          want.insert(want.end(), block.begin(), block.end());
        }
        k.equal(at("allgather of " + type_name<T>(), n), out, want);
      }
    });
  });
}

TEST_CASE("A communicator's send and recv pass messages around a ring, matched by tag and in order", "[comm]") {
  on_every_world([]<loom::communicator C>(C& c, checker& k) {
    const int next = (c.rank() + 1) % c.size(), prev = (c.rank() + c.size() - 1) % c.size();
    for_types<float, std::int64_t>([&]<class T>(std::type_identity<T>) {
      for (const std::size_t n : sizes) {
        // Blocking: even ranks send first, odd ranks receive first (a blocking send may wait
        // for its receiver); one rank sends to itself with isend.
        {
          const auto out = values<T>(c.rank(), n, 4);
          std::vector<T> in(n);
          if (c.size() == 1) {
            auto r = c.isend(out.data(), n, 0, 5);
            c.recv(in.data(), n, 0, 5);
            r.wait();
          } else if (c.rank() % 2 == 0) {
            c.send(out.data(), n, next, 5);
            c.recv(in.data(), n, prev, 5);
          } else {
            c.recv(in.data(), n, prev, 5);
            c.send(out.data(), n, next, 5);
          }
          k.equal(at("send/recv ring of " + type_name<T>(), n), in, values<T>(prev, n, 4));
        }
        // Non-blocking: tags 1 and 2 received in the opposite order to their sending, then two
        // messages with tag 3, which must arrive in the order they were sent.
        {
          const auto a1 = values<T>(c.rank(), n, 11), a2 = values<T>(c.rank(), n, 12);
          const auto a3 = values<T>(c.rank(), n, 13), a4 = values<T>(c.rank(), n, 14);
          std::vector<T> b1(n), b2(n), b3(n), b4(n);
          std::vector<typename C::request> rs;
          rs.push_back(c.irecv(b2.data(), n, prev, 2));
          rs.push_back(c.irecv(b1.data(), n, prev, 1));
          rs.push_back(c.irecv(b3.data(), n, prev, 3));
          rs.push_back(c.irecv(b4.data(), n, prev, 3));
          rs.push_back(c.isend(a1.data(), n, next, 1));
          rs.push_back(c.isend(a2.data(), n, next, 2));
          rs.push_back(c.isend(a3.data(), n, next, 3));
          rs.push_back(c.isend(a4.data(), n, next, 3));
          for (auto& r : rs) r.wait();
          k.equal(at("irecv with tag 1 of " + type_name<T>(), n), b1, values<T>(prev, n, 11));
          k.equal(at("irecv with tag 2 of " + type_name<T>(), n), b2, values<T>(prev, n, 12));
          k.equal(at("first irecv with tag 3 of " + type_name<T>(), n), b3, values<T>(prev, n, 13));
          k.equal(at("second irecv with tag 3 of " + type_name<T>(), n), b4, values<T>(prev, n, 14));
        }
      }
    });
  });
}

TEST_CASE("A communicator's iallreduce requests run together, complete in any order and report through test",
          "[comm]") {
  on_every_world([]<loom::communicator C>(C& c, checker& k) {
    auto reference = [&]<class T>(std::size_t n, int salt, reduce_op op, std::type_identity<T>) {
      auto want = values<T>(0, n, salt);
      for (int r = 1; r < c.size(); ++r)
        for (std::size_t i = 0; i < n; ++i) want[i] = reduce(want[i], value<T>(r, i, salt), op);
      return want;
    };
    for (const std::size_t n : sizes) {
      // Three at once, waited in the order they were started.
      auto f = values<float>(c.rank(), n, 5);
      auto d = values<double>(c.rank(), n, 6);
      auto l = values<std::int64_t>(c.rank(), n, 7);
      {
        auto rf = c.iallreduce(f.data(), n, reduce_op::sum);
        auto rd = c.iallreduce(d.data(), n, reduce_op::max);
        auto rl = c.iallreduce(l.data(), n, reduce_op::sum);
        rf.wait();
        rd.wait();
        rl.wait();
        rf.wait();  // waiting again on a completed request does nothing
        k.expect(rd.test(), "test() on a completed request is not true");
      }
      k.equal(at("iallreduce sum of float", n), f, reference(n, 5, reduce_op::sum, std::type_identity<float>{}));
      k.equal(at("iallreduce max of double", n), d, reference(n, 6, reduce_op::max, std::type_identity<double>{}));
      k.equal(at("iallreduce sum of int64", n), l, reference(n, 7, reduce_op::sum, std::type_identity<std::int64_t>{}));

      // Two at once, waited in the opposite order, one of them moved first.
      f = values<float>(c.rank(), n, 8);
      d = values<double>(c.rank(), n, 9);
      {
        auto rf = c.iallreduce(f.data(), n, reduce_op::max);
        typename C::request rd;
        rd = c.iallreduce(d.data(), n, reduce_op::sum);
        typename C::request moved(std::move(rd));
        moved.wait();
        rf.wait();
        rd.wait();  // moved from: nothing to wait for
      }
      k.equal(at("iallreduce max of float, waited second", n), f, reference(n, 8, reduce_op::max, std::type_identity<float>{}));
      k.equal(at("iallreduce sum of double, waited first", n), d, reference(n, 9, reduce_op::sum, std::type_identity<double>{}));

      // Polled with test() until it completes.
      f = values<float>(c.rank(), n, 10);
      auto r = c.iallreduce(f.data(), n, reduce_op::sum);
      std::size_t polls = 1;
      while (!r.test()) ++polls;
      k.equal(at("iallreduce sum of float polled " + std::to_string(polls) + " times", n), f,
              reference(n, 10, reduce_op::sum, std::type_identity<float>{}));
    }
    typename C::request none;
    none.wait();
    k.expect(none.test(), "test() on a default-constructed request is not true");
  });
}

TEST_CASE("A communicator splits by colour into groups ranked by key, each reducing on its own", "[comm]") {
  on_every_world([]<loom::communicator C>(C& c, checker& k) {
    const int colour = c.rank() % 2;
    // Key = -rank: ranked in reverse order of the parent's ranks.
    std::vector<std::int32_t> members;
    for (int r = c.size() - 1; r >= 0; --r)
      if (r % 2 == colour) members.push_back(r);
    C group = c.split(colour, -c.rank());
    const auto pos = std::find(members.begin(), members.end(), c.rank()) - members.begin();
    k.expect(group.size() == static_cast<int>(members.size()),
             "the group of colour " + std::to_string(colour) + " has size " + std::to_string(group.size()) +
                 ", not " + std::to_string(members.size()));
    k.expect(group.rank() == pos, "rank " + std::to_string(c.rank()) + " has rank " + std::to_string(group.rank()) +
                                      " in its group, not " + std::to_string(pos));
    if (group.size() != static_cast<int>(members.size())) return;

    // Ranked by key: gathering the parent ranks gives them in descending order.
    const std::int32_t me = c.rank();
    std::vector<std::int32_t> gathered(members.size());
    group.allgather(&me, gathered.data(), 1);
    k.equal("allgather of parent ranks in the group of colour " + std::to_string(colour), gathered, members);

    // An allreduce inside each group sees only that group's ranks.
    for (const std::size_t n : sizes) {
      auto data = values<double>(c.rank(), n, 15);
      group.allreduce(data.data(), n, reduce_op::sum);
      std::vector<double> want(n, 0.0);
      for (const auto r : members)
        for (std::size_t i = 0; i < n; ++i) want[i] += value<double>(r, i, 15);
      k.equal(at("allreduce in the group of colour " + std::to_string(colour), n), data, want);
    }

    // Groups of groups, and the parent is still whole.
    C single = group.split(group.rank(), 0);
    k.expect(single.size() == 1 && single.rank() == 0, "a split into singletons gives size " +
                                                            std::to_string(single.size()));
    std::int64_t one = 1;
    single.allreduce(&one, 1, reduce_op::sum);
    std::int64_t count = 1;
    c.allreduce(&count, 1, reduce_op::sum);
    k.expect(one == 1 && count == c.size(), "after splitting, the parent counts " + std::to_string(count) + " ranks");
  });
}

TEST_CASE("A communicator throws communication_error for an invalid peer, root or tag, and goes on working",
          "[comm]") {
  on_every_world([]<loom::communicator C>(C& c, checker& k) {
    std::vector<float> data(7, 1.0f);
    const int next = (c.rank() + 1) % c.size(), prev = (c.rank() + c.size() - 1) % c.size();
    const std::string me = "rank " + std::to_string(c.rank());
    k.throws("send to peer size()", [&] { c.send(data.data(), data.size(), c.size(), 0); }, {"send", me});
    k.throws("recv from peer -1", [&] { c.recv(data.data(), data.size(), -1, 0); }, {"recv", me});
    k.throws("isend to peer size() + 3", [&] { auto r = c.isend(data.data(), data.size(), c.size() + 3, 0); },
             {"send", me});
    k.throws("irecv with a negative tag", [&] { auto r = c.irecv(data.data(), data.size(), prev, -4); }, {"recv"});
    // Every rank names the same root outside the communicator.
    k.throws("broadcast from root size()", [&] { c.broadcast(data.data(), data.size(), c.size()); },
             {"broadcast", "root"});

    // A message of 7 elements received into 5: the receiver is told, the sender is not.
    std::vector<float> small(5);
    auto sent = c.isend(data.data(), data.size(), next, 9);
    k.throws("recv of 7 elements into 5", [&] { c.recv(small.data(), small.size(), prev, 9); }, {"recv"});
    sent.wait();

    // Still a working communicator.
    std::int64_t count = 1;
    c.allreduce(&count, 1, reduce_op::sum);
    k.expect(count == c.size(), "after the errors, allreduce counts " + std::to_string(count) + " ranks");
  });
}
