// A sweep with `accumulation:` enabled runs the model with each method in the loop and writes the
// arrays the report plots and the summary rows; the block is validated with file:line:col errors.
#include <H5Cpp.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "kvarn/data/error.hpp"
#include "kvarn/sweeps/config.hpp"
#include "kvarn/sweeps/engine.hpp"
#include "sweep_test_util.hpp"

#if KVARN_HAVE_RUNNER
#include "kvarn/runner/tokenizer.hpp"
#endif

namespace kvarn {
namespace {

using nlohmann::json;
using testing_util::slurp_file;
using testing_util::TempDirTest;
using testing_util::write_file;
namespace fs = std::filesystem;

fs::path fixture_model() {
  return fs::path(KVARN_SOURCE_DIR) / "data" / "models" / "fixture-qwen3-h128";
}

// Runs a sweep without a report or log output (only the runner-built tests use it).
[[maybe_unused]] SweepResult run_quietly(const SweepConfig& cfg) {
  std::FILE* devnull = std::fopen("/dev/null", "w");
  SweepOptions o;
  o.report = false;
  o.log = devnull;
  o.progress_tty = 0;
  SweepResult r = run_sweep(cfg, o);
  std::fclose(devnull);
  return r;
}

class AccumulationSweep : public TempDirTest {
 protected:
  std::string block(const std::string& extra = "") {
    return "accumulation:\n  enabled: true\n  model: " + fixture_model().string() +
           "\n  prompts: " + (fs::path(KVARN_SOURCE_DIR) / "data/prompts/mixed.jsonl").string() +
           "\n  block: 16\n  context: 48\n  decode_steps: 6\n  threads: 1\n" + extra;
  }
  std::string error_of(const std::string& extra, const std::vector<std::string>& sets = {}) {
    try {
      load_config(small_config("  - fp16\n", extra, "bad"), sets);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
};

#if KVARN_HAVE_RUNNER

TEST_F(AccumulationSweep, RunsAndWritesArraysAndRows) {
  ASSERT_TRUE(fs::exists(fixture_model() / "model.safetensors"))
      << "committed, missing: " << fixture_model();
  const SweepConfig cfg =
      load_config(small_config("  - fp16\n  - kivi:bits=2,group=8,residual=8\n", block()));
  ASSERT_TRUE(cfg.accumulation.enabled);
  EXPECT_EQ(cfg.accumulation.prompt_ids, std::vector<std::string>{"prose-lighthouse"});
  EXPECT_EQ(cfg.resolved["accumulation"]["context"], 48);
  const SweepResult r = run_quietly(cfg);
  ASSERT_EQ(r.finished, 2);

  std::map<std::string, std::map<std::string, double>> by_method;  // family -> metric -> value
  std::istringstream lines(slurp_file(r.run_dir / "summary.jsonl"));
  for (std::string line; std::getline(lines, line);) {
    const json row = json::parse(line);
    if (row["scope"] != "accumulation" && row["scope"] != "decode") continue;
    EXPECT_EQ(row["data"], "fixture-qwen3-h128");
    if (row["layer"] == "all" && row["value"].is_number()) {
      by_method[row["family"]][row["metric"]] = row["value"].get<double>();
    }
  }
  for (const char* m :
       {"accumulation.mae_accumulated.final", "accumulation.mae_static.final", "decode.kl.mean",
        "decode.top1_agreement", "decode.first_divergence", "decode.hidden_drift.last_layer"}) {
    ASSERT_TRUE(by_method["fp16"].count(m)) << m;
    ASSERT_TRUE(by_method["kivi"].count(m)) << m;
  }
  EXPECT_EQ(by_method["fp16"]["accumulation.mae_accumulated.final"], 0.0);
  EXPECT_EQ(by_method["fp16"]["decode.kl.mean"], 0.0);
  EXPECT_EQ(by_method["fp16"]["decode.first_divergence"], 6.0);
  EXPECT_GT(by_method["kivi"]["accumulation.mae_accumulated.final"], 0.0);
  EXPECT_GT(by_method["kivi"]["decode.kl.mean"], 0.0);

  // (KIVI with 8-token residual windows: the default 128 would keep the 48-token context fp16.)
  // The arrays the report reads, with matching shapes.
  for (const auto& e : fs::directory_iterator(r.run_dir / "arrays")) {
    H5::H5File f(e.path().string(), H5F_ACC_RDONLY);
    auto len = [&](const std::string& name) {
      hsize_t dims[2] = {0, 0};
      f.openDataSet(name).getSpace().getSimpleExtentDims(dims);
      return dims[0];
    };
    EXPECT_EQ(len("accumulation/context_len"), 3u);  // blocks ending at 16, 32, 48
    EXPECT_EQ(len("accumulation/mae_static"), 3u);
    EXPECT_EQ(len("accumulation/mae_accumulated"), 3u);
    EXPECT_EQ(len("accumulation/mae_accumulated_layer"), 3u);
    EXPECT_EQ(len("decode/step"), 6u);
    EXPECT_EQ(len("decode/kl"), 6u);
    EXPECT_EQ(len("decode/greedy/tokens"), 1u);  // one prompt
    EXPECT_EQ(len("accumulation_models/fixture-qwen3-h128/decode/kl"), 6u);
  }
}

// Token-id prompts (for builds without a tokenizer, e.g. the GPU image) give exactly the text
// prompt's results when the ids are its tokenization; bad ids fail naming the prompt.
// static_replay: false is hashed (resolved) and leaves the static arrays and rows out; the
// accumulated rows are the values of a run with the static side.
TEST_F(AccumulationSweep, WithoutStaticReplayNoStaticRowsOrArrays) {
  const SweepConfig with = load_config(small_config("  - kivi:bits=2,group=8,residual=8\n",
                                                    block("  modes: [pseudo_decode]\n"), "with"));
  EXPECT_FALSE(with.resolved["accumulation"].contains("static_replay"));  // older hashes kept
  const SweepConfig without = load_config(small_config(
      "  - kivi:bits=2,group=8,residual=8\n",
      block("  modes: [pseudo_decode]\n  static_replay: false\n"), "without"));
  EXPECT_EQ(without.resolved["accumulation"]["static_replay"], false);
  auto rows = [](const SweepResult& r) {
    std::map<std::string, double> out;
    std::istringstream lines(slurp_file(r.run_dir / "summary.jsonl"));
    for (std::string line; std::getline(lines, line);) {
      const json row = json::parse(line);
      if (row["scope"] == "accumulation" && row["layer"] == "all" && row["value"].is_number())
        out[row["metric"]] = row["value"].get<double>();
    }
    return out;
  };
  const SweepResult rw = run_quietly(with), ro = run_quietly(without);
  const auto a = rows(rw), b = rows(ro);
  ASSERT_TRUE(a.count("accumulation.mae_static.final"));
  EXPECT_FALSE(b.count("accumulation.mae_static.final"));
  EXPECT_FALSE(b.count("accumulation.mae_ratio.final"));
  ASSERT_TRUE(b.count("accumulation.mae_accumulated.final"));
  EXPECT_EQ(b.at("accumulation.mae_accumulated.final"), a.at("accumulation.mae_accumulated.final"));
  EXPECT_GT(b.at("accumulation.mae_accumulated.final"), 0.0);
  for (const auto& e : fs::directory_iterator(ro.run_dir / "arrays")) {
    H5::H5File f(e.path().string(), H5F_ACC_RDONLY);
    EXPECT_TRUE(f.nameExists("accumulation/mae_accumulated"));
    EXPECT_FALSE(f.nameExists("accumulation/mae_static"));
  }
}

TEST_F(AccumulationSweep, TokenIdPromptsMatchTheirText) {
  ASSERT_TRUE(fs::exists(fixture_model() / "model.safetensors"))
      << "committed, missing: " << fixture_model();
  if (!Tokenizer::available()) GTEST_SKIP() << "this build has no tokenizer (PCRE2)";
  const std::string text = "The ferry left the harbour a little after six, while the street lamps";
  json ids = Tokenizer::load(fixture_model() / "tokenizer.json")->encode(text, false);
  const fs::path prompts = dir_ / "prompts.jsonl";
  write_file(prompts, json{{"id", "t"}, {"text", text}}.dump() + "\n" +
                          json{{"id", "i"}, {"token_ids", ids}}.dump() + "\n");
  auto with_prompts = [&](const std::string& id) {  // block() with prompts.jsonl and one id
    std::string b = block("  prompt_ids: [" + id + "]\n");
    const std::size_t at = b.find("prompts: ");
    return b.replace(at, b.find('\n', at) - at, "prompts: " + prompts.string());
  };
  auto run = [&](const std::string& id) {
    const std::string b = with_prompts(id);
    const SweepResult r =
        run_quietly(load_config(small_config("  - kivi:bits=2,group=8,residual=8\n", b, id)));
    std::map<std::string, double> m;
    std::istringstream lines(slurp_file(r.run_dir / "summary.jsonl"));
    for (std::string line; std::getline(lines, line);) {
      const json row = json::parse(line);
      if (row["scope"] == "accumulation" || row["scope"] == "decode") {
        m[row["metric"].get<std::string>() + "@" + row["layer"].dump()] =
            row["value"].is_number() ? row["value"].get<double>() : -1.0;
      }
    }
    return m;
  };
  const auto from_text = run("t"), from_ids = run("i");
  ASSERT_GT(from_text.count("accumulation.mae_accumulated.final@\"all\""), 0u);
  EXPECT_GT(from_text.at("accumulation.mae_accumulated.final@\"all\""), 0.0);
  EXPECT_EQ(from_text, from_ids);

  const std::string big = json{{"id", "big"}, {"token_ids", {1, 99999}}}.dump() + "\n";
  write_file(prompts, big + json{{"id", "none"}, {"tokens", {1, 2}}}.dump() + "\n");
  const std::string b = with_prompts("big");
  EXPECT_NE(error_of(b).find("prompts.jsonl:2: expected a JSON object with a string id and either"),
            std::string::npos)
      << error_of(b);
  write_file(prompts, big);
  EXPECT_NE(error_of(b).find("prompt 'big': token id 99999 >= fixture-qwen3-h128's vocab_size"),
            std::string::npos)
      << error_of(b);
}

TEST_F(AccumulationSweep, BadBlocksFailWithLocation) {
  ASSERT_TRUE(fs::exists(fixture_model() / "config.json"))
      << "committed, missing: " << fixture_model();
  // small_config has 12 lines before `extra`: `modes` is line 21.
  EXPECT_NE(error_of(block("  modes: [pseudo_decode, teacher_forcing]\n"))
                .find(":21:26: key 'accumulation.modes.1': unknown mode 'teacher_forcing' "
                      "(nearest: teacher_forced)"),
            std::string::npos)
      << error_of(block("  modes: [pseudo_decode, teacher_forcing]\n"));
  EXPECT_NE(error_of(block("  prompt_ids: [nope]\n")).find("key 'accumulation.prompt_ids.0'"),
            std::string::npos);
  EXPECT_NE(error_of(block("  blocks: 3\n")).find("key 'accumulation.blocks': unknown key"),
            std::string::npos);
  EXPECT_NE(error_of(block("  top_p: 0\n")).find("key 'accumulation.top_p': must be in (0, 1]"),
            std::string::npos);
  const std::string missing =
      error_of("accumulation:\n  enabled: true\n  model: no/such/model\n  prompts: x.jsonl\n");
  EXPECT_NE(missing.find("key 'accumulation.model': not a checkpoint directory"), std::string::npos)
      << missing;
  EXPECT_NE(error_of(block(), {"accumulation.context=2000"}).find("exceeds"), std::string::npos);
}

#else

TEST_F(AccumulationSweep, WithoutRunnerIsSkippedWithNotice) {
  const SweepConfig cfg = load_config(small_config("  - fp16\n", block()));
  EXPECT_FALSE(cfg.accumulation.enabled);
  ASSERT_FALSE(cfg.notices.empty());
  EXPECT_NE(cfg.notices.back().find("accumulation skipped"), std::string::npos);
}

#endif

}  // namespace
}  // namespace kvarn
