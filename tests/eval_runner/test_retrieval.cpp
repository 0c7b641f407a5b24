// Retrieval (retrieval.hpp): binomial intervals against closed forms, passkey scoring on planted
// outputs, prompt and induction-sequence bookkeeping, and greedy decoding with the fp16 method in
// the loop against plain greedy decoding on the project's fixture model.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <set>

#include "kvarn/data/error.hpp"
#include "kvarn/runner/retrieval.hpp"
#include "runner_test_util.hpp"

namespace kvarn {
namespace {

TEST(BinomialInterval, WilsonClosedForms) {
  const double z = kZ95, z2 = z * z;
  for (int n : {1, 4, 10, 100}) {
    // x = 0 and x = n: one bound is exact, the other z^2 / (n + z^2) from it.
    const BinomialInterval lo = wilson_interval(0, n);
    EXPECT_DOUBLE_EQ(lo.low, 0.0);
    EXPECT_NEAR(lo.high, z2 / (n + z2), 1e-12);
    const BinomialInterval hi = wilson_interval(n, n);
    EXPECT_NEAR(hi.low, n / (n + z2), 1e-12);
    EXPECT_DOUBLE_EQ(hi.high, 1.0);
    for (int x = 0; x <= n; ++x) {  // symmetric under x -> n - x
      const BinomialInterval a = wilson_interval(x, n), b = wilson_interval(n - x, n);
      EXPECT_NEAR(a.low, 1 - b.high, 1e-12);
      EXPECT_LE(a.low, static_cast<double>(x) / n);
      EXPECT_GE(a.high, static_cast<double>(x) / n);
    }
  }
  // 8 of 10 (worked by hand from the formula): [0.4902, 0.9433].
  const BinomialInterval w = wilson_interval(8, 10);
  EXPECT_NEAR(w.low, 0.4902, 1e-4);
  EXPECT_NEAR(w.high, 0.9433, 1e-4);
  EXPECT_DOUBLE_EQ(wilson_interval(0, 0).low, 0.0);
  EXPECT_DOUBLE_EQ(wilson_interval(0, 0).high, 1.0);
  EXPECT_THROW(wilson_interval(3, 2), Error);
}

TEST(BinomialInterval, ClopperPearsonClosedForms) {
  for (int n : {1, 5, 20, 200}) {
    // x = 0: high = 1 - (alpha/2)^(1/n); x = n: low = (alpha/2)^(1/n).
    const BinomialInterval a = clopper_pearson_interval(0, n);
    EXPECT_DOUBLE_EQ(a.low, 0.0);
    EXPECT_NEAR(a.high, 1 - std::pow(0.025, 1.0 / n), 1e-9);
    const BinomialInterval b = clopper_pearson_interval(n, n);
    EXPECT_NEAR(b.low, std::pow(0.025, 1.0 / n), 1e-9);
    EXPECT_DOUBLE_EQ(b.high, 1.0);
  }
  // x = 1 of n = 2: P(X >= 1 | p) = 1 - (1 - p)^2 = 0.025 and P(X <= 1 | p) = 1 - p^2 = 0.025.
  const BinomialInterval c = clopper_pearson_interval(1, 2);
  EXPECT_NEAR(c.low, 1 - std::sqrt(0.975), 1e-9);
  EXPECT_NEAR(c.high, std::sqrt(0.975), 1e-9);
  // 5 of 10 (exact interval from the beta quantiles): [0.18709, 0.81291]; wider than Wilson.
  const BinomialInterval d = clopper_pearson_interval(5, 10);
  EXPECT_NEAR(d.low, 0.18709, 1e-5);
  EXPECT_NEAR(d.high, 0.81291, 1e-5);
  EXPECT_LT(d.low, wilson_interval(5, 10).low);
  EXPECT_THROW(clopper_pearson_interval(1, 2, 1.0), Error);
}

TEST(Passkey, ScoringOnPlantedOutputs) {
  const std::string key = "40719";
  EXPECT_TRUE(passkey_match(" 40719.<|im_end|>", key));
  EXPECT_TRUE(passkey_match("The pass key is 40719", key));      // words before it
  EXPECT_TRUE(passkey_match("40719 is the key, not 123", key));  // later digits ignored
  EXPECT_FALSE(passkey_match(" 407190", key));                   // an extra digit
  EXPECT_FALSE(passkey_match(" 4071", key));                     // partial
  EXPECT_FALSE(passkey_match(" 4071 9", key));                   // split
  EXPECT_FALSE(passkey_match(" a unique identifier", key));      // no digits
  EXPECT_FALSE(passkey_match("", key));
  EXPECT_FALSE(passkey_match(" 12 then 40719", key));  // the first run decides
  EXPECT_EQ(first_digit_run("ab 0071x9"), "0071");
  EXPECT_DOUBLE_EQ(passkey_digit_score(" 40719.", key), 1.0);
  EXPECT_DOUBLE_EQ(passkey_digit_score(" 4071", key), 0.8);
  EXPECT_DOUBLE_EQ(passkey_digit_score(" 40000", key), 0.4);
  EXPECT_DOUBLE_EQ(passkey_digit_score("none", key), 0.0);
}

TEST(Passkey, DigitsAreSeeded) {
  const std::string a = passkey_digits(11, 5);
  EXPECT_EQ(a.size(), 5u);
  EXPECT_EQ(a, passkey_digits(11, 5));
  EXPECT_EQ(first_digit_run(a), a);
  std::set<std::string> keys;
  for (std::uint64_t s = 0; s < 50; ++s) keys.insert(passkey_digits(s, 5));
  EXPECT_GT(keys.size(), 45u);  // different seeds, different keys (collisions are rare)
  EXPECT_THROW(passkey_digits(0, 0), Error);
}

TEST(Passkey, HaystackOfSeededSentences) {
  const std::vector<std::vector<std::int32_t>> sentences = {{100, 101, 102}, {200}, {}, {300, 301}};
  for (int tokens : {0, 1, 5, 37}) {
    const Haystack h = build_haystack(sentences, tokens, 7);
    ASSERT_EQ(static_cast<int>(h.tokens.size()), tokens);
    ASSERT_EQ(h.boundaries.front(), 0);
    ASSERT_EQ(h.boundaries.back(), tokens);
    // Between two boundaries lies one whole sentence (the last one may be cut).
    for (std::size_t i = 0; i + 1 < h.boundaries.size(); ++i) {
      const int b = h.boundaries[i], e = h.boundaries[i + 1];
      ASSERT_LT(b, e);
      const std::vector<std::int32_t> piece(h.tokens.begin() + b, h.tokens.begin() + e);
      bool whole = false, prefix_of_one = false;
      for (const auto& s : sentences) {
        whole |= piece == s;
        prefix_of_one |= !s.empty() && piece.size() <= s.size() &&
                         std::equal(piece.begin(), piece.end(), s.begin());
      }
      EXPECT_TRUE(whole || (e == tokens && prefix_of_one)) << tokens << " " << i;
    }
  }
  // Seeded: the same seed gives the same haystack, others differ; all sentences get used.
  EXPECT_EQ(build_haystack(sentences, 200, 7).tokens, build_haystack(sentences, 200, 7).tokens);
  EXPECT_NE(build_haystack(sentences, 200, 7).tokens, build_haystack(sentences, 200, 8).tokens);
  const std::vector<std::int32_t> t = build_haystack(sentences, 200, 7).tokens;
  for (std::int32_t id : {100, 200, 300}) EXPECT_NE(std::find(t.begin(), t.end(), id), t.end());
  EXPECT_THROW(build_haystack({{}, {}}, 5, 1), Error);
  EXPECT_THROW(build_haystack({}, 5, 1), Error);
  EXPECT_NO_THROW(build_haystack({}, 0, 1));
}

TEST(Passkey, PromptLengthAndDepthBookkeeping) {
  const std::vector<std::int32_t> head = {1, 2, 3}, needle = {7, 7}, tail = {9, 9, 9, 9};
  // Sentences of 5 tokens: the boundaries of the haystack are the multiples of 5 and F.
  const std::vector<std::vector<std::int32_t>> sentences = {{100, 101, 102, 103, 104},
                                                            {200, 201, 202, 203, 204}};
  for (int length : {9, 10, 17, 64}) {
    for (double depth : {0.0, 0.25, 0.5, 1.0}) {
      const PasskeyPrompt p = build_passkey_prompt(head, needle, tail, sentences, length, depth, 3);
      ASSERT_EQ(static_cast<int>(p.tokens.size()), length) << length << " " << depth;
      const int F = length - 9;
      EXPECT_EQ(p.filler_tokens, F);
      // The needle sits at the sentence boundary nearest depth * F (earlier one on a tie).
      std::vector<int> bounds;
      for (int b = 0; b < F; b += 5) bounds.push_back(b);
      bounds.push_back(F);
      int best = 0;
      for (int b : bounds)
        if (std::abs(b - depth * F) < std::abs(best - depth * F)) best = b;
      EXPECT_EQ(p.needle_start, 3 + best) << length << " " << depth;
      EXPECT_EQ(std::vector<std::int32_t>(p.tokens.begin(), p.tokens.begin() + 3), head);
      EXPECT_EQ(std::vector<std::int32_t>(p.tokens.begin() + p.needle_start,
                                          p.tokens.begin() + p.needle_start + 2),
                needle);
      EXPECT_EQ(std::vector<std::int32_t>(p.tokens.end() - 4, p.tokens.end()), tail);
      // The haystack around the needle is build_haystack's, with the trial's seed.
      std::vector<std::int32_t> hay(p.tokens.begin() + 3, p.tokens.begin() + p.needle_start);
      hay.insert(hay.end(), p.tokens.begin() + p.needle_start + 2, p.tokens.end() - 4);
      EXPECT_EQ(hay, build_haystack(sentences, F, 3).tokens);
    }
  }
  // 20 tokens: F = 11, boundaries 0, 5, 10, 11. Depth 0: right after the head; depth 1: right
  // before the question; depth 0.5 (5.5) goes to 5, depth 0.7 (7.7) to 10.
  EXPECT_EQ(build_passkey_prompt(head, needle, tail, sentences, 20, 0.0, 1).needle_start, 3);
  EXPECT_EQ(build_passkey_prompt(head, needle, tail, sentences, 20, 1.0, 1).needle_start,
            20 - 4 - 2);
  EXPECT_EQ(build_passkey_prompt(head, needle, tail, sentences, 20, 0.5, 1).needle_start, 3 + 5);
  EXPECT_EQ(build_passkey_prompt(head, needle, tail, sentences, 20, 0.7, 1).needle_start, 3 + 10);
  EXPECT_THROW(build_passkey_prompt(head, needle, tail, sentences, 8, 0.5, 1), Error);  // short
  EXPECT_THROW(build_passkey_prompt(head, needle, tail, sentences, 20, 1.5, 1), Error);
  EXPECT_THROW(build_passkey_prompt(head, needle, tail, {}, 20, 0.5, 1), Error);
  EXPECT_NO_THROW(build_passkey_prompt(head, needle, tail, {}, 9, 0.5, 1));  // no haystack needed
}

TEST(Induction, SpanPlacement) {
  const InductionSequence s = build_induction_sequence(5, 7, 12, 30, 3, 50);
  EXPECT_EQ(s.span, 12);
  EXPECT_EQ(s.span_start, 7);
  EXPECT_EQ(s.repeat_start, 7 + 12 + 30);
  ASSERT_EQ(s.tokens.size(), 7u + 12 + 30 + 12);
  for (int i = 0; i < 12; ++i) EXPECT_EQ(s.tokens[7 + i], s.tokens[s.repeat_start + i]);
  for (std::int32_t t : s.tokens) {
    EXPECT_GE(t, 3);
    EXPECT_LT(t, 50);
  }
  EXPECT_EQ(s.tokens, build_induction_sequence(5, 7, 12, 30, 3, 50).tokens);
  EXPECT_NE(s.tokens, build_induction_sequence(6, 7, 12, 30, 3, 50).tokens);
  const InductionSequence z = build_induction_sequence(1, 0, 2, 0, 0, 2);  // adjacent copies
  EXPECT_EQ(z.repeat_start, 2);
  EXPECT_EQ(z.tokens[0], z.tokens[2]);
  // Three occurrences: fresh gaps, the last copy is the scored one; the first two occurrences
  // and the first gap are those of the two-occurrence sequence of the same seed.
  const InductionSequence t = build_induction_sequence(5, 7, 12, 30, 3, 50, 3);
  EXPECT_EQ(t.span_start, 7);
  EXPECT_EQ(t.repeat_start, 7 + 2 * (12 + 30));
  ASSERT_EQ(t.tokens.size(), 7u + 3 * 12 + 2 * 30);
  for (int i = 0; i < 12; ++i) {
    EXPECT_EQ(t.tokens[7 + i], t.tokens[7 + 12 + 30 + i]);
    EXPECT_EQ(t.tokens[7 + i], t.tokens[t.repeat_start + i]);
  }
  EXPECT_EQ(std::vector<std::int32_t>(t.tokens.begin(), t.tokens.begin() + s.tokens.size()),
            s.tokens);
  EXPECT_NE(std::vector<std::int32_t>(t.tokens.begin() + 7 + 12, t.tokens.begin() + 7 + 12 + 30),
            std::vector<std::int32_t>(t.tokens.begin() + 7 + 2 * 12 + 30,
                                      t.tokens.begin() + 7 + 2 * 12 + 2 * 30));
  EXPECT_THROW(build_induction_sequence(1, 0, 4, 0, 0, 10, 1), Error);
  EXPECT_THROW(build_induction_sequence(1, 0, 1, 0, 0, 10), Error);
  EXPECT_THROW(build_induction_sequence(1, 0, 4, 0, 5, 5), Error);
}

// The fixture model (committed) with a method's cache in the loop.
class RetrievalModel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ASSERT_TRUE(std::filesystem::exists(test::fixture_dir() / "model.safetensors"));
    model_ = Model::load(test::fixture_dir()).release();
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }
  static ModelKvCache host(const std::string& spec) {
    ModelKvCache c = model_->make_cache(spec);
    c.set_placement(KvPlacement::kHost);
    return c;
  }
  static Model* model_;
};
Model* RetrievalModel::model_ = nullptr;

TEST_F(RetrievalModel, Fp16InTheLoopIsPlainGreedy) {
  const InductionSequence seq = build_induction_sequence(3, 4, 20, 40, 3, 12288);
  const std::vector<std::int32_t> prompt(seq.tokens.begin(), seq.tokens.begin() + 70);
  for (ChunkAttention ct : {ChunkAttention::kExact, ChunkAttention::kCache}) {
    // One block: the same forward calls as Model::generate_greedy.
    ModelKvCache a = host("fp16"), b = host("exact_fp16");
    EXPECT_EQ(greedy_in_loop(*model_, a, prompt, 1000, ct, 12, false),
              model_->generate_greedy(b, prompt, 12));
    // Blocks of 16: the fp16 method stores exactly what an fp16 cache stores.
    ModelKvCache c = host("fp16"), d = host("exact_fp16");
    EXPECT_EQ(greedy_in_loop(*model_, c, prompt, 16, ct, 12, false),
              greedy_in_loop(*model_, d, prompt, 16, ct, 12, false));
    EXPECT_EQ(c.size(), 70 + 11);
  }
}

TEST_F(RetrievalModel, InductionHitsFp16AndQuantized) {
  const InductionSequence seq = build_induction_sequence(9, 8, 24, 64, 3, 12288);
  ModelKvCache a = host("fp16"), b = host("exact_fp16");
  const std::vector<int> ha = induction_hits(*model_, a, seq, 32, ChunkAttention::kExact);
  const std::vector<int> hb = induction_hits(*model_, b, seq, 32, ChunkAttention::kExact);
  ASSERT_EQ(ha.size(), 23u);
  EXPECT_EQ(ha, hb);
  // The fixture copies part of a random span it has seen, far above chance (1 in 12285 per
  // token); docs/metrics.md §9 gives its measured fp16 accuracy (well below 100 %).
  EXPECT_GE(std::accumulate(ha.begin(), ha.end(), 0), 2);
  // The hits are the argmax of teacher-forced logits: the same as one full forward pass.
  ModelKvCache c = host("exact_fp16");
  ForwardOptions fo;
  fo.logits = LogitsMode::kAll;
  const ForwardResult r = model_->forward(c, seq.tokens, fo);
  for (int i = 1; i < seq.span; ++i) {
    const int row = seq.repeat_start + i - 1;
    const std::span<const float> lg(
        r.logits.data() + static_cast<std::size_t>(row) * r.logits.cols(),
        static_cast<std::size_t>(r.logits.cols()));
    EXPECT_EQ(argmax(lg) == seq.tokens[seq.repeat_start + i], hb[i - 1] == 1) << i;
  }
  ModelKvCache q = host("kivi_2bit");
  EXPECT_EQ(induction_hits(*model_, q, seq, 32, ChunkAttention::kExact).size(), 23u);
}

}  // namespace
}  // namespace kvarn
