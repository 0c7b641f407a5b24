#include "kvarn/cuda/error.hpp"

#include <map>

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

// Multiprocessors of the current device (132 where it cannot be asked), per device.
int sm_count() {
  static thread_local std::map<int, int> per_device;
  const int dev = current_device();
  auto it = per_device.find(dev);
  if (it == per_device.end()) {
    int n = 132;
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
      (void)cudaGetLastError();
      n = 132;
    }
    it = per_device.emplace(dev, n).first;
  }
  return it->second;
}

}  // namespace kvarn::cuda
