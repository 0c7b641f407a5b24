// Retrieval with the quantized cache in the model loop (docs/metrics.md, "Retrieval"):
//
//  * passkey (needle in a haystack): a seeded random digit string planted at depth d of a haystack
//    of seeded random filler sentences so that the whole prompt is exactly L tokens, the question
//    at the end; the prompt
//    is prefilled through the method's cache in pseudo-decode blocks (each block attends to the
//    method's cache of everything before it, then is written into it), then a few tokens are
//    decoded greedily with the same cache; scored by exact match of the digits.
//  * induction copy: a seeded random token span, then (a gap, the span again) once or more; the
//    sequence runs through the method's cache in blocks up to the last copy, then that copy is
//    fed one token at a time (teacher forced); accuracy = fraction of its tokens after the first
//    that the greedy argmax predicts.
//
// Accuracy per cell comes with a binomial 95 % interval (Wilson and Clopper-Pearson).
// This header is torch-free (kvarn_runner).
#ifndef KVARN_RUNNER_RETRIEVAL_HPP_
#define KVARN_RUNNER_RETRIEVAL_HPP_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kvarn/runner/model.hpp"

namespace kvarn {

// ---- binomial intervals -------------------------------------------------------------------

struct BinomialInterval {
  double low = 0, high = 1;
};

// z of a two-sided 95 % normal interval.
inline constexpr double kZ95 = 1.959963984540054;

// Wilson score interval of `successes` out of `trials` (trials >= 1; 0 trials: [0, 1]).
BinomialInterval wilson_interval(int successes, int trials, double z = kZ95);
// Exact (Clopper-Pearson) interval at `confidence`: the beta quantiles, computed by bisection on
// the binomial tail sums in double; low = 0 when successes = 0, high = 1 when successes = trials.
BinomialInterval clopper_pearson_interval(int successes, int trials, double confidence = 0.95);

// ---- greedy decoding with a method's cache in the loop -----------------------------------

// Runs `tokens` through `cache` in blocks of `block` tokens under the current-token policy and
// returns the next-token logits after the last one (the prompt exactly as it would be decoded).
std::vector<float> prefill_in_blocks(const Model& model, ModelKvCache& cache,
                                     std::span<const std::int32_t> tokens, int block,
                                     ChunkAttention current_token);

// prefill_in_blocks, then `steps` greedy tokens, each decoded through the same cache; stops
// after an EOS id of the model when stop_at_eos.
std::vector<std::int32_t> greedy_in_loop(const Model& model, ModelKvCache& cache,
                                         std::span<const std::int32_t> prompt, int block,
                                         ChunkAttention current_token, int steps, bool stop_at_eos);

// ---- passkey ------------------------------------------------------------------------------

// `digits` seeded random decimal digits ('0'-'9', each uniform; the same on every platform).
std::string passkey_digits(std::uint64_t seed, int digits);

struct PasskeyPrompt {
  std::vector<std::int32_t> tokens;  // exactly `length` tokens
  int needle_start = 0;              // index of the needle's first token
  int filler_tokens = 0;             // haystack tokens around the needle
};

// A haystack of exactly `tokens` tokens: sentences drawn uniformly with replacement by a seeded
// generator (the same on every platform) and concatenated, the last one cut at `tokens`.
// `boundaries` holds every offset where a sentence starts, then `tokens` (so 0 and `tokens` are
// always in it). Throws kvarn::Error when tokens > 0 and there is no non-empty sentence.
struct Haystack {
  std::vector<std::int32_t> tokens;
  std::vector<int> boundaries;
};
Haystack build_haystack(const std::vector<std::vector<std::int32_t>>& sentences, int tokens,
                        std::uint64_t seed);

// head + haystack[0, k) + needle + haystack[k, F) + tail with F = length - |head| - |needle| -
// |tail|, the haystack built by build_haystack(sentences, F, seed) and k the sentence boundary
// nearest depth * F (the earlier one on a tie): depth 0 puts the needle right after the head,
// depth 1 right before the tail, and it never splits a sentence. Throws kvarn::Error when F < 0
// or depth is outside [0, 1].
PasskeyPrompt build_passkey_prompt(std::span<const std::int32_t> head,
                                   std::span<const std::int32_t> needle,
                                   std::span<const std::int32_t> tail,
                                   const std::vector<std::vector<std::int32_t>>& sentences,
                                   int length, double depth, std::uint64_t seed);

// The first maximal run of ASCII digits in `output` ("" when none).
std::string first_digit_run(const std::string& output);
// Exact match: the first digit run of the decoded output is the key (extra or missing digits
// fail; words around it do not matter).
bool passkey_match(const std::string& output, const std::string& key);
// Digits of the key found at their place in the first digit run, / key length (partial credit).
double passkey_digit_score(const std::string& output, const std::string& key);

// ---- induction copy -----------------------------------------------------------------------

struct InductionSequence {
  std::vector<std::int32_t> tokens;  // prefix + span + (gap + span) x (occurrences - 1)
  int span_start = 0;                // first occurrence
  int repeat_start = 0;              // last occurrence (the scored one)
  int span = 0;
};

// `prefix` tokens, a span of `span` tokens, then `occurrences - 1` times: `distance` fresh gap
// tokens and the span again. Every token is drawn uniformly from [token_lo, token_hi) by a seeded
// generator (the same on every platform); with occurrences = 2 this is the classic repeated
// random sequence, and the last occurrence is the one scored.
InductionSequence build_induction_sequence(std::uint64_t seed, int prefix, int span, int distance,
                                           std::int32_t token_lo, std::int32_t token_hi,
                                           int occurrences = 2);

// Per position of the repeat after its first token: 1 when the greedy argmax after the previous
// repeat token is the span's token. The sequence up to and including the repeat's first token
// runs through `cache` in blocks; the rest one token at a time (teacher forced).
std::vector<int> induction_hits(const Model& model, ModelKvCache& cache,
                                const InductionSequence& seq, int block,
                                ChunkAttention current_token);

}  // namespace kvarn

#endif  // KVARN_RUNNER_RETRIEVAL_HPP_
