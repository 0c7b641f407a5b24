#include "kvarn/core/kivi.hpp"

#include <algorithm>
#include <sstream>
#include <vector>

#include "families.hpp"
#include "kvarn/core/pack.hpp"
#include "kvarn/core/portable_math.hpp"
#include "kvarn/data/error.hpp"

namespace kvarn {

void kivi_quantize_group(const float* x, int n, int stride, int bits, std::uint8_t* codes,
                         float* recon, std::uint16_t* scale_bits, std::uint16_t* min_bits) {
  const float qmax = static_cast<float>((1 << bits) - 1);
  // The cache holds fp16 K/V: statistics are taken on the fp16 values.
  float mn = round_to_half(x[0]), mx = mn;
  for (int i = 1; i < n; ++i) {
    const float v = round_to_half(x[static_cast<std::size_t>(i) * stride]);
    mn = std::min(mn, v);
    mx = std::max(mx, v);
  }
  *scale_bits = float_to_half_bits((mx - mn) / qmax);
  *min_bits = float_to_half_bits(mn);
  const float s = half_bits_to_float(*scale_bits), m = half_bits_to_float(*min_bits);
  for (int i = 0; i < n; ++i) {
    const std::size_t at = static_cast<std::size_t>(i) * stride;
    float q = 0.0f;
    if (s > 0.0f) {
      q = std::min(std::max((round_to_half(x[at]) - m) / s, 0.0f), qmax);
      q = round_half_even(q);
    }
    codes[i] = static_cast<std::uint8_t>(q);
    recon[at] = q * s + m;
  }
}

namespace {

void put_half(std::vector<std::uint8_t>& out, std::size_t i, std::uint16_t h) {
  out[2 * i] = static_cast<std::uint8_t>(h & 0xff);
  out[2 * i + 1] = static_cast<std::uint8_t>(h >> 8);
}

class KiviKeyCodec : public StreamCodec {
 public:
  KiviKeyCodec(int d, const KiviConfig& cfg) : StreamCodec(d), cfg_(cfg) {}
  StreamPolicy policy() const override { return {0, cfg_.residual, 0}; }
  std::size_t chunk_bytes() const override {
    const std::size_t d = head_dim_, groups = cfg_.residual / cfg_.key_group;
    return d * packed_bytes(cfg_.residual, cfg_.key_bits) + d * groups * 4;
  }
  double code_bits() const override { return 8.0 / pack_factor(cfg_.key_bits); }

  void encode(const float* rows, int n, Chunk* chunk, float* recon) override {
    KVARN_CHECK(n == cfg_.residual, "kivi key codec: chunk of ", n, " tokens, expected ",
                cfg_.residual);
    const std::size_t d = head_dim_, g = cfg_.key_group, groups = n / cfg_.key_group;
    const std::size_t row_bytes = packed_bytes(n, cfg_.key_bits);
    Field codes{"k_codes", "u8", {d, row_bytes}, std::vector<std::uint8_t>(d * row_bytes)};
    Field scale{"k_scale", "f16", {d, groups}, std::vector<std::uint8_t>(d * groups * 2)};
    Field mins{"k_min", "f16", {d, groups}, std::vector<std::uint8_t>(d * groups * 2)};
    std::vector<std::uint8_t> ch(n);
    for (std::size_t c = 0; c < d; ++c) {
      for (std::size_t j = 0; j < groups; ++j) {
        std::uint16_t sb, mb;
        const std::size_t off = j * g * d + c;  // token j*g, channel c
        kivi_quantize_group(rows + off, cfg_.key_group, head_dim_, cfg_.key_bits, ch.data() + j * g,
                            recon + off, &sb, &mb);
        put_half(scale.bytes, c * groups + j, sb);
        put_half(mins.bytes, c * groups + j, mb);
      }
      pack_codes(ch.data(), n, cfg_.key_bits, codes.bytes.data() + c * row_bytes);
    }
    chunk->fields.push_back(std::move(codes));
    chunk->fields.push_back(std::move(scale));
    chunk->fields.push_back(std::move(mins));
  }

 private:
  KiviConfig cfg_;
};

class KiviValueCodec : public StreamCodec {
 public:
  KiviValueCodec(int d, const KiviConfig& cfg) : StreamCodec(d), cfg_(cfg) {}
  StreamPolicy policy() const override { return {0, 1, cfg_.residual}; }
  std::size_t chunk_bytes() const override {
    const std::size_t d = head_dim_;
    return packed_bytes(d, cfg_.value_bits) + d / cfg_.value_group * 4;
  }
  double code_bits() const override { return 8.0 / pack_factor(cfg_.value_bits); }

  void encode(const float* rows, int n, Chunk* chunk, float* recon) override {
    KVARN_CHECK(n == 1, "kivi value codec: chunk of ", n, " tokens, expected 1");
    const std::size_t d = head_dim_, groups = d / cfg_.value_group;
    Field codes{"v_codes", "u8", {1, packed_bytes(d, cfg_.value_bits)}, {}};
    codes.bytes.resize(packed_bytes(d, cfg_.value_bits));
    Field scale{"v_scale", "f16", {groups}, std::vector<std::uint8_t>(groups * 2)};
    Field mins{"v_min", "f16", {groups}, std::vector<std::uint8_t>(groups * 2)};
    std::vector<std::uint8_t> q(d);
    for (std::size_t j = 0; j < groups; ++j) {
      std::uint16_t sb, mb;
      const std::size_t off = j * cfg_.value_group;
      kivi_quantize_group(rows + off, cfg_.value_group, 1, cfg_.value_bits, q.data() + off,
                          recon + off, &sb, &mb);
      put_half(scale.bytes, j, sb);
      put_half(mins.bytes, j, mb);
    }
    pack_codes(q.data(), d, cfg_.value_bits, codes.bytes.data());
    chunk->fields.push_back(std::move(codes));
    chunk->fields.push_back(std::move(scale));
    chunk->fields.push_back(std::move(mins));
  }

 private:
  KiviConfig cfg_;
};

}  // namespace

KiviMethod::KiviMethod(KiviConfig cfg) : cfg_(cfg) {
  for (const auto& [what, bits] : {std::pair{"key", cfg_.key_bits}, {"value", cfg_.value_bits}}) {
    KVARN_CHECK(bits == 2 || bits == 4, "kivi: ", what, " bits must be 2 or 4, got ", bits);
  }
  // Whole bytes per group keep KIVI's group-aligned packing (KIVI itself packs 32/b per int32).
  KVARN_CHECK(cfg_.key_group >= 1 && cfg_.key_group * cfg_.key_bits % 8 == 0,
              "kivi: key group must be a positive multiple of ", 8 / cfg_.key_bits, " at ",
              cfg_.key_bits, " bits, got ", cfg_.key_group);
  KVARN_CHECK(cfg_.value_group >= 1 && cfg_.value_group * cfg_.value_bits % 8 == 0,
              "kivi: value group must be a positive multiple of ", 8 / cfg_.value_bits, " at ",
              cfg_.value_bits, " bits, got ", cfg_.value_group);
  KVARN_CHECK(cfg_.residual >= cfg_.key_group && cfg_.residual % cfg_.key_group == 0,
              "kivi: residual must be a positive multiple of the key group (", cfg_.key_group,
              "), got ", cfg_.residual);
}

// Symmetric configurations keep the historical spellings (kivi_2bit, bits=/group=), so their
// specs and case ids do not change.
std::string KiviMethod::name() const {
  if (cfg_.key_group != 32 || cfg_.value_group != 32 || cfg_.residual != 128) return spec();
  if (cfg_.key_bits == cfg_.value_bits) return "kivi_" + std::to_string(cfg_.key_bits) + "bit";
  return "kivi_k" + std::to_string(cfg_.key_bits) + "v" + std::to_string(cfg_.value_bits);
}

std::string KiviMethod::spec() const {
  const std::string r = ",residual=" + std::to_string(cfg_.residual);
  if (cfg_.symmetric()) {
    return "kivi:bits=" + std::to_string(cfg_.key_bits) +
           ",group=" + std::to_string(cfg_.key_group) + r;
  }
  return "kivi:k=" + std::to_string(cfg_.key_bits) + ",v=" + std::to_string(cfg_.value_bits) +
         ",k_group=" + std::to_string(cfg_.key_group) +
         ",v_group=" + std::to_string(cfg_.value_group) + r;
}

std::string KiviMethod::description() const {
  std::ostringstream os;
  os << "KIVI-";
  if (cfg_.key_bits == cfg_.value_bits) {
    os << cfg_.key_bits;
  } else {
    os << "K" << cfg_.key_bits << "V" << cfg_.value_bits;
  }
  os << ": K per channel / V per token, groups of " << cfg_.key_group;
  if (cfg_.key_group != cfg_.value_group) os << " (K) / " << cfg_.value_group << " (V)";
  os << ", fp16 scale+min, " << cfg_.residual << " recent tokens fp16 (keys flushed "
     << cfg_.residual << " at a time)";
  return os.str();
}

void KiviMethod::check_head_dim(int head_dim) const {
  Method::check_head_dim(head_dim);
  KVARN_CHECK(head_dim % cfg_.value_group == 0, "method ", name(), ": head_dim ", head_dim,
              " is not a multiple of the value group ", cfg_.value_group);
}

std::unique_ptr<StreamCodec> KiviMethod::make_codec(StreamKind kind, int head_dim,
                                                    const LayerContext&) const {
  check_head_dim(head_dim);
  if (kind == StreamKind::kKey) return std::make_unique<KiviKeyCodec>(head_dim, cfg_);
  return std::make_unique<KiviValueCodec>(head_dim, cfg_);
}

namespace {
// `bits`/`group` set both streams; `k`/`v` and `k_group`/`v_group` set one each.
int stream_param(Params& p, const char* both, const char* one, int fallback) {
  KVARN_CHECK(!(p.has(both) && p.has(one)), "kivi: give ", both, " or ", one, ", not both");
  return p.get_int(p.has(one) ? one : both, fallback);
}
}  // namespace

void register_kivi(Registry& r) {
  r.add_family({"kivi",
                "KIVI: 2/4-bit min-max RTN, K per channel (token groups), V per token (channel "
                "groups), fp16 recent window",
                {"bits", "group", "k", "v", "k_group", "v_group", "residual"},
                [](Params& p) -> std::unique_ptr<Method> {
                  KiviConfig c;
                  c.key_bits = stream_param(p, "bits", "k", 2);
                  c.value_bits = stream_param(p, "bits", "v", 2);
                  c.key_group = stream_param(p, "group", "k_group", 32);
                  c.value_group = stream_param(p, "group", "v_group", 32);
                  c.residual = p.get_int("residual", 128);
                  return std::make_unique<KiviMethod>(c);
                }});
  r.add_preset("kivi_2bit", "kivi:bits=2,group=32,residual=128");
  r.add_preset("kivi_4bit", "kivi:bits=4,group=32,residual=128");
  r.add_preset("kivi_k4v2", "kivi:k=4,v=2,group=32,residual=128");
}

}  // namespace kvarn
