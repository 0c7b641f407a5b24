#include "kvarn/core/fp8.hpp"

#include <cmath>
#include <sstream>

#include "families.hpp"
#include "kvarn/data/error.hpp"

namespace kvarn {
namespace {

std::string format_name(Fp8Format f) { return f == Fp8Format::kE4M3 ? "e4m3" : "e5m2"; }

class Fp8Codec : public StreamCodec {
 public:
  Fp8Codec(StreamKind kind, int d, const Fp8Config& cfg)
      : StreamCodec(d), kind_(kind), cfg_(cfg), scale_(static_cast<float>(cfg.scale)) {}
  StreamPolicy policy() const override { return {0, 1, 0}; }
  std::size_t chunk_bytes() const override { return static_cast<std::size_t>(head_dim_); }
  double code_bits() const override { return 8.0; }

  // vLLM computes the scale once, from the first batch it sees, and freezes it.
  void calibrate(const float* rows, int n) override {
    if (!cfg_.calibrated) return;
    float amax = 0.0f;
    for (std::size_t i = 0; i < static_cast<std::size_t>(n) * head_dim_; ++i)
      amax = std::max(amax, std::abs(round_to_half(rows[i])));
    const float div = kind_ == StreamKind::kKey ? kFp8KeyScaleDivisor : kFp8ValueScaleDivisor;
    // vLLM would divide by a zero scale on an all-zero first batch; 1.0 keeps it finite.
    scale_ = amax > 0.0f ? amax / div : 1.0f;
  }

  void encode(const float* rows, int n, Chunk* chunk, float* recon) override {
    const std::size_t d = head_dim_, total = static_cast<std::size_t>(n) * d;
    Field f{
        kind_ == StreamKind::kKey ? "k_fp8" : "v_fp8", "u8", {static_cast<std::size_t>(n), d}, {}};
    f.bytes.resize(total);
    const Fp8Format fmt = cfg_.format;
    for (std::size_t i = 0; i < total; ++i) {
      const std::uint8_t q = float_to_fp8_bits(round_to_half(rows[i]) / scale_, fmt);
      f.bytes[i] = q;
      recon[i] = fp8_bits_to_float(q, fmt) * scale_;
    }
    chunk->fields.push_back(std::move(f));
  }

 private:
  StreamKind kind_;
  Fp8Config cfg_;
  float scale_;
};

}  // namespace

std::unique_ptr<StreamCodec> make_fp8_codec(StreamKind kind, int head_dim, const Fp8Config& cfg) {
  return std::make_unique<Fp8Codec>(kind, head_dim, cfg);
}

Fp8Method::Fp8Method(Fp8Config cfg) : cfg_(cfg) {
  KVARN_CHECK(cfg_.calibrated || (std::isfinite(cfg_.scale) && cfg_.scale > 0),
              "fp8: scale must be a positive number or 'calibrated', got ", cfg_.scale);
}

std::string Fp8Method::name() const {
  const bool plain = !cfg_.calibrated && cfg_.scale == 1.0 && !cfg_.per_head;
  return plain ? "fp8_" + format_name(cfg_.format) : spec();
}

std::string Fp8Method::spec() const {
  return "fp8:format=" + format_name(cfg_.format) +
         ",scale=" + (cfg_.calibrated ? std::string("calibrated") : format_spec_number(cfg_.scale)) +
         ",granularity=" + (cfg_.per_head ? "head" : "tensor");
}

std::string Fp8Method::description() const {
  return "vLLM FP8 " + format_name(cfg_.format) + " cache, " +
         (cfg_.calibrated ? std::string("scale amax/200 (K), amax/100 (V) from the first block")
                          : "fixed scale " + format_spec_number(cfg_.scale)) +
         ", 1 byte/element";
}

std::unique_ptr<StreamCodec> Fp8Method::make_codec(StreamKind kind, int head_dim,
                                                   const LayerContext&) const {
  check_head_dim(head_dim);
  return make_fp8_codec(kind, head_dim, cfg_);
}

void register_fp8(Registry& r) {
  r.add_family({"fp8",
                "vLLM FP8 KV cache: x/scale rounded (RNE, saturating) to e4m3 or e5m2",
                {"format", "scale", "granularity"},
                [](Params& p) -> std::unique_ptr<Method> {
                  Fp8Config c;
                  const std::string fmt = p.get_string("format", "e4m3");
                  KVARN_CHECK(fmt == "e4m3" || fmt == "e5m2",
                              "fp8: format must be e4m3 or e5m2, got '", fmt, "'");
                  c.format = fmt == "e4m3" ? Fp8Format::kE4M3 : Fp8Format::kE5M2;
                  const std::string sc = p.get_string("scale", "1");
                  if (sc == "calibrated") {
                    c.calibrated = true;
                  } else {
                    c.scale = p.get_double("scale", 1.0);
                  }
                  const std::string g = p.get_string("granularity", "tensor");
                  KVARN_CHECK(g == "tensor" || g == "head",
                              "fp8: granularity must be tensor or head, got '", g, "'");
                  c.per_head = g == "head";
                  return std::make_unique<Fp8Method>(c);
                }});
  r.add_preset("fp8_e4m3", "fp8:format=e4m3");
  r.add_preset("fp8_e5m2", "fp8:format=e5m2");
}

}  // namespace kvarn
