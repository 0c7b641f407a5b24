// The golden-file cases shared by the check (tests/core/test_golden.cpp) and the updater
// (tests/tools/update_golden.cpp): fixed fp16 inputs, every preset of the registry, the exact
// stored bytes of the first chunks (hex), per-field hashes over every chunk and a hash of the
// reconstruction.
#ifndef KVARN_TESTS_CORE_GOLDEN_CASES_HPP_
#define KVARN_TESTS_CORE_GOLDEN_CASES_HPP_

#include <cctype>
#include <cstdint>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kvarn/core/registry.hpp"
#include "test_util.hpp"

namespace kvarn::golden {

using nlohmann::json;
inline constexpr int kTokens = 300, kHeadDim = 64;

inline std::string hex(const std::vector<std::uint8_t>& b) {
  static const char* d = "0123456789abcdef";
  std::string s;
  s.reserve(b.size() * 2);
  for (auto x : b) {
    s += d[x >> 4];
    s += d[x & 15];
  }
  return s;
}

inline std::string fnv1a(const Matrix& m) {
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

inline std::string fnv1a_bytes(const std::vector<std::uint8_t>& b, std::uint64_t h) {
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
inline json chunks_json(const std::vector<Chunk>& chunks) {
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

inline std::vector<std::uint16_t> to_bits(const Matrix& m) {
  std::vector<std::uint16_t> b(m.size());
  for (int i = 0; i < m.size(); ++i) b[i] = float_to_half_bits(m.data()[i]);
  return b;
}

inline Matrix from_bits(const std::vector<std::uint16_t>& b, int rows, int cols) {
  Matrix m(rows, cols);
  for (int i = 0; i < m.size(); ++i) m.data()[i] = half_bits_to_float(b[i]);
  return m;
}

inline std::string golden_name(const std::string& method) {
  std::string s = method;
  for (char& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') c = '_';
  return std::string(KVARN_TEST_DATA_DIR) + "/golden/" + s + ".json";
}

// The inputs the goldens were made from (deterministic; the updater writes them to input.json).
inline void make_inputs(Matrix* k, Matrix* v) {
  *k = testing::random_kv(kTokens, kHeadDim, 2024, true);
  *v = testing::random_kv(kTokens, kHeadDim, 2025, false, 0.7f);
}

inline std::string input_path() { return std::string(KVARN_TEST_DATA_DIR) + "/golden/input.json"; }

inline json inputs_json(const Matrix& k, const Matrix& v) {
  return json{{"tokens", kTokens},
              {"head_dim", kHeadDim},
              {"k_fp16_bits", to_bits(k)},
              {"v_fp16_bits", to_bits(v)}};
}

// What one preset stores for (k, v): the content of tests/golden/<preset>.json.
inline json preset_json(const std::string& preset, const Matrix& k, const Matrix& v) {
  auto m = make_method(preset);
  LayerContext layer{3, 8};
  SequenceResult r = quantize_sequence(*m, k, v, layer);
  return {{"method", preset},
          {"spec", m->spec()},
          {"layer", {layer.layer, layer.num_layers}},
          {"stored_bytes", r.stored_bytes},
          {"k_hat_fnv1a", fnv1a(r.k_hat)},
          {"v_hat_fnv1a", fnv1a(r.v_hat)},
          {"k_chunks", chunks_json(r.k_chunks)},
          {"v_chunks", chunks_json(r.v_chunks)}};
}

}  // namespace kvarn::golden

#endif  // KVARN_TESTS_CORE_GOLDEN_CASES_HPP_
