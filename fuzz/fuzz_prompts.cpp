// The capture prompts file (JSONL: {"id", "text"} or {"id", "token_ids"} per line).
#include "fuzz_util.hpp"
#include "kvarn/runner/capture.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = kvarn::fuzz::write_scratch("prompts.jsonl", data, size);
  kvarn::fuzz::expect_clean([&] { kvarn::load_capture_prompts(path); });
  return 0;
}
