#include "kvarn/core/effective_bits.hpp"

#include <algorithm>

#include "kvarn/data/error.hpp"

namespace kvarn {

StreamSpan stream_span(const StreamPolicy& p, int tokens) {
  StreamSpan s;
  s.sink = std::min(std::max(tokens, 0), p.sink);
  const int flushable = std::max(0, tokens - s.sink - p.keep_recent);
  s.quantized = flushable / p.chunk * p.chunk;
  s.tail = std::max(tokens, 0) - s.sink - s.quantized;
  return s;
}

double effective_bits(const Method& method, int head_dim, int tokens, const LayerContext& layer) {
  KVARN_CHECK(tokens >= 1, "effective_bits (", method.name(), "): tokens must be >= 1, got ",
              tokens);
  const double bytes = static_cast<double>(method.sequence_bytes(tokens, head_dim, layer));
  return bytes * 8.0 / (2.0 * head_dim * tokens);
}

double model_effective_bits(const Method& method, int head_dim, int tokens, int num_layers) {
  KVARN_CHECK(num_layers >= 1, "model_effective_bits (", method.name(),
              "): num_layers must be >= 1, got ", num_layers);
  KVARN_CHECK(tokens >= 1, "model_effective_bits (", method.name(), "): tokens must be >= 1, got ",
              tokens);
  double bytes = 0;
  for (int l = 0; l < num_layers; ++l) {
    bytes += static_cast<double>(method.sequence_bytes(tokens, head_dim, {l, num_layers}));
  }
  return bytes * 8.0 / (2.0 * head_dim * tokens * static_cast<double>(num_layers));
}

}  // namespace kvarn
