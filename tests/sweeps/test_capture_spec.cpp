// `data.capture` in sweep configs: the engine captures from a local checkpoint into
// <run_dir>/data/capture.h5, runs every case on it, records it in the provenance and reuses it on
// resume; a hub id selects data.fallback with a notice; bad specs are file:line:col errors.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "kvarn/data/error.hpp"
#include "kvarn/data/tile_file.hpp"
#include "kvarn/sweeps/config.hpp"
#include "kvarn/sweeps/engine.hpp"
#include "kvarn/sweeps/estimate.hpp"
#include "kvarn/sweeps/provenance.hpp"
#include "sweep_test_util.hpp"

namespace kvarn {
namespace {

using nlohmann::json;
using testing_util::sample_tiles;
using testing_util::slurp_file;
using testing_util::TempDirTest;
using testing_util::write_file;
namespace fs = std::filesystem;

fs::path source_path(const std::string& rel) { return fs::path(KVARN_SOURCE_DIR) / rel; }
fs::path fixture_model() { return source_path("data/models/fixture-qwen3-h128"); }

std::string replaced(std::string s, const std::string& from, const std::string& to) {
  const auto at = s.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return at == std::string::npos ? s : s.replace(at, from.size(), to);
}

class CaptureSpecTest : public TempDirTest {
 protected:
  // A capture of two short AIME-style prompts from the fixture (two layers, two query heads).
  std::string capture_block(const std::string& extra = "", const std::string& indent = "  ") {
    const std::string i2 = indent + "  ";
    return indent + "capture:\n" + i2 + "model: " + fixture_model().string() + "\n" + i2 +
           "prompts: " + source_path("data/prompts/aime_style.jsonl").string() + "\n" + i2 +
           "prompt_ids: [aime-style-02, aime-style-03]\n" + i2 + "generate: 8\n" + i2 +
           "ignore_eos: true\n" + i2 + "max_tokens: 40\n" + i2 + "layers: [0, 7]\n" + i2 +
           "query_heads: [0, 2]\n" + i2 + "threads: 1\n" + extra;
  }
  fs::path config(const std::string& data, const std::string& name = "cap") {
    const fs::path p = dir_ / (name + ".yaml");
    write_file(p, "version: 1\nname: " + name + "\ndata:\n" + data +
                      "methods: [fp16, \"kvarn:k=4,v=2,g=32,sink=0\", "
                      "\"kivi:bits=2,group=8,residual=8\"]\n"
                      "metrics:\n  outlier_fractions: [1]\noutput: " +
                      (dir_ / "runs").string() + "\nreport: false\n");
    return p;
  }
  std::string error_of(const std::string& data, const std::vector<std::string>& sets = {}) {
    try {
      load_config(config(data, "bad"), sets);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
  // Runs the sweep with its log in `*log`.
  SweepResult sweep(const SweepConfig& cfg, std::string* log, std::vector<std::string> only = {}) {
    const fs::path lp = dir_ / "sweep.log";
    std::FILE* f = std::fopen(lp.c_str(), "w");
    SweepOptions o;
    o.report = false;
    o.log = f;
    o.progress_tty = 0;
    o.only = std::move(only);
    SweepResult r;
    try {
      r = run_sweep(cfg, o);
    } catch (...) {
      std::fclose(f);
      *log = slurp_file(lp);
      throw;
    }
    std::fclose(f);
    *log = slurp_file(lp);
    return r;
  }
  static bool has_model() { return fs::exists(fixture_model() / "model.safetensors"); }
};

void expect_has(const std::string& text, const std::string& needle) {
  EXPECT_NE(text.find(needle), std::string::npos) << "expected '" << needle << "' in: " << text;
}

TEST_F(CaptureSpecTest, KeyAndTypeErrorsNameFileLineColumnAndKey) {
  const std::string file = (dir_ / "bad.yaml").string();
  // Line 4 is `  capture:`; its keys start on line 5, column 5.
  std::string e = error_of("  capture:\n    modle: x\n");
  expect_has(e, file + ":5:5: key 'data.capture.modle': unknown key (nearest: model)");
  e = error_of(replaced(capture_block(), "generate: 8", "generate: lots"));
  expect_has(e, "key 'data.capture.generate': expected an integer, got scalar 'lots'");
  expect_has(error_of("  capture: 5\n"), file + ":4:12: key 'data.capture': expected a mapping");
  // A list is a list of capture blocks: each item must be one.
  expect_has(error_of("  capture: [a, b]\n"),
             file + ":4:13: key 'data.capture.0': expected a mapping, got scalar 'a'");
  expect_has(error_of("  capture: {prompts: p.jsonl}\n"), "key 'data.capture.model': missing");
  expect_has(error_of("  capture: {model: Qwen/Qwen3-8B, prompts: p.jsonl, device: tpu}\n"),
             "key 'data.capture.device': expected cpu, cuda or cuda:N");
  // A path (not a hub id) that does not exist is an error, never a silent fallback.
  expect_has(error_of("  capture: {model: ./nowhere/ckpt, prompts: p.jsonl}\n"
                      "  fallback: {tiles: " +
                      sample_tiles().string() + "}\n"),
             "key 'data.capture.model': checkpoint directory not found: ./nowhere/ckpt");
  // A hub id without a fallback: say how to supply the model.
  e = error_of("  capture: {model: Qwen/Qwen3-8B, prompts: p.jsonl}\n");
  expect_has(e, file + ":4:20: key 'data.capture.model': 'Qwen/Qwen3-8B' is not a local");
  expect_has(e, "--set data.capture.model=/path/to/checkpoint");
  // The fallback must be local too.
  expect_has(error_of("  capture: {model: Qwen/Qwen3-8B, prompts: p.jsonl}\n"
                      "  fallback:\n    capture: {model: org/other, prompts: p.jsonl}\n"),
             "key 'data.fallback.capture.model': 'org/other' is not a local checkpoint");
}

#if KVARN_HAVE_RUNNER

TEST_F(CaptureSpecTest, SpecIsCheckedAgainstCheckpointAndPromptsBeforeAnythingRuns) {
  ASSERT_TRUE(has_model()) << "committed fixture model missing: " << fixture_model();
  const std::string file = (dir_ / "bad.yaml").string();
  const std::string block = capture_block();
  auto with = [&](const std::string& from, const std::string& to) {
    return replaced(block, from, to);
  };
  // Missing prompts file: config file:line:col, the key, and the path.
  std::string e = error_of(with(source_path("data/prompts/aime_style.jsonl").string(),
                                (dir_ / "missing.jsonl").string()));
  expect_has(e, file + ":6:14: key 'data.capture.prompts': file not found: ");
  expect_has(e, "missing.jsonl");
  // A malformed prompts file: the prompts file's line as well.
  write_file(dir_ / "broken.jsonl", "{\"id\": \"a\", \"text\": \"x\"}\n{\"id\": \"b\", tex\n");
  e = error_of(with(source_path("data/prompts/aime_style.jsonl").string(),
                    (dir_ / "broken.jsonl").string()));
  expect_has(e, "key 'data.capture.prompts': ");
  expect_has(e, "broken.jsonl:2:");
  e = error_of(with("aime-style-03", "aime-style-3"));
  expect_has(e, "key 'data.capture.prompt_ids.1': no prompt 'aime-style-3'");
  expect_has(e, "nearest: aime-style-03");
  expect_has(error_of(with("layers: [0, 7]", "layers: [0, 8]")),
             "key 'data.capture.layers': index 8 out of range");
  expect_has(error_of(with("layers: [0, 7]", "kv_heads: [0]\n    layers: [0, 7]")),
             "key 'data.capture.kv_heads': schema kvarn-tiles v1 stores every KV head");
  e = error_of(replaced(with("max_tokens: 40", "max_tokens: 0"), "generate: 8", "generate: 1020"));
  expect_has(e, "key 'data.capture.generate': prompt 'aime-style-02': 35 prompt tokens + 1020 ");
  expect_has(e, "context of 1024 tokens");
  expect_has(error_of(with("threads: 1", "threads: -1")),
             "key 'data.capture.threads': must be in [0, 1024]");
  // The data-level selection applies to the captured file: checked against the spec.
  expect_has(error_of(block + "  sequences: [2]\n"),
             "key 'data.sequences': index 2 out of range: the capture of data.capture has 2");
}

TEST_F(CaptureSpecTest, SweepCapturesRunsEveryCaseRecordsProvenanceAndResumes) {
  ASSERT_TRUE(has_model()) << "committed fixture model missing: " << fixture_model();
  const SweepConfig cfg = load_config(config(capture_block()));
  ASSERT_FALSE(cfg.data.captures.empty());
  EXPECT_EQ(cfg.data.source, "capture");
  EXPECT_TRUE(cfg.data.tiles.empty());
  const CaptureSpec& cap = cfg.data.captures.front();
  EXPECT_EQ(cap.head_dim, 128);
  EXPECT_EQ(cap.captured_layers, 2);
  EXPECT_EQ(cap.sequence_tokens.size(), 2u);
  EXPECT_EQ(cfg.resolved["data"]["capture"]["model_files"]["model.safetensors"],
            file_fingerprint(fixture_model() / "model.safetensors"));
  EXPECT_EQ(cfg.resolved["data"]["capture"]["prompt_ids"],
            json::array({"aime-style-02", "aime-style-03"}));
  const SweepEstimate est = estimate_sweep(cfg);
  EXPECT_GT(est.capture_seconds, 0);
  EXPECT_GT(est.capture_bytes, 0);
  EXPECT_EQ(est.slabs, 2 * 2 * 2);  // sequences x captured layers x KV heads

  std::string log;
  const SweepResult r = sweep(cfg, &log);
  ASSERT_EQ(r.finished, 3) << log;
  EXPECT_EQ(r.computed, 3);
  expect_has(log, "capturing data.capture from " + fixture_model().string());
  const fs::path file = r.run_dir / kCaptureFile;
  ASSERT_TRUE(fs::is_regular_file(file));
  {
    const TileReader tr(file);
    EXPECT_EQ(tr.info().layers, (std::vector<int>{0, 7}));
    ASSERT_EQ(tr.num_sequences(), 2);
    EXPECT_EQ(tr.sequence(0).prompt_id, "aime-style-02");
    EXPECT_EQ(tr.sequence(1).q_heads, (std::vector<int>{0, 2}));
    EXPECT_LE(tr.sequence(0).num_tokens, 40);
    const json made = json::parse(tr.info().provenance);
    EXPECT_EQ(made["sweep"]["spec_hash"], cap.hash);
    EXPECT_EQ(made["settings"]["generate"], 8);
  }
  const std::string sha_before = sha256_file_hex(file);
  const auto mtime_before = fs::last_write_time(file);

  // Provenance records the capture.
  const json prov = json::parse(slurp_file(r.run_dir / "provenance.json"));
  ASSERT_TRUE(prov.contains("capture")) << prov.dump(1);
  EXPECT_EQ(prov["capture"]["status"], "captured");
  EXPECT_EQ(prov["capture"]["file"], kCaptureFile);
  EXPECT_EQ(prov["capture"]["spec_hash"], cap.hash);
  EXPECT_EQ(prov["capture"]["fingerprint"], file_fingerprint(file));
  EXPECT_EQ(prov["capture"]["sequences"], 2);
  EXPECT_EQ(prov["capture"]["checks"].size(), 2u);

  // Results on the captured data: every (layer, KV head) of the capture, quantizers worse than
  // fp16, attention from the captured queries.
  std::map<std::string, double> nmse;  // family -> pooled key NMSE
  int attention_rows = 0;
  std::istringstream lines(slurp_file(r.run_dir / "summary.jsonl"));
  for (std::string line; std::getline(lines, line);) {
    const json row = json::parse(line);
    EXPECT_EQ(row["data"], "fixture-qwen3-h128");
    if (row["metric"] == "key.end_to_end.nmse" && row["layer"] == "all") {
      nmse[row["family"].get<std::string>()] = row["value"].get<double>();
    }
    if (row["scope"] == "attention") ++attention_rows;
  }
  ASSERT_EQ(nmse.size(), 3u);
  EXPECT_EQ(nmse["fp16"], 0.0);
  EXPECT_GT(nmse["kvarn"], 0.0);
  EXPECT_GT(nmse["kivi"], 0.0);
  EXPECT_GT(attention_rows, 0);
  const json rec = json::parse(slurp_file(r.run_dir / "cases" / (cfg.cases[1].id + ".json")));
  EXPECT_EQ(rec["slabs"].size(), 8u);
  EXPECT_TRUE(rec["accounting"].contains("fixture-qwen3-h128"));

  // Resume: one case removed, recomputed from the same capture file (not captured again).
  const fs::path case2 = r.run_dir / "cases" / (cfg.cases[2].id + ".json");
  const json rows2 = json::parse(slurp_file(case2))["rows"];
  fs::remove(case2);
  const SweepResult again = sweep(load_config(config(capture_block())), &log);
  EXPECT_EQ(again.run_dir, r.run_dir);
  EXPECT_EQ(again.computed, 1);
  EXPECT_EQ(again.resumed, 2);
  EXPECT_EQ(log.find("capturing"), std::string::npos) << log;
  expect_has(log, "reusing " + file.string());
  EXPECT_EQ(sha256_file_hex(file), sha_before);
  EXPECT_EQ(fs::last_write_time(file), mtime_before);
  EXPECT_EQ(json::parse(slurp_file(r.run_dir / "provenance.json"))["capture"]["status"], "reused");
  EXPECT_EQ(json::parse(slurp_file(case2))["rows"], rows2);  // same capture, same results

  // A capture file of another spec is never mixed with results computed from the first one.
  fs::copy_file(sample_tiles(), file, fs::copy_options::overwrite_existing);
  fs::remove(case2);
  try {
    sweep(cfg, &log);
    ADD_FAILURE() << "a mismatching capture file with finished cases must be an error";
  } catch (const Error& e) {
    expect_has(e.what(), "records no data.capture spec");
    expect_has(e.what(), "--fresh");
  }
  EXPECT_FALSE(fs::exists(case2));
}

TEST_F(CaptureSpecTest, BrokenCaptureFileWithNoFinishedCaseIsRedone) {
  ASSERT_TRUE(has_model()) << "committed fixture model missing: " << fixture_model();
  const SweepConfig cfg = load_config(config(capture_block()));
  const fs::path file = run_directory(cfg, 0, 1, false) / kCaptureFile;
  write_file(file, "not an HDF5 file");
  std::string log;
  const SweepResult r = sweep(cfg, &log, {"0"});
  EXPECT_EQ(r.computed, 1);
  expect_has(log, "is unreadable");
  expect_has(log, "capturing again");
  EXPECT_EQ(json::parse(TileReader(file).info().provenance)["sweep"]["spec_hash"],
            cfg.data.captures.front().hash);
}

TEST_F(CaptureSpecTest, ValidateReportsTheCaptureStep) {
  ASSERT_TRUE(has_model()) << "committed fixture model missing: " << fixture_model();
#ifdef KVARN_EVAL_BIN
  const fs::path out = dir_ / "validate.txt";
  const std::string cmd = std::string("'") + KVARN_EVAL_BIN + "' validate '" +
                          config(capture_block()).string() + "' > '" + out.string() + "' 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << slurp_file(out);
  const std::string text = slurp_file(out);
  expect_has(text, "data/capture.h5 (fixture-qwen3-h128, head_dim 128): captured before the cases");
  expect_has(text, "2 prompt(s)");
  expect_has(text, "estimated ");
  EXPECT_FALSE(fs::exists(dir_ / "runs")) << "validate must not run anything";
#else
  GTEST_SKIP() << "KVARN_EVAL_BIN not defined";
#endif
}

TEST_F(CaptureSpecTest, LocalFallbackCaptureRunsWithNoticeForHubModel) {
  ASSERT_TRUE(has_model()) << "committed fixture model missing: " << fixture_model();
  const SweepConfig cfg = load_config(
      config("  capture: {model: Qwen/Qwen3-8B, prompts: p.jsonl, generate: 16384}\n"
             "  fallback:\n" +
             capture_block("", "    ") + "    tiles: [" + sample_tiles().string() + "]\n"));
  EXPECT_EQ(cfg.data.source, "fallback");
  ASSERT_FALSE(cfg.data.captures.empty());
  EXPECT_EQ(cfg.data.captures.front().key, "data.fallback.capture");
  ASSERT_EQ(cfg.data.tiles.size(), 1u);
  std::string log;
  const SweepResult r = sweep(cfg, &log, {"0"});
  EXPECT_EQ(r.computed, 1);
  expect_has(log,
             "cap: data.capture.model 'Qwen/Qwen3-8B' is not a local checkpoint, so "
             "data.fallback runs instead, at REDUCED SIZE");
  expect_has(log, "capturing data.fallback.capture");
  std::set<std::string> data;
  std::istringstream lines(slurp_file(r.run_dir / "summary.jsonl"));
  for (std::string line; std::getline(lines, line);)
    data.insert(json::parse(line)["data"].get<std::string>());
  EXPECT_EQ(data, (std::set<std::string>{"fixture-qwen3-h128", "sample"}));
}

// Two capture blocks (here the same checkpoint twice, as two models of different head_dim would
// be): two files, each its own spec, both measured, the second labelled apart; resume reuses both.
TEST_F(CaptureSpecTest, ListOfCapturesMakesOneFileEachAndMeasuresBoth) {
  ASSERT_TRUE(has_model()) << "committed fixture model missing: " << fixture_model();
  const std::string common = "model: " + fixture_model().string() +
                             ", prompts: " + source_path("data/prompts/aime_style.jsonl").string() +
                             ", max_tokens: 40, threads: 1";
  const std::string data = "  capture:\n    - {" + common +
                           ", prompt_ids: [aime-style-02], layers: [0], query_heads: [0, 2]}\n"
                           "    - {" +
                           common +
                           ", prompt_ids: [aime-style-03, aime-style-04], layers: [7], "
                           "query_heads: [1]}\n";
  const SweepConfig cfg = load_config(config(data));
  ASSERT_EQ(cfg.data.captures.size(), 2u);
  EXPECT_EQ(cfg.data.source, "capture");
  EXPECT_EQ(cfg.data.captures[0].key, "data.capture.0");
  EXPECT_EQ(cfg.data.captures[1].key, "data.capture.1");
  EXPECT_EQ(cfg.data.captures[0].name, "fixture-qwen3-h128");
  EXPECT_EQ(cfg.data.captures[1].name, "fixture-qwen3-h128_2");
  EXPECT_NE(cfg.data.captures[0].hash, cfg.data.captures[1].hash);
  ASSERT_TRUE(cfg.resolved["data"]["capture"].is_array());
  ASSERT_EQ(cfg.resolved["data"]["capture"].size(), 2u);
  EXPECT_EQ(cfg.resolved["data"]["capture"][1]["prompt_ids"],
            json::array({"aime-style-03", "aime-style-04"}));
  EXPECT_EQ(estimate_sweep(cfg).slabs, 1 * 1 * 2 + 2 * 1 * 2);  // sequences x layers x KV heads
  EXPECT_EQ(capture_file(0), kCaptureFile);
  EXPECT_EQ(capture_file(1), "data/capture_2.h5");

  std::string log;
  const SweepResult r = sweep(cfg, &log);
  ASSERT_EQ(r.finished, 3) << log;
  expect_has(log, "capturing data.capture.0 from ");
  expect_has(log, "capturing data.capture.1 from ");
  const fs::path first = r.run_dir / capture_file(0), second = r.run_dir / capture_file(1);
  ASSERT_TRUE(fs::is_regular_file(first));
  ASSERT_TRUE(fs::is_regular_file(second));
  EXPECT_EQ(TileReader(first).num_sequences(), 1);
  EXPECT_EQ(TileReader(second).num_sequences(), 2);
  EXPECT_EQ(TileReader(second).info().layers, (std::vector<int>{7}));
  EXPECT_EQ(json::parse(TileReader(second).info().provenance)["sweep"]["spec_hash"],
            cfg.data.captures[1].hash);
  const json prov = json::parse(slurp_file(r.run_dir / "provenance.json"));
  ASSERT_TRUE(prov["capture"].is_array()) << prov.dump(1);
  ASSERT_EQ(prov["capture"].size(), 2u);
  EXPECT_EQ(prov["capture"][1]["file"], "data/capture_2.h5");
  EXPECT_EQ(prov["capture"][1]["status"], "captured");

  // Every (sequence, layer, KV head) of both captures is measured, under its own label: the
  // pooled row's bootstrap units are the first capture's 2 and the second's 4.
  std::map<std::string, int> units;  // data label -> units of the pooled key NMSE (kvarn case)
  std::istringstream lines(slurp_file(r.run_dir / "summary.jsonl"));
  for (std::string line; std::getline(lines, line);) {
    const json row = json::parse(line);
    if (row["metric"] != "key.end_to_end.nmse" || row["layer"] != "all") continue;
    if (row["family"] == "kvarn") units[row["data"].get<std::string>()] = row["ci_units"];
  }
  EXPECT_EQ(units,
            (std::map<std::string, int>{{"fixture-qwen3-h128", 2}, {"fixture-qwen3-h128_2", 4}}));
  const json rec = json::parse(slurp_file(r.run_dir / "cases" / (cfg.cases[1].id + ".json")));
  EXPECT_EQ(rec["slabs"].size(), 6u);

  // Resume: both files reused, none captured again.
  const std::string sha = sha256_file_hex(second);
  fs::remove(r.run_dir / "cases" / (cfg.cases[2].id + ".json"));
  const SweepResult again = sweep(load_config(config(data)), &log);
  EXPECT_EQ(again.computed, 1);
  EXPECT_EQ(log.find("capturing"), std::string::npos) << log;
  expect_has(log, "reusing " + second.string());
  EXPECT_EQ(sha256_file_hex(second), sha);

  // Errors name the block; a hub id inside a list is an error, never a silent fallback.
  expect_has(error_of("  capture:\n    - {" + common + "}\n    - {" + common + ", modle: x}\n"),
             "key 'data.capture.1.modle': unknown key");
  expect_has(error_of("  capture:\n    - {" + common +
                      "}\n    - {model: Qwen/Qwen3-8B, prompts: p.jsonl}\n"),
             "key 'data.capture.1.model': 'Qwen/Qwen3-8B' is not a local checkpoint directory");
  expect_has(error_of("  capture: []\n"), "key 'data.capture': empty list of capture blocks");
}

#else  // !KVARN_HAVE_RUNNER

TEST_F(CaptureSpecTest, WithoutTheRunnerALocalCaptureIsAConfigError) {
  const std::string e = error_of(capture_block());
  expect_has(e, (dir_ / "bad.yaml").string() + ":");
  expect_has(e, "key 'data.capture': capturing from ");
  expect_has(e, "built without it");
  EXPECT_FALSE(fs::exists(dir_ / "runs"));
  // A fallback with tiles still runs, without its capture, and says so.
  const SweepConfig cfg = load_config(
      config("  capture: {model: Qwen/Qwen3-8B, prompts: p.jsonl}\n  fallback:\n" +
             capture_block("", "    ") + "    tiles: [" + sample_tiles().string() + "]\n"));
  EXPECT_TRUE(cfg.data.captures.empty());
  ASSERT_GE(cfg.notices.size(), 2u);
  expect_has(cfg.notices[0], "data.fallback.capture skipped: this kvarn-eval was built without");
}

#endif

// A hub model with a tiles fallback: notice, fallback tiles measured, no capture in the hash.
TEST_F(CaptureSpecTest, HubModelFallsBackToTilesWithANotice) {
  const SweepConfig cfg =
      load_config(config("  capture: {model: Qwen/Qwen3-8B, prompts: p.jsonl, generate: 16384}\n"
                         "  fallback: {tiles: " +
                         sample_tiles().string() + ", sequences: [0], max_tokens: 64}\n"));
  EXPECT_EQ(cfg.data.source, "fallback");
  EXPECT_TRUE(cfg.data.captures.empty());
  EXPECT_FALSE(cfg.resolved["data"].contains("capture"));
  ASSERT_FALSE(cfg.notices.empty());
  expect_has(cfg.notices[0],
             "cap: data.capture.model 'Qwen/Qwen3-8B' is not a local checkpoint, so "
             "data.fallback runs instead, at REDUCED SIZE (not the configured workload): " +
                 sample_tiles().string());
  expect_has(cfg.notices[0], "--set data.capture.model=/path/to/checkpoint");
  std::string log;
  const SweepResult r = sweep(cfg, &log, {"0"});
  EXPECT_EQ(r.computed, 1);
  expect_has(log, cfg.notices[0]);
  EXPECT_FALSE(fs::exists(r.run_dir / "data"));
  EXPECT_FALSE(json::parse(slurp_file(r.run_dir / "provenance.json")).contains("capture"));
}

}  // namespace
}  // namespace kvarn
