// accumulation.current_token: parsed (exact | quantized | a list of both), recorded in the
// resolved config when not the default, and run once per policy with its own `data` label; every
// accumulation row carries its policy and the model-level effective bits.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "kvarn/data/error.hpp"
#include "kvarn/sweeps/config.hpp"
#include "kvarn/sweeps/engine.hpp"
#include "sweep_test_util.hpp"

namespace kvarn {
namespace {

using nlohmann::json;
using testing_util::slurp_file;
using testing_util::TempDirTest;
namespace fs = std::filesystem;

#if KVARN_HAVE_RUNNER

fs::path fixture_model() {
  return fs::path(KVARN_SOURCE_DIR) / "data" / "models" / "fixture-qwen3-h128";
}

class CurrentTokenSweep : public TempDirTest {
 protected:
  std::string block(const std::string& current_token) {
    return "accumulation:\n  enabled: true\n  model: " + fixture_model().string() +
           "\n  prompts: " + (fs::path(KVARN_SOURCE_DIR) / "data/prompts/mixed.jsonl").string() +
           "\n  block: 16\n  context: 48\n  decode_steps: 4\n  threads: 1\n" +
           "  modes: [pseudo_decode, teacher_forced]\n" + current_token;
  }
  std::string error_of(const std::string& current_token) {
    try {
      load_config(small_config("  - fp16\n", block(current_token), "bad"));
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
};

TEST_F(CurrentTokenSweep, ParsesAndRecordsThePolicies) {
  if (!fs::exists(fixture_model() / "model.safetensors")) GTEST_SKIP() << "fixture model absent";
  const SweepConfig def = load_config(small_config("  - fp16\n", block(""), "def"));
  EXPECT_EQ(def.accumulation.current_token, std::vector<std::string>{"exact"});
  EXPECT_FALSE(def.resolved["accumulation"].contains("current_token"));  // older hashes kept
  const SweepConfig one =
      load_config(small_config("  - fp16\n", block("  current_token: quantized\n"), "one"));
  EXPECT_EQ(one.accumulation.current_token, std::vector<std::string>{"quantized"});
  EXPECT_EQ(one.resolved["accumulation"]["current_token"], json::array({"quantized"}));
  EXPECT_NE(one.hash, def.hash);
  const SweepConfig both = load_config(
      small_config("  - fp16\n", block("  current_token: [exact, quantized]\n"), "both"));
  EXPECT_EQ(both.accumulation.current_token, (std::vector<std::string>{"exact", "quantized"}));

  const std::string bad = error_of("  current_token: cache\n");
  EXPECT_NE(bad.find("accumulation.current_token"), std::string::npos) << bad;
  EXPECT_NE(bad.find("expected exact or quantized"), std::string::npos) << bad;
  EXPECT_NE(error_of("  current_token: [exact, exact]\n").find("given twice"), std::string::npos);
  EXPECT_NE(error_of("  current_token: []\n").find("empty list"), std::string::npos);
}

TEST_F(CurrentTokenSweep, RunsEachPolicyWithItsLabelAndEffectiveBits) {
  if (!fs::exists(fixture_model() / "model.safetensors")) GTEST_SKIP() << "fixture model absent";
  const SweepConfig cfg = load_config(
      small_config("  - fp16\n  - fp8_e4m3\n", block("  current_token: [exact, quantized]\n")));
  std::FILE* devnull = std::fopen("/dev/null", "w");
  SweepOptions o;
  o.report = false;
  o.log = devnull;
  o.progress_tty = 0;
  const SweepResult r = run_sweep(cfg, o);
  std::fclose(devnull);
  ASSERT_EQ(r.finished, 2);
  // data label -> family -> final accumulated MAE (layer "all")
  std::map<std::string, std::map<std::string, double>> mae;
  int rows = 0;
  for (const auto& e : fs::directory_iterator(r.run_dir / "cases")) {
    const json rec = json::parse(slurp_file(e.path()));
    EXPECT_EQ(rec["accumulation"]["current_token"], json::array({"exact", "quantized"}));
    for (const json& row : rec["rows"]) {
      ASSERT_TRUE(row.contains("effective_bits")) << row.dump();
      if (row["scope"] != "accumulation") continue;
      ++rows;
      const std::string data = row["data"];
      EXPECT_EQ(row["current_token"],
                data.find("@quantized") == std::string::npos ? "exact" : "quantized");
      // fp8: 8 bits everywhere (no fp16 windows); fp16: 16.
      EXPECT_DOUBLE_EQ(row["effective_bits"].get<double>(), row["family"] == "fp16" ? 16.0 : 8.0);
      if (row["metric"] == "accumulation.mae_accumulated.final" && row["layer"] == "all")
        mae[data][row["family"]] = row["value"].get<double>();
    }
  }
  EXPECT_GT(rows, 0);
  ASSERT_TRUE(mae.count("fixture-qwen3-h128") && mae.count("fixture-qwen3-h128@quantized"));
  EXPECT_EQ(mae["fixture-qwen3-h128"]["fp16"], 0.0);
  EXPECT_EQ(mae["fixture-qwen3-h128@quantized"]["fp16"], 0.0);
  EXPECT_GT(mae["fixture-qwen3-h128"]["fp8"], 0.0);
  EXPECT_NE(mae["fixture-qwen3-h128"]["fp8"], mae["fixture-qwen3-h128@quantized"]["fp8"]);
}

#endif  // KVARN_HAVE_RUNNER

}  // namespace
}  // namespace kvarn
