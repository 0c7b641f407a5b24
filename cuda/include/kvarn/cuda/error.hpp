// CUDA error reporting usable from .cpp and .cu files: every failure throws kvarn::Error.
#ifndef KVARN_CUDA_ERROR_HPP_
#define KVARN_CUDA_ERROR_HPP_

#include <cuda_runtime_api.h>

namespace kvarn::cuda {

// Throws kvarn::Error "file:line: what: cudaError (message)".
[[noreturn]] void report_cuda_error(cudaError_t err, const char* what, const char* file, int line);
[[noreturn]] void fail_unsupported(const char* what, long value, const char* file, int line);

// The current device (0 where it cannot be asked), for per-device caches.
int current_device();
// Multiprocessors of the current device (132 where it cannot be asked), cached per device.
int sm_count();
// Whether the current device launches thread-block clusters (sm_90+), cached per device.
bool cluster_launch_supported();

}  // namespace kvarn::cuda

#define KVARN_CUDA_CHECK(expr)                                                          \
  do {                                                                                  \
    cudaError_t kvarn_err_ = (expr);                                                    \
    if (kvarn_err_ != cudaSuccess)                                                      \
      ::kvarn::cuda::report_cuda_error(kvarn_err_, #expr, __FILE__, __LINE__);          \
  } while (0)

// After a kernel launch: the launch error, without synchronizing; `kernel` names it.
#define KVARN_CUDA_CHECK_LAUNCH(kernel)                                                  \
  do {                                                                                  \
    cudaError_t kvarn_err_ = cudaGetLastError();                                        \
    if (kvarn_err_ != cudaSuccess)                                                      \
      ::kvarn::cuda::report_cuda_error(kvarn_err_, "launch of " kernel, __FILE__, __LINE__); \
  } while (0)

#endif  // KVARN_CUDA_ERROR_HPP_
