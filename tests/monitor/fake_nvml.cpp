// SPDX-License-Identifier: Apache-2.0
/* A stand-in for NVML (libnvidia-ml.so.1) with the functions loom's sampler calls, declared as
 * NVML's header declares them, so that the dlopen path (monitor/sampler.hpp) runs on a machine
 * without a GPU: one device, PCI bus id 0000:3b:00.0, 1 GiB of 80 GiB in use, 42% busy. */
#include <cstring>

extern "C" {

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef void* nvmlDevice_t;

static int initialised;
static int device_tag;

int nvmlInit_v2(void) { initialised = 1; return 0; }
int nvmlShutdown(void) { initialised = 0; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t* device) {
  if (!initialised) return 1;           /* NVML_ERROR_UNINITIALIZED */
  if (index != 0) return 2;             /* NVML_ERROR_INVALID_ARGUMENT */
  *device = &device_tag;
  return 0;
}
int nvmlDeviceGetHandleByPciBusId_v2(const char* id, nvmlDevice_t* device) {
  if (!initialised) return 1;
  if (std::strcmp(id, "0000:3b:00.0") != 0) return 6; /* NVML_ERROR_NOT_FOUND */
  *device = &device_tag;
  return 0;
}
int nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t* m) {
  if (device != &device_tag) return 2;
  m->total = 80ull << 30;
  m->used = 1ull << 30;
  m->free = m->total - m->used;
  return 0;
}
int nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t* u) {
  if (device != &device_tag) return 2;
  u->gpu = 42;
  u->memory = 7;
  return 0;
}
}  // extern "C"
