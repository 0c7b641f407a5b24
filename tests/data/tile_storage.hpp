// Rewrites slab datasets of a tile file with another HDF5 storage layout (contiguous, other chunk
// shapes, other filters), same values and attributes: the reader must decode any layout to the
// same floats.
#ifndef KVARN_TESTS_DATA_TILE_STORAGE_HPP_
#define KVARN_TESTS_DATA_TILE_STORAGE_HPP_

#include <H5Cpp.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "kvarn/data/h5_io.hpp"

namespace kvarn::testing {

// Replaces dataset `obj` (an fp16 slab dataset) of `file` by a copy created with the property
// list `set_storage` fills in (chunk shapes clamped to the dataset's shape); keeps its integer
// attributes (post_rope, heads).
inline void restore_slab_dataset(const std::filesystem::path& file, const std::string& obj,
                                 const std::function<void(H5::DSetCreatPropList&)>& set_storage) {
  H5::H5File f(file.string(), H5F_ACC_RDWR);
  H5::DataSet ds = f.openDataSet(obj);
  H5::DataSpace space = ds.getSpace();
  std::vector<std::uint16_t> halfs(space.getSimpleExtentNpoints());
  ds.read(halfs.data(), h5::f16_type());
  std::vector<std::pair<std::string, std::vector<int>>> attrs;
  for (int i = 0; i < ds.getNumAttrs(); ++i) {
    H5::Attribute a = ds.openAttribute(static_cast<unsigned>(i));
    std::vector<int> v(a.getSpace().getSimpleExtentNpoints());
    a.read(H5::PredType::NATIVE_INT, v.data());
    attrs.emplace_back(a.getName(), v);
  }
  ds.close();
  f.unlink(obj);
  H5::DSetCreatPropList plist;
  set_storage(plist);
  if (plist.getLayout() == H5D_CHUNKED) {  // chunks may not exceed a fixed-size dataset's shape
    hsize_t dims[4], chunk[4];
    space.getSimpleExtentDims(dims);
    plist.getChunk(4, chunk);
    for (int i = 0; i < 4; ++i) chunk[i] = std::min(chunk[i], dims[i]);
    unsigned opts = 0;
    H5Pget_chunk_opts(plist.getId(), &opts);
    plist.setChunk(4, chunk);
    H5Pset_chunk_opts(plist.getId(), opts);
  }
  H5::DataSet out = f.createDataSet(obj, h5::f16_type(), space, plist);
  out.write(halfs.data(), h5::f16_type());
  for (const auto& [name, v] : attrs) {
    const hsize_t n = v.size();
    H5::DataSpace as = n == 1 ? H5::DataSpace(H5S_SCALAR) : H5::DataSpace(1, &n);
    out.createAttribute(name, H5::PredType::STD_I64LE, as)
        .write(H5::PredType::NATIVE_INT, v.data());
  }
}

// Every slab dataset (k, v, k_pre_rope, q) of every sequence.
inline void restore_all_slabs(const std::filesystem::path& file,
                              const std::function<void(H5::DSetCreatPropList&)>& set_storage) {
  std::vector<std::string> objs;
  {
    H5::H5File f(file.string(), H5F_ACC_RDONLY);
    H5::Group seqs = f.openGroup("sequences");
    for (hsize_t i = 0; i < seqs.getNumObjs(); ++i) {
      const std::string g = "/sequences/" + seqs.getObjnameByIdx(i);
      for (const char* name : {"k", "v", "k_pre_rope", "q"}) {
        if (f.nameExists(g + "/" + name)) objs.push_back(g + "/" + name);
      }
    }
  }
  for (const std::string& obj : objs) restore_slab_dataset(file, obj, set_storage);
}

}  // namespace kvarn::testing

#endif  // KVARN_TESTS_DATA_TILE_STORAGE_HPP_
