// SPDX-License-Identifier: Apache-2.0
#pragma once
// LOOM_CUDA_CHECK: every CUDA runtime, cuBLAS and cuDNN call loom makes goes through it, and a
// failure becomes a loom::backend_error naming the call, the file and line, and the library's
// own text for the status. Host code only; compiles with any C++ compiler (nvcc not needed).

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <string>

#include "loom/core/error.hpp"

namespace loom::detail {

[[noreturn]] inline void throw_cuda_failure(const char* library, const std::string& status, const char* call,
                                            const char* file, int line) {
  throw backend_error(std::string("loom: ") + library + " call " + call + " failed at " + file + ":" +
                      std::to_string(line) + ": " + status);
}

inline void check_call(cudaError_t e, const char* call, const char* file, int line) {
  if (e == cudaSuccess) return;
  (void)cudaGetLastError();  // clear a non-sticky error so that the next call does not report it again
  throw_cuda_failure("CUDA", std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e), call, file, line);
}
inline void check_call(cublasStatus_t s, const char* call, const char* file, int line) {
  if (s != CUBLAS_STATUS_SUCCESS) throw_cuda_failure("cuBLAS", std::string(cublasGetStatusName(s)) + ": " + cublasGetStatusString(s), call, file, line);
}
inline void check_call(cudnnStatus_t s, const char* call, const char* file, int line) {
  if (s != CUDNN_STATUS_SUCCESS) throw_cuda_failure("cuDNN", cudnnGetErrorString(s), call, file, line);
}

}  // namespace loom::detail

/// Runs a CUDA runtime, cuBLAS or cuDNN call; throws loom::backend_error naming the call, this
/// file and line, and the status, when it does not return success.
#define LOOM_CUDA_CHECK(call) ::loom::detail::check_call((call), #call, __FILE__, __LINE__)
