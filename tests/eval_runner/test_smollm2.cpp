// SmolLM2-135M-Instruct (converted by scripts/prepare_models.py) against transformers: fp32
// logits and 128 greedy tokens.
#include <gtest/gtest.h>

#include "real_model_check.hpp"

namespace kvarn {
namespace {

TEST(SmolLM2, MatchesTransformers) {
  if (!std::filesystem::exists(test::smollm2_dir() / "model.safetensors")) {
    GTEST_SKIP() << "SKIPPED: " << test::smollm2_dir()
                 << "/model.safetensors absent (scripts/prepare_models.py makes it)";
  }
  KVARN_REFERENCE_DIR(ref);
  test::check_real_model("smollm2", test::smollm2_dir(), ref);
}

}  // namespace
}  // namespace kvarn
