// The quantized-tile file: writer -> reader round trip, atomic writes, refused overwrites and
// clear errors on files that are not in the format.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "kvarn/data/error.hpp"
#include "kvarn/data/h5_io.hpp"
#include "kvarn/data/quantized_file.hpp"
#include "temp_dir_test.hpp"

namespace kvarn {
namespace {

namespace fs = std::filesystem;

class QuantizedFileTest : public kvarn::testing::TempDirTest {};

QuantizedFileInfo info(bool reconstruction) {
  QuantizedFileInfo i;
  i.method = "m";
  i.method_spec = "m:x=1";
  i.source_file = "tiles.h5";
  i.model = "model";
  i.num_layers = 4;
  i.head_dim = 8;
  i.reconstruction = reconstruction;
  return i;
}

// T = 5 tokens: a sink of 1, two chunks of 2 tokens (K), one (V), distinct bytes everywhere.
QuantizedSlab slab(int seed) {
  QuantizedSlab s;
  s.num_tokens = 5;
  s.stored_bytes = 100 + seed;
  s.accounted_bytes = 100 + seed;
  s.fp16_bytes = 4 * 5 * 8;
  s.k_nmse = 0.25 + seed;
  s.v_nmse = 1.0 / 3.0;
  s.k_quantized = {0, 1, 1, 1, 1};
  s.v_quantized = {0, 1, 1, 0, 0};
  for (int i = 0; i < 40; ++i) {
    s.k_hat.push_back(0.5f * i + seed);
    s.v_hat.push_back(-0.25f * i);
  }
  s.k.chunk_tokens = s.v.chunk_tokens = 2;
  s.k.sink = s.v.sink = 1;
  s.k.chunk_bytes = 11;
  s.k.kept_tokens = 1;
  s.k.kept_token_bytes = 16;
  s.k.code_bits = 4;
  s.k.first_token = {1, 3};
  s.k.fields.push_back({"k_codes", "u8", {3}, {1, 2, 3, 4, 5, static_cast<std::uint8_t>(seed)}});
  s.k.fields.push_back({"k_scale", "f16", {1}, {0x00, 0x3c, 0x00, 0xc0}});
  s.v.first_token = {1};
  s.v.fields.push_back({"v_f32", "f32", {1}, {0, 0, 0x80, 0x3f}});
  return s;
}

void expect_equal(const QuantizedStream& a, const QuantizedStream& b) {
  EXPECT_EQ(a.chunk_tokens, b.chunk_tokens);
  EXPECT_EQ(a.sink, b.sink);
  EXPECT_EQ(a.chunk_bytes, b.chunk_bytes);
  EXPECT_EQ(a.kept_tokens, b.kept_tokens);
  EXPECT_EQ(a.code_bits, b.code_bits);
  EXPECT_EQ(a.first_token, b.first_token);
  ASSERT_EQ(a.fields.size(), b.fields.size());
  for (std::size_t i = 0; i < a.fields.size(); ++i) {
    EXPECT_EQ(a.fields[i].name, b.fields[i].name);
    EXPECT_EQ(a.fields[i].dtype, b.fields[i].dtype);
    EXPECT_EQ(a.fields[i].shape, b.fields[i].shape);
    EXPECT_EQ(a.fields[i].bytes, b.fields[i].bytes);
  }
}

TEST_F(QuantizedFileTest, RoundTrip) {
  const fs::path p = dir_ / "q.h5";
  {
    QuantizedFileWriter w(p, info(true));
    w.add_slab({"000000", 5, "a", 2, 0, 0}, slab(0));
    w.add_slab({"000000", 5, "a", 2, 0, 1}, slab(1));
    w.add_slab({"000000", 5, "a", 3, 1, 0}, slab(2));
    w.add_slab({"000001", 5, "b", 2, 0, 0}, slab(3));
    EXPECT_FALSE(fs::exists(p));  // only the temporary exists until finish()
    w.finish();
  }
  QuantizedFileReader r(p);
  EXPECT_EQ(r.info().method_spec, "m:x=1");
  EXPECT_TRUE(r.info().reconstruction);
  ASSERT_EQ(r.slabs().size(), 4u);
  const int seeds[] = {0, 1, 2, 3};
  for (std::size_t i = 0; i < 4; ++i) {
    const SlabKey& key = r.slabs()[i];
    const QuantizedSlab want = slab(seeds[i]);
    const QuantizedSlab got = r.read(key);
    EXPECT_EQ(got.stored_bytes, want.stored_bytes) << i;
    EXPECT_EQ(got.k_nmse, want.k_nmse);
    EXPECT_EQ(got.v_nmse, want.v_nmse);
    EXPECT_EQ(got.k_quantized, want.k_quantized);
    EXPECT_EQ(got.v_hat, want.v_hat);
    EXPECT_EQ(got.k_hat, want.k_hat);
    expect_equal(got.k, want.k);
    expect_equal(got.v, want.v);
  }
  EXPECT_EQ(r.slabs()[2].model_layer, 3);
  EXPECT_EQ(r.slabs()[3].prompt_id, "b");
}

TEST_F(QuantizedFileTest, WithoutReconstructionThereIsNone) {
  const fs::path p = dir_ / "q.h5";
  QuantizedFileWriter w(p, info(false));
  w.add_slab({"000000", 5, "a", 0, 0, 0}, slab(0));
  w.finish();
  QuantizedFileReader r(p);
  EXPECT_FALSE(r.info().reconstruction);
  EXPECT_TRUE(r.read(r.slabs().at(0)).k_hat.empty());
  H5::H5File f(p.string(), H5F_ACC_RDONLY);
  EXPECT_FALSE(f.nameExists("/sequences/000000/layer_00/head_00/k_hat"));
  EXPECT_TRUE(f.nameExists("/sequences/000000/layer_00/head_00/k/k_codes"));
}

TEST_F(QuantizedFileTest, UnfinishedWriteLeavesNothingAndOverwriteIsRefused) {
  const fs::path p = dir_ / "q.h5";
  {
    QuantizedFileWriter w(p, info(false));
    w.add_slab({"000000", 5, "a", 0, 0, 0}, slab(0));
  }
  EXPECT_FALSE(fs::exists(p));
  EXPECT_TRUE(fs::is_empty(dir_));
  {
    QuantizedFileWriter w(p, info(false));
    w.finish();
  }
  EXPECT_THROW(QuantizedFileWriter(p, info(false)), Error);
  QuantizedFileWriter again(p, info(false), true);
  again.finish();
}

TEST_F(QuantizedFileTest, BadSlabsAndFilesAreErrors) {
  const fs::path p = dir_ / "q.h5";
  QuantizedFileWriter w(p, info(true));
  QuantizedSlab bad = slab(0);
  bad.k.fields[0].bytes.pop_back();  // 5 bytes for shape [2 chunks, 3]
  try {
    w.add_slab({"000000", 5, "a", 0, 0, 0}, bad);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("k_codes"), std::string::npos) << e.what();
  }
  bad = slab(0);
  bad.k_hat.pop_back();
  EXPECT_THROW(w.add_slab({"000000", 5, "a", 0, 0, 1}, bad), Error);

  EXPECT_THROW(QuantizedFileReader(dir_ / "missing.h5"), Error);
  const fs::path other = dir_ / "other.h5";
  {
    H5::H5File f(other.string(), H5F_ACC_TRUNC);
    h5::write_string_attr(f, "format", "kvarn-tiles");
  }
  try {
    QuantizedFileReader r(other);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("kvarn-tiles"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kvarn
