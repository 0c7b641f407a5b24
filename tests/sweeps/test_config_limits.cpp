// Sweep config bounds: integers never wrap (every integer key and list element is range-checked
// with file:line:col and the key), grids are counted before they are expanded, and the config
// and the files it names are read within a size limit.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "kvarn/data/error.hpp"
#include "kvarn/sweeps/config.hpp"
#include "kvarn/sweeps/config_keys.hpp"
#include "sweep_test_util.hpp"

namespace kvarn {
namespace {

using testing_util::sample_tiles;
using testing_util::TempDirTest;
using testing_util::write_file;
namespace fs = std::filesystem;

class ConfigLimitsTest : public TempDirTest {
 protected:
  std::string error_of(const std::string& yaml, const std::vector<std::string>& sets = {}) {
    return testing_util::config_error(dir_, yaml, sets);
  }
  std::string data() { return "data:\n  tiles: " + sample_tiles().string() + "\n"; }
  std::string base() { return "version: 1\nname: t\n" + data(); }
};

#define EXPECT_HAS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "in: " << (text)

TEST_F(ConfigLimitsTest, VersionDoesNotWrap) {
  // 2^32 + 1 read as int was 1: a valid version with the valid config's hash.
  EXPECT_HAS(error_of("version: 4294967297\nname: t\n" + data() + "methods: [fp16]\n"),
             "bad.yaml:1:10: key 'version': must be in [0, 2147483647], got 4294967297");
  EXPECT_HAS(error_of("version: 99999999999999999999\nname: t\n" + data() + "methods: [fp16]\n"),
             "bad.yaml:1:10: key 'version': must be in [0, 2147483647], got 99999999999999999999");
}

TEST_F(ConfigLimitsTest, DataIntegersDoNotWrap) {
  // max_tokens 2^32 was 0 (= every token); layers [2^32] was [0].
  EXPECT_HAS(error_of(base() + "  max_tokens: 4294967296\nmethods: [fp16]\n"),
             "bad.yaml:5:15: key 'data.max_tokens': must be in [0, 2147483647], got 4294967296");
  EXPECT_HAS(error_of(base() + "  layers: [4294967296]\nmethods: [fp16]\n"),
             "bad.yaml:5:12: key 'data.layers.0': must be in [0, 2147483647], got 4294967296");
  EXPECT_HAS(error_of(base() + "  sequences: 4294967296\nmethods: [fp16]\n"),
             "key 'data.sequences': must be in [0, 2147483647]");
  EXPECT_HAS(error_of(base() + "  kv_heads: [-1]\nmethods: [fp16]\n"),
             "key 'data.kv_heads.0': must be in [0, 2147483647], got -1");
}

TEST_F(ConfigLimitsTest, CaptureIntegersDoNotWrap) {
  // Keys are checked before the model is looked up, so a hub id is enough here.
  const std::string cap =
      "version: 1\nname: t\ndata:\n  capture:\n    model: Qwen/Qwen3-8B\n"
      "    prompts: p.jsonl\n";
  EXPECT_HAS(error_of(cap + "    max_tokens: 4294967296\nmethods: [fp16]\n"),
             "bad.yaml:7:17: key 'data.capture.max_tokens': must be in [0, 16777216], got "
             "4294967296");
  EXPECT_HAS(error_of(cap + "    generate: 4294967297\nmethods: [fp16]\n"),
             "key 'data.capture.generate': must be in [0, 4194304], got 4294967297");
  EXPECT_HAS(error_of(cap + "    layers: [0, 4294967296]\nmethods: [fp16]\n"),
             "bad.yaml:7:17: key 'data.capture.layers.1': must be in [0, 2147483647]");
}

TEST_F(ConfigLimitsTest, OtherIntegersDoNotWrap) {
  EXPECT_HAS(error_of(base() + "methods: [fp16]\nseed: 99999999999999999999\n"),
             "bad.yaml:6:7: key 'seed': must be in [0, 9223372036854775807]");
  EXPECT_HAS(error_of(base() + "methods: [fp16]\nmetrics: {topk: [1, 4294967297]}\n"),
             "key 'metrics.topk.1': must be in [1, 2147483647], got 4294967297");
  // A list index of --set that does not fit is an error, not an exception from std::stoul.
  EXPECT_HAS(error_of(base() + "methods: [fp16]\n", {"methods.99999999999999999999999=fp16"}),
             "out of range");
#if KVARN_HAVE_RUNNER
  EXPECT_HAS(error_of(base() + "methods: [fp16]\naccumulation:\n  enabled: true\n"
                               "  block: 4294967297\n"),
             "bad.yaml:8:10: key 'accumulation.block': must be in [1, 1048576], got 4294967297");
#endif
}

TEST_F(ConfigLimitsTest, GridIsCountedBeforeExpansion) {
  // 10 axes of 10 values: 10^10 combinations, refused at once with the number.
  std::string axes;
  for (int a = 0; a < 10; ++a) axes += ", a" + std::to_string(a) + ": [0,1,2,3,4,5,6,7,8,9]";
  const auto t0 = std::chrono::steady_clock::now();
  const std::string e =
      error_of(base() + "methods:\n  - fp16\n  - {grid: {family: kvarn" + axes + "}}\n");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_HAS(e,
             "bad.yaml:7:5: key 'methods.1.grid': the methods expand to 10000000000 "
             "combinations, above the limit of " +
                 std::to_string(kMaxMethodCombinations));
  EXPECT_LT(seconds, 10.0);  // nothing was expanded (expanding would not finish)
  // Axes whose product overflows 64 bits saturate instead of wrapping to a small count.
  std::string huge;
  for (int a = 0; a < 20; ++a) huge += ", a" + std::to_string(a) + ": [0,1,2,3,4,5,6,7,8,9]";
  EXPECT_HAS(error_of(base() + "methods:\n  - {grid: {family: kvarn" + huge + "}}\n"),
             "the methods expand to 9223372036854775807 combinations");
}

TEST_F(ConfigLimitsTest, GridsCountTogetherAndDeduplicate) {
  // 4 x 5000 x 5 = 100000 per grid: each at the limit alone, two together above it.
  std::string axis;
  for (int i = 0; i < 5000; ++i) {
    if (i) axis += ',';
    axis += std::to_string(i);
  }
  const std::string grid =
      "  - {grid: {family: kvarn, k: [2, 3, 4, 8], x: [" + axis + "], v: [2, 4, 8, 3, 5]}}\n";
  EXPECT_HAS(error_of(base() + "methods:\n" + grid + grid),
             "key 'methods.1.grid': the methods expand to 200000 combinations");
  // Duplicates within and across entries collapse onto the first occurrence.
  write_file(dir_ / "dup.yaml", base() +
                                    "methods:\n  - kvarn:k=4,v=2,g=128\n"
                                    "  - {grid: {family: kvarn, k: [4, 4], v: [2, 2], "
                                    "g: [128, 128]}}\n");
  const SweepConfig c = load_config(dir_ / "dup.yaml");
  ASSERT_EQ(c.cases.size(), 1u);
  EXPECT_EQ(c.cases[0].input, "kvarn:k=4,v=2,g=128");
}

TEST_F(ConfigLimitsTest, ConfigFilesAreReadWithinALimit) {
  // An endless stream and an oversized file are refused, not read whole.
  try {
    load_config("/dev/zero");
    ADD_FAILURE() << "/dev/zero loaded";
  } catch (const Error& e) {
    EXPECT_HAS(e.what(), "/dev/zero: config is larger than the limit of " +
                             std::to_string(kMaxConfigBytes) + " bytes");
  }
  write_file(dir_ / "big.yaml", base() + "methods: [fp16]\n" +
                                    std::string(static_cast<std::size_t>(kMaxConfigBytes), '#') +
                                    "\n");
  try {
    load_config(dir_ / "big.yaml");
    ADD_FAILURE() << "an oversized config loaded";
  } catch (const Error& e) {
    EXPECT_HAS(e.what(), "big.yaml: config is larger than the limit of");
  }
  // A file the config names (throughput results) is bounded the same way.
  EXPECT_HAS(error_of(base() + "methods: [fp16]\nthroughput: {results: /dev/zero}\n"),
             "bad.yaml:6:23: key 'throughput.results': /dev/zero: benchmark JSON is larger than "
             "the limit of");
}

}  // namespace
}  // namespace kvarn
