// Loading a model on CUDA in a test: a skip only when the machine has no CUDA device, a failure for
// any other load error (a broken checkpoint, a torch/CUDA mismatch, an out-of-memory).
#ifndef KVARN_TESTS_EVAL_RUNNER_CUDA_LOAD_HPP_
#define KVARN_TESTS_EVAL_RUNNER_CUDA_LOAD_HPP_

#include <gtest/gtest.h>

#include <exception>
#include <filesystem>
#include <memory>
#include <string>

#include "kvarn/runner/model.hpp"

namespace kvarn::test {

// Model::load's message when torch sees no CUDA device (eval/runner/model.cpp).
inline constexpr const char* kNoCudaDevice = "no CUDA device is available";

// The model at `dir` on CUDA in fp32. Null in two cases: no CUDA device (*no_device says so), or
// another load error, which is recorded as a test failure (*no_device stays empty).
inline std::unique_ptr<Model> load_on_cuda(const std::filesystem::path& dir,
                                           std::string* no_device) {
  no_device->clear();
  try {
    return Model::load(dir, LoadOptions{"cuda", "float32", 0});
  } catch (const std::exception& e) {
    if (std::string(e.what()).find(kNoCudaDevice) != std::string::npos) {
      *no_device = e.what();
    } else {
      ADD_FAILURE() << "loading " << dir << " on CUDA failed: " << e.what();
    }
    return nullptr;
  }
}

}  // namespace kvarn::test

// Declares `var`, the model at `dir` on CUDA; skips the test visibly without a CUDA device and
// ends it (failed) on any other load error. For TEST bodies only.
#define KVARN_CUDA_MODEL_OR_SKIP(var, dir)                               \
  std::string var##_no_device;                                           \
  const auto var = ::kvarn::test::load_on_cuda((dir), &var##_no_device); \
  if (var == nullptr) {                                                  \
    if (!var##_no_device.empty()) GTEST_SKIP() << var##_no_device;       \
    return;                                                              \
  }

#endif  // KVARN_TESTS_EVAL_RUNNER_CUDA_LOAD_HPP_
