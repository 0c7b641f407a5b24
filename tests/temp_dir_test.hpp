// A per-test scratch directory for tests that write files; gtest and the standard library only,
// so every test area (data included) can use it.
#ifndef KVARN_TESTS_TEMP_DIR_TEST_HPP_
#define KVARN_TESTS_TEMP_DIR_TEST_HPP_

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <system_error>

namespace kvarn::testing {

// A fresh, empty directory for the running test: unique per process, suite and test
// (parameterised names' '/' flattened).
inline std::filesystem::path make_test_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = std::string("kvarn_") + std::to_string(::getpid()) + "_" +
                     info->test_suite_name() + "_" + info->name();
  std::replace(name.begin(), name.end(), '/', '_');
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// Fixture: `dir_` is the test's scratch directory, created before the body, removed after it.
class TempDirTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = make_test_dir(); }
  void TearDown() override {
    std::error_code ec;  // best effort: a failed test must not also fail its clean-up
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
  }

  std::filesystem::path dir_;
};

}  // namespace kvarn::testing

#endif  // KVARN_TESTS_TEMP_DIR_TEST_HPP_
