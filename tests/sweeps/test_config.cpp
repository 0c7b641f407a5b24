// Sweep config parsing: case resolution, overrides, and file:line:col errors for bad configs.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "kvarn/data/error.hpp"
#include "kvarn/data/tile_file.hpp"
#include "kvarn/sweeps/config.hpp"
#include "kvarn/sweeps/estimate.hpp"
#include "kvarn/sweeps/provenance.hpp"
#include "sweep_test_util.hpp"

namespace kvarn {
namespace {

using testing_util::sample_tiles;
using testing_util::TempDirTest;
namespace fs = std::filesystem;
using testing_util::write_file;

class ConfigTest : public TempDirTest {
 protected:
  // The error message of loading `yaml` (written to dir_/bad.yaml), or "" when it loads.
  std::string error_of(const std::string& yaml, const std::vector<std::string>& sets = {}) {
    return testing_util::config_error(dir_, yaml, sets);
  }
  std::string base() {
    return "version: 1\nname: t\ndata:\n  tiles: " + sample_tiles().string() + "\n";
  }
};

TEST(Sha256, KnownVectors) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  // Crosses the 55/56/64-byte padding boundaries.
  EXPECT_EQ(sha256_hex(std::string(1000000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST_F(ConfigTest, QuickstartResolvesEveryPreset) {
  const SweepConfig c = load_config(fs::path(KVARN_SOURCE_DIR) / "configs" / "quickstart.yaml");
  ASSERT_EQ(c.cases.size(), 9u);
  std::set<std::string> ids, specs;
  for (const CaseSpec& cs : c.cases) {
    ids.insert(cs.id);
    specs.insert(cs.spec);
    EXPECT_EQ(cs.id.substr(0, 5), "c00" + std::to_string(cs.index) + "-");
  }
  EXPECT_EQ(ids.size(), 9u);
  EXPECT_EQ(specs.size(), 9u);
  EXPECT_EQ(c.cases[0].name, "fp16");
  EXPECT_EQ(c.cases[7].name, "kvarn_k4v2_g128");
  EXPECT_EQ(c.hash.size(), 64u);
  // Same file, same hash; an override of an unhashed key (output) keeps it.
  const SweepConfig again = load_config(fs::path(KVARN_SOURCE_DIR) / "configs" / "quickstart.yaml",
                                        {"output=/tmp/elsewhere", "report=false"});
  EXPECT_EQ(again.hash, c.hash);
  EXPECT_EQ(again.output, "/tmp/elsewhere");
  EXPECT_FALSE(again.report);
}

TEST_F(ConfigTest, GridIsCartesianDeduplicatedAndOrdered) {
  write_file(dir_ / "g.yaml", base() +
                                  "methods:\n  - kvarn_k4v2_g128\n"
                                  "  - {grid: {family: kvarn, k: [4], v: [2, 4], g: [64, 128]}}\n");
  const SweepConfig c = load_config(dir_ / "g.yaml");
  // k4v2_g128 appears both plainly and in the grid: kept once, at its first position.
  ASSERT_EQ(c.cases.size(), 4u);
  EXPECT_EQ(c.cases[0].input, "kvarn_k4v2_g128");
  EXPECT_EQ(c.cases[1].input, "kvarn:k=4,v=2,g=64");
  EXPECT_EQ(c.cases[2].input, "kvarn:k=4,v=4,g=64");
  EXPECT_EQ(c.cases[3].input, "kvarn:k=4,v=4,g=128");
}

TEST_F(ConfigTest, SetOverridesBeforeValidation) {
  write_file(dir_ / "s.yaml", base() + "methods: [fp16, kivi_2bit]\n");
  const SweepConfig c =
      load_config(dir_ / "s.yaml", {"methods.0=fp8_e4m3", "data.max_tokens=64", "methods.2=fp16",
                                    "metrics.outlier_fractions=[0.5]"});
  ASSERT_EQ(c.cases.size(), 3u);
  EXPECT_EQ(c.cases[0].name, "fp8_e4m3");
  EXPECT_EQ(c.cases[2].name, "fp16");
  EXPECT_EQ(c.data.max_tokens, 64);
  EXPECT_EQ(c.metrics.outlier_percents, std::vector<double>{0.5});
  const std::string e = error_of(base() + "methods: [fp16]\n", {"metrics.atention=true"});
  EXPECT_NE(e.find("key 'metrics.atention' (from --set): unknown key (nearest: attention)"),
            std::string::npos)
      << e;
  EXPECT_NE(error_of(base() + "methods: [fp16]\n", {"methods.5=fp16"}).find("out of range"),
            std::string::npos);
}

TEST_F(ConfigTest, UnknownKeyNamesLineColumnAndNearest) {
  const std::string e =
      error_of(base() + "methods: [fp16]\nmetrics:\n  reconstruction: true\n  atention: true\n");
  EXPECT_NE(e.find("bad.yaml:8:3: key 'metrics.atention': unknown key (nearest: attention"),
            std::string::npos)
      << e;
  const std::string top = error_of(base() + "method: [fp16]\n");
  EXPECT_NE(top.find(":5:1: key 'method': unknown key (nearest: methods"), std::string::npos)
      << top;
}

TEST_F(ConfigTest, BadTypesFilesGridsAndMethods) {
  EXPECT_NE(error_of(base() + "  max_tokens: lots\nmethods: [fp16]\n")
                .find(":5:15: key 'data.max_tokens': expected an integer"),
            std::string::npos);
  EXPECT_NE(error_of("version: 1\nname: t\ndata:\n  tiles: nowhere/x.h5\nmethods: [fp16]\n")
                .find(":4:10: key 'data.tiles': file not found: nowhere/x.h5"),
            std::string::npos);
  EXPECT_NE(error_of(base() + "methods:\n  - {grid: {family: kvarn, v: []}}\n")
                .find("key 'methods.0.grid.v': empty grid axis"),
            std::string::npos);
  const std::string m = error_of(base() + "methods:\n  - fp16\n  - kvarn_k4v2_g128x\n");
  EXPECT_NE(m.find(":7:5: key 'methods.1': "), std::string::npos) << m;
  EXPECT_NE(error_of(base() + "methods: []\n").find("empty list of methods"), std::string::npos);
  EXPECT_NE(error_of(base() + "  layers: [0, 7]\nmethods: [fp16]\n").find("out of range"),
            std::string::npos);
  EXPECT_NE(error_of(base() + "methods: [fp16]\nreport: maybe\n").find("expected true or false"),
            std::string::npos);
  EXPECT_NE(error_of("version: 2\nname: t\n").find("unsupported schema version 2"),
            std::string::npos);
  EXPECT_NE(error_of(base() + "methods: [fp16\n").find("YAML syntax error"), std::string::npos);
}

TEST_F(ConfigTest, CaptureNeedsFallbackAndAccumulationNeedsAModel) {
  const std::string cap =
      "version: 1\nname: t\ndata:\n  capture: {model: Qwen/Qwen3-8B, prompts: p.jsonl}\n"
      "methods: [fp16]\n";
  EXPECT_NE(error_of(cap).find("key 'data.capture.model': 'Qwen/Qwen3-8B' is not a local"),
            std::string::npos);
  write_file(dir_ / "fb.yaml",
             "version: 1\nname: aime\ndata:\n  capture: {model: Qwen/Qwen3-8B, prompts: p.jsonl}\n"
             "  fallback: {tiles: " +
                 sample_tiles().string() + ", max_tokens: 64}\nmethods: [fp16]\n");
  const SweepConfig c = load_config(dir_ / "fb.yaml");
  EXPECT_EQ(c.data.source, "fallback");
  EXPECT_EQ(c.data.max_tokens, 64);
  ASSERT_FALSE(c.notices.empty());
  EXPECT_NE(c.notices[0].find("aime: data.capture.model 'Qwen/Qwen3-8B' is not a local"),
            std::string::npos);
#if KVARN_HAVE_RUNNER
  // Enabled accumulation needs a model (test_accumulation_sweep.cpp checks the rest).
  EXPECT_NE(error_of(base() + "methods: [fp16]\naccumulation: {enabled: true}\n")
                .find(":6:15: key 'accumulation.model': missing"),
            std::string::npos);
#endif
}

TEST_F(ConfigTest, EstimateIsPositive) {
  const SweepConfig c = load_config(fs::path(KVARN_SOURCE_DIR) / "configs" / "quickstart.yaml");
  const SweepEstimate e = estimate_sweep(c);
  // Expected from the tile files themselves: one slab per (sequence, captured layer, KV head).
  std::int64_t slabs = 0, tokens = 0;
  for (const auto& tiles : c.data.tiles) {
    const TileReader r(tiles.resolved);
    const std::int64_t per_seq =
        std::int64_t{r.info().num_captured_layers()} * r.info().num_kv_heads;
    for (int s = 0; s < r.num_sequences(); ++s) {
      slabs += per_seq;
      tokens += per_seq * r.sequence(s).num_tokens;
    }
  }
  EXPECT_GT(slabs, 0);
  EXPECT_EQ(e.slabs, slabs);
  EXPECT_EQ(e.tokens, tokens);
  EXPECT_GT(e.seconds, 0);
  EXPECT_GT(e.bytes, 0);
}

}  // namespace
}  // namespace kvarn
