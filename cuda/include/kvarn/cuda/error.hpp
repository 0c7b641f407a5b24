// CUDA error reporting usable from .cpp and .cu files.
#ifndef KVARN_CUDA_ERROR_HPP_
#define KVARN_CUDA_ERROR_HPP_

#include <cuda_runtime_api.h>

namespace kvarn::cuda {

// Prints "file:line: what: cudaError (message)" to stderr and aborts.
[[noreturn]] void report_cuda_error(cudaError_t err, const char* what, const char* file, int line);
[[noreturn]] void fail_unsupported(const char* what, long value, const char* file, int line);

}  // namespace kvarn::cuda

#define KVARN_CUDA_CHECK(expr)                                                          \
  do {                                                                                  \
    cudaError_t kvarn_err_ = (expr);                                                    \
    if (kvarn_err_ != cudaSuccess)                                                      \
      ::kvarn::cuda::report_cuda_error(kvarn_err_, #expr, __FILE__, __LINE__);          \
  } while (0)

// After a kernel launch: the launch error, without synchronizing.
#define KVARN_CUDA_CHECK_LAUNCH() KVARN_CUDA_CHECK(cudaGetLastError())

#endif  // KVARN_CUDA_ERROR_HPP_
