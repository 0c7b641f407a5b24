// Passkey retrieval and induction copy with a method's cache in the model loop, and binomial
// intervals for their accuracies (retrieval.hpp).
#include "kvarn/runner/retrieval.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <random>

#include "kvarn/data/error.hpp"

namespace kvarn {

namespace {

// P(X <= x) for X ~ Binomial(n, p), summed in double from log-space terms.
double binomial_cdf(int x, int n, double p) {
  if (x < 0) return 0;
  if (x >= n) return 1;
  if (p <= 0) return 1;
  if (p >= 1) return 0;
  const double lp = std::log(p), lq = std::log1p(-p);
  const double lg_n = std::lgamma(n + 1.0);
  double s = 0;
  for (int k = 0; k <= x; ++k) {
    s += std::exp(lg_n - std::lgamma(k + 1.0) - std::lgamma(n - k + 1.0) + k * lp + (n - k) * lq);
  }
  return std::min(1.0, s);
}

// The p in [0, 1] where f (monotone) crosses `target`, by bisection to double resolution.
template <class F>
double bisect(F&& f, double target, bool increasing) {
  double lo = 0, hi = 1;
  for (int i = 0; i < 200 && hi - lo > 1e-15; ++i) {
    const double mid = 0.5 * (lo + hi);
    const bool below = f(mid) < target;
    if (below == increasing) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return 0.5 * (lo + hi);
}

// One uniform integer in [0, n) from 64 random bits (std's distributions are
// implementation-defined; this is the same everywhere).
std::uint64_t uniform_below(std::mt19937_64& rng, std::uint64_t n) {
  const std::uint64_t limit = ~0ull - (~0ull % n);  // rejection keeps it exactly uniform
  std::uint64_t r = rng();
  while (r >= limit) r = rng();
  return r % n;
}

std::vector<float> last_logits(const ForwardResult& r) {
  return {r.logits.data(), r.logits.data() + r.logits.size()};
}

}  // namespace

BinomialInterval wilson_interval(int successes, int trials, double z) {
  KVARN_CHECK(trials >= 0 && successes >= 0 && successes <= trials, "wilson_interval: successes ",
              successes, " of ", trials, " trials");
  if (trials == 0) return {0, 1};
  const double n = trials, p = successes / n, z2 = z * z;
  const double centre = (p + z2 / (2 * n)) / (1 + z2 / n);
  const double half = z / (1 + z2 / n) * std::sqrt(p * (1 - p) / n + z2 / (4 * n * n));
  // The bounds at x = 0 and x = n are exact (0 and 1); the formula leaves rounding there.
  return {successes == 0 ? 0.0 : std::max(0.0, centre - half),
          successes == trials ? 1.0 : std::min(1.0, centre + half)};
}

BinomialInterval clopper_pearson_interval(int successes, int trials, double confidence) {
  KVARN_CHECK(trials >= 0 && successes >= 0 && successes <= trials,
              "clopper_pearson_interval: successes ", successes, " of ", trials, " trials");
  KVARN_CHECK(confidence > 0 && confidence < 1, "clopper_pearson_interval: confidence ", confidence,
              " not in (0, 1)");
  if (trials == 0) return {0, 1};
  const double a = (1 - confidence) / 2;
  const int x = successes, n = trials;
  BinomialInterval ci;
  // low: P(X >= x | p) = a, i.e. 1 - cdf(x - 1) = a; that tail grows with p.
  ci.low = x == 0 ? 0.0 : bisect([&](double p) { return 1 - binomial_cdf(x - 1, n, p); }, a, true);
  // high: P(X <= x | p) = a; falls with p.
  ci.high = x == n ? 1.0 : bisect([&](double p) { return binomial_cdf(x, n, p); }, a, false);
  return ci;
}

std::vector<float> prefill_in_blocks(const Model& model, ModelKvCache& cache,
                                     std::span<const std::int32_t> tokens, int block,
                                     ChunkAttention current_token) {
  KVARN_CHECK(block >= 1, "prefill_in_blocks: block must be >= 1 (got ", block, ")");
  KVARN_CHECK(!tokens.empty(), "prefill_in_blocks: no tokens");
  const int n = static_cast<int>(tokens.size());
  std::vector<float> logits;
  for (int start = 0; start < n; start += block) {
    const int len = std::min(block, n - start);
    ForwardOptions fo;
    fo.logits = start + len == n ? LogitsMode::kLast : LogitsMode::kNone;
    fo.chunk_attention = current_token;
    const ForwardResult r = model.forward(cache, tokens.subspan(start, len), fo);
    if (start + len == n) logits = last_logits(r);
  }
  return logits;
}

std::vector<std::int32_t> greedy_in_loop(const Model& model, ModelKvCache& cache,
                                         std::span<const std::int32_t> prompt, int block,
                                         ChunkAttention current_token, int steps,
                                         bool stop_at_eos) {
  std::vector<std::int32_t> out;
  std::vector<float> logits = prefill_in_blocks(model, cache, prompt, block, current_token);
  const std::vector<int>& eos = model.config().eos_token_ids;
  ForwardOptions fo;
  fo.chunk_attention = current_token;
  for (int s = 0; s < steps; ++s) {
    const std::int32_t next = argmax(logits);
    out.push_back(next);
    if (stop_at_eos && std::find(eos.begin(), eos.end(), next) != eos.end()) break;
    if (s + 1 < steps) {
      logits = last_logits(model.forward(cache, std::span<const std::int32_t>(&next, 1), fo));
    }
  }
  return out;
}

std::string passkey_digits(std::uint64_t seed, int digits) {
  KVARN_CHECK(digits >= 1 && digits <= 64, "passkey_digits: digits must be in [1, 64] (got ",
              digits, ")");
  std::mt19937_64 rng(seed);
  std::string s;
  for (int i = 0; i < digits; ++i) s.push_back(static_cast<char>('0' + uniform_below(rng, 10)));
  return s;
}

Haystack build_haystack(const std::vector<std::vector<std::int32_t>>& sentences, int tokens,
                        std::uint64_t seed) {
  KVARN_CHECK(tokens >= 0, "haystack: negative length ", tokens);
  Haystack h;
  h.boundaries.push_back(0);
  if (tokens == 0) return h;
  const bool any = std::any_of(sentences.begin(), sentences.end(),
                               [](const std::vector<std::int32_t>& s) { return !s.empty(); });
  KVARN_CHECK(any, "haystack: no filler sentence has tokens");
  std::mt19937_64 rng(seed);
  h.tokens.reserve(static_cast<std::size_t>(tokens));
  while (static_cast<int>(h.tokens.size()) < tokens) {
    const auto& s = sentences[uniform_below(rng, sentences.size())];
    if (s.empty()) continue;
    const std::size_t room = static_cast<std::size_t>(tokens) - h.tokens.size();
    h.tokens.insert(h.tokens.end(), s.begin(), s.begin() + std::min(room, s.size()));
    h.boundaries.push_back(static_cast<int>(h.tokens.size()));
  }
  return h;  // the last boundary is `tokens`, where the haystack ends
}

PasskeyPrompt build_passkey_prompt(std::span<const std::int32_t> head,
                                   std::span<const std::int32_t> needle,
                                   std::span<const std::int32_t> tail,
                                   const std::vector<std::vector<std::int32_t>>& sentences,
                                   int length, double depth, std::uint64_t seed) {
  KVARN_CHECK(depth >= 0 && depth <= 1, "passkey prompt: depth ", depth, " not in [0, 1]");
  const int fixed = static_cast<int>(head.size() + needle.size() + tail.size());
  const int F = length - fixed;
  KVARN_CHECK(F >= 0, "passkey prompt: length ", length, " is shorter than the ", fixed,
              " tokens of head, needle and question");
  const Haystack hay = build_haystack(sentences, F, seed);
  const double target = depth * F;
  int k = 0;
  for (int b : hay.boundaries) {
    if (std::abs(b - target) < std::abs(k - target)) k = b;
  }
  PasskeyPrompt p;
  p.filler_tokens = F;
  p.tokens.reserve(static_cast<std::size_t>(length));
  p.tokens.insert(p.tokens.end(), head.begin(), head.end());
  p.tokens.insert(p.tokens.end(), hay.tokens.begin(), hay.tokens.begin() + k);
  p.needle_start = static_cast<int>(p.tokens.size());
  p.tokens.insert(p.tokens.end(), needle.begin(), needle.end());
  p.tokens.insert(p.tokens.end(), hay.tokens.begin() + k, hay.tokens.end());
  p.tokens.insert(p.tokens.end(), tail.begin(), tail.end());
  return p;
}

std::string first_digit_run(const std::string& output) {
  auto digit = [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; };
  const auto b = std::find_if(output.begin(), output.end(), digit);
  const auto e = std::find_if_not(b, output.end(), digit);
  return {b, e};
}

bool passkey_match(const std::string& output, const std::string& key) {
  return !key.empty() && first_digit_run(output) == key;
}

double passkey_digit_score(const std::string& output, const std::string& key) {
  if (key.empty()) return 0;
  const std::string run = first_digit_run(output);
  int hits = 0;
  for (std::size_t i = 0; i < key.size() && i < run.size(); ++i) hits += run[i] == key[i];
  return static_cast<double>(hits) / static_cast<double>(key.size());
}

InductionSequence build_induction_sequence(std::uint64_t seed, int prefix, int span, int distance,
                                           std::int32_t token_lo, std::int32_t token_hi,
                                           int occurrences) {
  KVARN_CHECK(prefix >= 0 && distance >= 0 && span >= 2 && occurrences >= 2,
              "induction sequence: prefix and distance must be >= 0, span and occurrences >= 2 "
              "(got ",
              prefix, ", ", distance, ", ", span, ", ", occurrences, ")");
  KVARN_CHECK(token_lo >= 0 && token_hi > token_lo, "induction sequence: empty token range [",
              token_lo, ", ", token_hi, ")");
  std::mt19937_64 rng(seed);
  const auto range = static_cast<std::uint64_t>(token_hi - token_lo);
  auto draw = [&] { return static_cast<std::int32_t>(token_lo + uniform_below(rng, range)); };
  InductionSequence s;
  s.span = span;
  for (int i = 0; i < prefix; ++i) s.tokens.push_back(draw());
  s.span_start = prefix;
  for (int i = 0; i < span; ++i) s.tokens.push_back(draw());
  for (int o = 1; o < occurrences; ++o) {
    for (int i = 0; i < distance; ++i) s.tokens.push_back(draw());
    s.repeat_start = static_cast<int>(s.tokens.size());
    for (int i = 0; i < span; ++i)
      s.tokens.push_back(s.tokens[static_cast<std::size_t>(prefix + i)]);
  }
  return s;
}

std::vector<int> induction_hits(const Model& model, ModelKvCache& cache,
                                const InductionSequence& seq, int block,
                                ChunkAttention current_token) {
  const std::span<const std::int32_t> all(seq.tokens);
  std::vector<float> logits =
      prefill_in_blocks(model, cache, all.first(static_cast<std::size_t>(seq.repeat_start) + 1),
                        block, current_token);
  ForwardOptions fo;
  fo.chunk_attention = current_token;
  std::vector<int> hits;
  for (int i = 1; i < seq.span; ++i) {
    const std::size_t at = static_cast<std::size_t>(seq.repeat_start + i);
    hits.push_back(argmax(logits) == seq.tokens[at] ? 1 : 0);
    if (i + 1 < seq.span) logits = last_logits(model.forward(cache, all.subspan(at, 1), fo));
  }
  return hits;
}

}  // namespace kvarn
