// The tokenizer against the `tokenizers` package: trained tokenizers (GPT-2, Llama-3 and
// SmolLM2-style pre-tokenizers), SmolLM2's and the fixture model's own tokenizers over a few
// thousand varied strings.
#include <gtest/gtest.h>

#include "kvarn/data/error.hpp"
#include "kvarn/runner/tokenizer.hpp"
#include "runner_test_util.hpp"

namespace kvarn {
namespace {

namespace fs = std::filesystem;

void check_cases(const fs::path& dir, const std::string& name,
                 const fs::path& tokenizer_json = {}) {
  auto tok = Tokenizer::load(tokenizer_json.empty() ? dir / "tokenizer.json" : tokenizer_json);
  const auto cases = nlohmann::json::parse(test::read_text(dir / "cases.json"));
  // An empty or missing case list would make every count below trivially equal.
  ASSERT_TRUE(cases.is_array() && !cases.empty()) << name << ": no cases in " << dir / "cases.json";
  int encode_ok = 0, special_ok = 0, decode_ok = 0, shown = 0;
  for (const auto& c : cases) {
    const auto text = c["text"].get<std::string>();
    const auto want = c["ids"].get<std::vector<std::int32_t>>();
    const auto got = tok->encode(text);
    if (got == want) {
      ++encode_ok;
    } else if (shown++ < 5) {
      ADD_FAILURE() << name << ": encode(" << nlohmann::json(text).dump()
                    << ") = " << nlohmann::json(got).dump()
                    << ", tokenizers: " << nlohmann::json(want).dump();
    }
    special_ok += tok->encode(text, true) == c["ids_special"].get<std::vector<std::int32_t>>();
    const auto dec = tok->decode(want);
    if (dec == c["decoded"].get<std::string>()) {
      ++decode_ok;
    } else if (shown++ < 5) {
      ADD_FAILURE() << name << ": decode of " << nlohmann::json(text).dump() << " gave "
                    << nlohmann::json(dec).dump();
    }
  }
  const int n = static_cast<int>(cases.size());
  EXPECT_EQ(encode_ok, n) << name;
  EXPECT_EQ(special_ok, n) << name;
  EXPECT_EQ(decode_ok, n) << name;
  std::printf("[ runner ] tokenizer %-15s encode %d/%d, with special tokens %d/%d, decode %d/%d\n",
              name.c_str(), encode_ok, n, special_ok, n, decode_ok, n);
}

TEST(Tokenizer, TrainedGpt2Style) {
  KVARN_REFERENCE_DIR(ref);
  check_cases(ref / "tokenizers/trained_gpt2", "trained_gpt2");
}

TEST(Tokenizer, TrainedLlama3Style) {
  KVARN_REFERENCE_DIR(ref);
  check_cases(ref / "tokenizers/trained_llama3", "trained_llama3");
}

TEST(Tokenizer, TrainedDigitsAndAddedTokenOptions) {
  KVARN_REFERENCE_DIR(ref);
  check_cases(ref / "tokenizers/trained_digits", "trained_digits");
}

TEST(Tokenizer, SmolLM2) {
  if (!fs::exists(test::smollm2_dir() / "tokenizer.json")) {
    GTEST_SKIP() << "SKIPPED: " << test::smollm2_dir()
                 << "/tokenizer.json absent (scripts/prepare_models.py makes it)";
  }
  KVARN_REFERENCE_DIR(ref);
  check_cases(ref / "tokenizers/smollm2", "smollm2", test::smollm2_dir() / "tokenizer.json");
}

TEST(Tokenizer, FixtureModel) {
  ASSERT_TRUE(fs::exists(test::fixture_dir() / "tokenizer.json")) << test::fixture_dir();
  KVARN_REFERENCE_DIR(ref);
  check_cases(ref / "tokenizers/fixture", "fixture", test::fixture_dir() / "tokenizer.json");
}

TEST(Tokenizer, Errors) {
  const auto d = fs::temp_directory_path() / ("kvarn_tok_" + std::to_string(::getpid()));
  fs::create_directories(d);
  EXPECT_THROW(Tokenizer::load(d / "tokenizer.json"), Error);  // missing
  std::ofstream(d / "tokenizer.json") << "{\"model\": ";
  EXPECT_THROW(Tokenizer::load(d / "tokenizer.json"), Error);  // corrupt
  std::ofstream(d / "tokenizer.json") << R"({"model": {"type": "WordPiece", "vocab": {}}})";
  try {
    Tokenizer::load(d / "tokenizer.json");
    ADD_FAILURE() << "WordPiece accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("WordPiece"), std::string::npos) << e.what();
  }
  std::ofstream(d / "tokenizer.json")
      << R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
             "pre_tokenizer": {"type": "ByteLevel"}, "normalizer": {"type": "NFKC"}})";
  EXPECT_THROW(Tokenizer::load(d / "tokenizer.json"), Error);
  // A value of the wrong JSON type (found by fuzz_tokenizer_json): one error naming the section.
  std::ofstream(d / "tokenizer.json")
      << R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
             "pre_tokenizer": {"type": "ByteLevel"}, "decoder": {"type": 47}})";
  try {
    Tokenizer::load(d / "tokenizer.json");
    ADD_FAILURE() << "a numeric decoder type accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), (d / "tokenizer.json").string() +
                                         ": 'decoder': malformed (type must be string, but is "
                                         "number)");
  }
  fs::remove_all(d);
}

TEST(Tokenizer, RejectsInvalidUtf8) {
  KVARN_REFERENCE_DIR(ref);
  auto tok = Tokenizer::load(ref / "tokenizers/trained_gpt2/tokenizer.json");
  EXPECT_THROW(tok->encode("abc\xff"), Error);
  EXPECT_THROW(tok->encode("\xed\xa0\x80"), Error);  // a surrogate
  EXPECT_EQ(tok->decode(tok->encode("héllo wörld 😀")), "héllo wörld 😀");
}

}  // namespace
}  // namespace kvarn
