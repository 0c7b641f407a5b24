// Shared helpers of the sweep tests: temp directories and small configs over the sample tiles.
#ifndef KVARN_TESTS_SWEEPS_SWEEP_TEST_UTIL_HPP_
#define KVARN_TESTS_SWEEPS_SWEEP_TEST_UTIL_HPP_

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "kvarn/data/error.hpp"
#include "kvarn/sweeps/config.hpp"
#include "temp_dir_test.hpp"

namespace kvarn::testing_util {

namespace fs = std::filesystem;

inline fs::path sample_tiles() {
  return fs::path(KVARN_SOURCE_DIR) / "data" / "tiles" / "sample.h5";
}

inline std::string slurp_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void write_file(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << text;
}

// The error message of loading `yaml` (written to dir/bad.yaml) with `sets`, or "" when it loads.
inline std::string config_error(const fs::path& dir, const std::string& yaml,
                                const std::vector<std::string>& sets = {}) {
  write_file(dir / "bad.yaml", yaml);
  try {
    load_config(dir / "bad.yaml", sets);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A per-test scratch directory (removed afterwards) with a small sweep config builder.
class TempDirTest : public kvarn::testing::TempDirTest {
 protected:
  // A small, fast config: `methods` is the YAML list body (one "  - x" per line).
  fs::path small_config(const std::string& methods, const std::string& extra = "",
                        const std::string& name = "small") {
    const fs::path p = dir_ / (name + ".yaml");
    write_file(p, "version: 1\nname: " + name + "\ndata:\n  tiles: " + sample_tiles().string() +
                      "\n  sequences: [0]\n  max_tokens: 160\nmethods:\n" + methods +
                      "metrics:\n  outlier_fractions: [1]\noutput: " + (dir_ / "runs").string() +
                      "\nreport: false\n" + extra);
    return p;
  }
};

}  // namespace kvarn::testing_util

#endif  // KVARN_TESTS_SWEEPS_SWEEP_TEST_UTIL_HPP_
