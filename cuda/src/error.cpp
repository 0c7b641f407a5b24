#include "kvarn/cuda/error.hpp"

#include "kvarn/data/error.hpp"

namespace kvarn::cuda {

void report_cuda_error(cudaError_t err, const char* what, const char* file, int line) {
  fail(file, ":", line, ": ", what, ": ", cudaGetErrorName(err), " (", cudaGetErrorString(err),
       ")");
}

void fail_unsupported(const char* what, long value, const char* file, int line) {
  fail(file, ":", line, ": kvarn_cuda: unsupported ", what, " ", value);
}

int current_device() {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return dev;
}

}  // namespace kvarn::cuda
