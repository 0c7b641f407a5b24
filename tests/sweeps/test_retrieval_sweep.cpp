// A sweep with `retrieval:` enabled runs passkey and induction copy with each method in the loop
// (on the committed fixture model) and writes per-cell rows with binomial intervals and effective
// bits; the block is validated with file:line:col errors.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "kvarn/data/error.hpp"
#include "kvarn/sweeps/config.hpp"
#include "kvarn/sweeps/engine.hpp"
#include "kvarn/sweeps/store.hpp"
#include "sweep_test_util.hpp"

namespace kvarn {
namespace {

using nlohmann::json;
using testing_util::slurp_file;
using testing_util::TempDirTest;
namespace fs = std::filesystem;

class RetrievalSweep : public TempDirTest {
 protected:
  static std::string fixture() {
    return (fs::path(KVARN_SOURCE_DIR) / "data/models/fixture-qwen3-h128").string();
  }
  static std::string block(const std::string& passkey_extra = "",
                           const std::string& top_extra = "") {
    return "retrieval:\n  enabled: true\n  block: 32\n  threads: 1\n" + top_extra +
           "  passkey:\n    model: " + fixture() +
           "\n    filler: " + (fs::path(KVARN_SOURCE_DIR) / "data/prompts/heldout.jsonl").string() +
           "\n    lengths: [96, 160]\n    depths: [0, 1]\n    trials: 2\n    digits: 3\n"
           "    decode_steps: 4\n    chat: false\n" +
           passkey_extra + "  induction:\n    model: " + fixture() +
           "\n    spans: [8]\n    distances: [0, 40]\n    prefix: 4\n    trials: 2\n";
  }
  std::string error_of(const std::string& retrieval) {
    try {
      load_config(small_config("  - fp16\n", retrieval, "bad"));
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
};

#if KVARN_HAVE_RUNNER

TEST_F(RetrievalSweep, RunsCellsWithIntervalsAndEffectiveBits) {
  const SweepConfig cfg =
      load_config(small_config("  - fp16\n  - kivi:bits=2,group=8,residual=8\n", block()));
  ASSERT_TRUE(cfg.retrieval.enabled);
  EXPECT_EQ(cfg.resolved["retrieval"]["passkey"]["lengths"], json({96, 160}));
  std::FILE* devnull = std::fopen("/dev/null", "w");
  SweepOptions o;
  o.report = false;
  o.log = devnull;
  o.progress_tty = 0;
  const SweepResult r = run_sweep(cfg, o);
  std::fclose(devnull);
  ASSERT_EQ(r.finished, 2);

  // family -> data -> metric -> row
  std::map<std::string, std::map<std::string, std::map<std::string, json>>> rows;
  std::istringstream lines(slurp_file(r.run_dir / "summary.jsonl"));
  for (std::string line; std::getline(lines, line);) {
    const json row = json::parse(line);
    if (row["scope"] == "retrieval") rows[row["family"]][row["data"]][row["metric"]] = row;
  }
  ASSERT_EQ(rows.size(), 2u);
  for (const auto& [family, by_data] : rows) {
    // 2 lengths x 2 depths passkey cells, 1 x 2 induction cells, and the pooled rows of both
    // tasks (one `data`: the same model runs both here).
    EXPECT_EQ(by_data.size(), 4u + 2u + 1u) << family;
    for (const auto& [data, m] : by_data) {
      const std::string task =
          data.find("span=") != std::string::npos || m.count("retrieval.induction.accuracy")
              ? "retrieval.induction"
              : "retrieval.passkey";
      ASSERT_TRUE(m.count(task + ".accuracy")) << data;
      const double acc = m.at(task + ".accuracy")["value"].get<double>();
      EXPECT_LE(m.at(task + ".ci_low")["value"].get<double>(), acc) << data;
      EXPECT_GE(m.at(task + ".ci_high")["value"].get<double>(), acc) << data;
      EXPECT_TRUE(m.at(task + ".accuracy")["effective_bits"].is_number()) << data;
    }
  }
  // fp16 agrees with the fp16 reference on every passkey prompt; its bits are 16 at any length.
  const auto& fp16 = rows.at("fp16");
  EXPECT_EQ(
      fp16.at("fixture-qwen3-h128/L=96/depth=0.0").at("retrieval.passkey.fp16_agreement")["value"],
      1.0);
  EXPECT_DOUBLE_EQ(fp16.at("fixture-qwen3-h128/span=8/distance=40")
                       .at("retrieval.induction.accuracy")["effective_bits"]
                       .get<double>(),
                   16.0);
  // KIVI's fp16 residual window makes its effective bits depend on the length.
  const auto& kivi = rows.at("kivi");
  EXPECT_LT(kivi.at("fixture-qwen3-h128/L=160/depth=0.0")
                .at("retrieval.passkey.accuracy")["effective_bits"]
                .get<double>(),
            kivi.at("fixture-qwen3-h128/L=96/depth=0.0")
                .at("retrieval.passkey.accuracy")["effective_bits"]
                .get<double>());
  // The record holds every run: keys, outputs, exact prompt lengths.
  const json rec = read_json_file(RunStore(r.run_dir).case_path(cfg.cases[0].id));
  bool has_cell_columns = false;  // the record's rows name their cell
  for (const json& row : rec["rows"]) {
    if (row["data"] == "fixture-qwen3-h128/L=96/depth=0.0") {
      EXPECT_EQ(row["length"], 96);
      EXPECT_EQ(row["depth"], 0.0);
      has_cell_columns = true;
    }
  }
  EXPECT_TRUE(has_cell_columns);
  ASSERT_EQ(rec["retrieval"]["passkey"]["cells"].size(), 4u);
  for (const json& c : rec["retrieval"]["passkey"]["cells"]) {
    EXPECT_EQ(c["runs"].size(), 2u);
    EXPECT_EQ(c["trials"], 2);
    for (const json& run : c["runs"]) EXPECT_EQ(run["output"], run["fp16_output"]);
  }
  EXPECT_EQ(rec["retrieval"]["induction"]["cells"][0]["trials"], 2 * 7);  // tokens after the first
}

TEST_F(RetrievalSweep, BadBlocksNameTheKey) {
  auto with = [](const std::string& from, const std::string& to) {
    std::string b = block();
    b.replace(b.find(from), from.size(), to);
    return b;
  };
  EXPECT_NE(error_of(with("depths: [0, 1]", "depths: [0, 1.5]")).find("retrieval.passkey.depths"),
            std::string::npos);
  EXPECT_NE(
      error_of(with("lengths: [96, 160]", "lengths: [100000]")).find("max_position_embeddings"),
      std::string::npos);
  // A prompt of exactly max_position_embeddings leaves no position for the answer's tokens.
  EXPECT_NE(error_of(with("lengths: [96, 160]", "lengths: [1024]")).find("need 1027 positions"),
            std::string::npos);
  EXPECT_NE(error_of(block("    needle: no key here\n")).find("{key}"), std::string::npos);
  EXPECT_NE(error_of(block("", "  current_token: later\n")).find("retrieval.current_token"),
            std::string::npos);
  EXPECT_NE(error_of(block("    lenghts: [96]\n")).find("lengths"), std::string::npos);
  EXPECT_NE(error_of("retrieval:\n  enabled: true\n").find("neither passkey nor induction"),
            std::string::npos);
  EXPECT_NE(error_of(block() + "    token_hi: 99999\n").find("retrieval.induction.token_hi"),
            std::string::npos);  // past the fixture's vocabulary of 12288
  EXPECT_NE(error_of(block() + "    token_lo: 10\n    token_hi: 11\n").find("fewer than 2"),
            std::string::npos);
}

#else

TEST_F(RetrievalSweep, SkippedWithoutTheRunner) {
  const SweepConfig cfg = load_config(small_config("  - fp16\n", block()));
  EXPECT_FALSE(cfg.retrieval.enabled);
  ASSERT_FALSE(cfg.notices.empty());
  EXPECT_NE(cfg.notices.back().find("retrieval skipped"), std::string::npos);
}

#endif

}  // namespace
}  // namespace kvarn
