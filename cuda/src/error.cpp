#include "kvarn/cuda/error.hpp"

#include <cstdio>
#include <cstdlib>

namespace kvarn::cuda {

void report_cuda_error(cudaError_t err, const char* what, const char* file, int line) {
  std::fprintf(stderr, "%s:%d: %s: %s (%s)\n", file, line, what, cudaGetErrorName(err),
               cudaGetErrorString(err));
  std::abort();
}

void fail_unsupported(const char* what, long value, const char* file, int line) {
  std::fprintf(stderr, "%s:%d: kvarn_cuda: unsupported %s %ld\n", file, line, what, value);
  std::abort();
}

}  // namespace kvarn::cuda
