#include "kvarn/core/quarot.hpp"

#include <algorithm>
#include <cmath>
#include <regex>
#include <sstream>
#include <vector>

#include "families.hpp"
#include "kvarn/core/pack.hpp"
#include "kvarn/core/portable_math.hpp"
#include "kvarn/data/error.hpp"

namespace kvarn {

void quarot_quantize_group(const float* x, int n, int bits, float clip, std::uint8_t* codes,
                           float* recon, std::uint16_t* scale_bits, std::uint16_t* zero_bits) {
  const float qmax = static_cast<float>((1 << bits) - 1);
  constexpr float kMinHalf = 5.9604644775390625e-8f;  // 2^-24
  float mn = x[0], mx = x[0];
  for (int i = 1; i < n; ++i) {
    mn = std::min(mn, x[i]);
    mx = std::max(mx, x[i]);
  }
  float xmin = mn * clip, xmax = mx * clip;
  if (xmin == 0.0f && xmax == 0.0f) xmin = -1.0f, xmax = 1.0f;
  float s = 0.0f, z = 0.0f;
  for (int attempt = 0; attempt < 2; ++attempt) {
    s = std::max(round_to_half((xmax - xmin) / qmax), kMinHalf);
    z = round_half_even(-xmin / s);
    if (std::abs(z) <= 2048.0f && xmax > xmin) break;
    xmin = std::min(xmin, 0.0f);  // degenerate group: include 0 so that zero lies in [0, qmax]
    xmax = std::max(xmax, 0.0f);
  }
  *scale_bits = float_to_half_bits(s);
  *zero_bits = float_to_half_bits(z);
  for (int i = 0; i < n; ++i) {
    const float q = std::min(std::max(round_half_even(x[i] / s) + z, 0.0f), qmax);
    codes[i] = static_cast<std::uint8_t>(q);
    recon[i] = s * (q - z);
  }
}

namespace {

void put_half(std::vector<std::uint8_t>& out, std::size_t i, std::uint16_t h) {
  out[2 * i] = static_cast<std::uint8_t>(h & 0xff);
  out[2 * i + 1] = static_cast<std::uint8_t>(h >> 8);
}

class QuarotCodec : public StreamCodec {
 public:
  QuarotCodec(StreamKind kind, int d, const QuarotConfig& cfg)
      : StreamCodec(d),
        kind_(kind),
        bits_(kind == StreamKind::kKey ? cfg.key_bits : cfg.value_bits),
        group_(cfg.group > 0 ? cfg.group : d),
        clip_(static_cast<float>(cfg.clip)),
        rot_(cfg.rotation, d, cfg.seed) {}
  StreamPolicy policy() const override { return {0, 1, 0}; }
  std::size_t chunk_bytes() const override {
    return packed_bytes(head_dim_, bits_) + static_cast<std::size_t>(head_dim_ / group_) * 4;
  }
  double code_bits() const override { return 8.0 / pack_factor(bits_); }

  void encode(const float* rows, int n, Chunk* chunk, float* recon) override {
    KVARN_CHECK(n == 1, "quarot codec: chunk of ", n, " tokens, expected 1");
    const std::size_t d = head_dim_, groups = d / group_;
    const std::string p = kind_ == StreamKind::kKey ? "k_" : "v_";
    // fp16 input, rotated in fp32 and held in fp16 (the online Hadamard's output dtype).
    rotated_.resize(d);
    for (std::size_t i = 0; i < d; ++i) rotated_[i] = round_to_half(rows[i]);
    rot_.forward_fp16(rotated_.data(), 1, chunk->first_token);  // throws beyond the fp16 range
    Field codes{p + "codes", "u8", {1, packed_bytes(d, bits_)}, {}};
    codes.bytes.resize(packed_bytes(d, bits_));
    Field scale{p + "scale", "f16", {groups}, std::vector<std::uint8_t>(groups * 2)};
    Field zero{p + "zero", "f16", {groups}, std::vector<std::uint8_t>(groups * 2)};
    q_.resize(d);
    for (std::size_t j = 0; j < groups; ++j) {
      std::uint16_t sb, zb;
      const std::size_t off = j * group_;
      quarot_quantize_group(rotated_.data() + off, group_, bits_, clip_, q_.data() + off,
                            recon + off, &sb, &zb);
      put_half(scale.bytes, j, sb);
      put_half(zero.bytes, j, zb);
    }
    pack_codes(q_.data(), d, bits_, codes.bytes.data());
    rot_.inverse(recon, 1);
    chunk->fields.push_back(std::move(codes));
    chunk->fields.push_back(std::move(scale));
    chunk->fields.push_back(std::move(zero));
  }

 private:
  StreamKind kind_;
  int bits_, group_;
  float clip_;
  Rotation rot_;
  std::vector<float> rotated_;
  std::vector<std::uint8_t> q_;
};

}  // namespace

QuarotMethod::QuarotMethod(QuarotConfig cfg) : cfg_(cfg) {
  KVARN_CHECK(cfg_.key_bits >= 1 && cfg_.key_bits <= 8, "quarot: k_bits must be 1..8, got ",
              cfg_.key_bits);
  KVARN_CHECK(cfg_.value_bits >= 1 && cfg_.value_bits <= 8, "quarot: v_bits must be 1..8, got ",
              cfg_.value_bits);
  KVARN_CHECK(cfg_.group >= 0, "quarot: group must be >= 0 (0 = head_dim), got ", cfg_.group);
  KVARN_CHECK(cfg_.clip > 0 && cfg_.clip <= 1, "quarot: clip must be in (0, 1], got ", cfg_.clip);
}

std::string QuarotMethod::name() const {
  const QuarotConfig def;
  const bool plain = cfg_.group == 0 && cfg_.clip == 1.0 && cfg_.rotation == def.rotation;
  return plain ? "quarot_k" + std::to_string(cfg_.key_bits) + "v" + std::to_string(cfg_.value_bits)
               : spec();
}

std::string QuarotMethod::spec() const {
  std::string s = "quarot:k_bits=" + std::to_string(cfg_.key_bits) +
                  ",v_bits=" + std::to_string(cfg_.value_bits) +
                  ",group=" + (cfg_.group == 0 ? std::string("head") : std::to_string(cfg_.group)) +
                  ",clip=" + format_spec_number(cfg_.clip) + ",rotation=" + to_string(cfg_.rotation);
  if (cfg_.rotation == RotationKind::kHaar) s += ",seed=" + std::to_string(cfg_.seed);
  return s;
}

std::string QuarotMethod::description() const {
  return "QuaRot-style: " + to_string(cfg_.rotation) + " rotation per head, asymmetric RTN K" +
         std::to_string(cfg_.key_bits) + "/V" + std::to_string(cfg_.value_bits) +
         " per token (group " +
         (cfg_.group ? std::to_string(cfg_.group) : std::string("head_dim")) +
         "), fp16 scale + integer zero, clip " + format_spec_number(cfg_.clip);
}

void QuarotMethod::check_head_dim(int head_dim) const {
  Method::check_head_dim(head_dim);
  const int g = cfg_.group > 0 ? cfg_.group : head_dim;
  KVARN_CHECK(head_dim % g == 0, "method ", name(), ": head_dim ", head_dim,
              " is not a multiple of group ", g);
  if (cfg_.rotation == RotationKind::kHadamard) {
    KVARN_CHECK(hadamard_supported(head_dim), "method ", name(),
                ": no orthogonal Hadamard for head_dim ", head_dim,
                " (supported: 2^m, 12*2^m, 20*2^m, 28*2^m)");
  }
}

std::unique_ptr<StreamCodec> QuarotMethod::make_codec(StreamKind kind, int head_dim,
                                                      const LayerContext&) const {
  check_head_dim(head_dim);
  return std::make_unique<QuarotCodec>(kind, head_dim, cfg_);
}

void register_quarot(Registry& r) {
  r.add_family({"quarot",
                "QuaRot-style: per-head Hadamard on K and V, asymmetric RTN with integer zero per "
                "token, every token quantized",
                {"k_bits", "v_bits", "group", "clip", "rotation", "seed"},
                [](Params& p) -> std::unique_ptr<Method> {
                  QuarotConfig c;
                  c.key_bits = p.get_int("k_bits", 4);
                  c.value_bits = p.get_int("v_bits", 4);
                  const std::string g = p.get_string("group", "head");
                  c.group = g == "head" ? 0 : p.get_int("group", 0);
                  c.clip = p.get_double("clip", 1.0);
                  c.rotation = parse_rotation(p.get_string("rotation", "hadamard"));
                  c.seed = static_cast<std::uint64_t>(p.get_int("seed", 0));
                  return std::make_unique<QuarotMethod>(c);
                }});
  r.add_preset("quarot_k4v4", "quarot:k_bits=4,v_bits=4");
  r.add_name_pattern([](const std::string& name) -> std::string {
    static const std::regex re("quarot_k(\\d+)v(\\d+)");
    std::smatch m;
    if (!std::regex_match(name, m, re)) return "";
    return "quarot:k_bits=" + m[1].str() + ",v_bits=" + m[2].str();
  });
}

}  // namespace kvarn
