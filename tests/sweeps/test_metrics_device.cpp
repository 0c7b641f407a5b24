// `metrics.device` (docs/config-schema.md): parsing, the run hash, and a sweep with the attention
// metrics on the GPU giving the CPU sweep's summaries (skips without a CUDA device).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "kvarn/data/error.hpp"
#include "kvarn/eval/attention.hpp"
#include "kvarn/sweeps/config.hpp"
#include "kvarn/sweeps/engine.hpp"
#include "sweep_test_util.hpp"

namespace kvarn {
namespace {

using nlohmann::json;
using testing_util::slurp_file;
using testing_util::TempDirTest;
namespace fs = std::filesystem;

class MetricsDeviceTest : public TempDirTest {
 protected:
  std::string error_of(const std::vector<std::string>& sets) {
    try {
      load_config(small_config("  - fp16\n"), sets);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
};

TEST_F(MetricsDeviceTest, ParsedValidatedAndHashedOnlyWhenNotCpu) {
  const SweepConfig plain = load_config(small_config("  - fp16\n"));
  EXPECT_EQ(plain.metrics.device, "cpu");
  EXPECT_FALSE(plain.resolved["metrics"].contains("device"));
  const SweepConfig cpu = load_config(small_config("  - fp16\n"), {"metrics.device=cpu"});
  EXPECT_EQ(cpu.hash, plain.hash);  // the default keeps older runs' hash
  const std::string bad = error_of({"metrics.device=gpu"});
  EXPECT_NE(bad.find("key 'metrics.device' (from --set): expected cpu or cuda"), std::string::npos)
      << bad;
  if (attention_cuda_built()) {
    const SweepConfig cuda = load_config(small_config("  - fp16\n"), {"metrics.device=cuda"});
    EXPECT_EQ(cuda.metrics.device, "cuda");
    EXPECT_EQ(cuda.resolved["metrics"]["device"], "cuda");
    EXPECT_NE(cuda.hash, plain.hash);
  } else {
    const std::string e = error_of({"metrics.device=cuda"});
    EXPECT_NE(e.find("cuda needs kvarn-eval built with CUDA"), std::string::npos) << e;
  }
}

// Summary rows of a run, one JSON object per line.
std::vector<json> summary_rows(const SweepResult& r) {
  std::vector<json> rows;
  std::istringstream in(slurp_file(r.run_dir / "summary.jsonl"));
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) rows.push_back(json::parse(line));
  return rows;
}

TEST_F(MetricsDeviceTest, CudaSweepGivesTheCpuSummaries) {
  if (!attention_cuda_built()) GTEST_SKIP() << "kvarn_eval was built without kvarn_cuda";
  if (attention_cuda_devices() == 0) GTEST_SKIP() << "no CUDA device";
  std::FILE* devnull = std::fopen("/dev/null", "w");
  SweepOptions o;
  o.report = false;
  o.log = devnull;
  o.progress_tty = 0;
  o.command = "test";
  o.fresh = true;
  const fs::path cfg_path = small_config("  - kivi_2bit\n  - kvarn_k4v2_g128\n");
  const SweepResult cpu = run_sweep(load_config(cfg_path), o);
  const SweepResult gpu = run_sweep(load_config(cfg_path, {"metrics.device=cuda"}), o);
  std::fclose(devnull);
  const std::vector<json> a = summary_rows(cpu), b = summary_rows(gpu);
  ASSERT_EQ(a.size(), b.size());
  int attention_rows = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    for (const char* key : {"spec", "data", "metric", "scope", "layer", "head"})
      ASSERT_EQ(a[i][key], b[i][key]) << "row " << i << " " << key;
    const std::string metric = a[i]["metric"];
    attention_rows += metric.rfind("attention.", 0) == 0;
    if (!a[i]["value"].is_number()) {
      EXPECT_EQ(a[i]["value"], b[i]["value"]) << metric;
      continue;
    }
    const double x = a[i]["value"], y = b[i]["value"];
    EXPECT_LE(std::fabs(x - y), 1e-9 * std::fabs(x) + 1e-12)
        << metric << ": cpu " << x << " gpu " << y;
  }
  EXPECT_GT(attention_rows, 0);
}

}  // namespace
}  // namespace kvarn
