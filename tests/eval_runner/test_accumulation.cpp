// Error accumulation (pseudo-decode, teacher-forced and free-running decode) on the tiny random
// llama_hd64 model of make_reference.py: what the protocols guarantee by construction.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <numeric>
#include <utility>

#include "cuda_load.hpp"
#include "kvarn/data/error.hpp"
#include "kvarn/runner/accumulation.hpp"
#include "kvarn/runner/kv_cache.hpp"
#include "kvarn/runner/model.hpp"
#include "runner_test_util.hpp"

namespace kvarn {
namespace {

constexpr const char* kSmallKivi = "kivi:bits=2,group=8,residual=8";

class Accumulation : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string why;
    const auto dir = test::reference_dir(&why);
    if (dir.empty()) {
      skip_ = why;
      return;
    }
    model_ = Model::load(dir / "models" / "llama_hd64").release();
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }
  void SetUp() override {
    if (model_ == nullptr) GTEST_SKIP() << skip_;
  }
  static AccumulationOptions options() {
    AccumulationOptions o;
    o.block = 8;
    o.context = 40;
    o.decode_steps = 12;
    o.seed = 7;
    o.temperature = 1.0;  // a random model is flat: high-entropy sampling diverges quickly
    o.top_p = 0.9;
    return o;
  }
  static std::vector<std::int32_t> prompt() {
    std::vector<std::int32_t> p(10);
    std::iota(p.begin(), p.end(), 3);
    return p;
  }
  static Model* model_;
  static std::string skip_;
};
Model* Accumulation::model_ = nullptr;
std::string Accumulation::skip_;

void expect_free_run_consistent(const FreeRunResult& f, int steps) {
  ASSERT_EQ(static_cast<int>(f.tokens.size()), steps);
  ASSERT_EQ(static_cast<int>(f.tokens_ref.size()), steps);
  int agree = 0;
  for (int t = 0; t < steps; ++t) agree += f.tokens[t] == f.tokens_ref[t];
  EXPECT_DOUBLE_EQ(f.token_agreement, static_cast<double>(agree) / steps);
  ASSERT_GE(f.first_divergence, 0);
  ASSERT_LE(f.first_divergence, steps);
  for (int t = 0; t < f.first_divergence; ++t) EXPECT_EQ(f.tokens[t], f.tokens_ref[t]) << t;
  if (f.first_divergence < steps) {
    EXPECT_NE(f.tokens[f.first_divergence], f.tokens_ref[f.first_divergence]);
  }
  for (int t = 0; t < steps; ++t) {
    if (t <= f.first_divergence) {
      EXPECT_TRUE(std::isfinite(f.kl[t]) && f.kl[t] >= 0) << t;
    } else {
      EXPECT_TRUE(std::isnan(f.kl[t])) << "KL after the prefixes differ must be NaN, step " << t;
    }
  }
}

TEST_F(Accumulation, Fp16MethodHasZeroErrorAndIdenticalTokens) {
  const AccumulationOptions o = options();
  const AccumulationReference ref = accumulation_reference(*model_, prompt(), o);
  ASSERT_EQ(static_cast<int>(ref.context.size()), o.context);
  EXPECT_EQ(ref.prompt_tokens, 10);
  const AccumulationResult r = run_accumulation(*model_, ref, "fp16", o);
  ASSERT_TRUE(r.has_pseudo && r.has_teacher && r.has_greedy && r.has_sampled);
  ASSERT_EQ(r.pseudo.context_len, (std::vector<int>{8, 16, 24, 32, 40}));
  for (std::size_t b = 0; b < r.pseudo.context_len.size(); ++b) {
    for (std::size_t l = 0; l < r.pseudo.mae_accumulated[b].size(); ++l) {
      EXPECT_EQ(r.pseudo.mae_accumulated[b][l], 0.0) << b << " " << l;
      EXPECT_EQ(r.pseudo.nmse_accumulated[b][l], 0.0);
      EXPECT_EQ(r.pseudo.mae_static[b][l], 0.0) << b << " " << l;
    }
  }
  for (int t = 0; t < o.decode_steps; ++t) {
    EXPECT_EQ(r.teacher.kl[t], 0.0);
    EXPECT_EQ(r.teacher.top1[t], 1.0);
    for (double d : r.teacher.hidden_drift[t]) EXPECT_EQ(d, 0.0);
  }
  EXPECT_EQ(r.greedy.tokens, ref.greedy_tokens);
  EXPECT_EQ(r.greedy.first_divergence, o.decode_steps);
  EXPECT_EQ(r.sampled.tokens, ref.sampled_tokens);
  EXPECT_EQ(r.sampled.token_agreement, 1.0);
}

TEST_F(Accumulation, SingleBlockStaticEqualsAccumulated) {
  AccumulationOptions o = options();
  o.block = o.context;  // one block: nothing is cached before it, in either protocol
  o.teacher_forced = o.free_running = false;
  const AccumulationReference ref = accumulation_reference(*model_, prompt(), o);
  const AccumulationResult r = run_accumulation(*model_, ref, "kivi_2bit", o);
  ASSERT_EQ(r.pseudo.context_len, std::vector<int>{40});
  EXPECT_EQ(r.pseudo.mae_static, r.pseudo.mae_accumulated);
  EXPECT_EQ(r.pseudo.nmse_static, r.pseudo.nmse_accumulated);
}

// static_replay off: the accumulated side and the decode steps are the same values, the static
// side and its summaries are absent (not zeros).
TEST_F(Accumulation, WithoutStaticReplayTheAccumulatedSideIsUnchanged) {
  AccumulationOptions o = options();
  o.free_running = false;
  const AccumulationReference ref = accumulation_reference(*model_, prompt(), o);
  const AccumulationResult both = run_accumulation(*model_, ref, kSmallKivi, o);
  o.static_replay = false;
  const AccumulationResult acc = run_accumulation(*model_, ref, kSmallKivi, o);
  ASSERT_TRUE(both.pseudo.has_static());
  EXPECT_FALSE(acc.pseudo.has_static());
  EXPECT_TRUE(acc.pseudo.mae_static.empty());
  EXPECT_TRUE(acc.pseudo.nmse_static.empty());
  EXPECT_EQ(acc.pseudo.context_len, both.pseudo.context_len);
  EXPECT_EQ(acc.pseudo.mae_accumulated, both.pseudo.mae_accumulated);
  EXPECT_EQ(acc.pseudo.nmse_accumulated, both.pseudo.nmse_accumulated);
  EXPECT_EQ(acc.teacher.kl, both.teacher.kl);
  const auto s_both = accumulation_summary(both), s_acc = accumulation_summary(acc);
  auto has = [](const std::vector<std::pair<std::string, double>>& s, const std::string& k) {
    return std::any_of(s.begin(), s.end(), [&](const auto& e) { return e.first == k; });
  };
  for (const char* k : {"accumulation.mae_static.final", "accumulation.nmse_static.final",
                        "accumulation.mae_static.first", "accumulation.mae_ratio.final"}) {
    EXPECT_TRUE(has(s_both, k)) << k;
    EXPECT_FALSE(has(s_acc, k)) << k;
  }
  EXPECT_TRUE(has(s_acc, "accumulation.mae_accumulated.final"));
  EXPECT_FALSE(to_json(acc)["pseudo_decode"].contains("mae_static"));
}

TEST_F(Accumulation, QuantizedMethodAccumulatesAndStaysConsistent) {
  const AccumulationOptions o = options();
  const AccumulationReference ref = accumulation_reference(*model_, prompt(), o);
  // KIVI-2 with residual windows of 8 tokens: the 40-token context reaches quantized rows (the
  // default residual of 128 would keep all of it in fp16).
  const AccumulationResult r = run_accumulation(*model_, ref, kSmallKivi, o);
  const auto& p = r.pseudo;
  // The first block reads no cache: both protocols equal the fp16 run there.
  EXPECT_EQ(p.mae_accumulated.front(), p.mae_static.front());
  for (double x : p.mae_accumulated.front()) EXPECT_EQ(x, 0.0);
  // Later blocks read 2-bit keys: nonzero error in every layer.
  for (std::size_t b = 1; b < p.context_len.size(); ++b) {
    for (std::size_t l = 0; l < p.mae_accumulated[b].size(); ++l) {
      EXPECT_GT(p.mae_accumulated[b][l], 0.0) << b << " " << l;
      EXPECT_GT(p.mae_static[b][l], 0.0) << b << " " << l;
      EXPECT_TRUE(std::isfinite(p.nmse_accumulated[b][l]));
    }
  }
  for (int t = 0; t < o.decode_steps; ++t) {
    EXPECT_GE(r.teacher.kl[t], 0.0);
    EXPECT_TRUE(r.teacher.top1[t] == 0.0 || r.teacher.top1[t] == 1.0);
    for (double d : r.teacher.hidden_drift[t]) EXPECT_TRUE(std::isfinite(d) && d >= 0);
  }
  EXPECT_GT(r.teacher.kl.back(), 0.0);
  expect_free_run_consistent(r.greedy, o.decode_steps);
  expect_free_run_consistent(r.sampled, o.decode_steps);
  EXPECT_EQ(r.greedy.tokens_ref, ref.greedy_tokens);
  const auto summary = accumulation_summary(r);
  for (const auto& [k, v] : summary) {
    if (k == "decode.top1_agreement" || k == "decode.token_agreement") {
      EXPECT_TRUE(v >= 0 && v <= 1) << k;
    }
  }
}

TEST_F(Accumulation, SameSeedGivesIdenticalArrays) {
  const AccumulationOptions o = options();
  const AccumulationReference a = accumulation_reference(*model_, prompt(), o);
  const AccumulationReference b = accumulation_reference(*model_, prompt(), o);
  EXPECT_EQ(a.context, b.context);
  EXPECT_EQ(a.sampled_tokens, b.sampled_tokens);
  const auto ja = to_json(run_accumulation(*model_, a, kSmallKivi, o));
  const auto jb = to_json(run_accumulation(*model_, b, kSmallKivi, o));
  EXPECT_EQ(ja.dump(), jb.dump());
  AccumulationOptions o2 = o;
  o2.seed = 8;
  const AccumulationReference c = accumulation_reference(*model_, prompt(), o2);
  EXPECT_NE(a.sampled_tokens, c.sampled_tokens) << "another seed should sample other tokens";
}

// CUDA vs CPU (accumulation.device: cuda): pseudo-decode of the fixture Qwen3 (8 layers, D 128) on
// a 256-token real-text context (no greedy continuation, so both devices see the same tokens).
// Tolerance: the devices' fp32 results differ by ~1e-6 relative (test_model: logits within 1e-4);
// a quantizer can flip a rounding decision on such a difference, changing isolated codes by one
// step, and the flip propagates to later layers, but each MAE averages 32 tokens x 512 hidden
// values, so flips move it far below 2 % (the bound test_model uses for quantized pseudo-decode
// logits). The floor, 1e-3 of the run's largest MAE, covers the fp16-only blocks (~1e-4,
// rounding-level). fp16 must give exactly 0 on both devices (same-device reference).
TEST(AccumulationCuda, PseudoDecodeMatchesCpu) {
  const auto dir = std::filesystem::path(KVARN_SOURCE_DIR) / "data/models/fixture-qwen3-h128";
  // The fixture is committed: its absence is a broken checkout, not a skip.
  ASSERT_TRUE(std::filesystem::exists(dir / "model.safetensors")) << dir;
  KVARN_CUDA_MODEL_OR_SKIP(gpu, dir);
  const auto cpu = Model::load(dir);
  const auto lines = test::read_text(std::filesystem::path(KVARN_SOURCE_DIR) /
                                     "data/prompts/long_context_fixture_ids.jsonl");
  const auto prompt =
      nlohmann::json::parse(lines.substr(0, lines.find('\n')))["token_ids"].get<std::vector<int>>();
  AccumulationOptions o;
  o.block = 32;
  o.context = 256;
  o.teacher_forced = o.free_running = false;
  ASSERT_GE(static_cast<int>(prompt.size()), o.context);
  const std::vector<std::int32_t> ids(prompt.begin(), prompt.end());
  const AccumulationReference rg = accumulation_reference(*gpu, ids, o);
  const AccumulationReference rc = accumulation_reference(*cpu, ids, o);
  ASSERT_EQ(rg.context, rc.context);
  for (const std::string spec : {"fp16", "kvarn_k4v2_g64", "kivi_2bit"}) {
    const PseudoDecodeResult g = run_accumulation(*gpu, rg, spec, o).pseudo;
    const PseudoDecodeResult c = run_accumulation(*cpu, rc, spec, o).pseudo;
    ASSERT_EQ(g.context_len, c.context_len);
    double top = 0, worst = 0;
    for (const auto* m : {&c.mae_accumulated, &c.mae_static}) {
      for (const auto& row : *m) top = std::max(top, *std::max_element(row.begin(), row.end()));
    }
    for (const auto& [a, b] : {std::pair{&g.mae_accumulated, &c.mae_accumulated},
                               std::pair{&g.mae_static, &c.mae_static}}) {
      for (std::size_t k = 0; k < b->size(); ++k) {
        for (std::size_t l = 0; l < (*b)[k].size(); ++l) {
          const double x = (*a)[k][l], y = (*b)[k][l];
          if (spec == "fp16") {
            EXPECT_EQ(x, 0.0) << "block " << k << " layer " << l;
            EXPECT_EQ(y, 0.0) << "block " << k << " layer " << l;
            continue;
          }
          EXPECT_TRUE(std::isfinite(x)) << spec << " block " << k << " layer " << l;
          EXPECT_LE(std::abs(x - y), 2e-2 * std::abs(y) + 1e-3 * top)
              << spec << " block " << k << " layer " << l << ": cuda " << x << " cpu " << y;
          worst = std::max(worst, std::abs(x - y) / std::max(std::abs(y), 1e-3 * top));
        }
      }
    }
    if (spec != "fp16") {
      EXPECT_GT(top, 0.0) << spec << " never read a quantized row";
    }
    std::printf(
        "[ runner ] accumulation CUDA vs CPU, %-15s pseudo-decode MAE worst rel diff %.2e\n",
        spec.c_str(), worst);
  }
}

TEST(AccumulationMath, KlAndTopPSampling) {
  const std::vector<float> p = {1.0f, 2.0f, 0.5f, -1.0f};
  EXPECT_EQ(next_token_kl(p, p), 0.0);
  // Two tokens: KL(Bern(a) || Bern(b)) in closed form.
  const std::vector<float> x = {0.0f, 0.0f}, y = {std::log(3.0f), 0.0f};
  const double expect = 0.5 * std::log(0.5 / 0.75) + 0.5 * std::log(0.5 / 0.25);
  EXPECT_NEAR(next_token_kl(x, y), expect, 1e-7);
  // top_p small: only the most likely token; u in [0, 1) walks the kept set's CDF.
  EXPECT_EQ(sample_top_p(p, 1.0, 1e-6, 0.99), 1);
  EXPECT_EQ(sample_top_p(p, 1.0, 1.0, 0.0), 1);
  EXPECT_EQ(sample_top_p(p, 1.0, 1.0, 0.999999), 3);
  const std::vector<float> tie = {0.0f, 0.0f};
  EXPECT_EQ(sample_top_p(tie, 1.0, 0.5, 0.9), 0);  // ties by id: token 0 first, alone reaches 0.5
}

// Current-token policy: `exact` (the chunk attends to its own exact K/V) and `quantized` (it reads
// itself back as stored) give the same zero error for fp16 and differ for a method that quantizes
// on arrival.
AccumulationResult run_policy(const Model& model, const std::string& spec, AccumulationOptions o,
                              ChunkAttention policy, const std::vector<std::int32_t>& prompt) {
  o.current_token = policy;
  return run_accumulation(model, accumulation_reference(model, prompt, o), spec, o);
}

TEST_F(Accumulation, CurrentTokenFp16HasZeroErrorUnderBothPolicies) {
  for (auto policy : {ChunkAttention::kExact, ChunkAttention::kCache}) {
    const AccumulationResult r = run_policy(*model_, "fp16", options(), policy, prompt());
    EXPECT_EQ(r.current_token, policy);
    for (const auto* arrays : {&r.pseudo.mae_accumulated, &r.pseudo.mae_static})
      for (const auto& block : *arrays)
        for (double x : block) EXPECT_EQ(x, 0.0) << current_token_name(policy);
    for (double kl : r.teacher.kl) EXPECT_EQ(kl, 0.0) << current_token_name(policy);
    EXPECT_EQ(r.greedy.token_agreement, 1.0);
    EXPECT_EQ(r.sampled.token_agreement, 1.0);
  }
}

TEST_F(Accumulation, CurrentTokenPoliciesDifferForAQuantizeOnArrivalMethod) {
  // fp8 stores every token on arrival: with `quantized` a block also reads its own tokens as fp8.
  const AccumulationResult exact =
      run_policy(*model_, "fp8_e4m3", options(), ChunkAttention::kExact, prompt());
  const AccumulationResult quant =
      run_policy(*model_, "fp8_e4m3", options(), ChunkAttention::kCache, prompt());
  EXPECT_EQ(to_json(exact)["current_token"], "exact");
  EXPECT_EQ(to_json(quant)["current_token"], "quantized");
  // Block 0 reads nothing cached: zero error with `exact`, not with `quantized`.
  for (double x : exact.pseudo.mae_accumulated.front()) EXPECT_EQ(x, 0.0);
  double first_block = 0;
  for (double x : quant.pseudo.mae_accumulated.front()) first_block += x;
  EXPECT_GT(first_block, 0.0);
  EXPECT_NE(exact.pseudo.mae_accumulated, quant.pseudo.mae_accumulated);
  EXPECT_NE(exact.teacher.kl, quant.teacher.kl);
}

TEST_F(Accumulation, CurrentTokenReferenceMustMatchThePolicy) {
  AccumulationOptions quantized = options();
  quantized.current_token = ChunkAttention::kCache;
  const AccumulationReference ref = accumulation_reference(*model_, prompt(), options());
  EXPECT_THROW(run_accumulation(*model_, ref, "fp16", quantized), Error);
  EXPECT_EQ(parse_current_token("quantized"), ChunkAttention::kCache);
  EXPECT_EQ(parse_current_token("exact"), ChunkAttention::kExact);
  EXPECT_THROW(parse_current_token("cache"), Error);
}

// The GPU paged cache seals every full block: a KVarN trailing window stays on the host path and
// says why (no model needed).
TEST(AccumulationDevice, KvarnRecentWindowIsAHostOnlyConfiguration) {
  const KvGeometry g{2, 2, 128};
  const std::string why = ModelKvCache(g, "kvarn_paper_k2v2").device_unsupported();
  EXPECT_TRUE(why.find("recent") != std::string::npos ||
              why.find("without kvarn_cuda") != std::string::npos)
      << why;
  const std::string plain = ModelKvCache(g, "kvarn:k=2,v=2,g=128,scales=fp8").device_unsupported();
  EXPECT_EQ(plain.find("recent"), std::string::npos) << plain;
}

}  // namespace
}  // namespace kvarn
