// Position buckets for attention and accumulation rows (docs/metrics.md, "Position buckets").
//
// A query row at position i reads cache tokens 0..i. Under a method's stream policies a cache of
// c tokens holds each stream as [fp16 sink | quantized chunks | fp16 tail or window]
// (kvarn/core/effective_bits.hpp, stream_span), so whether row i reads any quantized token, and
// how far back the newest one is, follows from the policies and c alone:
//
//   distance(i) = i - max{ j <= i : token j is quantized in K or in V },  -1 when there is none
//
// Rows with distance -1 read only fp16 tokens (KVarN: the first 128 rows, and every row of a
// sequence shorter than sink + one tile, 256 tokens at g = 128); averaging them in dilutes a
// metric toward zero error. Headline numbers use rows with distance >= 0.
//
// Which c to use: attention metrics over a final cache of T tokens use c = T for every row;
// the model loop's block of positions p0..p0+n-1 reads the cache as it stood after p0 tokens
// (current token exact) or after p0 + n (current token quantized). Streams stored as fp16
// (code_bits >= 16: the fp16 method, TurboQuant's boundary layers) hold no quantized token.
#ifndef KVARN_EVAL_POSITION_BUCKETS_HPP_
#define KVARN_EVAL_POSITION_BUCKETS_HPP_

#include <string>
#include <vector>

#include "kvarn/core/effective_bits.hpp"
#include "kvarn/core/method.hpp"

namespace kvarn {

inline constexpr int kReadsNoQuantizedToken = -1;

// Quantized token ranges of both streams of one (layer, KV head) cache of `cache_tokens` tokens.
struct QuantizedSpans {
  int key_begin = 0, key_end = 0;  // [begin, end); empty when the stream holds none
  int value_begin = 0, value_end = 0;
};
QuantizedSpans quantized_spans(const Method& method, int head_dim, int cache_tokens,
                               const LayerContext& layer = {});

// Distance of the row at `position` (reading tokens 0..position) to the newest quantized token
// it reads; kReadsNoQuantizedToken when it reads none.
int quantized_distance(const QuantizedSpans& spans, int position);

// Distances of rows 0..tokens-1 over the final cache of `tokens` tokens (attention metrics).
std::vector<int> row_distances(const Method& method, int head_dim, int tokens,
                               const LayerContext& layer = {});

// Bucket edges e_0 = 0 < e_1 < ...: bucket 0 = reads no quantized token; bucket k >= 1 holds
// distances in [e_{k-1}, e_k), the last one [e_back, inf). Default: 0 | 1-15 | 16-127 | >= 128.
struct BucketScheme {
  std::vector<int> edges = {0, 1, 16, 128};
  int count() const { return static_cast<int>(edges.size()) + 1; }
  int bucket(int distance) const;
  std::string label(int bucket) const;  // "fp16_only", "d0", "d1-15", "d16-127", "d128+"
};

// Per-bucket means of a per-row metric, plus the headline (rows reading a quantized token) and
// the all-rows mean beside it. Rows whose value is NaN are left out (counted in none).
struct BucketSummary {
  std::vector<std::string> labels;
  std::vector<double> mean;  // [buckets]; NaN where a bucket holds no row
  std::vector<long long> rows;
  double headline = 0;  // rows with distance >= 0; NaN when none
  long long headline_rows = 0;
  double all_rows = 0;  // every row
  long long total_rows = 0;
};
BucketSummary summarize_by_bucket(const std::vector<double>& values,
                                  const std::vector<int>& distances,
                                  const BucketScheme& scheme = {});

}  // namespace kvarn

#endif  // KVARN_EVAL_POSITION_BUCKETS_HPP_
