#include "kvarn/runner/runner.hpp"

#include <cmath>

#include "kvarn/data/error.hpp"

namespace kvarn {

Runner Runner::open(const std::filesystem::path& dir, const LoadOptions& options) {
  Runner r;
  r.model_ = Model::load(dir, options);
  const auto tok = dir / "tokenizer.json";
  if (!std::filesystem::exists(tok)) {
    r.no_tokenizer_reason_ = dir.string() + " has no tokenizer.json";
  } else if (!Tokenizer::available()) {
    r.no_tokenizer_reason_ = "this build has no tokenizer (PCRE2 was not found at configure time)";
  } else {
    r.tokenizer_ = Tokenizer::load(tok);
  }
  return r;
}

const Tokenizer& Runner::tokenizer() const {
  KVARN_CHECK(tokenizer_ != nullptr, "runner: no tokenizer: ", no_tokenizer_reason_,
              "; pass token ids instead");
  return *tokenizer_;
}

std::vector<std::int32_t> Runner::encode(const std::string& text, bool add_special_tokens) const {
  return tokenizer().encode(text, add_special_tokens);
}

std::string Runner::decode(const std::vector<std::int32_t>& ids) const {
  return tokenizer().decode(ids);
}

double relative_error(const float* a, const float* b, std::size_t n) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    num += d * d;
    den += static_cast<double>(b[i]) * b[i];
  }
  if (den == 0) return num == 0 ? 0.0 : INFINITY;
  return std::sqrt(num / den);
}

}  // namespace kvarn
