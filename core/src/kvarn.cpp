#include "kvarn/core/kvarn.hpp"

#include <algorithm>
#include <cstring>
#include <regex>
#include <sstream>

#include "families.hpp"
#include "kvarn/core/half_array.hpp"
#include "kvarn/core/pack.hpp"
#include "kvarn/core/portable_math.hpp"
#include "kvarn/data/error.hpp"
#include "kvarn/data/uninit_vector.hpp"
#include "simd.hpp"

namespace kvarn {
namespace {

std::size_t round_up(std::size_t x, std::size_t m) { return (x + m - 1) / m * m; }

std::size_t next_pow2(std::size_t x) {
  std::size_t p = 1;
  while (p < x) p <<= 1;
  return p;
}

void store_scale(std::uint8_t* dst, float v, std::size_t scale_bytes) {
  if (scale_bytes == 1) {
    dst[0] = float_to_fp8_bits(v, Fp8Format::kE4M3);
  } else {
    std::uint16_t h = float_to_half_bits(v);
    std::memcpy(dst, &h, 2);
  }
}

float load_scale(const std::uint8_t* src, std::size_t scale_bytes) {
  if (scale_bytes == 1) return fp8_bits_to_float(src[0], Fp8Format::kE4M3);
  std::uint16_t h;
  std::memcpy(&h, src, 2);
  return half_bits_to_float(h);
}

void store_half(std::uint8_t* dst, float v) {
  std::uint16_t h = float_to_half_bits(v);
  std::memcpy(dst, &h, 2);
}

float load_half(const std::uint8_t* src) {
  std::uint16_t h;
  std::memcpy(&h, src, 2);
  return half_bits_to_float(h);
}

}  // namespace

KvarnRecordLayout kvarn_record_layout(int head_dim, const KvarnConfig& cfg) {
  KvarnRecordLayout l;
  l.head_dim = head_dim;
  l.group = cfg.group;
  l.key_bits = cfg.key_bits;
  l.value_bits = cfg.value_bits;
  l.scale_bytes = cfg.scales == ScaleStorage::kFp8E4M3 ? 1 : 2;
  const std::size_t d = head_dim, g = cfg.group, sb = l.scale_bytes;
  l.k_codes = 0;
  l.s_col_k = d * packed_bytes(g, cfg.key_bits);
  l.zp_k = l.s_col_k + d * sb;
  l.s_row_k = l.zp_k + d * 2;
  l.v_codes = l.s_row_k + g * sb;
  l.s_col_v = l.v_codes + g * packed_bytes(d, cfg.value_bits);
  l.s_row_v = l.s_col_v + d * sb;
  l.zp_v = l.s_row_v + g * sb;
  l.end = l.zp_v + g * 2;
  if (head_dim <= 128) {
    l.aligned = round_up(l.end, 8);
  } else {
    l.aligned = next_pow2((l.end + g - 1) / g) * g;  // upstream: power-of-two per-token slot
  }
  return l;
}

namespace {

// The RTN row scale and zero-point folded into the Sinkhorn scale of the same axis, stored in the
// record: keys (rows = channels) s_chan = s_row · scale, s_tok = s_col; values (rows = tokens)
// s_tok = s_row · scale, s_chan = s_col.
void store_folded_scales(bool is_key, const KvarnRecordLayout& lay, int d, int g,
                         const VarnResult& vr, const float* scale, const float* lo,
                         std::uint8_t* record) {
  const std::size_t sb = lay.scale_bytes;
  if (is_key) {
    for (int c = 0; c < d; ++c) {
      store_scale(record + lay.s_col_k + c * sb, vr.s_row[c] * scale[c], sb);
      store_half(record + lay.zp_k + c * 2, vr.s_row[c] * lo[c]);
    }
    for (int t = 0; t < g; ++t) store_scale(record + lay.s_row_k + t * sb, vr.s_col[t], sb);
  } else {
    for (int c = 0; c < d; ++c) store_scale(record + lay.s_col_v + c * sb, vr.s_col[c], sb);
    for (int t = 0; t < g; ++t) {
      store_scale(record + lay.s_row_v + t * sb, vr.s_row[t] * scale[t], sb);
      store_half(record + lay.zp_v + t * 2, vr.s_row[t] * lo[t]);
    }
  }
}

// The stage outputs read back from the record as stored (scales, zero-points, dequantization in
// the rotated frame and after the inverse rotation).
void record_stage_outputs(StreamKind kind, const KvarnRecordLayout& lay, const Rotation& rot,
                          const std::uint8_t* record, KvarnStreamStages* st) {
  const int d = rot.dim(), g = static_cast<int>(st->raw.size()) / d;
  const std::size_t sb = lay.scale_bytes;
  st->s_col.assign(d, 0);
  st->s_row.assign(g, 0);
  if (kind == StreamKind::kKey) {
    st->zp.assign(d, 0);
    for (int c = 0; c < d; ++c) {
      st->s_col[c] = load_scale(record + lay.s_col_k + c * sb, sb);
      st->zp[c] = load_half(record + lay.zp_k + c * 2);
    }
    for (int t = 0; t < g; ++t) st->s_row[t] = load_scale(record + lay.s_row_k + t * sb, sb);
  } else {
    st->zp.assign(g, 0);
    for (int c = 0; c < d; ++c) st->s_col[c] = load_scale(record + lay.s_col_v + c * sb, sb);
    for (int t = 0; t < g; ++t) {
      st->s_row[t] = load_scale(record + lay.s_row_v + t * sb, sb);
      st->zp[t] = load_half(record + lay.zp_v + t * 2);
    }
  }
  st->dequant_rotated.resize(st->raw.size());
  kvarn_decode_stream(kind, lay, record, st->dequant_rotated.data());
  st->dequant = st->dequant_rotated;
  rot.inverse(st->dequant.data(), g);
}

}  // namespace

void kvarn_encode_stream(StreamKind kind, const KvarnConfig& cfg, const Rotation& rot,
                         const float* rows, std::uint8_t* record, KvarnStreamStages* st) {
  const int d = rot.dim(), g = cfg.group;
  const KvarnRecordLayout lay = kvarn_record_layout(d, cfg);
  const std::size_t n = static_cast<std::size_t>(g) * d;
  const bool is_key = kind == StreamKind::kKey;
  const int rows_o = is_key ? d : g, cols_o = is_key ? g : d;  // oriented shape

  thread_local std::vector<float> rotated, oriented, balanced, scale, lo;
  thread_local std::vector<std::uint8_t> codes;
  // Rotate on a channel-major copy (vectorized butterflies), round to fp16: that copy is already
  // the K orientation [D, G]; V goes back to token-major [G, D].
  oriented.resize(n);
  transpose(rows, g, d, oriented.data());
  rot.forward_columns_fp16(oriented.data(), g);
  if (!is_key || st) {
    rotated.resize(n);
    transpose(oriented.data(), d, g, rotated.data());
  }
  if (!is_key) oriented.swap(rotated);
  balanced.resize(n);
  VarnResult vr = variance_normalize(oriented.data(), rows_o, cols_o, cfg.varn, balanced.data());
  RtnParams rp;
  rp.bits = is_key ? cfg.key_bits : cfg.value_bits;
  rp.quantile = cfg.rtn_quantile;
  codes.resize(n);
  scale.resize(rows_o);
  lo.resize(rows_o);
  rtn_rows(balanced.data(), rows_o, cols_o, rp, codes.data(), scale.data(), lo.data());

  // Pack each oriented row along its columns.
  const std::size_t row_bytes = packed_bytes(cols_o, rp.bits);
  std::uint8_t* code_dst = record + (is_key ? lay.k_codes : lay.v_codes);
  for (int r = 0; r < rows_o; ++r)
    pack_codes(codes.data() + static_cast<std::size_t>(r) * cols_o, cols_o, rp.bits,
               code_dst + r * row_bytes);

  // Scale absorption: the RTN row scale/zero fold into the Sinkhorn scale of the same axis.
  store_folded_scales(is_key, lay, d, g, vr, scale.data(), lo.data(), record);

  if (st) {
    st->raw.assign(rows, rows + n);
    st->rotated = is_key ? rotated : oriented;
    st->normalized = balanced;
    st->varn = vr;
    st->codes = codes;
    st->rtn_scale = scale;
    st->rtn_lo = lo;
    record_stage_outputs(kind, lay, rot, record, st);
  }
}

namespace {

// K: codes are packed per channel along the tile's tokens. Each channel row is decoded
// contiguously into the channel-major block out [D, G].
KVARN_SIMD_CLONES void decode_key_channel_major(const KvarnRecordLayout& lay,
                                                const std::uint8_t* record, float* out) {
  const int d = lay.head_dim, g = lay.group, bits = lay.key_bits;
  const std::size_t sb = lay.scale_bytes, row_bytes = packed_bytes(g, bits);
  thread_local std::vector<float> s_row;
  thread_local std::vector<std::uint8_t> q;
  s_row.resize(g);
  q.resize(g);
  for (int t = 0; t < g; ++t) s_row[t] = load_scale(record + lay.s_row_k + t * sb, sb);
  for (int c = 0; c < d; ++c) {
    const float s = load_scale(record + lay.s_col_k + c * sb, sb);
    const float z = load_half(record + lay.zp_k + c * 2);
    unpack_codes(record + lay.k_codes + c * row_bytes, g, bits, q.data());
    float* o = out + static_cast<std::size_t>(c) * g;
    for (int t = 0; t < g; ++t) o[t] = (static_cast<float>(q[t]) * s + z) * s_row[t];
  }
}

// K decoded channel-major, then transposed to token-major rows.
void decode_key(const KvarnRecordLayout& lay, const std::uint8_t* record, float* out) {
  thread_local std::vector<float> channel_major;
  channel_major.resize(static_cast<std::size_t>(lay.head_dim) * lay.group);
  decode_key_channel_major(lay, record, channel_major.data());
  transpose(channel_major.data(), lay.head_dim, lay.group, out);
}

// V: codes are packed per token along the channels: rows decode in place.
KVARN_SIMD_CLONES void decode_value(const KvarnRecordLayout& lay, const std::uint8_t* record,
                                    float* out) {
  const int d = lay.head_dim, g = lay.group, bits = lay.value_bits;
  const std::size_t sb = lay.scale_bytes, row_bytes = packed_bytes(d, bits);
  thread_local std::vector<float> s_col;
  thread_local std::vector<std::uint8_t> q;
  s_col.resize(d);
  q.resize(d);
  for (int c = 0; c < d; ++c) s_col[c] = load_scale(record + lay.s_col_v + c * sb, sb);
  for (int t = 0; t < g; ++t) {
    const float s = load_scale(record + lay.s_row_v + t * sb, sb);
    const float z = load_half(record + lay.zp_v + t * 2);
    unpack_codes(record + lay.v_codes + t * row_bytes, d, bits, q.data());
    float* o = out + static_cast<std::size_t>(t) * d;
    for (int c = 0; c < d; ++c) o[c] = (static_cast<float>(q[c]) * s + z) * s_col[c];
  }
}

}  // namespace

void kvarn_decode_stream(StreamKind kind, const KvarnRecordLayout& lay, const std::uint8_t* record,
                         float* out) {
  if (kind == StreamKind::kKey) {
    decode_key(lay, record, out);
  } else {
    decode_value(lay, record, out);
  }
}

std::vector<std::uint8_t> kvarn_encode_record(const KvarnConfig& cfg, const Rotation& rot,
                                              const float* k, const float* v,
                                              KvarnStreamStages* ks, KvarnStreamStages* vs) {
  const KvarnRecordLayout lay = kvarn_record_layout(rot.dim(), cfg);
  std::vector<std::uint8_t> rec(lay.aligned, 0);
  kvarn_encode_stream(StreamKind::kKey, cfg, rot, k, rec.data(), ks);
  kvarn_encode_stream(StreamKind::kValue, cfg, rot, v, rec.data(), vs);
  return rec;
}

// ---------------------------------------------------------------------------------------------
namespace {

class KvarnCodec : public StreamCodec {
 public:
  KvarnCodec(StreamKind kind, const KvarnConfig& cfg, int head_dim)
      : StreamCodec(head_dim),
        kind_(kind),
        cfg_(cfg),
        rot_(cfg.rotation, head_dim, cfg.rotation_seed),
        layout_(kvarn_record_layout(head_dim, cfg)) {}

  StreamPolicy policy() const override { return {cfg_.sink(), cfg_.group, cfg_.recent}; }

  // The K codec owns the K fields; the V codec the V fields plus the record's alignment padding,
  // so K + V chunk bytes equal one aligned record.
  std::size_t chunk_bytes() const override {
    return kind_ == StreamKind::kKey ? layout_.key_bytes()
                                     : layout_.value_bytes() + (layout_.aligned - layout_.end);
  }

  double code_bits() const override {
    const int bits = kind_ == StreamKind::kKey ? cfg_.key_bits : cfg_.value_bits;
    return 8.0 / pack_factor(bits);
  }

  void encode(const float* rows, int n, Chunk* chunk, float* recon) override {
    KVARN_CHECK(n == cfg_.group, "kvarn codec: chunk of ", n, " tokens, expected ", cfg_.group);
    // The stream's fields are written whole; only the alignment padding needs its zeros.
    record_.resize(layout_.aligned);
    std::fill(record_.begin() + static_cast<std::ptrdiff_t>(layout_.end), record_.end(), 0);
    kvarn_encode_stream(kind_, cfg_, rot_, rows, record_.data());
    const std::size_t d = head_dim_, g = cfg_.group, sb = layout_.scale_bytes;
    const char* sdt = sb == 1 ? "u8" : "f16";  // fp8 scales are stored as raw e4m3 bytes
    auto add = [&](const char* name, const char* dtype, std::vector<std::size_t> shape,
                   std::size_t off, std::size_t len) {
      Field f{name, dtype, std::move(shape), {}};
      f.bytes.assign(record_.begin() + off, record_.begin() + off + len);
      chunk->fields.push_back(std::move(f));
    };
    if (kind_ == StreamKind::kKey) {
      add("k_codes", "u8", {d, packed_bytes(g, cfg_.key_bits)}, layout_.k_codes,
          layout_.s_col_k - layout_.k_codes);
      add("k_s_col", sdt, {d}, layout_.s_col_k, d * sb);
      add("k_zp", "f16", {d}, layout_.zp_k, d * 2);
      add("k_s_row", sdt, {g}, layout_.s_row_k, g * sb);
    } else {
      add("v_codes", "u8", {g, packed_bytes(d, cfg_.value_bits)}, layout_.v_codes,
          layout_.s_col_v - layout_.v_codes);
      add("v_s_col", sdt, {d}, layout_.s_col_v, d * sb);
      add("v_s_row", sdt, {g}, layout_.s_row_v, g * sb);
      add("v_zp", "f16", {g}, layout_.zp_v, g * 2);
      if (layout_.aligned > layout_.end)
        add("record_pad", "u8", {layout_.aligned - layout_.end}, layout_.end,
            layout_.aligned - layout_.end);
    }
    reconstruct(recon);
  }

  // Sink and tail are stored rotated in fp16.
  void keep(const float* rows, int n, float* recon) override {
    rot_.fp16_round_trip(rows, n, recon);
  }

 private:
  // The record's stream decoded and rotated back into token-major rows [G, D]. K decodes
  // channel-major, where the inverse rotation runs without transposing back and forth.
  void reconstruct(float* recon) const {
    const int d = head_dim_, g = cfg_.group;
    if (kind_ == StreamKind::kValue) {
      kvarn_decode_stream(kind_, layout_, record_.data(), recon);
      rot_.inverse(recon, g);
      return;
    }
    thread_local std::vector<float> channel_major;
    channel_major.resize(static_cast<std::size_t>(d) * g);
    decode_key_channel_major(layout_, record_.data(), channel_major.data());
    rot_.inverse_columns(channel_major.data(), g);
    transpose(channel_major.data(), d, g, recon);
  }

  StreamKind kind_;
  KvarnConfig cfg_;
  Rotation rot_;
  KvarnRecordLayout layout_;
  UninitVector<std::uint8_t> record_;
};

std::string scales_name(ScaleStorage s) { return s == ScaleStorage::kFp8E4M3 ? "fp8" : "fp16"; }

}  // namespace

KvarnMethod::KvarnMethod(KvarnConfig cfg) : cfg_(cfg) {
  KVARN_CHECK(cfg_.key_bits >= 1 && cfg_.key_bits <= 8, "kvarn: key bits must be 1..8, got ",
              cfg_.key_bits);
  KVARN_CHECK(cfg_.value_bits >= 1 && cfg_.value_bits <= 8, "kvarn: value bits must be 1..8, got ",
              cfg_.value_bits);
  KVARN_CHECK(cfg_.group == 32 || cfg_.group == 64 || cfg_.group == 128 || cfg_.group == 256,
              "kvarn: group must be 32, 64, 128 or 256, got ", cfg_.group);
  KVARN_CHECK(cfg_.varn.iters >= 0 && cfg_.varn.iters <= 1000, "kvarn: iters must be 0..1000, got ",
              cfg_.varn.iters);
  KVARN_CHECK(cfg_.sink_tokens >= -1, "kvarn: sink must be >= 0 tokens, got ", cfg_.sink_tokens);
  KVARN_CHECK(cfg_.recent >= 0 && cfg_.recent <= (1 << 24),
              "kvarn: recent must be 0..16777216 tokens, got ", cfg_.recent);
  KVARN_CHECK(cfg_.rtn_quantile >= 0.0f && cfg_.rtn_quantile < 0.5f,
              "kvarn: quantile must be in [0, 0.5), got ", cfg_.rtn_quantile);
}

std::string KvarnMethod::name() const {
  static const std::string paper_spec = make_method(kKvarnPaperSpec)->spec();
  if (spec() == paper_spec) return kKvarnPaperPreset;
  const KvarnConfig def;
  std::string n = "kvarn_k" + std::to_string(cfg_.key_bits) + "v" + std::to_string(cfg_.value_bits) +
                  "_g" + std::to_string(cfg_.group);
  const bool is_default = cfg_.varn.iters == def.varn.iters && cfg_.rotation == def.rotation &&
                          cfg_.rtn_quantile == def.rtn_quantile && cfg_.scales == def.scales &&
                          cfg_.sink_tokens == def.sink_tokens && cfg_.recent == def.recent;
  return is_default ? n : spec();
}

std::string KvarnMethod::spec() const {
  std::string s = "kvarn:k=" + std::to_string(cfg_.key_bits) + ",v=" + std::to_string(cfg_.value_bits) +
                  ",g=" + std::to_string(cfg_.group) + ",iters=" + std::to_string(cfg_.varn.iters) +
                  ",rotation=" + kvarn_rotation_name(cfg_.rotation);
  if (cfg_.rotation == RotationKind::kHaar) s += ",seed=" + std::to_string(cfg_.rotation_seed);
  if (cfg_.rtn_quantile > 0) {
    std::ostringstream q;
    q << cfg_.rtn_quantile;
    s += ",quantile=" + q.str();
  }
  s += ",scales=" + scales_name(cfg_.scales) + ",sink=" + std::to_string(cfg_.sink());
  if (cfg_.recent > 0) s += ",recent=" + std::to_string(cfg_.recent);  // older specs unchanged
  return s;
}

std::string KvarnMethod::description() const {
  return "KVarN: " + kvarn_rotation_name(cfg_.rotation) + " rotation, " + std::to_string(cfg_.varn.iters) +
         "-iteration log-domain variance normalization, RTN K" + std::to_string(cfg_.key_bits) +
         " per channel / V" + std::to_string(cfg_.value_bits) + " per token in tiles of " +
         std::to_string(cfg_.group) + " tokens, " + scales_name(cfg_.scales) +
         " scales, fp16 sink " + std::to_string(cfg_.sink()) +
         (cfg_.recent > 0 ? std::string(" + newest ") + std::to_string(cfg_.recent) + " tokens"
                          : std::string(" + tail"));
}

void KvarnMethod::check_head_dim(int head_dim) const {
  KVARN_CHECK(head_dim >= 8 && head_dim % 8 == 0, "method ", name(), ": head_dim ", head_dim,
              " must be a positive multiple of 8");
  if (cfg_.rotation == RotationKind::kHadamard || cfg_.rotation == RotationKind::kHadamardFp16) {
    KVARN_CHECK(hadamard_supported(head_dim), "method ", name(), ": no orthogonal Hadamard for head_dim ",
                head_dim, " (supported: 2^m, 12*2^m, 20*2^m, 28*2^m)");
  }
}

std::unique_ptr<StreamCodec> KvarnMethod::make_codec(StreamKind kind, int head_dim,
                                                     const LayerContext&) const {
  check_head_dim(head_dim);
  return std::make_unique<KvarnCodec>(kind, cfg_, head_dim);
}

void register_kvarn(Registry& r) {
  r.add_family({"kvarn",
                "KVarN: Hadamard + log-domain variance normalization + RTN (K per channel, V per "
                "token) per tile of g tokens",
                {"k", "v", "g", "iters", "rotation", "seed", "quantile", "scales", "sink",
                 "recent"},
                [](Params& p) -> std::unique_ptr<Method> {
                  KvarnConfig c;
                  c.key_bits = p.get_int("k", 4);
                  c.value_bits = p.get_int("v", 2);
                  c.group = p.get_int("g", 128);
                  c.varn.iters = p.get_int("iters", 8);
                  c.rotation = parse_kvarn_rotation(p.get_string("rotation", "hadamard"));
                  c.rotation_seed = static_cast<std::uint64_t>(p.get_int("seed", 0));
                  c.rtn_quantile = static_cast<float>(p.get_double("quantile", 0.0));
                  std::string sc = p.get_string("scales", "fp16");
                  KVARN_CHECK(sc == "fp16" || sc == "fp8", "kvarn: scales must be fp16 or fp8, got '",
                              sc, "'");
                  c.scales = sc == "fp8" ? ScaleStorage::kFp8E4M3 : ScaleStorage::kFp16;
                  if (p.has("sink")) {
                    c.sink_tokens = p.get_int("sink", 0);
                    KVARN_CHECK(c.sink_tokens >= 0, "kvarn: sink must be >= 0, got ", c.sink_tokens);
                    if (c.sink_tokens == c.group) c.sink_tokens = -1;  // canonical: one group
                  }
                  c.recent = p.get_int("recent", 0);
                  return std::make_unique<KvarnMethod>(c);
                }});
  for (const char* name : {"kvarn_k4v2_g128", "kvarn_k4v4_g128", "kvarn_k4v2_g64", "kvarn_k4v4_g64"}) {
    std::smatch m;
    std::string s(name);
    std::regex_match(s, m, std::regex("kvarn_k(\\d)v(\\d)_g(\\d+)"));
    r.add_preset(name, "kvarn:k=" + m[1].str() + ",v=" + m[2].str() + ",g=" + m[3].str());
  }
  r.add_preset(kKvarnPaperPreset, kKvarnPaperSpec);
  r.add_name_pattern([](const std::string& name) -> std::string {
    static const std::regex re("kvarn_k(\\d+)v(\\d+)_g(\\d+)");
    std::smatch m;
    if (!std::regex_match(name, m, re)) return "";
    return "kvarn:k=" + m[1].str() + ",v=" + m[2].str() + ",g=" + m[3].str();
  });
}

}  // namespace kvarn
