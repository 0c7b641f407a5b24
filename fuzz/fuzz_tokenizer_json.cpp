// tokenizer.json loading (BPE model, added tokens, normalizer, pre-tokenizer, post-processor,
// decoder), then a short encode/decode round with whatever loaded.
#include "fuzz_util.hpp"
#include "kvarn/runner/tokenizer.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = kvarn::fuzz::write_scratch("tokenizer.json", data, size);
  kvarn::fuzz::expect_clean([&] {
    const auto tok = kvarn::Tokenizer::load(path);
    const auto ids = tok->encode("Hello, world! 12345 <|im_start|>user\n\xc3\xa9t\xc3\xa9", true);
    tok->decode(ids, false);
  });
  return 0;
}
