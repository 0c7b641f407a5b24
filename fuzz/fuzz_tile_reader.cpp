// The kvarn-tiles v1 HDF5 reader: structure checks on open, then every slab and token id read
// (each value checked finite).
#include "fuzz_util.hpp"
#include "kvarn/data/tile_file.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = kvarn::fuzz::write_scratch("tiles.h5", data, size);
  kvarn::fuzz::expect_clean([&] {
    const kvarn::TileReader reader(path);
    reader.validate_values();
  });
  return 0;
}
