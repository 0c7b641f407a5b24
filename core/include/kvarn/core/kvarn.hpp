// KVarN reference (upstream vLLM fork, kvarn-upstream.md section 3), one tile of G tokens x D
// channels of one (layer, KV head):
//   rotate along D (default: the published fp16 matrix, rotation.hpp; rotated values are fp16)
//   -> orient: K tile [D, G] (rows = channels), V tile [G, D] (rows = tokens)
//   -> variance_normalize (varn.hpp) -> RTN per row (rtn.hpp) -> scale absorption -> pack
//
// Record per (block, KV head), byte layout (D=128, G=128, k4v2 -> 13,824 B):
//   off 0      K codes   [D, G/PACK_K] u8   channel-major, packed along tokens
//   +8192      s_col_K   [D] f16 (fp8 with scales=fp8)   = s_chan[d] * rtn_scale[d]
//   +8448      zp_K      [D] f16                          = s_chan[d] * rtn_lo[d]
//   +8704      s_row_K   [G] f16 (fp8)                    = s_tok[t]
//   +8960      V codes   [G, D/PACK_V] u8   token-major, packed along channels
//   +13056     s_col_V   [D] f16 (fp8)                    = s_chan[d]
//   +13312     s_row_V   [G] f16 (fp8)                    = s_tok[t] * rtn_scale[t]
//   +13568     zp_V      [G] f16                          = s_tok[t] * rtn_lo[t]
//   end 13824; aligned to 8 B for D <= 128, per-token slot rounded up to a power of two above.
// Dequantization (rotated frame): K[d,t] = (q*s_col_K[d] + zp_K[d]) * s_row_K[t],
//                                 V[t,d] = (q*s_row_V[t] + zp_V[t]) * s_col_V[d].
#ifndef KVARN_CORE_KVARN_HPP_
#define KVARN_CORE_KVARN_HPP_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kvarn/core/method.hpp"
#include "kvarn/core/rotation.hpp"
#include "kvarn/core/rtn.hpp"
#include "kvarn/core/varn.hpp"

namespace kvarn {

enum class ScaleStorage { kFp16, kFp8E4M3 };

struct KvarnConfig {
  int key_bits = 4;
  int value_bits = 2;
  int group = 128;
  VarnParams varn;  // iters default 8
  RotationKind rotation = RotationKind::kHadamardFp16;  // "hadamard": the published fp16 matrix
  std::uint64_t rotation_seed = 0;
  float rtn_quantile = 0.0f;
  ScaleStorage scales = ScaleStorage::kFp16;
  int sink_tokens = -1;  // -1: one group (upstream: the first block); 0: none; else a count
  int sink() const { return sink_tokens < 0 ? group : sink_tokens; }
};

struct KvarnRecordLayout {
  int head_dim = 0, group = 0, key_bits = 0, value_bits = 0;
  std::size_t scale_bytes = 2;  // per stored scale (2 fp16, 1 fp8); zero-points are always fp16
  std::size_t k_codes = 0, s_col_k = 0, zp_k = 0, s_row_k = 0;
  std::size_t v_codes = 0, s_col_v = 0, s_row_v = 0, zp_v = 0;
  std::size_t end = 0;      // unpadded size
  std::size_t aligned = 0;  // record size in the cache
  std::size_t key_bytes() const { return v_codes; }
  std::size_t value_bytes() const { return end - v_codes; }
};

KvarnRecordLayout kvarn_record_layout(int head_dim, const KvarnConfig& cfg);

// Every intermediate of one stream of one tile (for per-stage metrics and golden files).
// "Oriented" arrays use the quantization orientation: K [D, G], V [G, D].
struct KvarnStreamStages {
  std::vector<float> raw;              // [G, D] input rows
  std::vector<float> rotated;          // [G, D] rotated, fp16-rounded
  std::vector<float> normalized;       // oriented, balanced
  VarnResult varn;
  std::vector<std::uint8_t> codes;     // oriented, unpacked
  std::vector<float> rtn_scale, rtn_lo;  // per oriented row
  std::vector<float> s_col, zp, s_row;   // stored (absorbed) scales, decoded to float:
                                         // K: s_col[D], zp[D], s_row[G]; V: s_col[D], zp[G], s_row[G]
  std::vector<float> dequant_rotated;  // [G, D]
  std::vector<float> dequant;          // [G, D] original frame
};

// Quantizes one stream of one tile (rows: [G, D] token-major, finite) into its part of a
// record (`record` is the whole record buffer, layout.aligned bytes).
void kvarn_encode_stream(StreamKind kind, const KvarnConfig& cfg, const Rotation& rot,
                         const float* rows, std::uint8_t* record,
                         KvarnStreamStages* stages = nullptr);

// Dequantizes one stream of a record into [G, D] rows in the rotated frame.
void kvarn_decode_stream(StreamKind kind, const KvarnRecordLayout& layout,
                         const std::uint8_t* record, float* rotated_rows);

// Whole record of one tile pair (k, v: [G, D] each).
std::vector<std::uint8_t> kvarn_encode_record(const KvarnConfig& cfg, const Rotation& rot,
                                              const float* k, const float* v,
                                              KvarnStreamStages* k_stages = nullptr,
                                              KvarnStreamStages* v_stages = nullptr);

// The KVarN method (registry family "kvarn").
class KvarnMethod : public Method {
 public:
  explicit KvarnMethod(KvarnConfig cfg);
  std::string name() const override;
  std::string spec() const override;
  std::string family() const override { return "kvarn"; }
  std::string description() const override;
  void check_head_dim(int head_dim) const override;
  std::unique_ptr<StreamCodec> make_codec(StreamKind kind, int head_dim,
                                          const LayerContext& layer) const override;
  const KvarnConfig& config() const { return cfg_; }

 private:
  KvarnConfig cfg_;
};

}  // namespace kvarn

#endif  // KVARN_CORE_KVARN_HPP_
