// Golden files: fixed fp16 inputs, every preset of the registry, the exact stored bytes of every
// chunk (hex) and a hash of the reconstruction. Any change of numerics shows up in review as a
// diff of tests/golden/*.json. Regenerate deliberately with KVARN_UPDATE_GOLDEN=1.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "kvarn/core/registry.hpp"
#include "test_util.hpp"

namespace kvarn {
namespace {

using nlohmann::json;
constexpr int kTokens = 300, kHeadDim = 64;

std::string hex(const std::vector<std::uint8_t>& b) {
  static const char* d = "0123456789abcdef";
  std::string s;
  s.reserve(b.size() * 2);
  for (auto x : b) {
    s += d[x >> 4];
    s += d[x & 15];
  }
  return s;
}

std::string fnv1a(const Matrix& m) {
  std::uint64_t h = 1469598103934665603ULL;
  const auto* p = reinterpret_cast<const std::uint8_t*>(m.data());
  for (std::size_t i = 0; i < static_cast<std::size_t>(m.size()) * sizeof(float); ++i) {
    h ^= p[i];
    h *= 1099511628211ULL;
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

std::string fnv1a_bytes(const std::vector<std::uint8_t>& b, std::uint64_t h) {
  for (auto x : b) {
    h ^= x;
    h *= 1099511628211ULL;
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

// The first two chunks in full (codes and scales readable in review), and per field a hash over
// the bytes of every chunk, so any change anywhere is caught.
json chunks_json(const std::vector<Chunk>& chunks) {
  json out = {{"count", chunks.size()}, {"first_tokens", json::array()}, {"head", json::array()}};
  std::map<std::string, std::vector<std::uint8_t>> all;
  for (std::size_t i = 0; i < chunks.size(); ++i) {
    const Chunk& c = chunks[i];
    out["first_tokens"].push_back(c.first_token);
    json fields = json::object();
    for (const auto& f : c.fields) {
      if (i < 2) fields[f.name] = {{"dtype", f.dtype}, {"shape", f.shape}, {"hex", hex(f.bytes)}};
      auto& acc = all[f.name];
      acc.insert(acc.end(), f.bytes.begin(), f.bytes.end());
    }
    if (i < 2) out["head"].push_back(fields);
  }
  json hashes = json::object();
  for (const auto& [name, bytes] : all) hashes[name] = fnv1a_bytes(bytes, 1469598103934665603ULL);
  out["fnv1a_by_field"] = hashes;
  return out;
}

std::vector<std::uint16_t> to_bits(const Matrix& m) {
  std::vector<std::uint16_t> b(m.size());
  for (int i = 0; i < m.size(); ++i) b[i] = float_to_half_bits(m.data()[i]);
  return b;
}

Matrix from_bits(const std::vector<std::uint16_t>& b, int rows, int cols) {
  Matrix m(rows, cols);
  for (int i = 0; i < m.size(); ++i) m.data()[i] = half_bits_to_float(b[i]);
  return m;
}

std::string golden_name(const std::string& method) {
  std::string s = method;
  for (char& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') c = '_';
  return std::string(KVARN_TEST_DATA_DIR) + "/golden/" + s + ".json";
}

TEST(Golden, EveryPresetReproducesItsStoredBytes) {
  const bool update = std::getenv("KVARN_UPDATE_GOLDEN") != nullptr;
  const std::string input_path = std::string(KVARN_TEST_DATA_DIR) + "/golden/input.json";
  Matrix k, v;
  if (update) {
    k = testing::random_kv(kTokens, kHeadDim, 2024, true);
    v = testing::random_kv(kTokens, kHeadDim, 2025, false, 0.7f);
    std::filesystem::create_directories(std::filesystem::path(input_path).parent_path());
    std::ofstream(input_path) << json{{"tokens", kTokens}, {"head_dim", kHeadDim},
                                      {"k_fp16_bits", to_bits(k)}, {"v_fp16_bits", to_bits(v)}}
                                     .dump() << "\n";
  } else {
    std::ifstream is(input_path);
    ASSERT_TRUE(is.good()) << input_path << " missing (generate with KVARN_UPDATE_GOLDEN=1)";
    json in = json::parse(is);
    k = from_bits(in["k_fp16_bits"].get<std::vector<std::uint16_t>>(), kTokens, kHeadDim);
    v = from_bits(in["v_fp16_bits"].get<std::vector<std::uint16_t>>(), kTokens, kHeadDim);
  }
  int checked = 0;
  for (const auto& preset : Registry::instance().presets()) {
    auto m = make_method(preset.name);
    LayerContext layer{3, 8};
    SequenceResult r = quantize_sequence(*m, k, v, layer);
    json got = {{"method", preset.name},
                {"spec", m->spec()},
                {"layer", {layer.layer, layer.num_layers}},
                {"stored_bytes", r.stored_bytes},
                {"k_hat_fnv1a", fnv1a(r.k_hat)},
                {"v_hat_fnv1a", fnv1a(r.v_hat)},
                {"k_chunks", chunks_json(r.k_chunks)},
                {"v_chunks", chunks_json(r.v_chunks)}};
    const std::string path = golden_name(preset.name);
    if (update) {
      std::ofstream(path) << got.dump(1) << "\n";  // one key per line: reviewable diffs
      continue;
    }
    std::ifstream is(path);
    ASSERT_TRUE(is.good()) << path << " missing (generate with KVARN_UPDATE_GOLDEN=1)";
    json want = json::parse(is);
    EXPECT_EQ(got["spec"], want["spec"]) << preset.name;
    EXPECT_EQ(got["stored_bytes"], want["stored_bytes"]) << preset.name;
    EXPECT_EQ(got["k_chunks"], want["k_chunks"]) << preset.name << ": stored K bytes changed";
    EXPECT_EQ(got["v_chunks"], want["v_chunks"]) << preset.name << ": stored V bytes changed";
    EXPECT_EQ(got["k_hat_fnv1a"], want["k_hat_fnv1a"]) << preset.name << ": K reconstruction changed";
    EXPECT_EQ(got["v_hat_fnv1a"], want["v_hat_fnv1a"]) << preset.name << ": V reconstruction changed";
    ++checked;
  }
  if (!update) {
    EXPECT_GE(checked, 4);
  }
}

}  // namespace
}  // namespace kvarn
