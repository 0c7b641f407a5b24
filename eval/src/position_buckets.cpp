#include "kvarn/eval/position_buckets.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <tuple>
#include <utility>

#include "kvarn/data/error.hpp"

namespace kvarn {

namespace {
// [begin, end) of the quantized tokens of one stream; empty for fp16-stored streams.
std::pair<int, int> span_of(const StreamCodec& codec, int tokens) {
  if (codec.code_bits() >= 16.0) return {0, 0};
  const StreamSpan s = stream_span(codec.policy(), tokens);
  return {s.quantized_begin(), s.quantized_end()};
}
}  // namespace

QuantizedSpans quantized_spans(const Method& method, int head_dim, int cache_tokens,
                               const LayerContext& layer) {
  KVARN_CHECK(cache_tokens >= 0, "quantized_spans (", method.name(), "): negative cache length ",
              cache_tokens);
  QuantizedSpans s;
  const auto k = method.make_codec(StreamKind::kKey, head_dim, layer);
  const auto v = method.make_codec(StreamKind::kValue, head_dim, layer);
  std::tie(s.key_begin, s.key_end) = span_of(*k, cache_tokens);
  std::tie(s.value_begin, s.value_end) = span_of(*v, cache_tokens);
  return s;
}

int quantized_distance(const QuantizedSpans& s, int position) {
  int best = kReadsNoQuantizedToken;
  for (const auto& [begin, end] :
       {std::pair{s.key_begin, s.key_end}, {s.value_begin, s.value_end}}) {
    if (end <= begin || position < begin) continue;
    const int d = position - std::min(position, end - 1);
    if (best == kReadsNoQuantizedToken || d < best) best = d;
  }
  return best;
}

std::vector<int> row_distances(const Method& method, int head_dim, int tokens,
                               const LayerContext& layer) {
  const QuantizedSpans s = quantized_spans(method, head_dim, tokens, layer);
  std::vector<int> out(static_cast<std::size_t>(std::max(tokens, 0)));
  for (int i = 0; i < tokens; ++i) out[i] = quantized_distance(s, i);
  return out;
}

int BucketScheme::bucket(int distance) const {
  if (distance < 0) return 0;
  const auto it = std::upper_bound(edges.begin(), edges.end(), distance);
  return static_cast<int>(it - edges.begin());  // distance >= edges[0] = 0, so >= 1
}

std::string BucketScheme::label(int b) const {
  KVARN_CHECK(b >= 0 && b < count(), "position bucket ", b, " out of range [0, ", count(), ")");
  if (b == 0) return "fp16_only";
  std::ostringstream os;
  os << 'd' << edges[b - 1];
  if (b == count() - 1) {
    os << '+';
  } else if (edges[b] - 1 > edges[b - 1]) {
    os << '-' << edges[b] - 1;
  }
  return os.str();
}

BucketSummary summarize_by_bucket(const std::vector<double>& values,
                                  const std::vector<int>& distances, const BucketScheme& scheme) {
  KVARN_CHECK(values.size() == distances.size(), "summarize_by_bucket: ", values.size(),
              " values but ", distances.size(), " row distances");
  KVARN_CHECK(
      !scheme.edges.empty() && scheme.edges.front() == 0 &&
          std::is_sorted(scheme.edges.begin(), scheme.edges.end()) &&
          std::adjacent_find(scheme.edges.begin(), scheme.edges.end()) == scheme.edges.end(),
      "position buckets: edges must start at 0 and increase strictly");
  const int nb = scheme.count();
  BucketSummary s;
  std::vector<double> sum(nb, 0.0);
  s.rows.assign(nb, 0);
  double head_sum = 0, all_sum = 0;
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (std::isnan(values[i])) continue;
    const int b = scheme.bucket(distances[i]);
    sum[b] += values[i];
    ++s.rows[b];
    all_sum += values[i];
    ++s.total_rows;
    if (distances[i] >= 0) {
      head_sum += values[i];
      ++s.headline_rows;
    }
  }
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (int b = 0; b < nb; ++b) {
    s.labels.push_back(scheme.label(b));
    s.mean.push_back(s.rows[b] > 0 ? sum[b] / static_cast<double>(s.rows[b]) : nan);
  }
  s.headline = s.headline_rows > 0 ? head_sum / static_cast<double>(s.headline_rows) : nan;
  s.all_rows = s.total_rows > 0 ? all_sum / static_cast<double>(s.total_rows) : nan;
  return s;
}

}  // namespace kvarn
