// Result files of the real CLI compared byte for byte: a sweep SIGKILLed at >= 20 random moments
// and resumed each time, a run with OMP_NUM_THREADS=1 against one with 2, and shards merged against
// the unsharded run all give the same files as one uninterrupted run. Only the fields listed in
// docs/results.md ("What a byte comparison excludes") may differ.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>
#include <vector>

#include "cli_test_util.hpp"
#include "kvarn/data/error.hpp"
#include "kvarn/sweeps/store.hpp"
#include "sweep_test_util.hpp"

namespace kvarn {
namespace {

using nlohmann::json;
using testing_util::slurp_file;
using testing_util::spawn_cli;
using testing_util::TempDirTest;
using testing_util::wait_for;
namespace fs = std::filesystem;

int run_cli(const std::vector<std::string>& args, int threads = 1) {
  testing_util::CliOptions o;
  o.threads = threads;
  return testing_util::run_cli(args, o);
}

// The files of a finished run as compared: path relative to the run -> content. Provenance
// (host, date, command line) is left out; case records lose "timing" and "provenance_digest".
std::map<std::string, std::string> comparable_files(const fs::path& run) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(run)) {
    if (!e.is_regular_file()) continue;
    const std::string rel = fs::relative(e.path(), run).string();
    if (rel == "provenance.json" || rel.rfind("provenance/", 0) == 0 || rel == "shard.json") {
      continue;
    }
    std::string text = slurp_file(e.path());
    if (rel.rfind("cases/", 0) == 0) {
      json rec = json::parse(text);
      rec.erase("timing");
      rec.erase("provenance_digest");
      text = rec.dump(1);
    }
    out[rel] = text;
  }
  return out;
}

void expect_same_results(const fs::path& expected, const fs::path& actual) {
  const auto a = comparable_files(expected), b = comparable_files(actual);
  ASSERT_FALSE(a.empty());
  for (const auto& [rel, text] : a) {
    const auto it = b.find(rel);
    if (it == b.end()) {
      ADD_FAILURE() << actual / rel << " is missing";
      continue;
    }
    EXPECT_TRUE(it->second == text) << actual / rel << " differs from " << expected / rel;
  }
  for (const auto& [rel, text] : b) EXPECT_TRUE(a.count(rel)) << actual / rel << " is extra";
}

// No temporary, lock or unparsable JSON file is left in a finished run.
void expect_no_leftovers(const fs::path& run) {
  for (const auto& e : fs::recursive_directory_iterator(run)) {
    const std::string name = e.path().filename().string();
    EXPECT_EQ(name.find(".tmp"), std::string::npos) << e.path();
    EXPECT_NE(name, ".lock") << e.path();
    if (e.path().extension() == ".json") {
      EXPECT_FALSE(json::parse(slurp_file(e.path()), nullptr, false).is_discarded()) << e.path();
    }
  }
}

fs::path only_entry(const fs::path& dir) {
  std::vector<fs::path> entries;
  for (const auto& e : fs::directory_iterator(dir)) entries.push_back(e.path());
  EXPECT_EQ(entries.size(), 1u) << dir;
  return entries.empty() ? fs::path() : entries.front();
}

// True when `runs` holds a run whose invocation got to its summaries.
bool finished(const fs::path& runs) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(runs, ec)) {
    if (fs::exists(e.path() / "summary.csv")) return true;
  }
  return false;
}

class KillDeterminismTest : public TempDirTest {
 protected:
  // Methods of every family, arrays on (the default): HDF5 and JSON results are both compared.
  fs::path config() {
    return small_config(
        "  - fp16\n  - fp8_e4m3\n  - kivi_2bit\n  - quarot_k4v4\n  - turboquant_3bit_nc\n"
        "  - kvarn_k4v2_g128\n",
        "", "det");
  }
  // Runs the config once into runs/ and moves the run to `name`; returns its path.
  fs::path reference_run(const fs::path& cfg, const std::string& name, int threads = 1) {
    EXPECT_EQ(run_cli({"sweep", cfg.string(), "--no-report"}, threads), 0);
    const fs::path run = only_entry(dir_ / "runs");
    fs::create_directories(dir_ / name);
    fs::rename(run, dir_ / name / run.filename());
    return dir_ / name / run.filename();
  }
};

TEST_F(KillDeterminismTest, KilledAtRandomMomentsResumesToIdenticalFiles) {
  const fs::path cfg = config();
  const auto t0 = std::chrono::steady_clock::now();
  const fs::path clean = reference_run(cfg, "clean");
  const auto full_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  expect_no_leftovers(clean);

  // Kill points spread over the whole run: each attempt runs a random fraction of a full run's
  // time, so finished cases accumulate slowly and kills land in start-up, case computation,
  // atomic writes and summary writing alike.
  std::mt19937 rng(20261201);
  std::uniform_int_distribution<long> delay_ms(5, std::max<long>(40, full_ms / 5));
  int kills = 0;
  for (int attempt = 0; attempt < 80 && kills < 24; ++attempt) {
    const pid_t pid = spawn_cli({"sweep", cfg.string(), "--no-report"});
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms(rng)));
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == 0 && ::kill(pid, SIGKILL) == 0) {
      ++kills;
      wait_for(pid);
    }
    // A run that finished before its kill point is started over, so kills keep landing mid-run.
    if (finished(dir_ / "runs") && kills < 24) fs::remove_all(dir_ / "runs");
  }
  ASSERT_GE(kills, 20) << "kill points that hit a running sweep";
  std::printf("%d SIGKILLs over a %lld ms run\n", kills, static_cast<long long>(full_ms));
  ASSERT_EQ(run_cli({"sweep", cfg.string(), "--no-report"}), 0);
  const fs::path resumed = only_entry(dir_ / "runs");
  EXPECT_EQ(resumed.filename(), clean.filename());
  expect_same_results(clean, resumed);
  expect_no_leftovers(resumed);
}

TEST_F(KillDeterminismTest, OneAndTwoThreadsGiveIdenticalFiles) {
  const fs::path cfg = config();
  const fs::path one = reference_run(cfg, "one", 1);
  const fs::path two = reference_run(cfg, "two", 2);
  expect_same_results(one, two);
}

#if KVARN_HAVE_RUNNER
// The model loop (libtorch, intra-op threads from OMP_NUM_THREADS with accumulation.threads 0).
TEST_F(KillDeterminismTest, OneAndTwoThreadsGiveIdenticalFilesWithTheModel) {
  const fs::path model = fs::path(KVARN_SOURCE_DIR) / "data" / "models" / "fixture-qwen3-h128";
  if (!fs::exists(model / "model.safetensors")) GTEST_SKIP() << "fixture model absent: " << model;
  const fs::path cfg = small_config(
      "  - fp16\n  - kivi_2bit\n",
      "accumulation:\n  enabled: true\n  model: " + model.string() +
          "\n  prompts: " + (fs::path(KVARN_SOURCE_DIR) / "data/prompts/mixed.jsonl").string() +
          "\n  block: 16\n  context: 48\n  decode_steps: 6\n  threads: 0\n",
      "det_model");
  const fs::path one = reference_run(cfg, "one", 1);
  const fs::path two = reference_run(cfg, "two", 2);
  expect_same_results(one, two);
}
#endif

TEST_F(KillDeterminismTest, MergedShardsGiveTheUnshardedFiles) {
  const fs::path cfg = config();
  const fs::path whole = reference_run(cfg, "whole");
  for (const char* shard : {"0/3", "1/3", "2/3"}) {
    ASSERT_EQ(run_cli({"sweep", cfg.string(), "--no-report", "--shard", shard}), 0);
  }
  std::vector<std::string> args{"merge", (dir_ / "merged" / whole.filename()).string()};
  for (const auto& e : fs::directory_iterator(dir_ / "runs")) args.push_back(e.path().string());
  ASSERT_EQ(args.size(), 5u);
  ASSERT_EQ(run_cli(args), 0);
  expect_same_results(whole, dir_ / "merged" / whole.filename());
  expect_no_leftovers(dir_ / "merged" / whole.filename());
}

TEST_F(KillDeterminismTest, LockFileIsRemovedWhenReleasedAndTakenOverAfterAKill) {
  fs::create_directories(dir_ / "run");
  { RunLock lock(dir_ / "run"); }
  EXPECT_FALSE(fs::exists(dir_ / "run" / ".lock"));
  // A killed holder leaves the file behind, unlocked: the next process takes it and removes it.
  testing_util::write_file(dir_ / "run" / ".lock", "");
  {
    RunLock lock(dir_ / "run");
    EXPECT_THROW(RunLock second(dir_ / "run"), Error);
  }
  EXPECT_FALSE(fs::exists(dir_ / "run" / ".lock"));
}

}  // namespace
}  // namespace kvarn
