// `kvarn-eval capture` end to end: runs the real binary on the project's fixture model, on the
// tiny random checkpoints of tests/eval_runner/make_reference.py and (when prepared) on SmolLM2;
// reads the output back with TileReader and h5py, compares it with scripts/capture_tiles.py
// (transformers) within fp16 rounding, and checks every bad-input error leaves nothing behind.
#include <H5Cpp.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "eval_runner/runner_test_util.hpp"
#include "kvarn/data/tile_file.hpp"
#include "kvarn/sweeps/provenance.hpp"
#include "temp_dir_test.hpp"

#ifndef KVARN_EVAL_BIN
#error "tests/CMakeLists.txt must define KVARN_EVAL_BIN (path of the kvarn-eval binary)"
#endif

namespace kvarn {
namespace {

namespace fs = std::filesystem;

struct RunResult {
  int rc = -1;
  std::string out, err;
};

fs::path source_dir() { return fs::path(KVARN_SOURCE_DIR); }
fs::path fixture_dir() { return source_dir() / "data/models/fixture-qwen3-h128"; }
std::string python_tool() {
  return "python3 '" + (source_dir() / "scripts/capture_tiles.py").string() + "'";
}

bool python_has(const std::string& modules) {
  return std::system(("python3 -c 'import " + modules + "' >/dev/null 2>&1").c_str()) == 0;
}

class CaptureTest : public kvarn::testing::TempDirTest {
 protected:
  void SetUp() override {
    TempDirTest::SetUp();
    // Without the runner the subcommand exists but refuses; everything here then skips.
    const RunResult r = run("capture --model x --prompts y --out " + (dir_ / "probe.h5").string());
    if (r.err.find("built without libtorch") != std::string::npos) {
      GTEST_SKIP() << "kvarn-eval was built without libtorch: " << r.err;
    }
    ASSERT_TRUE(fs::exists(fixture_dir() / "model.safetensors"))
        << "committed fixture model missing: " << fixture_dir();
  }
  // `exe` is a shell prefix (e.g. "python3 'script.py'"); default: the kvarn-eval binary.
  RunResult run(const std::string& args,
                const std::string& exe = std::string("'") + KVARN_EVAL_BIN + "'") {
    const fs::path out = dir_ / "stdout.txt", err = dir_ / "stderr.txt";
    const std::string cmd = exe + " " + args + " >'" + out.string() + "' 2>'" + err.string() + "'";
    RunResult r;
    const int status = std::system(cmd.c_str());
    r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = test::read_text(out);
    r.err = test::read_text(err);
    fs::remove(out);
    fs::remove(err);
    return r;
  }

  fs::path write(const std::string& name, const std::string& text) {
    const fs::path p = dir_ / name;
    fs::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary) << text;
    return p;
  }

  // Files in dir_ other than the scratch ones: an error must leave none (no .h5, no temp file).
  std::vector<std::string> leftovers(const fs::path& where) {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(where)) {
      const std::string n = e.path().filename().string();
      if (n.find(".h5") != std::string::npos) out.push_back(n);
    }
    return out;
  }

  // A copy of the fixture (weights and tokenizer symlinked) whose files can be broken.
  fs::path fixture_copy(const std::string& name) {
    const fs::path d = dir_ / name;
    fs::create_directories(d);
    for (const char* f : {"model.safetensors", "tokenizer.json", "tokenizer_config.json"}) {
      fs::create_symlink(fixture_dir() / f, d / f);
    }
    fs::copy_file(fixture_dir() / "config.json", d / "config.json");
    return d;
  }

  // Expects one clear error (exit 2) containing `needle` and no output file.
  void expect_error(const std::string& args, const std::string& needle) {
    const RunResult r = run(args);
    EXPECT_EQ(r.rc, 2) << args << "\n" << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << "expected '" << needle << "' in: " << r.err;
    EXPECT_NE(r.err.find("kvarn-eval: error: "), std::string::npos) << r.err;
    EXPECT_TRUE(leftovers(dir_).empty()) << args << ": left " << leftovers(dir_).front();
  }
};

const char* kTwoPrompts =
    "{\"id\": \"p-one\", \"text\": \"The lighthouse keeper climbed the stairs at dusk and lit "
    "the lamp, as he had done every evening for thirty years.\"}\n"
    "\n"
    "{\"id\": 7, \"text\": \"A write-ahead log appends every change before the data pages are "
    "modified, so a crash never loses an acknowledged transaction.\"}\n";

// Within fp16 rounding: |a - b| <= one fp16 step of the larger magnitude, plus the fp32
// difference of two implementations (runner vs transformers: different matmul blocking, ~1e-6
// relative, growing with depth), bounded relative to the row's largest magnitude (2e-5, i.e. far
// below that row's own fp16 step of 2^-11 = 4.9e-4).
void expect_fp16_close(const TileMatrix& a, const TileMatrix& b, const std::string& what) {
  ASSERT_EQ(a.rows(), b.rows()) << what;
  ASSERT_EQ(a.cols(), b.cols()) << what;
  double worst = 0;
  for (Eigen::Index i = 0; i < a.rows(); ++i) {
    const double row_max = std::max(a.row(i).cwiseAbs().maxCoeff(), b.row(i).cwiseAbs().maxCoeff());
    for (Eigen::Index j = 0; j < a.cols(); ++j) {
      const double x = a(i, j), y = b(i, j);
      const double tol =
          std::max(std::abs(x), std::abs(y)) * std::ldexp(1.0, -10) + 2e-5 * row_max + 6e-8;
      worst = std::max(worst, std::abs(x - y) / tol);
    }
  }
  EXPECT_LE(worst, 1.0) << what << ": differs by more than fp16 rounding";
}

// The number of filters on /sequences/000000/k (0: unfiltered; 2: shuffle + gzip).
int k_filters(const fs::path& tiles) {
  H5::H5File f(tiles.string(), H5F_ACC_RDONLY);
  return f.openDataSet("/sequences/000000/k").getCreatePlist().getNfilters();
}

TEST_F(CaptureTest, FixtureTextPromptsReadBackWithChecksAndProvenance) {
  const fs::path prompts = write("prompts.jsonl", kTwoPrompts);
  const fs::path out = dir_ / "tiles.h5";
  const RunResult r = run("capture --model " + fixture_dir().string() + " --prompts " +
                          prompts.string() + " --out " + out.string() +
                          " --layers 0,7 --query-heads 0,2 --generate 6 --ignore-eos "
                          "--max-tokens 40 --threads 2");
  ASSERT_EQ(r.rc, 0) << r.err;
  TileReader tr(out);
  const TileFileInfo& info = tr.info();
  EXPECT_EQ(info.model, "fixture-qwen3-h128");
  EXPECT_EQ(info.num_layers, 8);
  EXPECT_EQ(info.num_kv_heads, 2);
  EXPECT_EQ(info.num_q_heads, 4);
  EXPECT_EQ(info.head_dim, 128);
  ASSERT_TRUE(info.rope_theta.has_value());
  EXPECT_EQ(*info.rope_theta, 1e6);
  EXPECT_EQ(info.layers, (std::vector<int>{0, 7}));
  ASSERT_EQ(tr.num_sequences(), 2);
  EXPECT_EQ(tr.sequence(0).prompt_id, "p-one");
  EXPECT_EQ(tr.sequence(1).prompt_id, "7");
  for (int s = 0; s < 2; ++s) {
    EXPECT_TRUE(tr.sequence(s).has_k_pre_rope);
    EXPECT_TRUE(tr.sequence(s).has_q);
    EXPECT_EQ(tr.sequence(s).q_heads, (std::vector<int>{0, 2}));
    EXPECT_GT(tr.sequence(s).num_tokens, 6);
    EXPECT_LE(tr.sequence(s).num_tokens, 40);
  }
  tr.validate_values();
  const auto prov = nlohmann::json::parse(info.provenance);
  EXPECT_EQ(prov["tool"], "kvarn-eval capture");
  EXPECT_TRUE(prov.contains("git_commit"));
  EXPECT_EQ(prov["model"]["sha256"]["model.safetensors"],
            sha256_file_hex(fixture_dir() / "model.safetensors"));
  EXPECT_EQ(prov["prompts"]["sha256"], sha256_file_hex(prompts));
  EXPECT_EQ(prov["model"]["config"]["architectures"][0], "Qwen3ForCausalLM");
  EXPECT_EQ(prov["settings"]["generate"], 6);
  EXPECT_EQ(prov["settings"]["compression"], "none");
  EXPECT_EQ(k_filters(out), 0);
  ASSERT_EQ(prov["checks"].size(), 2u);
  for (const auto& c : prov["checks"]) {
    EXPECT_EQ(c["k_vs_cache"], 0.0);
    EXPECT_EQ(c["v_vs_cache"], 0.0);
    EXPECT_LE(c["rope_worst_over_tolerance"].get<double>(), 1.0);
  }
  ASSERT_EQ(prov["generation"].size(), 2u);
  EXPECT_EQ(prov["generation"][0]["generated"].get<int>() +
                prov["generation"][0]["prompt_tokens"].get<int>(),
            std::max(tr.sequence(0).num_tokens, prov["generation"][0]["prompt_tokens"].get<int>()));

  // Refuses to overwrite; --force replaces.
  const auto before = fs::last_write_time(out);
  const RunResult again = run("capture --model " + fixture_dir().string() + " --prompts " +
                              prompts.string() + " --out " + out.string());
  EXPECT_EQ(again.rc, 2);
  EXPECT_NE(again.err.find("refusing to overwrite"), std::string::npos) << again.err;
  EXPECT_EQ(fs::last_write_time(out), before);
  const RunResult forced =
      run("capture --model " + fixture_dir().string() + " --prompts " + prompts.string() +
          " --out " + out.string() + " --layers 3 --max-tokens 16 --force --compress");
  ASSERT_EQ(forced.rc, 0) << forced.err;
  EXPECT_EQ(TileReader(out).info().layers, (std::vector<int>{3}));
  EXPECT_EQ(k_filters(out), 2);
  EXPECT_EQ(nlohmann::json::parse(TileReader(out).info().provenance)["settings"]["compression"],
            "gzip-4+shuffle");

  // h5py reads it (the stats command of the Python tool).
  if (python_has("h5py, numpy")) {
    const RunResult st = run("stats " + out.string(), python_tool());
    EXPECT_EQ(st.rc, 0) << st.err;
    EXPECT_NE(st.out.find("first_token_attention_mass"), std::string::npos) << st.out;
  }
}

// The Python stand-in (transformers) on the same prompts: identical token ids, every tensor
// within fp16 rounding.
void compare_tile_files(const fs::path& ours, const fs::path& theirs) {
  TileReader a(ours), b(theirs);
  ASSERT_EQ(a.num_sequences(), b.num_sequences());
  EXPECT_EQ(a.info().layers, b.info().layers);
  EXPECT_EQ(a.info().head_dim, b.info().head_dim);
  for (int s = 0; s < a.num_sequences(); ++s) {
    ASSERT_EQ(a.token_ids(s), b.token_ids(s)) << "sequence " << s;
    EXPECT_EQ(a.sequence(s).prompt_id, b.sequence(s).prompt_id);
    EXPECT_EQ(a.sequence(s).q_heads, b.sequence(s).q_heads);
    for (int j = 0; j < a.info().num_captured_layers(); ++j) {
      for (int h = 0; h < a.info().num_kv_heads; ++h) {
        for (const char* ds : {"k", "v", "k_pre_rope"}) {
          expect_fp16_close(a.read(s, ds, j, h), b.read(s, ds, j, h),
                            "seq " + std::to_string(s) + " " + ds + " layer_index " +
                                std::to_string(j) + " head " + std::to_string(h));
        }
      }
      for (std::size_t h = 0; h < a.sequence(s).q_heads.size(); ++h) {
        expect_fp16_close(a.read(s, "q", j, static_cast<int>(h)),
                          b.read(s, "q", j, static_cast<int>(h)),
                          "seq " + std::to_string(s) + " q layer_index " + std::to_string(j));
      }
    }
  }
}

TEST_F(CaptureTest, FixtureMatchesPythonCaptureTiles) {
  if (!python_has("torch, transformers, h5py")) {
    GTEST_SKIP() << "python3 cannot import torch/transformers/h5py (scripts/install_deps.sh)";
  }
  const fs::path prompts = write("prompts.jsonl", kTwoPrompts);
  const std::string common = " --prompts " + prompts.string() +
                             " --layers 0,4,7 --query-heads 1,3 --generate 8 --max-tokens 48";
  const fs::path ours = dir_ / "ours.h5", theirs = dir_ / "theirs.h5";
  const RunResult r =
      run("capture --model " + fixture_dir().string() + common + " --out " + ours.string());
  ASSERT_EQ(r.rc, 0) << r.err;
  const RunResult p = run("capture --model " + fixture_dir().string() + common + " --out " +
                              theirs.string() + " --compress",
                          python_tool());
  ASSERT_EQ(p.rc, 0) << p.err;
  EXPECT_EQ(k_filters(ours), 0);
  EXPECT_EQ(k_filters(theirs), 2);
  compare_tile_files(ours, theirs);
}

TEST_F(CaptureTest, SmolLM2ChatMatchesPythonCaptureTiles) {
  const fs::path smol = test::smollm2_dir();
  if (!fs::exists(smol / "model.safetensors")) {
    GTEST_SKIP() << "SmolLM2 not prepared at " << smol
                 << " (python3 scripts/prepare_models.py; docs/models.md)";
  }
  if (!python_has("torch, transformers, h5py")) {
    GTEST_SKIP() << "python3 cannot import torch/transformers/h5py (scripts/install_deps.sh)";
  }
  const fs::path prompts = write("prompts.jsonl", kTwoPrompts);
  const std::string common = " --prompts " + prompts.string() +
                             " --ids 7 --chat --layers 0,17,29 --query-heads 0,4,8 "
                             "--generate 12 --max-tokens 72";
  const fs::path ours = dir_ / "ours.h5", theirs = dir_ / "theirs.h5";
  const RunResult r = run("capture --model " + smol.string() + common + " --out " + ours.string());
  ASSERT_EQ(r.rc, 0) << r.err;
  const RunResult p =
      run("capture --model " + smol.string() + common + " --out " + theirs.string(), python_tool());
  ASSERT_EQ(p.rc, 0) << p.err;
  compare_tile_files(ours, theirs);
  // The chat template starts with <|im_start|>system.
  EXPECT_EQ(TileReader(ours).token_ids(0).front(), 1);
}

// Tiny random checkpoints of every architecture (llama3 RoPE scaling, q/k/v bias, q/k norm,
// sliding window, fp16/bf16 storage, shards): token-id prompts, all checks pass.
TEST_F(CaptureTest, TinyRandomModelsOfEveryArchitecture) {
  std::string why;
  const fs::path ref = test::reference_dir(&why);
  if (ref.empty()) GTEST_SKIP() << why;
  std::string ids;
  for (int i = 0; i < 50; ++i) {
    if (i) ids += ',';
    ids += std::to_string((i * 37 + 11) % 200);
  }
  const fs::path prompts =
      write("ids.jsonl", "{\"id\": \"ids-a\", \"token_ids\": [" + ids + "]}\n");
  for (const char* name : {"llama3", "qwen2", "qwen3", "mistral", "llama_hd64"}) {
    SCOPED_TRACE(name);
    const fs::path model = ref / "models" / name;
    ASSERT_TRUE(fs::exists(model / "config.json")) << model;
    const fs::path out = dir_ / (std::string(name) + ".h5");
    const RunResult r = run("capture --model " + model.string() + " --prompts " + prompts.string() +
                            " --out " + out.string() + " --generate 10 --ignore-eos");
    ASSERT_EQ(r.rc, 0) << r.err;
    TileReader tr(out);
    EXPECT_EQ(tr.sequence(0).num_tokens, 60);
    EXPECT_EQ(tr.info().num_captured_layers(), tr.info().num_layers);
    const auto ids_back = tr.token_ids(0);
    EXPECT_EQ(ids_back[0], 11);
    tr.validate_values();
    const auto prov = nlohmann::json::parse(tr.info().provenance);
    EXPECT_EQ(prov["checks"][0]["k_vs_cache"], 0.0);
    EXPECT_LE(prov["checks"][0]["rope_worst_over_tolerance"].get<double>(), 1.0);
  }
}

TEST_F(CaptureTest, BadInputIsOneClearErrorAndLeavesNothing) {
  const fs::path prompts = write("prompts.jsonl", kTwoPrompts);
  const std::string out = " --out " + (dir_ / "out.h5").string();
  const std::string p = " --prompts " + prompts.string();
  const std::string fx = " --model " + fixture_dir().string();

  // Model directory problems.
  expect_error("capture --model " + (dir_ / "nope").string() + p + out,
               "model directory not found");
  fs::path d = fixture_copy("no_config");
  fs::remove(d / "config.json");
  expect_error("capture --model " + d.string() + p + out, "config.json");
  d = fixture_copy("bad_config");
  write("bad_config/config.json", "{\"architectures\": [\"Qwen3ForCausalLM\", ");
  expect_error("capture --model " + d.string() + p + out, "config.json");
  d = fixture_copy("gpt2");
  {
    auto cfg = nlohmann::json::parse(test::read_text(fixture_dir() / "config.json"));
    cfg["architectures"] = {"GPT2LMHeadModel"};
    write("gpt2/config.json", cfg.dump());
  }
  expect_error("capture --model " + d.string() + p + out, "GPT2LMHeadModel");
  d = fixture_copy("shape");
  {
    auto cfg = nlohmann::json::parse(test::read_text(fixture_dir() / "config.json"));
    cfg["intermediate_size"] = 1024;
    write("shape/config.json", cfg.dump());
  }
  expect_error("capture --model " + d.string() + p + out, "shape");
  d = fixture_copy("no_weights");
  fs::remove(d / "model.safetensors");
  expect_error("capture --model " + d.string() + p + out, "safetensors");
  d = fixture_copy("truncated");
  fs::remove(d / "model.safetensors");
  {
    std::ifstream in(fixture_dir() / "model.safetensors", std::ios::binary);
    std::vector<char> buf(1 << 20);
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    std::ofstream(d / "model.safetensors", std::ios::binary).write(buf.data(), in.gcount());
  }
  expect_error("capture --model " + d.string() + p + out, "model.safetensors");
  d = fixture_copy("no_tokenizer");
  fs::remove(d / "tokenizer.json");
  expect_error("capture --model " + d.string() + p + out, "p-one");
  d = fixture_copy("bad_tokenizer");
  fs::remove(d / "tokenizer.json");
  write("bad_tokenizer/tokenizer.json", "{\"model\": {\"type\": \"BPE\", ");
  expect_error("capture --model " + d.string() + p + out, "tokenizer.json");

  // Prompt problems: file:line, ids, context, vocabulary.
  const fs::path bad =
      write("bad.jsonl", "{\"id\": \"a\", \"text\": \"x\"}\n{\"id\": \"b\", tex\n");
  expect_error("capture" + fx + " --prompts " + bad.string() + out, "bad.jsonl:2: invalid JSON");
  const fs::path notext = write("notext.jsonl", "{\"id\": \"a\"}\n");
  expect_error("capture" + fx + " --prompts " + notext.string() + out, "notext.jsonl:1:");
  const fs::path dup = write("dup.jsonl",
                             "{\"id\": \"a\", \"text\": \"x\"}\n{\"id\": \"a\", "
                             "\"text\": \"y\"}\n");
  expect_error("capture" + fx + " --prompts " + dup.string() + out, "duplicate prompt id 'a'");
  expect_error("capture" + fx + p + " --ids p-one,nope" + out, "unknown prompt id(s) 'nope'");
  expect_error("capture" + fx + " --prompts " + (dir_ / "missing.jsonl").string() + out,
               "prompts file not found");
  std::string long_ids;
  for (int i = 0; i < 1100; ++i) {
    if (i) long_ids += ',';
    long_ids += std::to_string(5 + i % 100);
  }
  const fs::path longp =
      write("long.jsonl", "{\"id\": \"long\", \"token_ids\": [" + long_ids + "]}\n");
  expect_error("capture" + fx + " --prompts " + longp.string() + out,
               "exceed the model's context of 1024 tokens");
  const fs::path genlong =
      write("genlong.jsonl", "{\"id\": \"g\", \"token_ids\": [5, 6, 7, 8, 9, 10]}\n");
  expect_error("capture" + fx + " --prompts " + genlong.string() + " --generate 1020" + out,
               "generated exceed the model's context");
  const fs::path oov = write("oov.jsonl", "{\"id\": \"o\", \"token_ids\": [1, 2, 99999]}\n");
  expect_error("capture" + fx + " --prompts " + oov.string() + out,
               "oov.jsonl:1: prompt 'o': token id 99999 at index 2 is outside the vocabulary");

  // Selection problems.
  expect_error("capture" + fx + p + " --layers 0,8" + out, "--layers: index 8 out of range");
  expect_error("capture" + fx + p + " --layers 1,1" + out, "given twice");
  expect_error("capture" + fx + p + " --kv-heads 0" + out, "stores every KV head");
  expect_error("capture" + fx + p + " --query-heads x" + out, "--query-heads");
  expect_error("capture" + fx + p + " --chat" + out, "chat_template");
  expect_error("capture" + fx + p + " --device cuda:7" + out, "cuda");
}

TEST_F(CaptureTest, InterruptedCaptureLeavesNoFile) {
  const fs::path prompts = write("prompts.jsonl", kTwoPrompts);
  const fs::path out = dir_ / "out.h5";
  const fs::path err = dir_ / "err.txt";
  const std::string cmd = "'" + std::string(KVARN_EVAL_BIN) + "' capture --model " +
                          fixture_dir().string() + " --prompts " + prompts.string() + " --out " +
                          out.string() + " --generate 900 --ignore-eos --threads 1 >/dev/null " +
                          "2>'" + err.string() + "' & pid=$!; " +
                          // The signal goes once the capture logs that it is loading the model
                          // (its handlers are installed by then); 900 generated tokens are far
                          // longer than the poll interval.
                          "for i in $(seq 1200); do grep -q '^\\[capture\\] loading' '" +
                          err.string() + "' && break; sleep 0.05; done; " +
                          "kill -TERM $pid; wait $pid";
  const int status = std::system(cmd.c_str());
  const int rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  ASSERT_NE(rc, 0) << "the capture finished before the signal (it must still be generating): "
                   << test::read_text(err);
  EXPECT_EQ(rc, 2) << test::read_text(dir_ / "err.txt");
  EXPECT_NE(test::read_text(dir_ / "err.txt").find("interrupted"), std::string::npos)
      << test::read_text(dir_ / "err.txt");
  EXPECT_FALSE(fs::exists(out));
  EXPECT_TRUE(leftovers(dir_).empty());
}

}  // namespace
}  // namespace kvarn
