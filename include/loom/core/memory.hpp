// SPDX-License-Identifier: Apache-2.0
#pragma once
// Memory spaces and the owning, aligned buffer every tensor and flat parameter block sits in.
// Only the host space lives here; the CUDA space comes with the CUDA backend's own header.

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <new>
#include <type_traits>
#include <utility>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace loom {

/// What loom's host buffers (every loom::buffer in host_space: parameters, gradients, optimizer
/// state, activations, scratch) hold in this process: the bytes they asked for, now and at most
/// since the last reset_host_memory_peak(). Counted in host_space::allocate and deallocate, so
/// memory that oneDNN, MPI or the C++ library allocate on their own is not in it, nor a data
/// set. Process-wide: ranks run as threads of one process (loom::local_comm) add up. Buffers
/// let go of by buffer::abandon stay counted, as they stay allocated.
struct host_memory_usage {
  std::size_t live_bytes = 0;
  std::size_t peak_bytes = 0;
};

namespace detail {
inline std::atomic<std::size_t> host_live_bytes{0}, host_peak_bytes{0};
inline void count_host_allocation(std::size_t bytes) noexcept {
  const std::size_t now = host_live_bytes.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  std::size_t peak = host_peak_bytes.load(std::memory_order_relaxed);
  while (now > peak && !host_peak_bytes.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}
inline void count_host_release(std::size_t bytes) noexcept { host_live_bytes.fetch_sub(bytes, std::memory_order_relaxed); }
}  // namespace detail

/// The bytes loom's host buffers hold now and their peak (see host_memory_usage).
inline host_memory_usage host_memory() noexcept {
  return {detail::host_live_bytes.load(std::memory_order_relaxed), detail::host_peak_bytes.load(std::memory_order_relaxed)};
}
/// Starts a new peak from what is held now (e.g. before a fit whose peak is to be measured).
inline void reset_host_memory_peak() noexcept {
  detail::host_peak_bytes.store(detail::host_live_bytes.load(std::memory_order_relaxed), std::memory_order_relaxed);
}

namespace detail {
/// Whether host buffers of huge_page_bytes / 2 and more go on transparent huge pages: yes unless
/// the environment says LOOM_HUGE_PAGES=0 (read once).
inline bool host_huge_pages() noexcept {
  static const bool on = [] {
    const char* v = std::getenv("LOOM_HUGE_PAGES");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  return on;
}
}  // namespace detail

/// Ordinary host memory, 64-byte aligned so vector units and oneDNN get whole cache lines.
/// Buffers of 1 MiB and more (activations, their gradients and copies, large weights) start on
/// a 2 MiB boundary, take whole 2 MiB and are asked of Linux as transparent huge pages
/// (madvise MADV_HUGEPAGE; nothing changes where THP is "never"): loom's passes stream through
/// them at memory speed, and a 4 KiB page's TLB miss every 1,024 floats slowed a bf16 ResNet-20
/// step by about 10% here (993 -> 1,095 samples/s with them; benchmarks/README.md, `resnet`). PyTorch's CPU allocator does the same behind
/// THP_MEM_ALLOC_ENABLE=1. LOOM_HUGE_PAGES=0 turns it off (then only 64-byte alignment).
struct host_space {
  static constexpr const char* name = "host";
  /// Host code may read and write this memory directly (not so cuda_space).
  static constexpr bool host_accessible = true;
  static constexpr std::size_t alignment = 64;
  static constexpr std::size_t huge_page_bytes = std::size_t{2} << 20;
  static void* allocate(std::size_t bytes) {
    if (bytes == 0) return nullptr;
    const bool huge = bytes >= huge_page_bytes / 2 && detail::host_huge_pages();
    const std::size_t align = huge ? huge_page_bytes : alignment;
    const std::size_t rounded = (bytes + align - 1) / align * align;
    void* p = std::aligned_alloc(align, rounded);
    if (!p) throw std::bad_alloc();
#if defined(__linux__)
    if (huge) ::madvise(p, rounded, MADV_HUGEPAGE);  // advice only: its failure changes nothing
#endif
    detail::count_host_allocation(bytes);
    return p;
  }
  /// bytes: what allocate was asked for.
  static void deallocate(void* p, std::size_t bytes) noexcept {
    if (p) detail::count_host_release(bytes);
    std::free(p);
  }
  static void zero(void* p, std::size_t bytes) {
    if (bytes) std::memset(p, 0, bytes);
  }
};

/// An owning, contiguous, aligned array of T in memory space Space. Move-only.
template <class T, class Space = host_space>
class buffer {
  static_assert(std::is_trivially_copyable_v<T>, "loom::buffer holds trivially copyable scalars only");

 public:
  using value_type = T;
  using memory_space = Space;

  buffer() = default;
  /// Allocates n elements, zero-filled.
  explicit buffer(std::size_t n) : data_(static_cast<T*>(Space::allocate(n * sizeof(T)))), size_(n) {
    Space::zero(data_, n * sizeof(T));
  }
  buffer(buffer&& o) noexcept : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  buffer& operator=(buffer&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  buffer(const buffer&) = delete;
  buffer& operator=(const buffer&) = delete;
  ~buffer() { release(); }

  /// Grows to at least n elements (contents are not kept); never shrinks. The old memory is
  /// freed before the new is allocated, so growing never holds both. If the allocation throws,
  /// the buffer is left empty.
  void reserve_discard(std::size_t n) {
    if (n <= size_) return;
    release();
    *this = buffer(n);
  }

  T* data() noexcept { return data_; }
  const T* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  /// Lets go of the memory without freeing it (the buffer becomes empty): for memory that an
  /// abandoned communication may still write (a recovery from a failed rank), which must
  /// never be handed out again.
  void abandon() noexcept {
    data_ = nullptr;
    size_ = 0;
  }
  T& operator[](std::size_t i) noexcept { return data_[i]; }
  const T& operator[](std::size_t i) const noexcept { return data_[i]; }
  T* begin() noexcept { return data_; }
  T* end() noexcept { return data_ + size_; }
  const T* begin() const noexcept { return data_; }
  const T* end() const noexcept { return data_ + size_; }

 private:
  void release() noexcept {
    if (data_) Space::deallocate(data_, size_ * sizeof(T));
    data_ = nullptr;
    size_ = 0;
  }
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace loom
