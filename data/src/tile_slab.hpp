// The direct chunk path of the tile reader (tile_slab.cpp): reading a slab's stored chunks
// without HDF5's filter pipeline, for decode_slab to inflate on any thread.
#ifndef KVARN_DATA_SRC_TILE_SLAB_HPP_
#define KVARN_DATA_SRC_TILE_SLAB_HPP_

#include <H5Cpp.h>

#include <cstdint>

#include "kvarn/data/tile_file.hpp"

namespace kvarn {

// Reads the stored chunks of slab [slab->layer_index, slab->head] of `ds` (a [L, H, T, D] fp16
// dataset whose shape the reader checked) into `slab` and returns true, when its storage is one
// decode_slab handles: chunks of [1, 1, c, D] with only shuffle (2-byte elements) and deflate
// filters, partial edge chunks filtered like the others. Returns false, reading nothing, for any
// other storage. Throws H5::Exception when HDF5 cannot read a chunk, kvarn::Error when the
// chunk index is inconsistent with the file.
bool read_direct_chunks(const H5::DataSet& ds, std::uintmax_t file_size, StoredSlab* slab);

}  // namespace kvarn

#endif  // KVARN_DATA_SRC_TILE_SLAB_HPP_
