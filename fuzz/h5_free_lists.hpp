// libhdf5 keeps freed blocks on free lists for reuse, by default at most 64 KiB per list of
// fixed-size blocks. The metadata cache of each file it opens is one such block of over 64 KiB:
// it went back to malloc at every close and came back as fresh pages, zeroed, at the next open
// (under ASan, a fifth of the CPU time per input of fuzz_tile_reader). The fuzz targets that open
// an HDF5 file per input raise that list's limit; the other lists keep libhdf5's defaults.
#ifndef KVARN_FUZZ_H5_FREE_LISTS_HPP_
#define KVARN_FUZZ_H5_FREE_LISTS_HPP_

#include <H5public.h>

namespace kvarn::fuzz {

// Once per process; before the first file is opened (and before a probe child is forked).
inline void keep_h5_metadata_caches() {
  static const bool done =
      (H5set_free_list_limits(16 << 20, 8 << 20, 4 << 20, 256 << 10, 16 << 20, 1 << 20), true);
  (void)done;
}

}  // namespace kvarn::fuzz

#endif  // KVARN_FUZZ_H5_FREE_LISTS_HPP_
