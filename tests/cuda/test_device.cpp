// The device check every GPU test starts with: kvarn::cuda::device_count() agrees with the CUDA
// runtime, and KVARN_REQUIRE_GPU() reports a skip (with its message) exactly when there is no
// device, so a machine without a GPU shows SKIPPED rather than passes.
#include <gtest/gtest.h>

#include "cuda_test_util.hpp"

namespace kvarn {
namespace {

int runtime_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

void require_gpu() { KVARN_REQUIRE_GPU(); }

TEST(CudaDevice, SkipsVisiblyWithoutDevice) {
  const int n = runtime_device_count();
  EXPECT_EQ(cuda::device_count(), n);
  require_gpu();  // a skip here marks this test skipped; the checks below still run
  EXPECT_EQ(::testing::Test::IsSkipped(), n == 0)
      << "KVARN_REQUIRE_GPU must skip exactly when no device is visible (" << n << " devices)";
}

}  // namespace
}  // namespace kvarn
