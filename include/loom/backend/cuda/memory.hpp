// SPDX-License-Identifier: Apache-2.0
#pragma once
// GPU memory: loom::cuda_space (device memory through a caching allocator) and
// loom::pinned_space (page-locked host memory, for staging copies). cudaMalloc and cudaFree
// synchronise the whole device, so freed blocks are kept in free lists by size class and handed
// out again; never managed memory. Host code only (no nvcc needed).

#include <cuda_runtime_api.h>

#include <bit>
#include <cstddef>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "loom/backend/cuda/check.hpp"
#include "loom/backend/cuda/runtime.hpp"

namespace loom {

/// What the caching allocator has done so far (for tests and tuning).
struct cuda_allocator_stats {
  std::size_t device_allocations = 0;  ///< cudaMalloc calls
  std::size_t reuses = 0;              ///< allocations served from a free list
  std::size_t bytes_in_use = 0;        ///< bytes of blocks handed out and not yet freed
  std::size_t bytes_cached = 0;        ///< bytes of freed blocks kept for reuse
};

namespace detail {

/// A device allocator that keeps freed blocks. A block is reused only on the device and the
/// stream it was allocated for (the calling thread's compute stream), so work queued on that
/// stream with the old owner runs before work with the new one, without synchronising. Sizes
/// are rounded up to classes 4 per power of two (at most 25% larger), at least 512 bytes.
/// When cudaMalloc runs out of memory, the cached blocks are released (after waiting for the
/// device) and it is tried once more. Thread safe. It lives for the whole process and is never
/// destroyed: freeing device memory while the CUDA runtime shuts down fails.
class cuda_caching_allocator {
 public:
  static cuda_caching_allocator& instance() {
    static cuda_caching_allocator* a = new cuda_caching_allocator;  // never destroyed, see above
    return *a;
  }

  /// The size class `bytes` is served from.
  static constexpr std::size_t size_class(std::size_t bytes) noexcept {
    if (bytes <= 512) return 512;
    const std::size_t top = std::bit_floor(bytes - 1);  // bytes - 1 in [top, 2 top)
    const std::size_t step = top / 4;
    return (bytes + step - 1) / step * step;
  }

  /// A block of at least `bytes` bytes of device memory on the current device, 256-byte aligned.
  /// Throws: std::bad_alloc when the device has no room even after releasing cached blocks;
  /// loom::backend_error for other CUDA failures (no device).
  void* allocate(std::size_t bytes) {
    if (bytes == 0) return nullptr;
    const std::size_t size = size_class(bytes);
    const int device = cuda_current_device();
    cudaStream_t stream = cuda_compute_stream();
    {
      std::lock_guard<std::mutex> lock(m_);
      auto it = free_.find(key{device, stream, size});
      if (it != free_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        live_[p] = block{size, device, stream};
        ++stats_.reuses;
        stats_.bytes_cached -= size;
        stats_.bytes_in_use += size;
        return p;
      }
    }
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, size);
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      release_cached();
      e = cudaMalloc(&p, size);
    }
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      throw std::bad_alloc();
    }
    LOOM_CUDA_CHECK(e);
    std::lock_guard<std::mutex> lock(m_);
    live_[p] = block{size, device, stream};
    ++stats_.device_allocations;
    stats_.bytes_in_use += size;
    return p;
  }

  /// Returns p to its free list (p from allocate, or null).
  void deallocate(void* p) noexcept {
    if (!p) return;
    std::lock_guard<std::mutex> lock(m_);
    auto it = live_.find(p);
    if (it == live_.end()) return;  // not ours: ignore rather than corrupt the lists
    const block b = it->second;
    live_.erase(it);
    try {
      free_[key{b.device, b.stream, b.size}].push_back(p);
    } catch (...) {  // no memory for the list: give the block back to CUDA instead
      (void)cudaFree(p);
      stats_.bytes_in_use -= b.size;
      return;
    }
    stats_.bytes_in_use -= b.size;
    stats_.bytes_cached += b.size;
  }

  /// Frees every cached block (cudaFree, after waiting for the devices' queued work).
  void release_cached() {
    std::lock_guard<std::mutex> lock(m_);
    int current = 0;
    (void)cudaGetDevice(&current);
    for (auto& [k, blocks] : free_) {
      if (blocks.empty()) continue;
      (void)cudaSetDevice(k.device);
      (void)cudaDeviceSynchronize();
      for (void* p : blocks) {
        (void)cudaFree(p);
        stats_.bytes_cached -= k.size;
      }
      blocks.clear();
    }
    (void)cudaSetDevice(current);
  }

  cuda_allocator_stats stats() const {
    std::lock_guard<std::mutex> lock(m_);
    return stats_;
  }

 private:
  struct key {
    int device;
    cudaStream_t stream;
    std::size_t size;
    bool operator<(const key& o) const noexcept {
      return std::tie(device, stream, size) < std::tie(o.device, o.stream, o.size);
    }
  };
  struct block {
    std::size_t size;
    int device;
    cudaStream_t stream;
  };

  cuda_caching_allocator() = default;

  mutable std::mutex m_;
  std::map<key, std::vector<void*>> free_;
  std::unordered_map<void*, block> live_;
  cuda_allocator_stats stats_;
};

}  // namespace detail

/// Device memory of the calling thread's current GPU, from loom's caching allocator. Not
/// readable by the host: copy with copy_to_host / copy_from_host (or loom::cuda::copy).
struct cuda_space {
  static constexpr const char* name = "cuda";
  static constexpr bool host_accessible = false;
  static constexpr std::size_t alignment = 256;
  static void* allocate(std::size_t bytes) { return detail::cuda_caching_allocator::instance().allocate(bytes); }
  static void deallocate(void* p, std::size_t) noexcept { detail::cuda_caching_allocator::instance().deallocate(p); }
  /// Zeroes on the compute stream (ordered with the thread's other work; does not block).
  static void zero(void* p, std::size_t bytes) {
    if (bytes) LOOM_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, cuda_compute_stream()));
  }
  /// Copies bytes from device memory to the host, after the work queued before it; blocks.
  static void copy_to_host(void* host, const void* device, std::size_t bytes) {
    if (!bytes) return;
    cudaStream_t s = cuda_compute_stream();
    LOOM_CUDA_CHECK(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, s));
    LOOM_CUDA_CHECK(cudaStreamSynchronize(s));
  }
  /// Copies bytes from the host to device memory, ordered on the compute stream; returns once
  /// the host memory may be reused.
  static void copy_from_host(void* device, const void* host, std::size_t bytes) {
    if (!bytes) return;
    cudaStream_t s = cuda_compute_stream();
    LOOM_CUDA_CHECK(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, s));
    LOOM_CUDA_CHECK(cudaStreamSynchronize(s));
  }
  /// What the caching allocator has done so far.
  static cuda_allocator_stats allocator_stats() { return detail::cuda_caching_allocator::instance().stats(); }
  /// Frees the blocks the allocator keeps for reuse.
  static void release_cached() { detail::cuda_caching_allocator::instance().release_cached(); }
};

/// Page-locked host memory (cudaMallocHost): host-readable, and the source or target of
/// asynchronous copies to and from the GPU. For staging buffers that live long.
struct pinned_space {
  static constexpr const char* name = "pinned";
  static constexpr bool host_accessible = true;
  static constexpr std::size_t alignment = 256;
  static void* allocate(std::size_t bytes) {
    if (bytes == 0) return nullptr;
    void* p = nullptr;
    const cudaError_t e = cudaMallocHost(&p, bytes);
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      throw std::bad_alloc();
    }
    LOOM_CUDA_CHECK(e);
    return p;
  }
  static void deallocate(void* p, std::size_t) noexcept {
    if (p) (void)cudaFreeHost(p);
  }
  static void zero(void* p, std::size_t bytes) {
    if (bytes) std::memset(p, 0, bytes);
  }
};

}  // namespace loom
