// Model-level quality (kvarn/runner/quality.hpp): KLD closed forms, perplexity against an
// independent float64 computation on the fixture model, fp16 in the loop giving exactly zero,
// window / bucket bookkeeping at the boundaries and reuse of the cached fp16 log-probs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>

#include "cuda_load.hpp"
#include "kvarn/core/registry.hpp"
#include "kvarn/data/error.hpp"
#include "kvarn/eval/position_buckets.hpp"
#include "kvarn/runner/quality.hpp"
#include "runner_test_util.hpp"
#include "temp_dir_test.hpp"

namespace kvarn {
namespace {

namespace fs = std::filesystem;

std::string bytes_of(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(QualityKld, IdenticalRowsGiveExactlyZero) {
  const std::vector<float> logits = {1.5f, -2.0f, 0.25f, 3.0f, -0.5f};
  std::vector<float> lp(logits.size());
  log_softmax_row(logits, lp);
  EXPECT_EQ(kl_from_log_probs(lp, lp), 0.0);
  double total = 0;
  for (float x : lp) total += std::exp(static_cast<double>(x));
  EXPECT_NEAR(total, 1.0, 1e-6);
}

TEST(QualityKld, KnownPairMatchesClosedForm) {
  // p = (1/2, 1/2), q = (1/4, 3/4): KL = 1/2 ln 2 + 1/2 ln(2/3).
  const std::vector<float> lp = {std::log(0.5f), std::log(0.5f)};
  const std::vector<float> lq = {std::log(0.25f), std::log(0.75f)};
  EXPECT_NEAR(kl_from_log_probs(lp, lq), 0.5 * std::log(2.0) + 0.5 * std::log(2.0 / 3.0), 1e-7);
  // Logits shifted by a constant give the same distribution: log_softmax removes the shift.
  const std::vector<float> a = {0.0f, std::log(3.0f)}, b = {10.0f, 10.0f + std::log(3.0f)};
  std::vector<float> la(2), lb(2);
  log_softmax_row(a, la);
  log_softmax_row(b, lb);
  EXPECT_NEAR(la[0], std::log(0.25), 1e-6);
  EXPECT_NEAR(kl_from_log_probs(la, lb), 0.0, 1e-7);
  EXPECT_THROW(kl_from_log_probs(la, std::vector<float>(3)), Error);
}

TEST(QualityWindows, BoundariesAndCounts) {
  std::vector<std::int32_t> ids(10);
  std::iota(ids.begin(), ids.end(), 0);
  const auto all = quality_windows(ids, 3, 0);
  ASSERT_EQ(all.size(), 3u);  // the last token (9) fits no full window
  EXPECT_EQ(all[0].front(), 0);
  EXPECT_EQ(all[0].back(), 2);
  EXPECT_EQ(all[2].front(), 6);
  EXPECT_EQ(all[2].back(), 8);
  EXPECT_EQ(quality_windows(ids, 3, 2).size(), 2u);
  EXPECT_EQ(quality_windows(ids, 10, 1).size(), 1u);
  EXPECT_THROW(quality_windows(ids, 3, 4), Error);
  EXPECT_THROW(quality_windows(ids, 11, 0), Error);
  EXPECT_THROW(quality_windows(ids, 1, 0), Error);
}

// Synthetic windows: statistics, bucket filters at their edges, bootstrap bounds.
TEST(QualityStatistics, PooledStatisticsAndBucketEdges) {
  std::vector<QualityWindow> ws(4);
  for (int w = 0; w < 4; ++w) {
    for (int t = 0; t < 10; ++t) {
      ws[w].kld.push_back(0.01 * (t + 1) + 0.001 * w);
      ws[w].nll_ref.push_back(2.0);
      ws[w].nll.push_back(2.0 + 0.1 * (t >= 5));
      ws[w].same_top1.push_back(t % 2);
      ws[w].distance.push_back(t < 3 ? kReadsNoQuantizedToken : t - 3);
    }
  }
  auto find = [](const std::vector<QualityStat>& st, const std::string& name) {
    for (const QualityStat& s : st)
      if (s.name == name) return s;
    ADD_FAILURE() << "no statistic " << name;
    return QualityStat{};
  };
  const auto all = quality_statistics(ws, [](int, int) { return true; });
  EXPECT_EQ(find(all, "tokens").value, 40);
  EXPECT_NEAR(find(all, "ppl_ref").value, std::exp(2.0), 1e-12);
  EXPECT_NEAR(find(all, "ppl_ratio").value, std::exp(0.05), 1e-12);
  EXPECT_NEAR(find(all, "same_top1").value, 50.0, 1e-12);
  EXPECT_NEAR(find(all, "kld.max").value, 0.103, 1e-12);
  const QualityStat mean = find(all, "kld.mean");
  EXPECT_NEAR(mean.value, 0.055 + 0.0015, 1e-12);
  EXPECT_LE(mean.lo, mean.value);
  EXPECT_GE(mean.hi, mean.value);
  EXPECT_GT(mean.hi, mean.lo);  // windows differ
  // Position bucket [5, 10): exactly 5 predictions per window, edges included / excluded.
  const auto b = quality_statistics(ws, [](int t, int) { return t >= 5 && t < 10; });
  EXPECT_EQ(find(b, "tokens").value, 20);
  EXPECT_NEAR(find(b, "ppl_ratio").value, std::exp(0.1), 1e-12);
  // Rows reading a quantized token (distance >= 0): t >= 3.
  const auto q = quality_statistics(ws, [](int, int d) { return d >= 0; });
  EXPECT_EQ(find(q, "tokens").value, 28);
  EXPECT_TRUE(quality_statistics(ws, [](int, int) { return false; }).empty());
  // One window: no interval.
  const auto one = quality_statistics({ws[0]}, [](int, int) { return true; });
  EXPECT_TRUE(std::isnan(find(one, "kld.mean").lo));
}

class QualityRun : public kvarn::testing::TempDirTest {
 protected:
  void SetUp() override {
    if (!fs::exists(test::fixture_dir() / "model.safetensors")) {
      FAIL() << "committed fixture missing: " << test::fixture_dir();
    }
    LoadOptions lo;
    lo.num_threads = 1;
    model_ = Model::load(test::fixture_dir(), lo);
    TempDirTest::SetUp();
    // Deterministic varied token ids within the vocabulary.
    tokens_.resize(kWindow);
    for (int i = 0; i < kWindow; ++i) tokens_[i] = (i * 7919 + 13) % 12000 + 5;
  }
  QualityOptions options() const {
    QualityOptions o;
    o.window = kWindow;
    o.block = 16;
    return o;
  }

  static constexpr int kWindow = 300;
  std::unique_ptr<Model> model_;
  std::vector<std::int32_t> tokens_;
};

TEST_F(QualityRun, Fp16InTheLoopGivesZeroKldAndIdenticalPerplexity) {
  const QualityReference ref =
      QualityReference::make(*model_, tokens_, options(), dir_ / "ref.f32", "k");
  const auto fp16 = make_method("fp16");
  const QualityWindow w = run_quality_window(*model_, ref, tokens_, *fp16, options());
  ASSERT_EQ(w.size(), kWindow - 1);
  for (int t = 0; t < w.size(); ++t) {
    ASSERT_EQ(w.kld[t], 0.0) << t;
    ASSERT_EQ(w.nll[t], w.nll_ref[t]) << t;
    ASSERT_EQ(w.same_top1[t], 1) << t;
    ASSERT_EQ(w.distance[t], kReadsNoQuantizedToken) << t;
  }
  // A quantizing method differs, and its rows read quantized tokens once a chunk is flushed:
  // KVarN (sink 128, chunk 128) flushes at 256 tokens; a block starting at p0 reads p0 tokens.
  const auto kvarn = make_method("kvarn_k4v2_g128");
  const QualityWindow q = run_quality_window(*model_, ref, tokens_, *kvarn, options());
  EXPECT_EQ(q.distance[255], kReadsNoQuantizedToken);
  EXPECT_EQ(q.distance[256], 1);  // block [256, 272) reads chunk [128, 256): newest 255
  EXPECT_EQ(q.distance[271], 16);
  double after = 0;
  for (int t = 256; t < q.size(); ++t) after += q.kld[t];
  EXPECT_GT(after, 0.0);
}

// PPL = exp(mean NLL), the NLL computed here in float64 from the model's logits.
TEST_F(QualityRun, PerplexityMatchesIndependentFloat64) {
  const QualityReference ref =
      QualityReference::make(*model_, tokens_, options(), dir_ / "ref.f32", "k");
  const QualityWindow w =
      run_quality_window(*model_, ref, tokens_, *make_method("fp16"), options());
  ModelKvCache cache = model_->make_cache("exact_fp16");
  double nll = 0;
  for (int start = 0; start < kWindow; start += 16) {
    ForwardOptions fo;
    fo.logits = LogitsMode::kAll;
    // The last block is short (300 = 18 x 16 + 12): never read past the window.
    const std::size_t n = static_cast<std::size_t>(std::min(16, kWindow - start));
    const ForwardResult r =
        model_->forward(cache, std::span<const std::int32_t>(tokens_).subspan(start, n), fo);
    for (int i = 0; i < r.tokens && start + i + 1 < kWindow; ++i) {
      double m = -1e300, s = 0;
      for (Eigen::Index j = 0; j < r.logits.cols(); ++j) m = std::max(m, double(r.logits(i, j)));
      for (Eigen::Index j = 0; j < r.logits.cols(); ++j) s += std::exp(double(r.logits(i, j)) - m);
      nll += m + std::log(s) - double(r.logits(i, tokens_[start + i + 1]));
    }
  }
  const double ppl = std::exp(nll / (kWindow - 1));
  const auto st = quality_statistics({w, w}, [](int, int) { return true; });
  for (const QualityStat& s : st) {
    if (s.name == "ppl_ref" || s.name == "ppl") {
      EXPECT_NEAR(s.value / ppl, 1.0, 1e-6) << s.name;
    }
  }
  EXPECT_GT(ppl, 1.0);
}

TEST_F(QualityRun, ReferenceFileIsReusedByteForByte) {
  const fs::path file = dir_ / "ref.f32";
  const QualityReference a = QualityReference::make(*model_, tokens_, options(), file, "key-1");
  EXPECT_FALSE(a.reused());
  EXPECT_EQ(a.bytes(), fs::file_size(file));
  EXPECT_GE(a.bytes(), std::uint64_t{4} * (kWindow - 1) * 12288);
  const std::string first = bytes_of(file);
  const auto mtime = fs::last_write_time(file);
  const QualityReference b = QualityReference::make(*model_, tokens_, options(), file, "key-1");
  EXPECT_TRUE(b.reused());
  EXPECT_EQ(fs::last_write_time(file), mtime);
  EXPECT_EQ(bytes_of(file), first);
  std::vector<float> ra(12288), rb(12288);
  a.read(100, 1, ra.data());
  b.read(100, 1, rb.data());
  EXPECT_EQ(ra, rb);
  // Another key (model, text, window, block or policy changed): recomputed, not reused.
  const QualityReference c = QualityReference::make(*model_, tokens_, options(), file, "key-2");
  EXPECT_FALSE(c.reused());
  EXPECT_EQ(bytes_of(file).size(), first.size());
  // A truncated file is recomputed too.
  fs::resize_file(file, 100);
  EXPECT_FALSE(QualityReference::make(*model_, tokens_, options(), file, "key-2").reused());
  EXPECT_THROW(a.read(kWindow - 1, 1, ra.data()), Error);
}

TEST_F(QualityRun, OneLayerMethodQuantizesOnlyItsLayer) {
  const auto kvarn = make_method("kvarn_k4v2_g128");
  const auto one = one_layer_method(*kvarn, 3);
  for (int l = 0; l < 8; ++l) {
    const auto codec = one->make_codec(StreamKind::kKey, 128, LayerContext{l, 8});
    EXPECT_EQ(codec->code_bits() < 16.0, l == 3) << l;
  }
  const QualityReference ref =
      QualityReference::make(*model_, tokens_, options(), dir_ / "ref.f32", "k");
  const QualityWindow w = run_quality_window(*model_, ref, tokens_, *one, options());
  EXPECT_EQ(w.distance[256], 1);
  double kl = 0;
  for (double x : w.kld) kl += x;
  EXPECT_GT(kl, 0.0);
}

// On CUDA: fp16 in the loop is exactly zero there too, and a method's KLD and perplexity agree
// with the CPU run (the GPU's matmuls differ in rounding, not in what is measured).
TEST(QualityCuda, Fp16ExactAndMethodMatchesCpu) {
  ASSERT_TRUE(fs::exists(test::fixture_dir() / "model.safetensors")) << test::fixture_dir();
  KVARN_CUDA_MODEL_OR_SKIP(gpu, test::fixture_dir());
  const auto cpu = Model::load(test::fixture_dir());
  std::vector<std::int32_t> tokens(300);
  for (int i = 0; i < 300; ++i) tokens[i] = (i * 7919 + 13) % 12000 + 5;
  QualityOptions o;
  o.window = 300;
  o.block = 16;
  const fs::path dir =
      fs::temp_directory_path() / ("kvarn_quality_cuda_" + std::to_string(::getpid()));
  const QualityReference rg = QualityReference::make(*gpu, tokens, o, dir / "gpu.f32", "gpu");
  const QualityReference rc = QualityReference::make(*cpu, tokens, o, dir / "cpu.f32", "cpu");
  const QualityWindow f = run_quality_window(*gpu, rg, tokens, *make_method("fp16"), o);
  for (int t = 0; t < f.size(); ++t) {
    ASSERT_EQ(f.kld[t], 0.0) << t;
    ASSERT_EQ(f.nll[t], f.nll_ref[t]) << t;
  }
  const auto kvarn = make_method("kvarn_k4v2_g128");
  const QualityWindow g = run_quality_window(*gpu, rg, tokens, *kvarn, o);
  const QualityWindow c = run_quality_window(*cpu, rc, tokens, *kvarn, o);
  const auto all = [](int, int) { return true; };
  const auto sg = quality_statistics({g, g}, all), sc = quality_statistics({c, c}, all);
  ASSERT_EQ(sg.size(), sc.size());
  for (std::size_t i = 0; i < sg.size(); ++i) {
    if (sg[i].name == "kld.mean" || sg[i].name == "ppl" || sg[i].name == "ppl_ref") {
      EXPECT_NEAR(sg[i].value, sc[i].value, 0.05 * std::abs(sc[i].value) + 1e-6) << sg[i].name;
    }
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kvarn
