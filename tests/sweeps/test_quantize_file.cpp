// quantize_tile_file (the `kvarn-eval quantize` path): the datasets it writes
// equal, byte for byte, the committed fingerprints of an earlier version's
// output (tests/sweeps/data/ quantized_reference.json, made by
// make_quantized_reference.py), and the file does not depend on the thread
// count.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "data/tile_storage.hpp"
#include "kvarn/data/error.hpp"
#include "kvarn/data/h5_io.hpp"
#include "kvarn/data/quantized_file.hpp"
#include "kvarn/data/tile_file.hpp"
#include "kvarn/sweeps/provenance.hpp"
#include "kvarn/sweeps/quantize.hpp"
#include "temp_dir_test.hpp"

namespace kvarn {
namespace {

namespace fs = std::filesystem;

struct Fingerprint {
  std::map<std::string, nlohmann::json> datasets;    // path -> {dtype, shape, sha256}
  std::map<std::string, nlohmann::json> attributes;  // group path -> {name: number}
};

// numpy's dtype.str of a little-endian HDF5 integer or float type.
std::string numpy_dtype(const H5::DataType& t) {
  const std::size_t n = t.getSize();
  const std::string order = n == 1 ? "|" : "<";
  if (t.getClass() == H5T_FLOAT) return order + "f" + std::to_string(n);
  const H5::IntType it = H5::IntType(H5Tcopy(t.getId()));
  return order + (it.getSign() == H5T_SGN_NONE ? "u" : "i") + std::to_string(n);
}

nlohmann::json dataset_fingerprint(const H5::DataSet& ds) {
  H5::DataType t = ds.getDataType();
  H5::DataSpace space = ds.getSpace();
  std::vector<hsize_t> dims(space.getSimpleExtentNdims());
  if (!dims.empty()) space.getSimpleExtentDims(dims.data());
  std::string bytes(static_cast<std::size_t>(space.getSimpleExtentNpoints()) * t.getSize(), '\0');
  if (!bytes.empty()) ds.read(bytes.data(), t);  // file type == memory type: raw LE bytes
  return {{"dtype", numpy_dtype(t)}, {"shape", dims}, {"sha256", sha256_hex(bytes)}};
}

void visit(const H5::Group& g, const std::string& path, Fingerprint* fp) {
  nlohmann::json attrs = nlohmann::json::object();
  for (int i = 0; i < g.getNumAttrs(); ++i) {
    H5::Attribute a = g.openAttribute(static_cast<unsigned>(i));
    const H5T_class_t c = a.getDataType().getClass();
    if (c == H5T_INTEGER) {
      long long v = 0;
      a.read(H5::PredType::NATIVE_LLONG, &v);
      attrs[a.getName()] = v;
    } else if (c == H5T_FLOAT) {
      double v = 0;
      a.read(H5::PredType::NATIVE_DOUBLE, &v);
      attrs[a.getName()] = v;
    }
  }
  if (!attrs.empty()) fp->attributes[path] = attrs;
  for (hsize_t i = 0; i < g.getNumObjs(); ++i) {
    const std::string name = g.getObjnameByIdx(i);
    const std::string child = path + "/" + name;
    if (g.childObjType(name) == H5O_TYPE_GROUP) {
      visit(g.openGroup(name), child, fp);
    } else {
      fp->datasets[child] = dataset_fingerprint(g.openDataSet(name));
    }
  }
}

Fingerprint fingerprint(const fs::path& file) {
  h5::silence_errors();
  H5::H5File f(file.string(), H5F_ACC_RDONLY);
  Fingerprint fp;
  visit(f.openGroup("sequences"), "sequences", &fp);
  return fp;
}

Fingerprint from_reference(const nlohmann::json& entry) {
  Fingerprint fp;
  for (const auto& [k, v] : entry.at("datasets").items()) fp.datasets[k] = v;
  for (const auto& [k, v] : entry.at("attributes").items()) fp.attributes[k] = v;
  return fp;
}

void expect_same(const Fingerprint& want, const Fingerprint& got, const std::string& what) {
  for (const auto& [path, f] : want.datasets) {
    auto it = got.datasets.find(path);
    if (it == got.datasets.end()) {
      ADD_FAILURE() << what << ": missing dataset " << path;
      continue;
    }
    EXPECT_EQ(it->second, f) << what << ": dataset " << path;
  }
  for (const auto& [path, f] : got.datasets) {
    EXPECT_TRUE(want.datasets.count(path)) << what << ": unexpected dataset " << path;
  }
  EXPECT_EQ(got.attributes.size(), want.attributes.size()) << what;
  for (const auto& [path, a] : want.attributes) {
    auto it = got.attributes.find(path);
    ASSERT_NE(it, got.attributes.end()) << what << ": missing group " << path;
    EXPECT_EQ(it->second, a) << what << ": attributes of " << path;
  }
}

nlohmann::json reference() {
  std::ifstream in(fs::path(KVARN_TEST_DATA_DIR) / "sweeps/data/quantized_reference.json");
  return nlohmann::json::parse(in);
}

class QuantizeFileTest : public kvarn::testing::TempDirTest {
 protected:
  fs::path run(const std::string& spec, const fs::path& tiles, bool reconstruction, int threads,
               const std::string& name) {
    QuantizeFileOptions o;
    o.method = spec;
    o.in = tiles;
    o.out = dir_ / name;
    o.reconstruction = reconstruction;
    o.threads = threads;
    quantize_tile_file(o);
    return o.out;
  }
};

fs::path source_path(const std::string& rel) { return fs::path(KVARN_SOURCE_DIR) / rel; }

TEST_F(QuantizeFileTest, DatasetsEqualTheCommittedReference) {
  const nlohmann::json ref = reference();
  const fs::path tiles = source_path(ref.at("produced_by").at("tiles").get<std::string>());
  ASSERT_GE(ref.at("entries").size(), 6u);
  int i = 0;
  for (const nlohmann::json& e : ref.at("entries")) {
    // `test_spec` reproduces the bytes the reference's `spec` produced at the
    // reference commit.
    const std::string spec = e.value("test_spec", e.at("spec").get<std::string>());
    SCOPED_TRACE(spec);
    const Fingerprint want = from_reference(e);
    ASSERT_GT(want.datasets.size(), 0u);
    const fs::path full = run(spec, tiles, true, 2, "full" + std::to_string(i) + ".h5");
    expect_same(want, fingerprint(full), spec + " --reconstruction");
    // Default: everything but the fp32 reconstructions.
    Fingerprint want_default = want;
    for (auto it = want_default.datasets.begin(); it != want_default.datasets.end();) {
      const bool hat =
          it->first.size() > 6 && (it->first.compare(it->first.size() - 6, 6, "/k_hat") == 0 ||
                                   it->first.compare(it->first.size() - 6, 6, "/v_hat") == 0);
      it = hat ? want_default.datasets.erase(it) : std::next(it);
    }
    EXPECT_LT(want_default.datasets.size(), want.datasets.size());
    const fs::path def = run(spec, tiles, false, 2, "default" + std::to_string(i) + ".h5");
    expect_same(want_default, fingerprint(def), spec);
    ++i;
  }
}

TEST_F(QuantizeFileTest, OutputDoesNotDependOnThreadCount) {
  const fs::path tiles = source_path("data/tiles/fixture_heldout.h5");
  for (const char* spec : {"kvarn_k4v2_g128", "kivi_2bit"}) {
    SCOPED_TRACE(spec);
    const fs::path one = run(spec, tiles, true, 1, std::string(spec) + "_1.h5");
    const fs::path two = run(spec, tiles, true, 2, std::string(spec) + "_2.h5");
    const fs::path three = run(spec, tiles, true, 3, std::string(spec) + "_3.h5");
    const Fingerprint a = fingerprint(one);
    ASSERT_GT(a.datasets.size(), 16u);
    expect_same(a, fingerprint(two), "2 threads vs 1");
    expect_same(a, fingerprint(three), "3 threads vs 1");
  }
}

TEST_F(QuantizeFileTest, OutputDoesNotDependOnTheInputStorage) {
  // The same tiles stored contiguously are read through HDF5, not the direct chunk path.
  const fs::path tiles = source_path("data/tiles/sample.h5");
  const fs::path contiguous = dir_ / "contiguous.h5";
  fs::copy_file(tiles, contiguous);
  testing::restore_all_slabs(contiguous, [](H5::DSetCreatPropList&) {});
  ASSERT_EQ(TileReader(contiguous).read_stored(0, "k", 0, 0).chunk_tokens, 0);
  const Fingerprint a = fingerprint(run("kvarn_k4v2_g64", tiles, true, 2, "chunked.h5"));
  ASSERT_GT(a.datasets.size(), 16u);
  expect_same(a, fingerprint(run("kvarn_k4v2_g64", contiguous, true, 2, "contiguous_2.h5")),
              "contiguous input");
  expect_same(a, fingerprint(run("kvarn_k4v2_g64", contiguous, true, 1, "contiguous_1.h5")),
              "contiguous input, 1 thread");
}

TEST_F(QuantizeFileTest, ReaderReturnsWhatWasWritten) {
  const fs::path tiles = source_path("data/tiles/sample.h5");
  const fs::path out = run("kvarn_k4v2_g64", tiles, true, 2, "q.h5");
  QuantizedFileReader r(out);
  EXPECT_EQ(r.info().method, "kvarn_k4v2_g64");
  EXPECT_TRUE(r.info().reconstruction);
  EXPECT_EQ(r.info().head_dim, 128);
  ASSERT_EQ(r.slabs().size(), 2u * 2u * 2u);
  for (const SlabKey& key : r.slabs()) {
    const QuantizedSlab s = r.read(key);
    EXPECT_EQ(s.num_tokens, key.num_tokens);
    EXPECT_EQ(s.stored_bytes, s.accounted_bytes);
    EXPECT_EQ(static_cast<long long>(s.k.payload_bytes() + s.v.payload_bytes() +
                                     s.k.kept_tokens * s.k.kept_token_bytes +
                                     s.v.kept_tokens * s.v.kept_token_bytes),
              s.stored_bytes);
    EXPECT_EQ(s.k_hat.size(), static_cast<std::size_t>(key.num_tokens) * 128);
    // sink 64, then tiles of 64: T = 300 -> 3 tiles, T = 200 -> 2 tiles.
    EXPECT_EQ(s.k.num_chunks(), (key.num_tokens - 64) / 64);
    EXPECT_GT(s.k_nmse, 0.0);
    EXPECT_LT(s.k_nmse, 0.1);
  }
}

// Writes one fp16 value into the stored tiles of `dataset` at [layer, head, token, channel].
void put_half(const fs::path& p, const std::string& dataset, hsize_t layer, hsize_t head,
              hsize_t token, hsize_t channel, std::uint16_t half) {
  H5::H5File f(p.string(), H5F_ACC_RDWR);
  H5::DataSet ds = f.openDataSet(dataset);
  H5::DataSpace space = ds.getSpace();
  const hsize_t start[4] = {layer, head, token, channel}, count[4] = {1, 1, 1, 1}, one = 1;
  space.selectHyperslab(H5S_SELECT_SET, count, start);
  ds.write(&half, h5::f16_type(), H5::DataSpace(1, &one), space);
}

TEST_F(QuantizeFileTest, TheFirstBadSlabInFileOrderIsReportedWhateverTheThreadCount) {
  // sample.h5 holds 2 sequences x 2 layers x 2 heads; slabs are taken in that order. Slab 3
  // (sequence 0, layer 1, head 1) holds a NaN, slabs 4 and 7 an Inf: with several threads the
  // later slabs can fail first, and slab 3's error must still be the one reported.
  const fs::path tiles = dir_ / "bad.h5";
  fs::copy_file(source_path("data/tiles/sample.h5"), tiles);
  put_half(tiles, "/sequences/000000/k", 1, 1, 250, 7, 0x7e00);  // NaN
  put_half(tiles, "/sequences/000001/k", 0, 0, 3, 2, 0x7c00);    // Inf
  put_half(tiles, "/sequences/000001/v", 1, 1, 0, 0, 0x7c00);    // Inf
  for (int threads : {1, 2, 3, 8}) {
    SCOPED_TRACE(threads);
    const std::string name = std::to_string(threads) + "_threads.h5";
    try {
      run("kvarn_k4v2_g64", tiles, false, threads, name);
      FAIL() << "no error";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("/sequences/000000/k: non-finite value (nan) at [layer 1, head 1, "
                         "token 250, channel 7]"),
                std::string::npos)
          << msg;
    }
    for (const auto& entry : fs::directory_iterator(dir_))  // no output, no temporary file
      EXPECT_EQ(entry.path(), tiles);
  }
}

// A tile file of one sequence with `layers` x `heads` slabs of `tokens` x 64 smooth values.
fs::path many_slab_tiles(const fs::path& p, int layers, int heads, int tokens) {
  constexpr int kDim = 64;
  TileFileInfo info;
  info.model = "synthetic";
  info.num_layers = layers;
  info.num_kv_heads = heads;
  info.num_q_heads = heads;
  info.head_dim = kDim;
  info.source = "synthetic (test_quantize_file.cpp)";
  for (int l = 0; l < layers; ++l) info.layers.push_back(l);
  SequenceData seq;
  seq.prompt_id = "synthetic";
  seq.token_ids.assign(tokens, 1);
  const std::size_t n = static_cast<std::size_t>(layers) * heads * tokens * kDim;
  seq.k.resize(n);
  seq.v.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    seq.k[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i % 100003)) * 3.0);
    seq.v[i] = static_cast<float>(std::cos(0.11 * static_cast<double>(i % 99991)));
  }
  TileWriter w(p, info, true);
  w.add_sequence(seq);
  w.finish();
  return p;
}

TEST_F(QuantizeFileTest, ManySlabsAreWrittenInOrderInBatchesWhateverTheThreadCount) {
  // 6 layers x 8 heads = 48 slabs: several full HDF5 turns of reads and writes and a last,
  // partial one.
  const fs::path tiles = many_slab_tiles(dir_ / "many.h5", 6, 8, 200);
  const fs::path one = run("kvarn_k4v2_g64", tiles, true, 1, "many_1.h5");
  const Fingerprint a = fingerprint(one);
  ASSERT_EQ(a.datasets.size(), 48u * 14u);  // 12 as without reconstruction, k_hat and v_hat
  for (int threads : {2, 3, 8}) {
    SCOPED_TRACE(threads);
    const std::string name = "many_" + std::to_string(threads) + ".h5";
    expect_same(a, fingerprint(run("kvarn_k4v2_g64", tiles, true, threads, name)), name);
  }
  QuantizedFileReader r(one);
  ASSERT_EQ(r.slabs().size(), 48u);
  for (std::size_t i = 0; i < r.slabs().size(); ++i) {
    EXPECT_EQ(r.slabs()[i].model_layer, static_cast<int>(i) / 8);
    EXPECT_EQ(r.slabs()[i].head, static_cast<int>(i) % 8);
  }
}

TEST_F(QuantizeFileTest, ABadSlabAfterWholeBatchesIsReportedAndNothingIsLeft) {
  // Slab 41 (layer 5, head 1) holds a NaN: the slabs before it are quantized and written in
  // full batches first, and the error is still that slab's, with no file left behind.
  const fs::path tiles = many_slab_tiles(dir_ / "bad_many.h5", 6, 8, 200);
  put_half(tiles, "/sequences/000000/k", 5, 1, 0, 5, 0x7e00);  // NaN
  for (int threads : {1, 2, 3}) {
    SCOPED_TRACE(threads);
    try {
      run("kvarn_k4v2_g64", tiles, false, threads, "bad_many_out.h5");
      FAIL() << "no error";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("non-finite value (nan) at [layer 5, head 1, token 0, channel 5]"),
                std::string::npos)
          << msg;
    }
    for (const auto& entry : fs::directory_iterator(dir_)) EXPECT_EQ(entry.path(), tiles);
  }
}

}  // namespace
}  // namespace kvarn
