#include "kvarn/core/turboquant.hpp"

#include <algorithm>
#include <cmath>
#include <regex>
#include <vector>

#include "families.hpp"
#include "kvarn/core/fp8.hpp"
#include "kvarn/core/lloyd_max.hpp"
#include "kvarn/core/portable_math.hpp"
#include "kvarn/core/rng.hpp"
#include "kvarn/core/rotation.hpp"
#include "kvarn/data/error.hpp"

namespace kvarn {

std::size_t bitstream_bytes(std::size_t n, int bits) {
  return (n * static_cast<std::size_t>(bits) + 7) / 8;
}

void bitstream_pack(const std::uint8_t* codes, std::size_t n, int bits, std::uint8_t* out) {
  std::fill(out, out + bitstream_bytes(n, bits), 0);
  for (std::size_t j = 0; j < n; ++j) {
    for (int b = 0; b < bits; ++b) {
      const std::size_t bit = j * bits + b;
      if ((codes[j] >> b) & 1u)
        out[bit / 8] = static_cast<std::uint8_t>(out[bit / 8] | (1u << (bit % 8)));
    }
  }
}

std::uint8_t bitstream_code(const std::uint8_t* packed, std::size_t j, int bits) {
  unsigned v = 0;
  for (int b = 0; b < bits; ++b) {
    const std::size_t bit = j * bits + b;
    v |= ((packed[bit / 8] >> (bit % 8)) & 1u) << b;
  }
  return static_cast<std::uint8_t>(v);
}

void turboquant_quantize_value(const float* x, int n, int bits, std::uint8_t* codes, float* recon,
                               std::uint16_t* scale_bits, std::uint16_t* min_bits) {
  const int qmax = (1 << bits) - 1;
  float mn = round_to_half(x[0]), mx = mn;
  for (int i = 1; i < n; ++i) {
    mn = std::min(mn, round_to_half(x[i]));
    mx = std::max(mx, round_to_half(x[i]));
  }
  float scale = (mx - mn) / static_cast<float>(qmax);
  scale = scale > 1e-8f ? scale : 1e-8f;
  *scale_bits = float_to_half_bits(scale);
  *min_bits = float_to_half_bits(mn);
  const float s16 = half_bits_to_float(*scale_bits), m16 = half_bits_to_float(*min_bits);
  for (int i = 0; i < n; ++i) {
    // int(v + 0.5) truncates, i.e. rounds half up for v >= 0
    const int q = std::clamp(static_cast<int>((round_to_half(x[i]) - mn) / scale + 0.5f), 0, qmax);
    codes[i] = static_cast<std::uint8_t>(q);
    recon[i] = static_cast<float>(q) * s16 + m16;
  }
}

namespace {

constexpr float kHalfMax = 65504.0f;

void put_half(std::vector<std::uint8_t>& out, std::size_t i, std::uint16_t h) {
  out[2 * i] = static_cast<std::uint8_t>(h & 0xff);
  out[2 * i + 1] = static_cast<std::uint8_t>(h >> 8);
}

std::string prefix(StreamKind kind) { return kind == StreamKind::kKey ? "k_" : "v_"; }

// Boundary layers: the native-dtype cache (fp16, one token per chunk).
class Fp16Codec : public StreamCodec {
 public:
  Fp16Codec(StreamKind kind, int d) : StreamCodec(d), kind_(kind) {}
  StreamPolicy policy() const override { return {0, 1, 0}; }
  std::size_t chunk_bytes() const override { return 2 * static_cast<std::size_t>(head_dim_); }
  double code_bits() const override { return 16.0; }
  void encode(const float* rows, int n, Chunk* chunk, float* recon) override {
    const std::size_t total = static_cast<std::size_t>(n) * head_dim_;
    Field f{prefix(kind_) + "fp16",
            "f16",
            {static_cast<std::size_t>(n), static_cast<std::size_t>(head_dim_)},
            std::vector<std::uint8_t>(2 * total)};
    for (std::size_t i = 0; i < total; ++i) {
      const std::uint16_t h = float_to_half_bits(rows[i]);
      put_half(f.bytes, i, h);
      recon[i] = half_bits_to_float(h);
    }
    chunk->fields.push_back(std::move(f));
  }

 private:
  StreamKind kind_;
};

// ||x|| of the fp16 input in fp32; saturated to the fp16 maximum when stored (vLLM would store
// Inf and reconstruct Inf/NaN).
float norm_of(const float* x, int n) {
  float s = 0.0f;
  for (int i = 0; i < n; ++i) s += x[i] * x[i];
  return sqrt_rn(s);
}

std::uint16_t store_norm(float n) { return float_to_half_bits(std::min(n, kHalfMax)); }

class TqKeyCodec : public StreamCodec {
 public:
  TqKeyCodec(int d, int bits, bool nc)
      : StreamCodec(d),
        bits_(bits),
        nc_(nc),
        rot_(RotationKind::kHadamard, d),
        cb_(vllm_turboquant_codebook(d, bits)) {}
  StreamPolicy policy() const override { return {0, 1, 0}; }
  std::size_t chunk_bytes() const override { return bitstream_bytes(head_dim_, bits_) + 2; }
  double code_bits() const override { return bits_; }

  void encode(const float* rows, int n, Chunk* chunk, float* recon) override {
    KVARN_CHECK(n == 1, "turboquant key codec: chunk of ", n, " tokens, expected 1");
    const int d = head_dim_;
    y_.resize(d);
    idx_.resize(d);
    for (int i = 0; i < d; ++i) y_[i] = round_to_half(rows[i]);
    const float norm = norm_of(y_.data(), d);
    for (int i = 0; i < d; ++i) y_[i] = y_[i] / (norm + 1e-8f);
    rot_.forward(y_.data(), 1);
    float sq = 0.0f;
    for (int i = 0; i < d; ++i) {
      idx_[i] = static_cast<std::uint8_t>(cb_.index(y_[i]));
      recon[i] = cb_.centroids[idx_[i]];
      sq += recon[i] * recon[i];
    }
    const std::uint16_t nb = store_norm(norm);
    const float n16 = half_bits_to_float(nb);
    const float inv = nc_ ? 1.0f / sqrt_rn(sq + 1e-16f) : 1.0f;
    for (int i = 0; i < d; ++i) recon[i] = n16 * (recon[i] * inv);
    rot_.inverse(recon, 1);
    Field codes{"k_idx", "u8", {1, bitstream_bytes(d, bits_)}, {}};
    codes.bytes.resize(bitstream_bytes(d, bits_));
    bitstream_pack(idx_.data(), d, bits_, codes.bytes.data());
    Field nf{"k_norm", "f16", {1}, std::vector<std::uint8_t>(2)};
    put_half(nf.bytes, 0, nb);
    chunk->fields.push_back(std::move(codes));
    chunk->fields.push_back(std::move(nf));
  }

 private:
  int bits_;
  bool nc_;
  Rotation rot_;
  const ScalarCodebook& cb_;
  std::vector<float> y_;
  std::vector<std::uint8_t> idx_;
};

class TqValueCodec : public StreamCodec {
 public:
  TqValueCodec(int d, int bits, std::size_t pad) : StreamCodec(d), bits_(bits), pad_(pad) {}
  StreamPolicy policy() const override { return {0, 1, 0}; }
  std::size_t chunk_bytes() const override { return bitstream_bytes(head_dim_, bits_) + 4 + pad_; }
  double code_bits() const override { return bits_; }

  void encode(const float* rows, int n, Chunk* chunk, float* recon) override {
    KVARN_CHECK(n == 1, "turboquant value codec: chunk of ", n, " tokens, expected 1");
    const int d = head_dim_;
    q_.resize(d);
    std::uint16_t sb, mb;
    turboquant_quantize_value(rows, d, bits_, q_.data(), recon, &sb, &mb);
    Field codes{"v_codes", "u8", {1, bitstream_bytes(d, bits_)}, {}};
    codes.bytes.resize(bitstream_bytes(d, bits_));
    bitstream_pack(q_.data(), d, bits_, codes.bytes.data());
    Field meta{"v_scale_min", "f16", {2}, std::vector<std::uint8_t>(4)};
    put_half(meta.bytes, 0, sb);
    put_half(meta.bytes, 1, mb);
    chunk->fields.push_back(std::move(codes));
    chunk->fields.push_back(std::move(meta));
    if (pad_)
      chunk->fields.push_back(Field{"slot_pad", "u8", {pad_}, std::vector<std::uint8_t>(pad_)});
  }

 private:
  int bits_;
  std::size_t pad_;
  std::vector<std::uint8_t> q_;
};

struct TqPreset {
  const char* name;
  int k, v;
  bool nc;
};
constexpr TqPreset kTqPresets[] = {{"turboquant_k8v4", 8, 4, false},
                                   {"turboquant_4bit_nc", 4, 4, true},
                                   {"turboquant_k3v4_nc", 3, 4, true},
                                   {"turboquant_3bit_nc", 3, 3, true}};

}  // namespace

TurboQuantMethod::TurboQuantMethod(TurboQuantConfig cfg) : cfg_(cfg) {
  const int k = cfg_.key_bits;
  KVARN_CHECK(k == 2 || k == 3 || k == 4 || k == 8,
              "turboquant: k must be 2, 3, 4 or 8 (fp8), got ", k);
  KVARN_CHECK(cfg_.value_bits >= 2 && cfg_.value_bits <= 4, "turboquant: v must be 2..4, got ",
              cfg_.value_bits);
  KVARN_CHECK(!(k == 8 && cfg_.norm_correction),
              "turboquant: nc (norm correction) needs Lloyd-Max keys, not fp8 keys (k=8)");
  KVARN_CHECK(cfg_.boundary >= 0, "turboquant: boundary must be >= 0, got ", cfg_.boundary);
}

std::string TurboQuantMethod::name() const {
  if (cfg_.boundary == 2) {
    for (const auto& p : kTqPresets)
      if (p.k == cfg_.key_bits && p.v == cfg_.value_bits && p.nc == cfg_.norm_correction)
        return p.name;
  }
  return spec();
}

std::string TurboQuantMethod::spec() const {
  return "turboquant:k=" + std::to_string(cfg_.key_bits) + ",v=" + std::to_string(cfg_.value_bits) +
         ",nc=" + (cfg_.norm_correction ? "1" : "0") + ",boundary=" + std::to_string(cfg_.boundary);
}

std::string TurboQuantMethod::description() const {
  const std::string keys = cfg_.key_bits == 8
                               ? std::string("fp8 e4m3 keys")
                               : std::to_string(cfg_.key_bits) + "-bit Hadamard + Lloyd-Max keys" +
                                     (cfg_.norm_correction ? " with norm correction" : "");
  return "vLLM TurboQuant: " + keys + ", " + std::to_string(cfg_.value_bits) +
         "-bit per-token min-max values, first/last " + std::to_string(cfg_.boundary) +
         " layers fp16";
}

void TurboQuantMethod::check_head_dim(int head_dim) const {
  Method::check_head_dim(head_dim);
  if (cfg_.key_bits != 8) {
    KVARN_CHECK(hadamard_supported(head_dim), "method ", name(),
                ": no orthogonal Hadamard for head_dim ", head_dim,
                " (supported: 2^m, 12*2^m, 20*2^m, 28*2^m)");
  }
}

bool TurboQuantMethod::layer_skipped(const LayerContext& layer) const {
  const int n = std::min(cfg_.boundary, layer.num_layers / 2);
  return n > 0 && (layer.layer < n || layer.layer >= layer.num_layers - n);
}

std::unique_ptr<StreamCodec> TurboQuantMethod::make_codec(StreamKind kind, int head_dim,
                                                          const LayerContext& layer) const {
  check_head_dim(head_dim);
  if (layer_skipped(layer)) return std::make_unique<Fp16Codec>(kind, head_dim);
  const std::size_t d = head_dim;
  if (kind == StreamKind::kKey) {
    if (cfg_.key_bits == 8) return make_fp8_codec(kind, head_dim, Fp8Config{});
    return std::make_unique<TqKeyCodec>(head_dim, cfg_.key_bits, cfg_.norm_correction);
  }
  const std::size_t key_bytes = cfg_.key_bits == 8 ? d : bitstream_bytes(d, cfg_.key_bits) + 2;
  const std::size_t slot = key_bytes + bitstream_bytes(d, cfg_.value_bits) + 4;
  return std::make_unique<TqValueCodec>(head_dim, cfg_.value_bits, slot % 2);
}

// ---------------------------------------------------------------------------------------------
namespace {

constexpr std::uint64_t kQjlSeedSalt = 0x51f15eedULL;

class TqPaperCodec : public StreamCodec {
 public:
  TqPaperCodec(StreamKind kind, int d, const TurboQuantPaperConfig& cfg)
      : StreamCodec(d),
        kind_(kind),
        prod_(cfg.mode == TurboQuantPaperMode::kProd),
        mse_bits_(prod_ ? cfg.bits - 1 : cfg.bits),
        rot_(RotationKind::kHaar, d, cfg.seed),
        cb_(mse_bits_ > 0 ? &sphere_codebook(d, mse_bits_) : nullptr) {
    if (prod_) {
      Rng rng(cfg.seed ^ kQjlSeedSalt);
      s_.resize(static_cast<std::size_t>(d) * d);
      for (float& v : s_) v = static_cast<float>(rng.normal());
    }
  }
  StreamPolicy policy() const override { return {0, 1, 0}; }
  std::size_t chunk_bytes() const override {
    std::size_t b = (mse_bits_ > 0 ? bitstream_bytes(head_dim_, mse_bits_) : 0) + 2;
    if (prod_) b += bitstream_bytes(head_dim_, 1) + 2;
    return b;
  }
  double code_bits() const override { return mse_bits_ + (prod_ ? 1 : 0); }

  void encode(const float* rows, int n, Chunk* chunk, float* recon) override {
    KVARN_CHECK(n == 1, "turboquant_paper codec: chunk of ", n, " tokens, expected 1");
    const int d = head_dim_;
    const std::string p = prefix(kind_);
    u_.resize(d);
    y_.resize(d);
    idx_.assign(d, 0);
    for (int i = 0; i < d; ++i) u_[i] = round_to_half(rows[i]);
    const float norm = norm_of(u_.data(), d);
    for (int i = 0; i < d; ++i) u_[i] = norm > 0 ? u_[i] / norm : 0.0f;
    // u_mse: codebook reconstruction of the unit vector, original frame
    std::vector<float> u_mse(d, 0.0f);
    if (cb_) {
      std::copy(u_.begin(), u_.end(), y_.begin());
      rot_.forward(y_.data(), 1);
      for (int i = 0; i < d; ++i) {
        idx_[i] = static_cast<std::uint8_t>(cb_->index(y_[i]));
        u_mse[i] = cb_->centroids[idx_[i]];
      }
      rot_.inverse(u_mse.data(), 1);
      Field codes{p + "idx", "u8", {1, bitstream_bytes(d, mse_bits_)}, {}};
      codes.bytes.resize(bitstream_bytes(d, mse_bits_));
      bitstream_pack(idx_.data(), d, mse_bits_, codes.bytes.data());
      chunk->fields.push_back(std::move(codes));
    }
    const std::uint16_t nb = store_norm(norm);
    Field nf{p + "norm", "f16", {1}, std::vector<std::uint8_t>(2)};
    put_half(nf.bytes, 0, nb);
    chunk->fields.push_back(std::move(nf));
    std::copy(u_mse.begin(), u_mse.end(), recon);
    if (prod_) {
      std::vector<float> r(d);
      for (int i = 0; i < d; ++i) r[i] = u_[i] - u_mse[i];
      const float gamma = norm_of(r.data(), d);
      std::vector<std::uint8_t> sign(d);
      for (int i = 0; i < d; ++i) {
        float dot = 0.0f;
        for (int j = 0; j < d; ++j) dot += s_[static_cast<std::size_t>(i) * d + j] * r[j];
        sign[i] = dot >= 0.0f ? 1 : 0;  // sign(0) = +1
      }
      const std::uint16_t gb = float_to_half_bits(gamma);
      const float g16 = half_bits_to_float(gb);
      const float coef = std::sqrt(3.14159265358979323846f / 2.0f) / d * g16;
      for (int j = 0; j < d; ++j) {
        float acc = 0.0f;
        for (int i = 0; i < d; ++i)
          acc += sign[i] ? s_[static_cast<std::size_t>(i) * d + j]
                         : -s_[static_cast<std::size_t>(i) * d + j];
        recon[j] += coef * acc;
      }
      Field qjl{p + "qjl",
                "u8",
                {bitstream_bytes(d, 1)},
                std::vector<std::uint8_t>(bitstream_bytes(d, 1))};
      bitstream_pack(sign.data(), d, 1, qjl.bytes.data());
      Field gf{p + "gamma", "f16", {1}, std::vector<std::uint8_t>(2)};
      put_half(gf.bytes, 0, gb);
      chunk->fields.push_back(std::move(qjl));
      chunk->fields.push_back(std::move(gf));
    }
    const float n16 = half_bits_to_float(nb);
    for (int i = 0; i < d; ++i) recon[i] *= n16;
  }

 private:
  StreamKind kind_;
  bool prod_;
  int mse_bits_;
  Rotation rot_;
  const ScalarCodebook* cb_;
  std::vector<float> s_;  // QJL matrix S [D, D], row-major
  std::vector<float> u_, y_;
  std::vector<std::uint8_t> idx_;
};

std::string mode_name(TurboQuantPaperMode m) {
  return m == TurboQuantPaperMode::kMse ? "mse" : "prod";
}

}  // namespace

TurboQuantPaperMethod::TurboQuantPaperMethod(TurboQuantPaperConfig cfg) : cfg_(cfg) {
  const int hi = cfg_.mode == TurboQuantPaperMode::kProd ? 5 : 4;  // prod 1 = QJL alone
  KVARN_CHECK(cfg_.bits >= 1 && cfg_.bits <= hi, "turboquant_paper: bits must be 1..", hi,
              " for mode=", mode_name(cfg_.mode), ", got ", cfg_.bits);
}

std::string TurboQuantPaperMethod::name() const {
  const std::string n =
      "turboquant_" + mode_name(cfg_.mode) + "_" + std::to_string(cfg_.bits) + "bit";
  return cfg_.seed == 0 ? n : spec();
}

std::string TurboQuantPaperMethod::spec() const {
  return "turboquant_paper:mode=" + mode_name(cfg_.mode) + ",bits=" + std::to_string(cfg_.bits) +
         ",seed=" + std::to_string(cfg_.seed);
}

std::string TurboQuantPaperMethod::description() const {
  return "TurboQuant paper (" + mode_name(cfg_.mode) + ", " + std::to_string(cfg_.bits) +
         " bits/coordinate): seeded Haar rotation, Beta-law Lloyd-Max codebook, fp16 norm" +
         (cfg_.mode == TurboQuantPaperMode::kProd ? " + 1-bit QJL residual with fp16 gamma" : "") +
         ", on K and V per token";
}

std::unique_ptr<StreamCodec> TurboQuantPaperMethod::make_codec(StreamKind kind, int head_dim,
                                                               const LayerContext&) const {
  check_head_dim(head_dim);
  return std::make_unique<TqPaperCodec>(kind, head_dim, cfg_);
}

void register_turboquant(Registry& r) {
  r.add_family({"turboquant",
                "vLLM TurboQuant: Hadamard + Lloyd-Max keys (or fp8), per-token min-max values, "
                "boundary layers fp16",
                {"k", "v", "nc", "boundary", "skip_layers"},
                [](Params& p) -> std::unique_ptr<Method> {
                  TurboQuantConfig c;
                  c.key_bits = p.get_int("k", 4);
                  c.value_bits = p.get_int("v", 4);
                  c.norm_correction = p.get_bool("nc", c.key_bits != 8);
                  KVARN_CHECK(!(p.has("boundary") && p.has("skip_layers")),
                              "turboquant: give boundary or its alias skip_layers, not both");
                  c.boundary = p.get_int(p.has("skip_layers") ? "skip_layers" : "boundary", 2);
                  return std::make_unique<TurboQuantMethod>(c);
                }});
  for (const auto& pr : kTqPresets) {
    r.add_preset(pr.name, "turboquant:k=" + std::to_string(pr.k) + ",v=" + std::to_string(pr.v) +
                              ",nc=" + (pr.nc ? "1" : "0"));
  }
  r.add_family({"turboquant_paper",
                "TurboQuant paper: Haar rotation + Beta-law Lloyd-Max (mse) or mse(b-1) + 1-bit "
                "QJL (prod), K and V per token",
                {"mode", "bits", "seed"},
                [](Params& p) -> std::unique_ptr<Method> {
                  TurboQuantPaperConfig c;
                  const std::string m = p.get_string("mode", "mse");
                  KVARN_CHECK(m == "mse" || m == "prod",
                              "turboquant_paper: mode must be mse or prod, got '", m, "'");
                  c.mode = m == "mse" ? TurboQuantPaperMode::kMse : TurboQuantPaperMode::kProd;
                  c.bits = p.get_int("bits", 3);
                  c.seed = static_cast<std::uint64_t>(p.get_int("seed", 0));
                  return std::make_unique<TurboQuantPaperMethod>(c);
                }});
  for (int b = 1; b <= 4; ++b) {
    r.add_preset("turboquant_mse_" + std::to_string(b) + "bit",
                 "turboquant_paper:mode=mse,bits=" + std::to_string(b));
  }
  for (int b = 2; b <= 4; ++b) {
    r.add_preset("turboquant_prod_" + std::to_string(b) + "bit",
                 "turboquant_paper:mode=prod,bits=" + std::to_string(b));
  }
  r.add_name_pattern([](const std::string& name) -> std::string {
    static const std::regex re("turboquant_(mse|prod)_(\\d+)bit");
    std::smatch m;
    if (!std::regex_match(name, m, re)) return "";
    return "turboquant_paper:mode=" + m[1].str() + ",bits=" + m[2].str();
  });
}

}  // namespace kvarn
