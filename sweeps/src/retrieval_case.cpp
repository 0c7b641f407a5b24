// Retrieval in the sweep engine: passkey and induction copy (kvarn/runner/retrieval.hpp) for one
// case. Work that does not depend on the method is done once per process and reused by every
// case: the loaded models, the tokenized prompt pieces and haystack, and the fp16 reference
// answers; each method runs every prompt through its own cache (nothing of a method's cache is
// shared, so every method sees its prompt exactly as it would decode it).
#include "retrieval_case.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "kvarn/core/effective_bits.hpp"
#include "kvarn/core/registry.hpp"
#include "kvarn/data/error.hpp"
#include "kvarn/data/read_file.hpp"
#include "kvarn/eval/metrics.hpp"
#include "kvarn/runner/accumulation.hpp"
#include "kvarn/runner/capture.hpp"
#include "kvarn/runner/retrieval.hpp"
#include "kvarn/runner/runner.hpp"
#include "runner_cache.hpp"

namespace kvarn {

namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// Tokenized pieces of the passkey prompt of one model: the filler sentences and what surrounds
// the haystack.
struct PasskeyText {
  std::vector<std::int32_t> head, tail;
  std::vector<std::vector<std::int32_t>> sentences;
};

struct Memo {
  std::map<std::string, PasskeyText> passkey_text;
  std::map<std::string, std::string> reference_outputs;    // fp16 answer of one passkey prompt
  std::map<std::string, std::vector<int>> reference_hits;  // fp16 hits of one induction sequence
};
Memo& memo() {
  static Memo m;
  return m;
}

const Runner& runner_for(const RetrievalModel& m, const RetrievalSettings& r) {
  return shared_runner(m.resolved, r.device, r.threads);
}

// The filler text: a JSONL file's "text" fields joined by newlines, or the file as it is.
std::string filler_text(const PasskeySettings& p) {
  const std::string raw = read_regular_file(p.filler_resolved, "retrieval filler");
  if (p.filler_resolved.extension() != ".jsonl") return raw;
  std::istringstream in(raw);
  std::string line, out;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const json j = json::parse(line, nullptr, false);
    KVARN_CHECK(j.is_object() && j.contains("text") && j["text"].is_string(), p.filler, ":", lineno,
                ": expected a JSON object with a string \"text\"");
    out += j["text"].get<std::string>() + "\n";
  }
  return out;
}

// The filler's sentences: its non-blank lines, trimmed, each tokenized after one space (the
// separator between sentences of the haystack).
std::vector<std::vector<std::int32_t>> filler_sentences(const Runner& r, const PasskeySettings& p) {
  std::istringstream in(filler_text(p));
  std::vector<std::vector<std::int32_t>> out;
  std::string line;
  while (std::getline(in, line)) {
    const std::size_t b = line.find_first_not_of(" \t\r");
    if (b == std::string::npos) continue;
    const std::size_t e = line.find_last_not_of(" \t\r");
    std::string sentence(1, ' ');
    sentence.append(line, b, e - b + 1);
    std::vector<std::int32_t> t = r.encode(sentence);
    if (!t.empty()) out.push_back(std::move(t));
  }
  KVARN_CHECK(!out.empty(), p.filler, ": the filler has no sentences (non-blank lines)");
  return out;
}

const PasskeyText& passkey_text(const Runner& r, const PasskeySettings& p) {
  const std::string key = p.model.resolved.string() + "|" + p.filler_resolved.string() + "|" +
                          std::to_string(p.chat) + "|" + p.intro + "|" + p.question + "|" +
                          p.answer_prefix;
  auto it = memo().passkey_text.find(key);
  if (it != memo().passkey_text.end()) return it->second;
  // The user turn's text is intro + haystack + question; the haystack is spliced in as tokens.
  const std::string marker = "\x01HAYSTACK\x01";
  const std::string turn = p.chat ? render_chat_prompt(p.model.resolved, marker) : marker;
  const std::size_t at = turn.find(marker);
  PasskeyText t;
  t.head = r.encode(turn.substr(0, at) + p.intro);
  t.tail = r.encode(p.question + turn.substr(at + marker.size()) + p.answer_prefix);
  t.sentences = filler_sentences(r, p);
  return memo().passkey_text.emplace(key, std::move(t)).first->second;
}

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (std::size_t pos = s.find(from); pos != std::string::npos;
       pos = s.find(from, pos + to.size()))
    s.replace(pos, from.size(), to);
  return s;
}

// The fp16 method stores exactly what the exact_fp16 reference cache stores, so its runs are
// the reference's bit for bit (tests/eval_runner/test_retrieval.cpp): one run serves both.
bool reuses_reference(const CaseSpec& cs) { return cs.spec == "fp16"; }

// One summary row of this case.
struct RowContext {
  const CaseSpec& cs;
  double bits;
  json& rows;
};
void add_row(const RowContext& rc, const std::string& data, double eff, const std::string& metric,
             double value, json extra = json::object()) {
  json row = {{"case_id", rc.cs.id},    {"method", rc.cs.name}, {"spec", rc.cs.spec},
              {"family", rc.cs.family}, {"data", data},         {"bits_per_element", rc.bits},
              {"effective_bits", eff},  {"metric", metric},     {"scope", "retrieval"},
              {"layer", "all"},         {"head", "all"},        {"value", json_number(value)}};
  for (auto& [k, v] : extra.items()) row[k] = v;
  rc.rows.push_back(std::move(row));
}

// accuracy with its Wilson and Clopper-Pearson 95 % intervals.
json binomial_json(int successes, int trials) {
  const BinomialInterval w = wilson_interval(successes, trials);
  const BinomialInterval cp = clopper_pearson_interval(successes, trials);
  return {{"successes", successes},
          {"trials", trials},
          {"accuracy", trials > 0 ? static_cast<double>(successes) / trials : 0.0},
          {"wilson", {w.low, w.high}},
          {"clopper_pearson", {cp.low, cp.high}}};
}

// Accuracy rows (value, Wilson bounds) of one cell.
void add_accuracy_rows(const RowContext& rc, const std::string& data, double eff,
                       const std::string& prefix, const json& b, const json& extra) {
  add_row(rc, data, eff, prefix + ".accuracy", b["accuracy"].get<double>(), extra);
  add_row(rc, data, eff, prefix + ".ci_low", b["wilson"][0].get<double>(), extra);
  add_row(rc, data, eff, prefix + ".ci_high", b["wilson"][1].get<double>(), extra);
}

// The filler of a trial draws from the trial's seed mixed with this, its key from the seed itself.
constexpr std::uint64_t kFillerSeed = 0xf111e5ull;

std::uint64_t cell_seed(std::int64_t seed, std::size_t a, std::size_t b, int trial) {
  return static_cast<std::uint64_t>(seed) * 1000003ull + (a * 1009 + b) * 100003ull +
         static_cast<std::uint64_t>(trial);
}

// The model's greedy answer to one prompt with `spec` in the loop ("exact_fp16": the reference).
std::string answer(const Runner& r, const RetrievalSettings& s, const std::string& spec,
                   const std::vector<std::int32_t>& prompt) {
  ModelKvCache cache = r.model().make_cache(spec);
  cache.set_placement(KvPlacement::kHost);
  const std::vector<std::int32_t> out =
      greedy_in_loop(r.model(), cache, prompt, s.block, parse_current_token(s.current_token),
                     s.passkey.decode_steps, true);
  return r.decode(out);
}

json run_passkey(const RetrievalSettings& s, const Method& method, const CaseSpec& cs, json& rows) {
  const PasskeySettings& p = s.passkey;
  const RowContext rc{cs, method.accounting(p.model.head_dim).bits_per_element(), rows};
  const Runner& r = runner_for(p.model, s);
  const PasskeyText& text = passkey_text(r, p);
  json cells = json::array();
  int all_hits = 0, all_n = 0, all_agree = 0;
  for (std::size_t li = 0; li < p.lengths.size(); ++li) {
    const int L = p.lengths[li];
    const double eff = model_effective_bits(method, p.model.head_dim, L, p.model.num_layers);
    for (std::size_t di = 0; di < p.depths.size(); ++di) {
      int hits = 0, agree = 0;
      double digit_score = 0;
      json trials = json::array();
      for (int t = 0; t < p.trials; ++t) {
        const std::string key = passkey_digits(cell_seed(s.seed, li, di, t), p.digits);
        const std::vector<std::int32_t> needle = r.encode(replace_all(p.needle, "{key}", key));
        const PasskeyPrompt prompt =
            build_passkey_prompt(text.head, needle, text.tail, text.sentences, L, p.depths[di],
                                 cell_seed(s.seed, li, di, t) ^ kFillerSeed);
        const std::string ref_key = p.model.resolved.string() + "|" + std::to_string(s.block) +
                                    "|" + s.current_token + "|" + std::to_string(p.decode_steps) +
                                    "|" + json(prompt.tokens).dump();
        auto ref = memo().reference_outputs.find(ref_key);
        if (ref == memo().reference_outputs.end()) {
          ref = memo()
                    .reference_outputs.emplace(ref_key, answer(r, s, "exact_fp16", prompt.tokens))
                    .first;
        }
        const std::string out =
            reuses_reference(rc.cs) ? ref->second : answer(r, s, rc.cs.spec, prompt.tokens);
        const bool match = passkey_match(out, key);
        hits += match;
        agree += out == ref->second;
        digit_score += passkey_digit_score(out, key);
        trials.push_back({{"key", key},
                          {"needle_start", prompt.needle_start},
                          {"output", out},
                          {"fp16_output", ref->second},
                          {"match", match}});
      }
      json b = binomial_json(hits, p.trials);
      const json where = {{"length", L}, {"depth", p.depths[di]}};
      const std::string data =
          p.model.name + "/L=" + std::to_string(L) + "/depth=" + json(p.depths[di]).dump();
      add_accuracy_rows(rc, data, eff, "retrieval.passkey", b, where);
      add_row(rc, data, eff, "retrieval.passkey.digit_score", digit_score / p.trials, where);
      add_row(rc, data, eff, "retrieval.passkey.fp16_agreement",
              static_cast<double>(agree) / p.trials, where);
      b["length"] = L;
      b["depth"] = p.depths[di];
      b["effective_bits"] = eff;
      b["fp16_agreement"] = static_cast<double>(agree) / p.trials;
      b["runs"] = std::move(trials);
      cells.push_back(std::move(b));
      all_hits += hits;
      all_agree += agree;
      all_n += p.trials;
    }
  }
  const int longest = *std::max_element(p.lengths.begin(), p.lengths.end());
  const double eff = model_effective_bits(method, p.model.head_dim, longest, p.model.num_layers);
  const json all = binomial_json(all_hits, all_n);
  add_accuracy_rows(rc, p.model.name, eff, "retrieval.passkey", all, json::object());
  add_row(rc, p.model.name, eff, "retrieval.passkey.fp16_agreement",
          static_cast<double>(all_agree) / all_n);
  return {{"model", p.model.name}, {"all", all}, {"cells", std::move(cells)}};
}

json run_induction(const RetrievalSettings& s, const Method& method, const CaseSpec& cs,
                   json& rows) {
  const InductionSettings& ind = s.induction;
  const RowContext rc{cs, method.accounting(ind.model.head_dim).bits_per_element(), rows};
  const Runner& r = runner_for(ind.model, s);
  const ChunkAttention ct = parse_current_token(s.current_token);
  auto hits_of = [&](const std::string& spec, const InductionSequence& seq) {
    ModelKvCache cache = r.model().make_cache(spec);
    cache.set_placement(KvPlacement::kHost);
    return induction_hits(r.model(), cache, seq, s.block, ct);
  };
  json cells = json::array();
  int all_hits = 0, all_n = 0;
  for (std::size_t si = 0; si < ind.spans.size(); ++si) {
    for (std::size_t di = 0; di < ind.distances.size(); ++di) {
      const int span = ind.spans[si], dist = ind.distances[di];
      const int tokens = static_cast<int>(induction_tokens(ind, span, dist));
      const double eff =
          model_effective_bits(method, ind.model.head_dim, tokens, ind.model.num_layers);
      int hits = 0, n = 0, ref_hits = 0, exact_copies = 0;
      for (int t = 0; t < ind.trials; ++t) {
        const InductionSequence seq =
            build_induction_sequence(cell_seed(s.seed, si, di, t) ^ 0x5eedull, ind.prefix, span,
                                     dist, ind.token_lo, ind.token_hi, ind.occurrences);
        const std::string ref_key = ind.model.resolved.string() + "|" + std::to_string(s.block) +
                                    "|" + s.current_token + "|" + json(seq.tokens).dump();
        auto ref = memo().reference_hits.find(ref_key);
        if (ref == memo().reference_hits.end())
          ref = memo().reference_hits.emplace(ref_key, hits_of("exact_fp16", seq)).first;
        const std::vector<int> h = reuses_reference(rc.cs) ? ref->second : hits_of(rc.cs.spec, seq);
        int seq_hits = 0;
        for (int x : h) seq_hits += x;
        for (int x : ref->second) ref_hits += x;
        hits += seq_hits;
        n += static_cast<int>(h.size());
        exact_copies += seq_hits == static_cast<int>(h.size());
      }
      json b = binomial_json(hits, n);
      const json where = {{"span", span}, {"distance", dist}};
      const std::string data =
          ind.model.name + "/span=" + std::to_string(span) + "/distance=" + std::to_string(dist);
      add_accuracy_rows(rc, data, eff, "retrieval.induction", b, where);
      add_row(rc, data, eff, "retrieval.induction.fp16_accuracy", static_cast<double>(ref_hits) / n,
              where);
      add_row(rc, data, eff, "retrieval.induction.exact_copies",
              static_cast<double>(exact_copies) / ind.trials, where);
      b["span"] = span;
      b["distance"] = dist;
      b["tokens"] = tokens;
      b["effective_bits"] = eff;
      b["fp16_accuracy"] = static_cast<double>(ref_hits) / n;
      b["exact_copies"] = exact_copies;
      b["sequences"] = ind.trials;
      cells.push_back(std::move(b));
      all_hits += hits;
      all_n += n;
    }
  }
  const int longest = static_cast<int>(
      induction_tokens(ind, *std::max_element(ind.spans.begin(), ind.spans.end()),
                       *std::max_element(ind.distances.begin(), ind.distances.end())));
  const json all = binomial_json(all_hits, all_n);
  add_accuracy_rows(rc, ind.model.name,
                    model_effective_bits(method, ind.model.head_dim, longest, ind.model.num_layers),
                    "retrieval.induction", all, json::object());
  return {{"model", ind.model.name}, {"all", all}, {"cells", std::move(cells)}};
}

// A method that cannot hold the model's heads (e.g. a group larger than head_dim): "" when it can.
std::string unsupported(const Method& method, int head_dim) {
  try {
    method.check_head_dim(head_dim);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

RetrievalCase run_retrieval_case(const SweepConfig& cfg, const CaseSpec& cs) {
  const RetrievalSettings& s = cfg.retrieval;
  const std::unique_ptr<Method> method = make_method(cs.spec);
  RetrievalCase out;
  out.record = {{"block", s.block}, {"current_token", s.current_token}};
  if (s.passkey.enabled) {
    const std::string why = unsupported(*method, s.passkey.model.head_dim);
    out.record["passkey"] = why.empty() ? run_passkey(s, *method, cs, out.rows)
                                        : json{{"model", s.passkey.model.name}, {"skipped", why}};
  }
  if (s.induction.enabled) {
    const std::string why = unsupported(*method, s.induction.model.head_dim);
    out.record["induction"] = why.empty()
                                  ? run_induction(s, *method, cs, out.rows)
                                  : json{{"model", s.induction.model.name}, {"skipped", why}};
  }
  return out;
}

}  // namespace kvarn
