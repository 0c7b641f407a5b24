// An HF checkpoint's config.json (architecture, sizes, RoPE, sliding windows).
#include "fuzz_util.hpp"
#include "kvarn/runner/model.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = kvarn::fuzz::write_scratch("config.json", data, size);
  kvarn::fuzz::expect_clean([&] { kvarn::load_model_config(path); });
  return 0;
}
