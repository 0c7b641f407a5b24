// The sweep config loader (YAML -> SweepConfig) on arbitrary bytes. The seeds name the small
// tile file written next to the config (small_tiles.hpp) or the repository's data/tiles/.
#include "fuzz_util.hpp"
#include "kvarn/sweeps/config.hpp"
#include "small_tiles.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  kvarn::fuzz::small_tiles();
  const auto path = kvarn::fuzz::write_scratch("config.yaml", data, size);
  kvarn::fuzz::expect_clean([&] { kvarn::load_config(path); });
  return 0;
}
