// TurboQuant, two flavours (baselines.md section 1, kvarn-upstream.md section 8).
//
// Family "turboquant" = vLLM's implementation (presets turboquant_k8v4, _4bit_nc, _k3v4_nc,
// _3bit_nc). Per token and KV head, every token quantized on arrival:
//   keys (k = 2..4): n = ||k|| (fp32, stored fp16), u = k / (n + 1e-8), y = u H (Sylvester
//     Hadamard / sqrt(D)), idx = bucketize(y, Lloyd-Max midpoints for N(0, 1/D), ties up);
//     recon c = centroids[idx], with nc: c /= sqrt(sum c^2 + 1e-16); k_hat = (n_fp16 * c) H^T.
//   keys (k = 8): fp8 e4m3, no scale, no rotation.
//   values: no rotation, per-token min-max over D, scale = max((max-min)/(2^b-1), 1e-8),
//     q = floor((x - min)/scale + 0.5) clamped; scale and min stored fp16; v_hat = q*s16 + min16.
//   packing: LSB-first bit stream (4-bit: low nibble = even index; 3-bit: 8 codes in 3 bytes).
//   slot = K (ceil(D*k/8) + 2, or D for fp8) + V (ceil(D*v/8) + 4), rounded up to even bytes
//   (the pad byte is counted in the value chunk): 196 / 134 / 118 / 102 B at D=128.
//   Boundary layers (first and last `boundary` layers, capped at num_layers/2) stay fp16.
//
// Family "turboquant_paper" = the paper's TurboQuant_mse / TurboQuant_prod applied to K and V:
//   n = ||x|| (fp16), u = x/n, y = u Pi (seeded Haar rotation), idx = nearest centroid of the
//   exact Beta-law Lloyd-Max codebook for dimension D; mse: x_hat = n * c[idx] Pi^T.
//   prod (b bits): mse at b-1 bits, r = u - u_mse, s = sign(S r) (S: seeded D x D Gaussian,
//   sign(0) = +1), gamma = ||r|| (fp16); x_hat = n * (u_mse + sqrt(pi/2)/D * gamma * S^T s).
//   Stored per token and stream: ceil(D*b_mse/8) code bytes + 2 (norm) [+ D/8 sign bytes + 2].
#ifndef KVARN_CORE_TURBOQUANT_HPP_
#define KVARN_CORE_TURBOQUANT_HPP_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "kvarn/core/method.hpp"

namespace kvarn {

struct TurboQuantConfig {
  int key_bits = 4;    // 2, 3, 4 (Lloyd-Max) or 8 (fp8 e4m3)
  int value_bits = 4;  // 2, 3, 4
  bool norm_correction = true;
  int boundary = 2;  // boundary layers kept fp16 on each side (vLLM n=2); 0 disables
};

class TurboQuantMethod : public Method {
 public:
  explicit TurboQuantMethod(TurboQuantConfig cfg);
  std::string name() const override;
  std::string spec() const override;
  std::string family() const override { return "turboquant"; }
  std::string description() const override;
  void check_head_dim(int head_dim) const override;
  bool layer_skipped(const LayerContext& layer) const override;
  std::unique_ptr<StreamCodec> make_codec(StreamKind kind, int head_dim,
                                          const LayerContext& layer) const override;
  const TurboQuantConfig& config() const { return cfg_; }

 private:
  TurboQuantConfig cfg_;
};

enum class TurboQuantPaperMode { kMse, kProd };

struct TurboQuantPaperConfig {
  TurboQuantPaperMode mode = TurboQuantPaperMode::kMse;
  int bits = 3;            // total bits per coordinate (prod: b-1 for the codebook + 1 QJL)
  std::uint64_t seed = 0;  // Haar rotation seed; the QJL matrix uses a seed derived from it
};

class TurboQuantPaperMethod : public Method {
 public:
  explicit TurboQuantPaperMethod(TurboQuantPaperConfig cfg);
  std::string name() const override;
  std::string spec() const override;
  std::string family() const override { return "turboquant_paper"; }
  std::string description() const override;
  std::unique_ptr<StreamCodec> make_codec(StreamKind kind, int head_dim,
                                          const LayerContext& layer) const override;
  const TurboQuantPaperConfig& config() const { return cfg_; }

 private:
  TurboQuantPaperConfig cfg_;
};

// vLLM's value quantizer on one token (n values): codes, fp16 scale/min bits, recon.
void turboquant_quantize_value(const float* x, int n, int bits, std::uint8_t* codes, float* recon,
                               std::uint16_t* scale_bits, std::uint16_t* min_bits);

// LSB-first bit stream: code j occupies bits [j*bits, (j+1)*bits); ceil(n*bits/8) bytes.
std::size_t bitstream_bytes(std::size_t n, int bits);
void bitstream_pack(const std::uint8_t* codes, std::size_t n, int bits, std::uint8_t* out);
std::uint8_t bitstream_code(const std::uint8_t* packed, std::size_t j, int bits);

}  // namespace kvarn

#endif  // KVARN_CORE_TURBOQUANT_HPP_
