// SPDX-License-Identifier: Apache-2.0
// host_space's huge pages: a buffer of 1 MiB and more starts on 2 MiB and its mapping carries
// the kernel's huge-page advice (VmFlags "hg" in /proc/self/smaps: set by madvise whether or not
// huge pages were free to back it, so the check does not depend on fragmentation); smaller
// buffers keep 64-byte alignment and no advice; loom::host_memory() counts the bytes asked,
// not the rounding. With argument "off" (run under LOOM_HUGE_PAGES=0): no advice anywhere.
// Exit 0 passed, 1 failed, 77 skipped (a kernel without transparent huge pages).
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "loom/core/memory.hpp"

namespace {
int failures = 0;
void check(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "FAILED: %s\n", what.c_str());
    ++failures;
  }
}

/// The VmFlags of the mapping holding address p in /proc/self/smaps ("" where none holds it).
std::string vm_flags_of(const void* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  std::ifstream in("/proc/self/smaps");
  std::string line;
  bool inside = false;
  while (std::getline(in, line)) {
    unsigned long long lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-' && line.find(':') > line.find(' ')) {
      inside = a >= lo && a < hi;
      continue;
    }
    if (inside && line.rfind("VmFlags:", 0) == 0) return line.substr(8) + " ";
  }
  return "";
}
bool advised(const void* p) { return vm_flags_of(p).find(" hg ") != std::string::npos; }
}  // namespace

int main(int argc, char** argv) {
  const bool off = argc > 1 && std::string(argv[1]) == "off";
  if (!std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled")) {
    std::puts("skipped: this kernel has no transparent huge pages");
    return 77;
  }
  constexpr std::size_t mib = std::size_t{1} << 20;
  const std::size_t before = loom::host_memory().live_bytes;
  loom::buffer<float> small(mib / sizeof(float) - 16), exact(mib / sizeof(float)), large(3 * mib / sizeof(float) + 5);
  check(loom::host_memory().live_bytes - before == small.size() * 4 + exact.size() * 4 + large.size() * 4,
        "host_memory() counts the bytes asked for, not the rounding");
  for (const auto* b : {&small, &exact, &large}) {  // zero-filled and writable to their last value
    check(b->data()[0] == 0.0f && b->data()[b->size() - 1] == 0.0f, "a new buffer is zero-filled");
    const_cast<float*>(b->data())[b->size() - 1] = 1.0f;
  }
  const auto at = [](const loom::buffer<float>& b) { return reinterpret_cast<std::uintptr_t>(b.data()); };
  check(at(small) % 64 == 0 && at(exact) % 64 == 0 && at(large) % 64 == 0, "every buffer is 64-byte aligned");
  check(!vm_flags_of(large.data()).empty(), "/proc/self/smaps lists the mapping of a buffer");
  if (off) {
    check(!advised(exact.data()) && !advised(large.data()), "LOOM_HUGE_PAGES=0: no huge-page advice");
  } else {
    check(at(exact) % (2 * mib) == 0 && at(large) % (2 * mib) == 0, "buffers of 1 MiB and more start on 2 MiB");
    check(advised(exact.data()) && advised(large.data()) && advised(large.data() + large.size() - 1),
          "buffers of 1 MiB and more carry the huge-page advice, to their end");
    check(!advised(small.data()), "a buffer under 1 MiB carries no huge-page advice");
  }
  if (failures) return 1;
  std::printf("all checks passed (%s; 1 MiB buffer at %#llx, VmFlags%s)\n", off ? "LOOM_HUGE_PAGES=0" : "huge pages on",
              static_cast<unsigned long long>(at(exact)), vm_flags_of(exact.data()).c_str());
  return 0;
}
