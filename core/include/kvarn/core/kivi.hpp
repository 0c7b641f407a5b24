// KIVI (Liu et al., ICML 2024; baselines.md section 2): 2/4-bit asymmetric min-max RTN,
// keys per channel over groups of `group` tokens, flushed `residual` tokens at a time (0..R-1
// fp16 keys), values per token over groups of `group` channels behind a sliding window of R fp16
// tokens. Scale and minimum stored fp16 per group.
//
// Stored chunk (D = head_dim, G = group, R = residual, b = bits; codes packed with pack.hpp):
//   keys   (R tokens): k_codes u8 [D, R*b/8] (channel-major, packed along tokens),
//                      k_scale f16 [D, R/G], k_min f16 [D, R/G]
//   values (1 token):  v_codes u8 [1, D*b/8], v_scale f16 [D/G], v_min f16 [D/G]
//   bytes/token (quantized region) = 2 * (D*b/8 + 4*D/G): 96 (b=2) / 160 (b=4) at D=128, G=32.
#ifndef KVARN_CORE_KIVI_HPP_
#define KVARN_CORE_KIVI_HPP_

#include <cstdint>
#include <memory>
#include <string>

#include "kvarn/core/method.hpp"

namespace kvarn {

struct KiviConfig {
  int bits = 2;        // 2 or 4
  int group = 32;      // tokens per key group, channels per value group
  int residual = 128;  // R: multiple of group
};

class KiviMethod : public Method {
 public:
  explicit KiviMethod(KiviConfig cfg);
  std::string name() const override;
  std::string spec() const override;
  std::string family() const override { return "kivi"; }
  std::string description() const override;
  void check_head_dim(int head_dim) const override;
  std::unique_ptr<StreamCodec> make_codec(StreamKind kind, int head_dim,
                                          const LayerContext& layer) const override;
  const KiviConfig& config() const { return cfg_; }

 private:
  KiviConfig cfg_;
};

// KIVI's per-group quantizer on n values x[i * stride]: min-max, scale and min rounded to fp16,
// code = round_half_even(clamp((x - mn) / scale, 0, 2^b - 1)); recon = code * scale + mn with
// the fp16 values. A zero fp16 scale (constant group) gives codes 0 and recon mn (KIVI has no
// guard and would produce NaN). Returns the fp16 bits of scale and min.
void kivi_quantize_group(const float* x, int n, int stride, int bits, std::uint8_t* codes,
                         float* recon, std::uint16_t* scale_bits, std::uint16_t* min_bits);

}  // namespace kvarn

#endif  // KVARN_CORE_KIVI_HPP_
