// vLLM FP8 KV cache (baselines.md section 3): store fp8(x / scale) with saturating
// round-to-nearest-even, read fp8 * scale. One byte per element; the fp32 scale lives per
// (layer, K|V) outside the cache pages and is counted as 0 bytes per token.
#ifndef KVARN_CORE_FP8_HPP_
#define KVARN_CORE_FP8_HPP_

#include <memory>
#include <string>

#include "kvarn/core/method.hpp"
#include "kvarn/core/portable_math.hpp"

namespace kvarn {

struct Fp8Config {
  Fp8Format format = Fp8Format::kE4M3;
  bool calibrated = false;  // vLLM calculate_kv_scales: amax(first block) / 200 (K) or / 100 (V)
  double scale = 1.0;       // fixed scale when not calibrated
  bool per_head = false;    // granularity=head; our cache is one (layer, head), so it equals tensor
};

// vLLM's K_SCALE_CONSTANT / V_SCALE_CONSTANT.
constexpr float kFp8KeyScaleDivisor = 200.0f;
constexpr float kFp8ValueScaleDivisor = 100.0f;

class Fp8Method : public Method {
 public:
  explicit Fp8Method(Fp8Config cfg);
  std::string name() const override;
  std::string spec() const override;
  std::string family() const override { return "fp8"; }
  std::string description() const override;
  std::unique_ptr<StreamCodec> make_codec(StreamKind kind, int head_dim,
                                          const LayerContext& layer) const override;
  const Fp8Config& config() const { return cfg_; }

 private:
  Fp8Config cfg_;
};

// One FP8 stream (chunk 1, field "k_fp8" / "v_fp8", u8 [1, D]); also TurboQuant k8v4's keys.
std::unique_ptr<StreamCodec> make_fp8_codec(StreamKind kind, int head_dim, const Fp8Config& cfg);

}  // namespace kvarn

#endif  // KVARN_CORE_FP8_HPP_
