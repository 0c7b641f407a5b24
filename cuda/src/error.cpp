#include "kvarn/cuda/error.hpp"

#include <map>
#include <utility>

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

namespace {
// An attribute of the current device (fallback where it cannot be asked), cached per device.
int device_attribute(cudaDeviceAttr attr, int fallback) {
  static thread_local std::map<std::pair<int, int>, int> cache;
  const std::pair<int, int> key{current_device(), static_cast<int>(attr)};
  auto it = cache.find(key);
  if (it == cache.end()) {
    int v = fallback;
    if (cudaDeviceGetAttribute(&v, attr, key.first) != cudaSuccess) {
      (void)cudaGetLastError();
      v = fallback;
    }
    it = cache.emplace(key, v).first;
  }
  return it->second;
}
}  // namespace

int sm_count() { return device_attribute(cudaDevAttrMultiProcessorCount, 132); }

bool cluster_launch_supported() { return device_attribute(cudaDevAttrClusterLaunch, 0) != 0; }

}  // namespace kvarn::cuda
