// HF tokenizer.json, byte-level BPE (GPT-2, Llama-3, Qwen2, SmolLM2 and the fixture's trained
// tokenizer): added/special tokens are split out first, then the pre-tokenizer (Split regex
// evaluated with PCRE2 in UTF + UCP mode, Digits, ByteLevel with its GPT-2 regex and
// byte->unicode mapping), then BPE merges by rank per piece; decoding maps tokens back to bytes.
// Unsupported normalizers, pre-tokenizers, models or decoders are errors naming the file.
//
// Built only when PCRE2 is found (KVARN_HAVE_TOKENIZER); otherwise Tokenizer::load throws and
// the runner takes plain token ids.
#ifndef KVARN_RUNNER_TOKENIZER_HPP_
#define KVARN_RUNNER_TOKENIZER_HPP_

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace kvarn {

class Tokenizer {
 public:
  // Throws kvarn::Error naming the file for missing/corrupt/unsupported tokenizer.json.
  static std::unique_ptr<Tokenizer> load(const std::filesystem::path& tokenizer_json);
  static bool available();  // false when built without PCRE2
  virtual ~Tokenizer() = default;

  // UTF-8 text -> ids. add_special_tokens applies the post-processor template (e.g. a BOS), as
  // `tokenizers`' encode(text, add_special_tokens=True). Invalid UTF-8 is an error.
  virtual std::vector<std::int32_t> encode(const std::string& text,
                                           bool add_special_tokens = false) const = 0;
  // ids -> UTF-8 text (invalid byte sequences become U+FFFD, as `tokenizers`).
  virtual std::string decode(const std::vector<std::int32_t>& ids,
                             bool skip_special_tokens = false) const = 0;
  virtual int vocab_size() const = 0;  // largest id + 1 (added tokens included)
  virtual std::optional<std::int32_t> token_to_id(const std::string& token) const = 0;
  virtual std::string id_to_token(std::int32_t id) const = 0;  // "" when unknown
};

}  // namespace kvarn

#endif  // KVARN_RUNNER_TOKENIZER_HPP_
