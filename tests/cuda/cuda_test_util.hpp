// Test helpers: device buffers, skip when no device.
#ifndef KVARN_TESTS_CUDA_UTIL_HPP_
#define KVARN_TESTS_CUDA_UTIL_HPP_

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "kvarn/cuda/api.hpp"

#define KVARN_REQUIRE_GPU()                                           \
  do {                                                                \
    if (::kvarn::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device"; \
  } while (0)

template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t n) : n_(n) {
    if (n) KVARN_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p_), n * sizeof(T)));
  }
  explicit DeviceBuffer(const std::vector<T>& h) : DeviceBuffer(h.size()) { upload(h); }
  ~DeviceBuffer() {
    if (p_) cudaFree(p_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void upload(const std::vector<T>& h) {
    if (n_) KVARN_CUDA_CHECK(cudaMemcpy(p_, h.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> h(n_);
    if (n_) KVARN_CUDA_CHECK(cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  void fill_bytes(int byte) {
    if (n_) KVARN_CUDA_CHECK(cudaMemset(p_, byte, n_ * sizeof(T)));
  }
  T* get() const { return p_; }
  std::size_t size() const { return n_; }

 private:
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

#endif  // KVARN_TESTS_CUDA_UTIL_HPP_
