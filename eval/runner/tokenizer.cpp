// Byte-level BPE tokenizer.json, checked against the `tokenizers` package (tests/eval_runner).
#define PCRE2_CODE_UNIT_WIDTH 8
#include "kvarn/runner/tokenizer.hpp"

#include <pcre2.h>

#include <array>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <queue>
#include <set>
#include <tuple>
#include <unordered_map>

#include "kvarn/data/error.hpp"
#include "kvarn/data/read_file.hpp"

namespace kvarn {
namespace {

using nlohmann::json;

// GPT-2's pre-tokenizer regex (ByteLevel with use_regex = true).
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Oniguruma's \s (what `tokenizers` uses) is Unicode White_Space, which includes U+0085; PCRE2's
// UCP \s does not. Spell it out so both engines agree.
constexpr const char* kSpaceClassBody = R"(\t\n\x0B\f\r\x{85}\p{Z})";

std::string rewrite_spaces(const std::string& p) {
  std::string out;
  bool in_class = false;
  for (std::size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[i + 1];
      if (e == 's') {
        if (!in_class) out += '[';
        out += kSpaceClassBody;
        if (!in_class) out += ']';
      } else if (e == 'S' && !in_class) {
        out += "[^";
        out += kSpaceClassBody;
        out += ']';
      } else {
        out += c;
        out += e;
      }
      ++i;
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      out += c;
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];  // literal ']' first in class
      continue;
    }
    if (c == ']' && in_class) in_class = false;
    out += c;
  }
  return out;
}

std::string escape_literal(const std::string& s) {
  std::string out = "\\Q";
  std::size_t pos = 0, e;
  while ((e = s.find("\\E", pos)) != std::string::npos) {  // \E cannot appear inside \Q..\E
    out += s.substr(pos, e - pos) + "\\E\\\\E\\Q";
    pos = e + 2;
  }
  return out + s.substr(pos) + "\\E";
}

class Regex {
 public:
  Regex(const std::string& pattern, const std::string& where) {
    int err = 0;
    PCRE2_SIZE off = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                          PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
    if (code_ == nullptr) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      fail(where, ": cannot compile pre-tokenizer regex at offset ", off, ": ",
           reinterpret_cast<const char*>(msg), " (pattern ", pattern, ")");
    }
    pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // optional speed-up; falls back silently
  }
  ~Regex() { pcre2_code_free(code_); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Non-empty matches [begin, end) left to right (empty matches are skipped).
  std::vector<std::pair<std::size_t, std::size_t>> find_all(std::string_view s) const {
    std::vector<std::pair<std::size_t, std::size_t>> out;
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_, nullptr);
    std::size_t off = 0;
    while (off <= s.size()) {
      const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), off,
                                 PCRE2_NO_UTF_CHECK, md, nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        pcre2_match_data_free(md);
        fail("tokenizer: regex match failed (PCRE2 error ", rc, ")");
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      if (ov[1] > ov[0]) {
        out.emplace_back(ov[0], ov[1]);
        off = ov[1];
      } else {  // empty match: step over one UTF-8 character
        off = ov[0] + 1;
        while (off < s.size() && (static_cast<unsigned char>(s[off]) & 0xC0) == 0x80) ++off;
      }
    }
    pcre2_match_data_free(md);
    return out;
  }

 private:
  pcre2_code* code_ = nullptr;
};

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// Splits `s` by the matches of `re` (invert: the gaps are the delimiters) as `tokenizers` does.
std::vector<std::string> split(const std::string& s, const Regex& re, Behavior behavior,
                               bool invert) {
  // Pieces as (begin, end, is_match).
  std::vector<std::tuple<std::size_t, std::size_t, bool>> parts;
  std::size_t prev = 0;
  for (auto [b, e] : re.find_all(s)) {
    if (b > prev) parts.emplace_back(prev, b, false);
    parts.emplace_back(b, e, true);
    prev = e;
  }
  if (prev < s.size()) parts.emplace_back(prev, s.size(), false);
  if (invert) {
    for (auto& p : parts) std::get<2>(p) = !std::get<2>(p);
  }
  std::vector<std::pair<std::size_t, std::size_t>> out;
  bool prev_match = false;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    auto [b, e, m] = parts[i];
    switch (behavior) {
      case Behavior::kRemoved:
        if (!m) out.emplace_back(b, e);
        break;
      case Behavior::kIsolated:
        out.emplace_back(b, e);
        break;
      case Behavior::kContiguous:
        if (m && prev_match && !out.empty()) {
          out.back().second = e;
        } else {
          out.emplace_back(b, e);
        }
        break;
      case Behavior::kMergedWithPrevious:
        if (m && !out.empty() && !prev_match) {
          out.back().second = e;
        } else {
          out.emplace_back(b, e);
        }
        break;
      case Behavior::kMergedWithNext:
        if (!m && !out.empty() && prev_match) {
          out.back().second = e;
        } else {
          out.emplace_back(b, e);
        }
        break;
    }
    prev_match = m;
  }
  std::vector<std::string> pieces;
  for (auto [b, e] : out) {
    if (e > b) pieces.push_back(s.substr(b, e - b));
  }
  return pieces;
}

// GPT-2 bytes_to_unicode: printable bytes map to themselves, the rest to U+0100 upwards.
std::array<std::string, 256> byte_to_unicode_table() {
  std::array<std::string, 256> t;
  auto utf8 = [](unsigned cp) {
    std::string s;
    if (cp < 0x80) {
      s += static_cast<char>(cp);
    } else {
      s += static_cast<char>(0xC0 | (cp >> 6));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    }
    return s;
  };
  unsigned n = 0;
  for (unsigned b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
    t[b] = utf8(printable ? b : 256 + n++);
  }
  return t;
}

// Decodes UTF-8 leniently: each maximal invalid subsequence becomes U+FFFD (Rust's lossy rule).
std::string utf8_lossy(const std::string& in) {
  std::string out;
  std::size_t i = 0;
  const auto* s = reinterpret_cast<const unsigned char*>(in.data());
  const std::size_t n = in.size();
  while (i < n) {
    const unsigned c = s[i];
    std::size_t len = 0;
    unsigned lo = 0x80, hi = 0xBF;
    if (c < 0x80) {
      out += static_cast<char>(c);
      ++i;
      continue;
    } else if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    }
    std::size_t k = 1;
    if (len > 0) {
      for (; k < len && i + k < n; ++k) {
        const unsigned cc = s[i + k];
        const unsigned l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
        if (cc < l || cc > h) break;
      }
    }
    if (len > 0 && k == len) {
      out.append(in, i, len);
      i += len;
    } else {
      out += "\xEF\xBF\xBD";
      i += std::max<std::size_t>(k, 1);
    }
  }
  return out;
}

bool valid_utf8(const std::string& s) { return utf8_lossy(s) == s; }

bool is_space_cp(unsigned cp) {  // Rust char::is_whitespace (Unicode White_Space)
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

// Code point starting at s[i] (valid UTF-8) and its length.
std::pair<unsigned, std::size_t> decode_cp(const std::string& s, std::size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) return {c, 1};
  const std::size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
  unsigned cp = c & (0xFF >> (len + 1));
  for (std::size_t k = 1; k < len; ++k)
    cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  return {cp, len};
}

std::size_t prev_cp_start(const std::string& s, std::size_t i) {
  do {
    --i;
  } while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80);
  return i;
}

// A word character for single_word added tokens: Unicode \w as the Rust regex crate defines it
// (Alphabetic, marks, decimal digits, connector punctuation, joiners; so not '½' or '²').
class WordChar {
 public:
  WordChar() : re_(R"(\A[\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\x{200C}\x{200D}])", "tokenizer") {}
  bool at(const std::string& s, std::size_t i) const {
    const auto len = decode_cp(s, i).second;
    return !re_.find_all(std::string_view(s).substr(i, len)).empty();
  }

 private:
  Regex re_;
};

struct AddedToken {
  std::int32_t id = 0;
  std::string content;
  bool single_word = false, lstrip = false, rstrip = false, special = false;
};

struct PreStep {
  enum Kind { kSplit, kByteLevel, kDigits } kind = kSplit;
  std::shared_ptr<Regex> regex;  // kSplit, kDigits, kByteLevel with use_regex
  Behavior behavior = Behavior::kIsolated;
  bool invert = false;
  bool add_prefix_space = false;
};

class BpeTokenizer : public Tokenizer {
 public:
  explicit BpeTokenizer(const std::filesystem::path& path) : file_(path.string()) {
    KVARN_CHECK(std::filesystem::exists(path), file_,
                ": cannot read tokenizer (missing tokenizer.json?)");
    const std::string text = read_regular_file(path, "tokenizer (tokenizer.json)");
    json j;
    try {
      j = json::parse(text);
    } catch (const json::exception& e) {
      fail(file_, ": corrupt tokenizer (invalid JSON): ", without_tag(e.what()));
    }
    KVARN_CHECK(j.is_object() && j.contains("model") && j["model"].is_object(), file_,
                ": not a tokenizer.json (no 'model' object)");
    byte_map_ = byte_to_unicode_table();
    for (int b = 0; b < 256; ++b) unicode_to_byte_[byte_map_[b]] = static_cast<std::uint8_t>(b);
    in_section("model", [&] { load_model(j["model"]); });
    in_section("added_tokens", [&] { load_added(j); });
    in_section("normalizer", [&] { load_normalizer(j.value("normalizer", json())); });
    in_section("pre_tokenizer", [&] { load_pre_tokenizer(j.value("pre_tokenizer", json())); });
    in_section("post_processor", [&] { load_post_processor(j.value("post_processor", json())); });
    in_section("decoder", [&] { load_decoder(j.value("decoder", json())); });
  }

  // Runs one section's loader; a value of the wrong JSON type inside it (a number where a string
  // belongs, ...) becomes one error naming the file and the section.
  template <typename Fn>
  void in_section(const char* key, Fn&& load) {
    try {
      load();
    } catch (const json::exception& e) {
      fail(file_, ": '", key, "': malformed (", without_tag(e.what()), ")");
    }
  }

  std::vector<std::int32_t> encode(const std::string& text, bool add_special) const override {
    KVARN_CHECK(valid_utf8(text), "tokenizer ", file_, ": input is not valid UTF-8");
    std::vector<std::int32_t> ids;
    for (const auto& [piece, added] : split_added(text)) {
      if (added >= 0) {
        ids.push_back(added);
        continue;
      }
      for (const auto& word : pre_tokenize(piece)) bpe(word, &ids);
    }
    if (add_special) {
      std::vector<std::int32_t> out = prefix_;
      out.insert(out.end(), ids.begin(), ids.end());
      out.insert(out.end(), suffix_.begin(), suffix_.end());
      return out;
    }
    return ids;
  }

  std::string decode(const std::vector<std::int32_t>& ids, bool skip_special) const override {
    std::string bytes;
    for (auto id : ids) {
      auto it = id_to_token_.find(id);
      KVARN_CHECK(it != id_to_token_.end(), "tokenizer ", file_, ": unknown token id ", id);
      if (skip_special && special_ids_.count(id)) continue;
      const std::string& tok = it->second;
      std::string mapped;
      bool ok = true;
      for (std::size_t i = 0; i < tok.size() && ok;) {
        const auto [cp, len] = decode_cp(tok, i);
        auto b = unicode_to_byte_.find(tok.substr(i, len));
        if (b == unicode_to_byte_.end()) {
          ok = false;
        } else {
          mapped += static_cast<char>(b->second);
        }
        i += len;
      }
      bytes += ok ? mapped : tok;  // tokens outside the byte alphabet pass through (as HF)
    }
    return utf8_lossy(bytes);
  }

  int vocab_size() const override {
    return id_to_token_.empty() ? 0 : id_to_token_.rbegin()->first + 1;
  }
  std::optional<std::int32_t> token_to_id(const std::string& token) const override {
    for (const auto& a : added_) {
      if (a.content == token) return a.id;
    }
    auto it = vocab_.find(token);
    if (it == vocab_.end()) return std::nullopt;
    return it->second;
  }
  std::string id_to_token(std::int32_t id) const override {
    auto it = id_to_token_.find(id);
    return it == id_to_token_.end() ? std::string() : it->second;
  }

 private:
  static std::uint64_t pair_key(std::int32_t a, std::int32_t b) {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32) |
           static_cast<std::uint32_t>(b);
  }

  void load_model(const json& m) {
    const std::string type = m.value("type", std::string("BPE"));
    KVARN_CHECK(type == "BPE", file_, ": tokenizer model '", type,
                "' is not supported (byte-level BPE only)");
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      KVARN_CHECK(!m.contains(key) || m[key].is_null() || m[key] == "", file_, ": BPE ", key,
                  " is not supported");
    }
    KVARN_CHECK(!m.value("byte_fallback", false), file_, ": BPE byte_fallback is not supported");
    KVARN_CHECK(!m.contains("dropout") || m["dropout"].is_null() || m["dropout"] == 0.0, file_,
                ": BPE dropout is not supported");
    ignore_merges_ = m.value("ignore_merges", false);
    KVARN_CHECK(m.contains("vocab") && m["vocab"].is_object(), file_, ": BPE vocab missing");
    for (auto it = m["vocab"].begin(); it != m["vocab"].end(); ++it) {
      KVARN_CHECK(it->is_number_integer(), file_, ": vocab entry '", it.key(),
                  "' has no integer id");
      const auto id = it->get<std::int32_t>();
      KVARN_CHECK(id >= 0, file_, ": vocab entry '", it.key(), "' has negative id ", id);
      vocab_[it.key()] = id;
      id_to_token_[id] = it.key();
    }
    if (m.contains("unk_token") && m["unk_token"].is_string()) {
      auto it = vocab_.find(m["unk_token"].get<std::string>());
      KVARN_CHECK(it != vocab_.end(), file_, ": unk_token is not in the vocabulary");
      unk_id_ = it->second;
    }
    KVARN_CHECK(m.contains("merges") && m["merges"].is_array(), file_, ": BPE merges missing");
    std::int32_t rank = 0;
    for (const auto& mg : m["merges"]) {
      std::string a, b;
      if (mg.is_string()) {  // "a b" (older format)
        const auto s = mg.get<std::string>();
        const auto sp = s.find(' ', 1);
        KVARN_CHECK(sp != std::string::npos, file_, ": merge ", rank, " '", s,
                    "' is not 'left right'");
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else {
        KVARN_CHECK(mg.is_array() && mg.size() == 2 && mg[0].is_string() && mg[1].is_string(),
                    file_, ": merge ", rank, " is neither \"a b\" nor [a, b]");
        a = mg[0].get<std::string>();
        b = mg[1].get<std::string>();
      }
      auto ia = vocab_.find(a), ib = vocab_.find(b), iab = vocab_.find(a + b);
      KVARN_CHECK(ia != vocab_.end() && ib != vocab_.end() && iab != vocab_.end(), file_,
                  ": merge ", rank, " (", a, " ", b, ") uses a token outside the vocabulary");
      merges_.emplace(pair_key(ia->second, ib->second), std::make_pair(rank, iab->second));
      ++rank;
    }
  }

  void load_added(const json& j) {
    if (!j.contains("added_tokens") || j["added_tokens"].is_null()) return;
    KVARN_CHECK(j["added_tokens"].is_array(), file_, ": added_tokens is not a list");
    for (const auto& t : j["added_tokens"]) {
      KVARN_CHECK(t.is_object() && t.contains("id") && t["id"].is_number_integer() &&
                      t.contains("content") && t["content"].is_string(),
                  file_, ": malformed added token ", t.dump());
      AddedToken a;
      a.id = t["id"].get<std::int32_t>();
      a.content = t["content"].get<std::string>();
      a.single_word = t.value("single_word", false);
      a.lstrip = t.value("lstrip", false);
      a.rstrip = t.value("rstrip", false);
      a.special = t.value("special", false);
      KVARN_CHECK(!a.content.empty(), file_, ": added token ", a.id, " is empty");
      id_to_token_[a.id] = a.content;
      if (a.special) special_ids_.insert(a.id);
      added_.push_back(std::move(a));
    }
  }

  void load_normalizer(const json& n) {
    if (n.is_null()) return;
    const std::string type = n.value("type", std::string());
    if (type == "Sequence" && n.contains("normalizers") && n["normalizers"].is_array()) {
      for (const auto& x : n["normalizers"]) load_normalizer(x);
      return;
    }
    fail(file_, ": normalizer '", type, "' is not supported (none)");
  }

  void load_pre_tokenizer(const json& p) {
    if (p.is_null()) return;
    const std::string type = p.value("type", std::string());
    if (type == "Sequence") {
      KVARN_CHECK(p.contains("pretokenizers") && p["pretokenizers"].is_array(), file_,
                  ": Sequence pre-tokenizer without 'pretokenizers'");
      for (const auto& x : p["pretokenizers"]) load_pre_tokenizer(x);
    } else if (type == "ByteLevel") {
      PreStep s;
      s.kind = PreStep::kByteLevel;
      s.add_prefix_space = p.value("add_prefix_space", false);
      if (p.value("use_regex", true))
        s.regex = std::make_shared<Regex>(rewrite_spaces(kGpt2Pattern), file_);
      pre_.push_back(std::move(s));
      byte_level_ = true;
    } else if (type == "Split") {
      PreStep s;
      s.kind = PreStep::kSplit;
      const auto& pat = p.value("pattern", json());
      std::string regex;
      if (pat.is_object() && pat.contains("Regex") && pat["Regex"].is_string()) {
        regex = rewrite_spaces(pat["Regex"].get<std::string>());
      } else if (pat.is_object() && pat.contains("String") && pat["String"].is_string()) {
        regex = escape_literal(pat["String"].get<std::string>());
      } else {
        fail(file_, ": Split pre-tokenizer pattern must be {\"Regex\": ..} or {\"String\": ..}");
      }
      s.regex = std::make_shared<Regex>(regex, file_);
      const std::string b = p.value("behavior", std::string("Isolated"));
      if (b == "Removed") {
        s.behavior = Behavior::kRemoved;
      } else if (b == "Isolated") {
        s.behavior = Behavior::kIsolated;
      } else if (b == "MergedWithPrevious") {
        s.behavior = Behavior::kMergedWithPrevious;
      } else if (b == "MergedWithNext") {
        s.behavior = Behavior::kMergedWithNext;
      } else if (b == "Contiguous") {
        s.behavior = Behavior::kContiguous;
      } else {
        fail(file_, ": Split behavior '", b, "' is not supported");
      }
      s.invert = p.value("invert", false);
      pre_.push_back(std::move(s));
    } else if (type == "Digits") {
      PreStep s;
      s.kind = PreStep::kDigits;
      // Rust char::is_numeric is Unicode N; contiguous digits form one piece unless individual.
      const bool individual = p.value("individual_digits", false);
      s.regex = std::make_shared<Regex>(individual ? R"(\p{N})" : R"(\p{N}+)", file_);
      pre_.push_back(std::move(s));
    } else {
      fail(file_, ": pre-tokenizer '", type,
           "' is not supported (Sequence, Split, Digits, ByteLevel)");
    }
  }

  void load_post_processor(const json& p) {
    if (p.is_null()) return;
    const std::string type = p.value("type", std::string());
    if (type == "ByteLevel") return;  // offsets only
    if (type == "Sequence" && p.contains("processors") && p["processors"].is_array()) {
      for (const auto& x : p["processors"]) load_post_processor(x);
      return;
    }
    if (type == "TemplateProcessing") {
      KVARN_CHECK(p.contains("single") && p["single"].is_array(), file_,
                  ": TemplateProcessing without 'single'");
      const auto& specials = p.value("special_tokens", json::object());
      bool seen_sequence = false;
      for (const auto& item : p["single"]) {
        if (item.contains("Sequence")) {
          seen_sequence = true;
          continue;
        }
        KVARN_CHECK(item.contains("SpecialToken") && item["SpecialToken"].contains("id"), file_,
                    ": malformed TemplateProcessing item ", item.dump());
        const auto name = item["SpecialToken"]["id"].get<std::string>();
        KVARN_CHECK(specials.contains(name) && specials[name].contains("ids"), file_,
                    ": TemplateProcessing special token '", name, "' is not defined");
        for (const auto& id : specials[name]["ids"]) {
          (seen_sequence ? suffix_ : prefix_).push_back(id.get<std::int32_t>());
        }
      }
      return;
    }
    fail(file_, ": post-processor '", type,
         "' is not supported (ByteLevel, TemplateProcessing, Sequence)");
  }

  void load_decoder(const json& d) {
    if (d.is_null()) return;
    const std::string type = d.value("type", std::string());
    if (type == "ByteLevel") return;
    if (type == "Sequence" && d.contains("decoders") && d["decoders"].is_array()) {
      for (const auto& x : d["decoders"]) load_decoder(x);
      return;
    }
    fail(file_, ": decoder '", type, "' is not supported (ByteLevel)");
  }

  // Splits out added tokens (leftmost-longest), honouring lstrip/rstrip/single_word. Returns
  // (text, -1) pieces and ("", id) tokens.
  std::vector<std::pair<std::string, std::int32_t>> split_added(const std::string& text) const {
    std::vector<std::pair<std::string, std::int32_t>> out;
    std::size_t start = 0;  // start of pending plain text
    std::size_t i = 0;
    while (i < text.size()) {
      const AddedToken* best = nullptr;
      for (const auto& a : added_) {
        if (text.compare(i, a.content.size(), a.content) == 0 &&
            (best == nullptr || a.content.size() > best->content.size())) {
          best = &a;
        }
      }
      if (best != nullptr && best->single_word) {
        const std::size_t end = i + best->content.size();
        const bool left_ok = i == 0 || !word_char_.at(text, prev_cp_start(text, i));
        const bool right_ok = end >= text.size() || !word_char_.at(text, end);
        if (!left_ok || !right_ok) best = nullptr;
      }
      if (best == nullptr) {
        i += decode_cp(text, i).second;
        continue;
      }
      std::size_t mb = i, me = i + best->content.size();
      if (best->lstrip) {
        while (mb > start) {
          const std::size_t p = prev_cp_start(text, mb);
          if (!is_space_cp(decode_cp(text, p).first)) break;
          mb = p;
        }
      }
      if (best->rstrip) {
        while (me < text.size()) {
          const auto [cp, len] = decode_cp(text, me);
          if (!is_space_cp(cp)) break;
          me += len;
        }
      }
      if (mb > start) out.emplace_back(text.substr(start, mb - start), -1);
      out.emplace_back(std::string(), best->id);
      start = i = me;
    }
    if (start < text.size()) out.emplace_back(text.substr(start), -1);
    return out;
  }

  std::vector<std::string> pre_tokenize(const std::string& text) const {
    std::vector<std::string> pieces{text};
    for (const auto& s : pre_) {
      std::vector<std::string> next;
      for (auto& piece : pieces) {
        if (s.kind == PreStep::kByteLevel) {
          std::string p = piece;
          if (s.add_prefix_space && (p.empty() || p[0] != ' ')) p.insert(p.begin(), ' ');
          std::vector<std::string> parts =
              s.regex ? split(p, *s.regex, Behavior::kIsolated, false) : std::vector{p};
          for (const auto& part : parts) {
            std::string mapped;
            for (unsigned char c : part) mapped += byte_map_[c];
            next.push_back(std::move(mapped));
          }
        } else {
          for (auto& part : split(piece, *s.regex, s.behavior, s.invert)) {
            next.push_back(std::move(part));
          }
        }
      }
      pieces = std::move(next);
    }
    if (!byte_level_) {
      fail(file_, ": tokenizer has no ByteLevel pre-tokenizer (only byte-level BPE is supported)");
    }
    return pieces;
  }

  // BPE of one pre-token (already byte-mapped), as tokenizers' Word::merge_all.
  void bpe(const std::string& word, std::vector<std::int32_t>* ids) const {
    if (word.empty()) return;
    if (ignore_merges_) {
      auto it = vocab_.find(word);
      if (it != vocab_.end()) {
        ids->push_back(it->second);
        return;
      }
    }
    struct Sym {
      std::int32_t id;
      int prev, next;
      bool alive;
    };
    std::vector<Sym> syms;
    for (std::size_t i = 0; i < word.size();) {
      const std::size_t len = decode_cp(word, i).second;
      auto it = vocab_.find(word.substr(i, len));
      i += len;
      std::int32_t id;
      if (it != vocab_.end()) {
        id = it->second;
      } else if (unk_id_ >= 0) {
        id = unk_id_;
      } else {
        continue;  // `tokenizers` drops characters it cannot map when there is no unk token
      }
      const int n = static_cast<int>(syms.size());
      syms.push_back({id, n - 1, -1, true});
      if (n > 0) syms[n - 1].next = n;
    }
    struct Cand {
      std::int32_t rank;
      int pos;
      std::int32_t new_id;
      bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> q;
    auto push = [&](int pos) {
      if (pos < 0 || syms[pos].next < 0) return;
      auto it = merges_.find(pair_key(syms[pos].id, syms[syms[pos].next].id));
      if (it != merges_.end()) q.push({it->second.first, pos, it->second.second});
    };
    for (int i = 0; i + 1 < static_cast<int>(syms.size()); ++i) push(i);
    while (!q.empty()) {
      const Cand c = q.top();
      q.pop();
      Sym& s = syms[c.pos];
      if (!s.alive || s.next < 0) continue;
      auto it = merges_.find(pair_key(s.id, syms[s.next].id));
      if (it == merges_.end() || it->second.second != c.new_id) continue;  // stale entry
      Sym& r = syms[s.next];
      s.id = c.new_id;
      r.alive = false;
      s.next = r.next;
      if (r.next >= 0) syms[r.next].prev = c.pos;
      push(s.prev);
      push(c.pos);
    }
    for (const auto& s : syms) {
      if (s.alive) ids->push_back(s.id);
    }
  }

  std::string file_;
  std::unordered_map<std::string, std::int32_t> vocab_;
  std::map<std::int32_t, std::string> id_to_token_;
  std::unordered_map<std::uint64_t, std::pair<std::int32_t, std::int32_t>> merges_;
  std::vector<AddedToken> added_;
  std::set<std::int32_t> special_ids_;
  std::vector<PreStep> pre_;
  std::vector<std::int32_t> prefix_, suffix_;
  std::array<std::string, 256> byte_map_;
  std::unordered_map<std::string, std::uint8_t> unicode_to_byte_;
  WordChar word_char_;
  std::int32_t unk_id_ = -1;
  bool ignore_merges_ = false;
  bool byte_level_ = false;
};

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::load(const std::filesystem::path& path) {
  return std::make_unique<BpeTokenizer>(path);
}

bool Tokenizer::available() { return true; }

}  // namespace kvarn
