// KIVI (Liu et al., ICML 2024; baselines.md section 2): 2/4-bit asymmetric min-max RTN,
// keys per channel over groups of `key_group` tokens, flushed `residual` tokens at a time (0..R-1
// fp16 keys), values per token over groups of `value_group` channels behind a sliding window of R
// fp16 tokens. Scale and minimum stored fp16 per group. Keys and values have their own bits and
// groups ("kivi:k=4,v=2"), so budgets such as KVarN's k4v2 have a KIVI rival at the same bits.
//
// Stored chunk (D = head_dim, Gk/Gv = groups, R = residual, bk/bv = bits; codes packed as in
// pack.hpp):
//   keys   (R tokens): k_codes u8 [D, R*bk/8] (channel-major, packed along tokens),
//                      k_scale f16 [D, R/Gk], k_min f16 [D, R/Gk]
//   values (1 token):  v_codes u8 [1, D*bv/8], v_scale f16 [D/Gv], v_min f16 [D/Gv]
//   bytes/token (quantized region) = D*bk/8 + 4*D/Gk + D*bv/8 + 4*D/Gv:
//   96 (2/2) / 160 (4/4) / 128 (k4v2) at D=128, Gk = Gv = 32.
#ifndef KVARN_CORE_KIVI_HPP_
#define KVARN_CORE_KIVI_HPP_

#include <cstdint>
#include <memory>
#include <string>

#include "kvarn/core/method.hpp"

namespace kvarn {

struct KiviConfig {
  int key_bits = 2;      // 2 or 4
  int value_bits = 2;    // 2 or 4
  int key_group = 32;    // tokens per key group (per channel)
  int value_group = 32;  // channels per value group (per token)
  int residual = 128;    // R: multiple of key_group
  bool symmetric() const { return key_bits == value_bits && key_group == value_group; }
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
