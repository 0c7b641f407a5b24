// The model runner: a checkpoint directory opened as model + tokenizer, the entry point used by
// capture and by the decode-time metrics (docs/runner.md). Typical use:
//
//   auto r = Runner::open("data/models/fixture");
//   auto cache = r.model().make_cache("kvarn_k4v2_g64");  // or "exact", "exact_fp16", ...
//   auto ids = r.encode("The quick brown fox");
//   auto logits = r.model().prefill(cache, ids);
//   auto next = r.model().decode_step(cache, kvarn::argmax(logits));
#ifndef KVARN_RUNNER_RUNNER_HPP_
#define KVARN_RUNNER_RUNNER_HPP_

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "kvarn/runner/kv_cache.hpp"
#include "kvarn/runner/model.hpp"
#include "kvarn/runner/tokenizer.hpp"

namespace kvarn {

class Runner {
 public:
  // Loads the model; loads tokenizer.json when present (and the build has a tokenizer).
  static Runner open(const std::filesystem::path& dir, const LoadOptions& options = {});

  const Model& model() const { return *model_; }
  bool has_tokenizer() const { return tokenizer_ != nullptr; }
  const Tokenizer& tokenizer() const;  // throws when absent, saying why
  std::vector<std::int32_t> encode(const std::string& text, bool add_special_tokens = false) const;
  std::string decode(const std::vector<std::int32_t>& ids) const;

 private:
  std::unique_ptr<Model> model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::string no_tokenizer_reason_;
};

// Reference agreement of two logit arrays: ||a - b||_2 / ||b||_2 (0 when both are zero).
double relative_error(const float* a, const float* b, std::size_t n);

}  // namespace kvarn

#endif  // KVARN_RUNNER_RUNNER_HPP_
