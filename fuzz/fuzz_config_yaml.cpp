// The sweep config loader (YAML -> SweepConfig) on arbitrary bytes.
#include "fuzz_util.hpp"
#include "kvarn/sweeps/config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = kvarn::fuzz::write_scratch("config.yaml", data, size);
  kvarn::fuzz::expect_clean([&] { kvarn::load_config(path); });
  return 0;
}
