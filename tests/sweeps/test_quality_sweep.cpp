// A sweep with `quality:` enabled runs each method in the model loop over text windows, writes
// the llama.cpp-style statistics as summary rows, keeps the fp16 log-probs in the run directory
// and reuses them on a second run; the block is validated with file:line:col errors.
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
using testing_util::write_file;
namespace fs = std::filesystem;

fs::path fixture() { return fs::path(KVARN_SOURCE_DIR) / "data/models/fixture-qwen3-h128"; }

class QualitySweep : public TempDirTest {
 protected:
  // Token ids (no tokenizer needed): 2 windows of 48 tokens fit in 100 ids.
  std::string block(const std::string& extra = "") {
    std::string ids;
    for (int i = 0; i < 100; ++i) {
      if (i > 0) ids += ',';
      ids += std::to_string((i * 7919 + 13) % 12000);
    }
    write_file(dir_ / "text.jsonl", "{\"token_ids\": [" + ids + "]}\n");
    return "quality:\n  enabled: true\n  model: " + fixture().string() + "\n  text: " +
           (dir_ / "text.jsonl").string() +
           "\n  window: 48\n  block: 16\n  bucket: 16\n  resamples: 50\n  threads: 1\n" + extra;
  }
  std::string error_of(const std::string& extra) {
    try {
      load_config(small_config("  - fp16\n", extra, "bad"));
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
};

#if KVARN_HAVE_RUNNER

SweepResult run_quietly(const SweepConfig& cfg) {
  std::FILE* devnull = std::fopen("/dev/null", "w");
  SweepOptions o;
  o.report = false;
  o.log = devnull;
  o.progress_tty = 0;
  o.fresh = false;
  SweepResult r = run_sweep(cfg, o);
  std::fclose(devnull);
  return r;
}

TEST_F(QualitySweep, RunsWritesRowsAndReusesTheFp16Cache) {
  const std::string methods = "  - fp16\n  - kivi:bits=2,group=8,residual=8\n";
  const SweepConfig cfg = load_config(
      small_config(methods, block("  per_layer: true\n  per_layer_windows: 1\n"
                                  "  per_layer_methods: ['kivi:bits=2,group=8,residual=8']\n")));
  ASSERT_TRUE(cfg.quality.enabled);
  EXPECT_EQ(cfg.resolved["quality"]["window"], 48);
  const SweepResult r = run_quietly(cfg);
  ASSERT_EQ(r.finished, 2);
  std::map<std::string, std::map<std::string, double>> v;  // family -> metric -> value
  int layer_rows = 0;
  std::istringstream lines(slurp_file(r.run_dir / "summary.jsonl"));
  for (std::string line; std::getline(lines, line);) {
    const json row = json::parse(line);
    if (row["scope"] != "quality") continue;
    EXPECT_EQ(row["data"], "fixture-qwen3-h128");
    ASSERT_TRUE(row["value"].is_number()) << line;
    if (row["layer"] == "all") v[row["family"]][row["metric"]] = row["value"].get<double>();
    if (row["metric"] == "quality.layer.kld.mean") ++layer_rows;
  }
  EXPECT_EQ(v["fp16"]["quality.all_rows.kld.mean"], 0.0);
  EXPECT_EQ(v["fp16"]["quality.all_rows.kld.max"], 0.0);
  EXPECT_EQ(v["fp16"]["quality.all_rows.ppl_ratio"], 1.0);
  EXPECT_EQ(v["fp16"]["quality.all_rows.same_top1"], 100.0);
  EXPECT_EQ(v["fp16"]["quality.all_rows.tokens"], 2 * 47);
  EXPECT_EQ(v["fp16"].count("quality.kld.mean"), 0u);  // no row reads a quantized token
  EXPECT_GT(v["kivi"]["quality.kld.mean"], 0.0);
  EXPECT_LE(v["kivi"]["quality.kld.mean.ci_lo"], v["kivi"]["quality.kld.mean"]);
  EXPECT_GE(v["kivi"]["quality.kld.mean.ci_hi"], v["kivi"]["quality.kld.mean"]);
  EXPECT_EQ(v["kivi"]["quality.all_rows.ppl_ref"], v["fp16"]["quality.all_rows.ppl"]);
  EXPECT_EQ(v["kivi"]["quality.pos0-16.tokens"], 2 * 16);
  EXPECT_EQ(v["kivi"]["quality.pos32-47.tokens"], 2 * 15);
  EXPECT_EQ(layer_rows, 8);  // the fixture's 8 layers, kivi only

  // The fp16 log-probs: one file per window in the run directory, reused by the second case.
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(r.run_dir / "quality" / "fp16_logprobs"))
    files.push_back(e.path());
  ASSERT_EQ(files.size(), 2u);
  std::map<fs::path, std::string> bytes;
  for (const fs::path& f : files) bytes[f] = slurp_file(f);
  const json kivi = json::parse(slurp_file(r.run_dir / "cases" /
                                           (cfg.cases[1].id + ".json")))["quality"]["models"][0];
  EXPECT_EQ(kivi["fp16_reference"]["reused_windows"], 2);
  // Per-window bucket means: one per window, pooling to the bucket's mean (equal token counts).
  for (const json& b : kivi["stats"]["position_buckets"]) {
    ASSERT_TRUE(b.contains("window_means")) << b.dump();
    const json& wm = b["window_means"];
    ASSERT_EQ(wm["kld"].size(), 2u);
    EXPECT_EQ(wm["tokens"][0], b["end"].get<int>() - b["begin"].get<int>());
    EXPECT_NEAR((wm["kld"][0].get<double>() + wm["kld"][1].get<double>()) / 2,
                b["stats"]["kld.mean"]["value"].get<double>(), 1e-12);
  }
  EXPECT_EQ(kivi["fp16_reference"]["bytes_per_window"].get<std::uint64_t>(), fs::file_size(files[0]));

  // A second run of the same config in a fresh process state: the cases are redone (--only
  // ignores nothing: remove the records) and read the cache, which stays byte-identical.
  fs::remove_all(r.run_dir / "cases");
  const SweepResult again = run_quietly(cfg);
  ASSERT_EQ(again.run_dir, r.run_dir);
  for (const fs::path& f : files) EXPECT_EQ(slurp_file(f), bytes[f]) << f;
  const json fp16 = json::parse(slurp_file(r.run_dir / "cases" /
                                           (cfg.cases[0].id + ".json")))["quality"]["models"][0];
  EXPECT_EQ(fp16["fp16_reference"]["reused_windows"], 2);
}

TEST_F(QualitySweep, BadBlocksNameTheKey) {
  EXPECT_NE(error_of(block("  current_token: maybe\n")).find("quality.current_token"),
            std::string::npos);
  EXPECT_NE(error_of(block("  windw: 3\n")).find("nearest: window"), std::string::npos);
  const std::string f = fixture().string();
  EXPECT_NE(error_of("quality:\n  enabled: true\n  model: /nonexistent\n  text: " + f +
                     "/config.json\n")
                .find("key 'quality.model'"),
            std::string::npos);
  EXPECT_NE(error_of("quality:\n  enabled: true\n  model: " + f + "\n  text: " + f + "\n")
                .find("key 'quality.text': not a regular file"),
            std::string::npos);
  EXPECT_NE(error_of(block("  per_layer_methods: ['kvarn:k=9']\n")).find("per_layer_methods"),
            std::string::npos);
}

TEST_F(QualitySweep, ModelEntriesOverrideWindowAndCapAtTrainedPositions) {
  const std::string f = fixture().string();
  std::string b = block();
  b.replace(b.find("model: " + f), 7 + f.size(),
            "model: [{path: " + f + ", window: 32, windows: 1}]");
  const SweepConfig cfg = load_config(small_config("  - fp16\n", b));
  ASSERT_EQ(cfg.quality.models.size(), 1u);
  EXPECT_EQ(cfg.quality.models[0].window, 32);
  EXPECT_EQ(cfg.quality.models[0].windows, 1);
  EXPECT_EQ(cfg.quality.window, 48);  // the section's default is untouched
  // The fixture was trained with 1024 positions: a longer window is capped, with a notice.
  const SweepConfig capped = load_config(small_config("  - fp16\n", block()), {"quality.window=4096"});
  EXPECT_EQ(capped.quality.models[0].window, 1024);
  bool noticed = false;
  for (const std::string& n : capped.notices) noticed |= n.find("1024-token windows") != std::string::npos;
  EXPECT_TRUE(noticed);
  b = block();
  b.replace(b.find("model: " + f), 7 + f.size(), "model: [{path: " + f + ", windw: 32}]");
  EXPECT_NE(error_of(b).find("nearest: window"), std::string::npos) << error_of(b);
}

TEST_F(QualitySweep, TooFewWindowsIsOneClearError) {
  const SweepConfig cfg = load_config(small_config("  - fp16\n", block("  windows: 3\n")));
  try {
    run_quietly(cfg);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("2 window(s) of 48, 3 needed"), std::string::npos)
        << e.what();
  }
}

#endif  // KVARN_HAVE_RUNNER

}  // namespace
}  // namespace kvarn
