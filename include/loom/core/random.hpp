// SPDX-License-Identifier: Apache-2.0
#pragma once
// Counter-based random numbers: a value depends only on (seed, stream, index), never on the
// thread, the order of calls or how a buffer is split. That is what makes initialisation and
// dropout identical under every backend, thread count and (later) parallelism policy.

#include <cmath>
#include <cstdint>

#include "loom/core/config.hpp"

namespace loom {

/// SplitMix64's finaliser: a bijective 64-bit mixer with good avalanche.
LOOM_HD constexpr std::uint64_t mix64(std::uint64_t z) noexcept {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/// A 64-bit hash of (seed, stream, index).
LOOM_HD constexpr std::uint64_t counter_hash(std::uint64_t seed, std::uint64_t stream, std::uint64_t index) noexcept {
  return mix64(mix64(mix64(seed) ^ stream) + index);
}

/// Uniform in [0, 1) with 53 random bits.
LOOM_HD constexpr double uniform01(std::uint64_t bits) noexcept {
  return static_cast<double>(bits >> 11) * (1.0 / 9007199254740992.0);
}

/// Uniform in (0, 1] — safe for log().
LOOM_HD constexpr double uniform01_open_low(std::uint64_t bits) noexcept {
  return (static_cast<double>(bits >> 11) + 1.0) * (1.0 / 9007199254740992.0);
}

/// Standard normal sample for (seed, stream, index), by Box–Muller on two hashed uniforms.
LOOM_HD inline double normal_at(std::uint64_t seed, std::uint64_t stream, std::uint64_t index) noexcept {
  const double u1 = uniform01_open_low(counter_hash(seed, stream, 2 * index));
  const double u2 = uniform01(counter_hash(seed, stream, 2 * index + 1));
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

/// A small sequential generator (SplitMix64) for host-side shuffles.
class splitmix64 {
 public:
  constexpr explicit splitmix64(std::uint64_t seed) noexcept : state_(seed) {}
  constexpr std::uint64_t operator()() noexcept {
    state_ += 0x9e3779b97f4a7c15ULL;
    std::uint64_t z = state_;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  /// Uniform integer in [0, bound), bound > 0, without modulo bias (Lemire's method).
  constexpr std::uint64_t below(std::uint64_t bound) noexcept {
    while (true) {
      __extension__ const unsigned __int128 m = static_cast<unsigned __int128>((*this)()) * bound;
      const auto low = static_cast<std::uint64_t>(m);
      if (low >= bound || low >= (-bound) % bound) return static_cast<std::uint64_t>(m >> 64);
    }
  }

 private:
  std::uint64_t state_;
};

}  // namespace loom
