// Sweep engine in process: resume, determinism, fresh runs, --only, shards merged == unsharded,
// and what a case record and its arrays hold.
#include <H5Cpp.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <nlohmann/json.hpp>

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

class EngineTest : public TempDirTest {
 protected:
  void SetUp() override {
    TempDirTest::SetUp();
    devnull_ = std::fopen("/dev/null", "w");
  }
  void TearDown() override {
    std::fclose(devnull_);
    TempDirTest::TearDown();
  }
  SweepOptions quiet(int shard = 0, int of = 1) {
    SweepOptions o;
    o.report = false;
    o.log = devnull_;
    o.progress_tty = 0;
    o.shard_index = shard;
    o.shard_count = of;
    o.command = "test";
    return o;
  }
  SweepConfig config() {
    return load_config(small_config("  - fp16\n  - kivi_2bit\n  - kvarn_k4v2_g128\n"));
  }
  std::FILE* devnull_ = nullptr;
};

TEST_F(EngineTest, ResumeSkipsFinishedCasesAndSummariesAreStable) {
  const SweepConfig cfg = config();
  const SweepResult a = run_sweep(cfg, quiet());
  EXPECT_EQ(a.computed, 3);
  EXPECT_EQ(a.finished, 3);
  EXPECT_EQ(a.run_dir.filename().string(), "small-" + cfg.hash.substr(0, 12));
  const std::string jl = slurp_file(a.run_dir / "summary.jsonl");
  const std::string csv = slurp_file(a.run_dir / "summary.csv");
  ASSERT_FALSE(jl.empty());
  EXPECT_EQ(jl.find("timing"), std::string::npos);

  const SweepResult b = run_sweep(cfg, quiet());
  EXPECT_EQ(b.run_dir, a.run_dir);
  EXPECT_EQ(b.computed, 0);
  EXPECT_EQ(b.resumed, 3);
  EXPECT_EQ(slurp_file(b.run_dir / "summary.jsonl"), jl);

  // A lost case is recomputed, bit-identically.
  fs::remove(RunStore(a.run_dir).case_path(cfg.cases[1].id));
  const SweepResult c = run_sweep(cfg, quiet());
  EXPECT_EQ(c.computed, 1);
  EXPECT_EQ(slurp_file(c.run_dir / "summary.jsonl"), jl);

  // --fresh: a new directory, same summaries.
  SweepOptions fresh = quiet();
  fresh.fresh = true;
  const SweepResult d = run_sweep(cfg, fresh);
  EXPECT_EQ(d.run_dir.filename().string(), a.run_dir.filename().string() + "-2");
  EXPECT_EQ(d.computed, 3);
  EXPECT_EQ(slurp_file(d.run_dir / "summary.jsonl"), jl);
  EXPECT_EQ(slurp_file(d.run_dir / "summary.csv"), csv);
}

TEST_F(EngineTest, CaseRecordArraysAndProvenance) {
  // All 300 tokens of sequence 0: KVarN (sink 128, g 128) then quantizes one full tile.
  const SweepConfig cfg = load_config(
      small_config("  - fp16\n  - kivi_2bit\n  - kvarn_k4v2_g128\n"), {"data.max_tokens=0"});
  SweepOptions o = quiet();
  o.only = {cfg.cases[2].id};
  const SweepResult r = run_sweep(cfg, o);
  EXPECT_EQ(r.computed, 1);
  const RunStore store(r.run_dir);
  const json rec = read_json_file(store.case_path(cfg.cases[2].id));
  EXPECT_EQ(rec["spec"], cfg.cases[2].spec);
  EXPECT_NE(rec["command"].get<std::string>().find("kvarn-eval sweep "), std::string::npos);
  EXPECT_NE(rec["command"].get<std::string>().find("--only " + cfg.cases[2].id), std::string::npos);
  EXPECT_TRUE(rec["timing"].contains("seconds"));
  EXPECT_TRUE(fs::exists(r.run_dir / "provenance" /
                         (rec["provenance_digest"].get<std::string>() + ".json")));
  const json prov = read_json_file(r.run_dir / "provenance.json");
  for (const char* k : {"git", "build_type", "compiler", "libraries", "cpu", "attention_gemm",
                        "hostname", "date", "seeds", "command"}) {
    EXPECT_TRUE(prov.contains(k)) << k;
  }
  EXPECT_EQ(rec["slabs"].size(), 4u);      // 1 sequence x 2 layers x 2 KV heads
  EXPECT_EQ(rec["attention"].size(), 4u);  // one report per KV head
  bool stage_row = false, kl_row = false;
  for (const json& row : rec["rows"]) {
    stage_row = stage_row || row["metric"] == "key.stage.rotation.nmse";
    kl_row = kl_row || (row["metric"] == "attention.kl.mean" && row["layer"] == "all");
  }
  EXPECT_TRUE(stage_row);
  EXPECT_TRUE(kl_row);
  H5::H5File f(store.arrays_path(cfg.cases[2].id).string(), H5F_ACC_RDONLY);
  EXPECT_TRUE(f.nameExists("attention"));
  H5::DataSet kl = f.openDataSet("attention/kl_layer_head");
  hsize_t dims[2];
  kl.getSpace().getSimpleExtentDims(dims);
  EXPECT_EQ(dims[0], 2u);  // layers
  EXPECT_EQ(dims[1], 2u);  // captured query heads
  EXPECT_TRUE(f.nameExists("key"));
  EXPECT_THROW(
      {
        SweepOptions bad = quiet();
        bad.only = {"c999-zzzz"};
        run_sweep(cfg, bad);
      },
      Error);
}

TEST_F(EngineTest, MergedShardsEqualUnshardedRun) {
  const SweepConfig cfg = config();
  const SweepResult whole = run_sweep(cfg, quiet());
  const SweepResult s0 = run_sweep(cfg, quiet(0, 2));
  const SweepResult s1 = run_sweep(cfg, quiet(1, 2));
  EXPECT_EQ(s0.run_dir.filename().string(), whole.run_dir.filename().string() + "-shard-0-of-2");
  EXPECT_EQ(s0.computed, 2);  // cases 0 and 2
  EXPECT_EQ(s1.computed, 1);
  EXPECT_TRUE(fs::exists(s0.run_dir / "shard.json"));
  const auto [done, total] = merge_runs(dir_ / "merged", {s0.run_dir, s1.run_dir});
  EXPECT_EQ(done, 3);
  EXPECT_EQ(total, 3);
  EXPECT_EQ(slurp_file(dir_ / "merged" / "summary.jsonl"),
            slurp_file(whole.run_dir / "summary.jsonl"));
  EXPECT_EQ(slurp_file(dir_ / "merged" / "summary.csv"), slurp_file(whole.run_dir / "summary.csv"));
  // Shards of another config are refused.
  const SweepConfig other = load_config(small_config("  - fp16\n", "", "other"));
  const SweepResult o = run_sweep(other, quiet());
  EXPECT_THROW(merge_runs(dir_ / "merged2", {s0.run_dir, o.run_dir}), Error);
}

TEST(Shard, Parse) {
  EXPECT_EQ(parse_shard("1/4"), std::make_pair(1, 4));
  EXPECT_THROW(parse_shard("4/4"), Error);
  EXPECT_THROW(parse_shard("a/b"), Error);
  EXPECT_THROW(parse_shard("1"), Error);
}

}  // namespace
}  // namespace kvarn
