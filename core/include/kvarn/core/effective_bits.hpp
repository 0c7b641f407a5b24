// Bits per element as actually stored at a given length, beside the steady-state figure.
//
// Accounting::bits_per_element() is the steady state of a quantized layer: it leaves out every
// token a method keeps in fp16 (KVarN's sink and tail or trailing window, KIVI's residual
// windows) and TurboQuant's fp16 boundary layers. At a finite length T those cost real bytes:
//
//   effective_bits(m, D, T, layer) = 8 * sequence_bytes(T) / (2 * D * T)    one (layer, KV head)
//   model_effective_bits(m, D, T, L) = the same averaged over layers 0..L-1   (boundary layers in)
//
// Both count metadata and packing exactly as the stored fields do (Method::sequence_bytes, which
// tests compare with what encode() really stores). docs/metrics.md, "Effective bits".
#ifndef KVARN_CORE_EFFECTIVE_BITS_HPP_
#define KVARN_CORE_EFFECTIVE_BITS_HPP_

#include "kvarn/core/method.hpp"

namespace kvarn {

// Where a stream's tokens sit after `tokens` appends: [0, sink) fp16, [sink, sink + quantized)
// in flushed chunks, the rest fp16 (pending tail / recent window). The quantized region is one
// contiguous run because chunks are flushed oldest first.
struct StreamSpan {
  int sink = 0, quantized = 0, tail = 0;
  int quantized_begin() const { return sink; }
  int quantized_end() const { return sink + quantized; }
};
StreamSpan stream_span(const StreamPolicy& policy, int tokens);

// Bits per element one (layer, KV head) cache stores at `tokens` tokens (K and V together).
// Throws kvarn::Error for tokens < 1 or an unsupported head_dim.
double effective_bits(const Method& method, int head_dim, int tokens,
                      const LayerContext& layer = {});

// Bits per element of a whole model's cache at `tokens` tokens: every layer's stored bytes
// (fp16 boundary layers included) over num_layers * 2 * head_dim * tokens fp16 elements.
double model_effective_bits(const Method& method, int head_dim, int tokens, int num_layers);

}  // namespace kvarn

#endif  // KVARN_CORE_EFFECTIVE_BITS_HPP_
