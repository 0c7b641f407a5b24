// Built when PCRE2 is missing: the runner takes token ids only.
#include "kvarn/data/error.hpp"
#include "kvarn/runner/tokenizer.hpp"

namespace kvarn {

std::unique_ptr<Tokenizer> Tokenizer::load(const std::filesystem::path& path) {
  fail(path.string(),
       ": this build has no tokenizer (PCRE2 was not found at configure time); "
       "pass token ids instead");
}

bool Tokenizer::available() { return false; }

}  // namespace kvarn
