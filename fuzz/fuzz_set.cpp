// `--set key.path=value` overrides (one per input line) applied to a small valid config on the
// small tile file (small_tiles.hpp).
#include <sstream>
#include <vector>

#include "fuzz_util.hpp"
#include "kvarn/sweeps/config.hpp"
#include "small_tiles.hpp"

namespace {
const char kBase[] =
    "version: 1\nname: fuzz\ndata:\n  tiles: small_tiles.h5\n  sequences: [0]\n"
    "  layers: [0]\n  kv_heads: [0]\n  max_tokens: 64\nmethods:\n  - fp16\n  - kivi_2bit\n"
    "metrics:\n  outlier_fractions: [1]\noutput: runs\nreport: false\n";
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const auto base = [] {
    kvarn::fuzz::small_tiles();
    const std::string text = kBase;
    return kvarn::fuzz::write_scratch(
        "base.yaml", reinterpret_cast<const std::uint8_t*>(text.data()), text.size());
  }();
  std::vector<std::string> sets;
  std::stringstream ss(kvarn::fuzz::as_string(data, size));
  for (std::string line; std::getline(ss, line) && sets.size() < 16;) sets.push_back(line);
  kvarn::fuzz::expect_clean([&] { kvarn::load_config(base, sets); });
  return 0;
}
