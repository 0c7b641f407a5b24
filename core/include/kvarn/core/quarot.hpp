// QuaRot-style KV quantization (Ashkboos et al. 2024; baselines.md 0.2 and 4.1): rotate each
// head vector (K after RoPE, V per head) by the normalized Hadamard, then asymmetric RTN with an
// integer zero-point per group of `group` channels of one token; every token is quantized on
// arrival (no fp16 window). Reconstruction is rotated back to the original frame.
//
//   xmax = max(g) * clip, xmin = min(g) * clip;  xmin = xmax = 0 -> -1, +1
//   scale = (xmax - xmin) / (2^b - 1);  zero = round(-xmin / scale)  (both stored fp16)
//   q = clamp(round(x / scale) + zero, 0, 2^b - 1);  x_hat = scale * (q - zero)
//
// Stored per token and stream: codes u8 [1, D*b/8] (pack.hpp), scale f16 [D/group],
// zero f16 [D/group] -> 68 B per stream at D=128, b=4, group=128 (4.25 bits/element).
#ifndef KVARN_CORE_QUAROT_HPP_
#define KVARN_CORE_QUAROT_HPP_

#include <cstdint>
#include <memory>
#include <string>

#include "kvarn/core/method.hpp"
#include "kvarn/core/rotation.hpp"

namespace kvarn {

struct QuarotConfig {
  int key_bits = 4;
  int value_bits = 4;
  int group = 0;  // channels per group; 0 = head_dim (one group per token and head)
  double clip = 1.0;
  RotationKind rotation = RotationKind::kHadamard;
  std::uint64_t seed = 0;  // for rotation=haar
};

class QuarotMethod : public Method {
 public:
  explicit QuarotMethod(QuarotConfig cfg);
  std::string name() const override;
  std::string spec() const override;
  std::string family() const override { return "quarot"; }
  std::string description() const override;
  void check_head_dim(int head_dim) const override;
  std::unique_ptr<StreamCodec> make_codec(StreamKind kind, int head_dim,
                                          const LayerContext& layer) const override;
  const QuarotConfig& config() const { return cfg_; }

 private:
  QuarotConfig cfg_;
};

// One group: n rotated values -> codes, fp16 scale/zero bits, recon (rotated frame).
// Guards (QuaRot has none): a constant non-zero group (scale 0, zero = -inf) or a zero-point that
// is not an exact fp16 integer (|zero| > 2048) widens the range to include 0; the fp16 scale is
// floored at the smallest fp16 subnormal 2^-24.
void quarot_quantize_group(const float* x, int n, int bits, float clip, std::uint8_t* codes,
                           float* recon, std::uint16_t* scale_bits, std::uint16_t* zero_bits);

}  // namespace kvarn

#endif  // KVARN_CORE_QUAROT_HPP_
