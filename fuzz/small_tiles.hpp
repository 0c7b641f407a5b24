// A small valid tile file in the fuzz scratch directory, for the config targets: the configs they
// mutate name it (`tiles: small_tiles.h5`, found next to the config), so loading a config checks
// it against a file of a few kilobytes instead of the 1.6 MB sample (which every input would
// otherwise open and hash). Shape as a real capture: 2 captured layers, 2 KV heads, 4 query
// heads, head_dim 128, 2 sequences of 8 tokens, queries in the first.
#ifndef KVARN_FUZZ_SMALL_TILES_HPP_
#define KVARN_FUZZ_SMALL_TILES_HPP_

#include <cstdint>
#include <filesystem>
#include <vector>

#include "fuzz_util.hpp"
#include "kvarn/data/tile_file.hpp"

namespace kvarn::fuzz {

// Writes scratch_dir()/small_tiles.h5 once per process; returns its path.
inline const std::filesystem::path& small_tiles() {
  static const std::filesystem::path path = [] {
    const std::filesystem::path p = scratch_dir() / "small_tiles.h5";
    TileFileInfo info;
    info.model = "fuzz";
    info.num_layers = 2;
    info.num_kv_heads = 2;
    info.num_q_heads = 4;
    info.head_dim = 128;
    info.source = "fuzz/small_tiles.hpp";
    info.layers = {0, 1};
    TileWriter w(p, info, /*overwrite=*/true);
    std::uint32_t state = 12345;
    const auto next = [&] {  // deterministic values in [-2, 2)
      state = state * 1664525u + 1013904223u;
      return static_cast<float>(state >> 8) / static_cast<float>(1u << 24) * 4.0f - 2.0f;
    };
    constexpr int kTokens = 8;
    for (int s = 0; s < 2; ++s) {
      SequenceData seq;
      seq.prompt_id = "fuzz-" + std::to_string(s);
      for (int t = 0; t < kTokens; ++t) seq.token_ids.push_back(t + 1);
      for (auto* v : {&seq.k, &seq.v}) {
        v->resize(2 * 2 * kTokens * 128);
        for (float& x : *v) x = next();
      }
      if (s == 0) {  // queries in the first sequence only: both kinds of file content
        seq.q.resize(2 * 4 * kTokens * 128);
        for (float& x : seq.q) x = next();
        seq.q_heads = {0, 1, 2, 3};
      }
      w.add_sequence(seq);
    }
    w.finish();
    return p;
  }();
  return path;
}

}  // namespace kvarn::fuzz

#endif  // KVARN_FUZZ_SMALL_TILES_HPP_
