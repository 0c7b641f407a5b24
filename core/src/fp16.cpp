// fp16: the identity baseline (every token stored as fp16, 512 B/token/head at D=128).
#include "families.hpp"
#include "kvarn/core/portable_math.hpp"

namespace kvarn {
namespace {

class Fp16Codec : public StreamCodec {
 public:
  explicit Fp16Codec(int d) : StreamCodec(d) {}
  StreamPolicy policy() const override { return {0, 1, 0}; }
  std::size_t chunk_bytes() const override { return 2 * static_cast<std::size_t>(head_dim_); }
  double code_bits() const override { return 16.0; }
  void encode(const float* rows, int n, Chunk* chunk, float* recon) override {
    Field f{"fp16", "f16", {static_cast<std::size_t>(n), static_cast<std::size_t>(head_dim_)}, {}};
    f.bytes.resize(2 * static_cast<std::size_t>(n) * head_dim_);
    for (std::size_t i = 0; i < static_cast<std::size_t>(n) * head_dim_; ++i) {
      std::uint16_t h = float_to_half_bits(rows[i]);
      f.bytes[2 * i] = static_cast<std::uint8_t>(h & 0xff);
      f.bytes[2 * i + 1] = static_cast<std::uint8_t>(h >> 8);
      recon[i] = half_bits_to_float(h);
    }
    chunk->fields.push_back(std::move(f));
  }
};

class Fp16Method : public Method {
 public:
  std::string name() const override { return "fp16"; }
  std::string spec() const override { return "fp16"; }
  std::string family() const override { return "fp16"; }
  std::string description() const override { return "FP16 cache (identity reference)"; }
  std::unique_ptr<StreamCodec> make_codec(StreamKind, int head_dim,
                                          const LayerContext&) const override {
    return std::make_unique<Fp16Codec>(head_dim);
  }
};

}  // namespace

void register_fp16(Registry& r) {
  r.add_family({"fp16", "FP16 cache (identity)", {}, [](Params&) -> std::unique_ptr<Method> {
                  return std::make_unique<Fp16Method>();
                }});
}

}  // namespace kvarn
