// SmolLM2-135M-Instruct (converted by scripts/prepare_models.py) against transformers.
#include <gtest/gtest.h>

#include "kvarn/eval/runner.hpp"
#include "kvarn/eval/safetensors.hpp"
#include "runner_test_util.hpp"

namespace kvarn {
namespace {

namespace fs = std::filesystem;

TEST(SmolLM2, MatchesTransformers) {
  if (!fs::exists(test::smollm2_dir() / "model.safetensors")) {
    GTEST_SKIP() << "SKIPPED: " << test::smollm2_dir()
                 << "/model.safetensors absent (scripts/prepare_models.py makes it)";
  }
  KVARN_REFERENCE_DIR(ref);
  ASSERT_TRUE(fs::exists(ref / "smollm2.json"));
  const auto j = nlohmann::json::parse(test::read_text(ref / "smollm2.json"));
  auto runner = Runner::open(test::smollm2_dir());
  const auto tokens = j["tokens"].get<std::vector<std::int32_t>>();
  if (runner.has_tokenizer()) {
    EXPECT_EQ(runner.encode(j["prompt"].get<std::string>()), tokens);
  }
  SafetensorsFile f(ref / "smollm2_logits.safetensors");
  const auto& info = f.info("logits");
  Matrix want(info.shape[0], info.shape[1]);
  std::memcpy(want.data(), f.data(info), info.end - info.begin);
  auto cache = runner.model().make_cache("exact");
  ForwardOptions all;
  all.logits = LogitsMode::kAll;
  const auto got = runner.model().forward(cache, tokens, all).logits;
  const double e = relative_error(got.data(), want.data(), got.size());
  EXPECT_LE(e, 1e-4);
  auto gen_cache = runner.model().make_cache("exact");
  const auto greedy = runner.model().generate_greedy(gen_cache, tokens, 32);
  EXPECT_EQ(greedy, j["greedy"].get<std::vector<std::int32_t>>());
  std::printf("[ runner ] SmolLM2-135M prompt of %zu tokens: logits rel err %.2e, greedy 32: %s\n",
              tokens.size(), e, runner.has_tokenizer() ? runner.decode(greedy).c_str() : "");
}

}  // namespace
}  // namespace kvarn
