// The byte-level BPE encoder of a real tokenizer (the fixture Qwen3's, KVARN_FUZZ_TOKENIZER to
// use another) on arbitrary text, and decoding what it produced.
#include <cstdlib>

#include "fuzz_util.hpp"
#include "kvarn/runner/tokenizer.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const auto tok = [] {
    const char* env = std::getenv("KVARN_FUZZ_TOKENIZER");
    return kvarn::Tokenizer::load(env ? env : "data/models/fixture-qwen3-h128/tokenizer.json");
  }();
  const std::string text = kvarn::fuzz::as_string(data, size);
  kvarn::fuzz::expect_clean([&] {
    const auto ids = tok->encode(text, size % 2 == 0);
    for (const std::int32_t id : ids) {
      if (id < 0 || id >= tok->vocab_size()) __builtin_trap();  // an id the model cannot embed
    }
    tok->decode(ids, size % 3 == 0);
  });
  return 0;
}
