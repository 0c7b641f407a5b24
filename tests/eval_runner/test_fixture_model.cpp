// The project's fixture model (data/models/fixture-qwen3-h128: Qwen3, head_dim 128, GQA 4/2,
// stored fp16) against transformers: fp32 logits and 128 greedy tokens.
#include <gtest/gtest.h>

#include "real_model_check.hpp"

namespace kvarn {
namespace {

TEST(FixtureModel, MatchesTransformers) {
  // The fixture is committed, so its absence is a broken checkout, not a skip.
  ASSERT_TRUE(std::filesystem::exists(test::fixture_dir() / "model.safetensors"))
      << test::fixture_dir();
  KVARN_REFERENCE_DIR(ref);
  test::check_real_model("fixture", test::fixture_dir(), ref);
}

}  // namespace
}  // namespace kvarn
