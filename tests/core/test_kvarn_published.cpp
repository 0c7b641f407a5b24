// KVarN records pinned to the published arithmetic: tests/published/kvarn_published.py computes
// whole tile records (codes, scales, zero points, row scales, padding) with numpy, independently
// of this code (exact fp16 Hadamard, section 3.2 VarN, RTN and packing); the default KVarN
// must reproduce every byte, at D = 128 (real KV) and D = 512 (synthetic).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kvarn/core/kvarn.hpp"
#include "kvarn/core/portable_math.hpp"
#include "kvarn/core/registry.hpp"
#include "kvarn/data/tile_file.hpp"

namespace kvarn {
namespace {

const std::string kDir = std::string(KVARN_SOURCE_DIR) + "/tests/golden/kvarn_published/";

// Same generator as synthetic_tile() in kvarn_published.py.
void synthetic_tile(std::uint64_t seed, int g, int d, std::vector<float>& k,
                    std::vector<float>& v) {
  std::uint64_t state = seed;
  auto next = [&state]() {
    state += 0x9E3779B97F4A7C15ull;
    std::uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  k.resize(static_cast<std::size_t>(g) * d);
  v.resize(k.size());
  for (int t = 0; t < g; ++t)
    for (int c = 0; c < d; ++c) {
      const float i = static_cast<float>(static_cast<int>((next() >> 40) % 4001) - 2000);
      k[static_cast<std::size_t>(t) * d + c] = round_to_half(i * 0x1p-9f * (c % 37 == 0 ? 16 : 1));
    }
  for (int t = 0; t < g; ++t)
    for (int c = 0; c < d; ++c) {
      const float i = static_cast<float>(static_cast<int>((next() >> 40) % 4001) - 2000);
      v[static_cast<std::size_t>(t) * d + c] = round_to_half(i * 0x1p-11f * (1 + t % 4));
    }
}

TEST(KvarnPublished, DefaultRecordsMatchTheIndependentEmulation) {
  std::ifstream mf(kDir + "manifest.json");
  ASSERT_TRUE(mf) << kDir << "manifest.json";
  const nlohmann::json manifest = nlohmann::json::parse(mf);
  std::ifstream bf(kDir + "records.bin", std::ios::binary);
  const std::vector<std::uint8_t> blob((std::istreambuf_iterator<char>(bf)),
                                       std::istreambuf_iterator<char>());
  ASSERT_GE(manifest["cases"].size(), 5u);
  int d512 = 0;
  for (const auto& c : manifest["cases"]) {
    const std::string name = c["name"];
    const int g = c["g"], d = c["head_dim"];
    std::vector<float> k, v;
    if (c.contains("synthetic")) {
      synthetic_tile(c["synthetic"]["seed"].get<std::uint64_t>(), g, d, k, v);
      d512 += d == 512;
    } else {
      const TileReader reader(std::string(KVARN_SOURCE_DIR) + "/" + c["file"].get<std::string>());
      const int t0 = c["first_token"], seq = c["seq"], layer = c["layer"], head = c["head"];
      for (const char* ds : {"k", "v"}) {
        const Matrix m = reader.read(seq, ds, layer, head).middleRows(t0, g);
        (ds[0] == 'k' ? k : v).assign(m.data(), m.data() + m.size());
      }
    }
    const std::string spec = "kvarn_k" + std::to_string(c["k"].get<int>()) + "v" +
                             std::to_string(c["v"].get<int>()) + "_g" + std::to_string(g);
    const KvarnConfig cfg = dynamic_cast<const KvarnMethod&>(*make_method(spec)).config();
    ASSERT_EQ(cfg.rotation, RotationKind::kHadamardFp16);
    const std::vector<std::uint8_t> got =
        kvarn_encode_record(cfg, Rotation(cfg.rotation, d), k.data(), v.data());
    const std::size_t off = c["offset"], bytes = c["bytes"];
    ASSERT_EQ(got.size(), bytes) << name;
    ASSERT_LE(off + bytes, blob.size()) << name;
    std::size_t diff = 0, first = bytes;
    for (std::size_t i = 0; i < bytes; ++i) {
      if (got[i] != blob[off + i]) {
        ++diff;
        first = std::min(first, i);
      }
    }
    EXPECT_EQ(diff, 0u) << name << ": " << diff << " of " << bytes
                        << " record bytes differ, first at byte " << first;
    // The exact-scale option is a different arithmetic: at D = 128 and 512 it changes records.
    KvarnConfig exact = cfg;
    exact.rotation = RotationKind::kHadamard;
    EXPECT_NE(kvarn_encode_record(exact, Rotation(exact.rotation, d), k.data(), v.data()), got)
        << name;
  }
  EXPECT_EQ(d512, 1);
}

}  // namespace
}  // namespace kvarn
