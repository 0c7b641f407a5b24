// The tile reader's direct chunk path (data/src/tile_slab.cpp): slabs read as stored and decoded
// off HDF5 equal, bit for bit, what HDF5's own read gives, on random and real tiles, for every
// storage layout (others fall back to HDF5's read), with per-chunk skipped filters, on any
// thread; damaged chunks and non-finite values are located errors.
#include <H5Cpp.h>
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "data/tile_storage.hpp"
#include "kvarn/data/error.hpp"
#include "kvarn/data/h5_io.hpp"
#include "kvarn/data/tile_file.hpp"
#include "temp_dir_test.hpp"

namespace kvarn {
namespace {

namespace fs = std::filesystem;

constexpr int kL = 2, kH = 2, kD = 16;

bool same_bits(const TileMatrix& a, const TileMatrix& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() &&
         std::memcmp(a.data(), b.data(), sizeof(float) * a.size()) == 0;
}

std::vector<std::string> slab_datasets(const SequenceInfo& si) {
  std::vector<std::string> out = {"k", "v"};
  if (si.has_k_pre_rope) out.push_back("k_pre_rope");
  if (si.has_q) out.push_back("q");
  return out;
}

// Reads every slab of `path` both ways; expects identical floats and (if given) the direct path
// used or not. Returns the number of slabs compared.
int expect_paths_agree(const fs::path& path, int expect_direct = -1) {
  const TileReader r(path);
  int n = 0;
  for (int s = 0; s < r.num_sequences(); ++s) {
    const SequenceInfo& si = r.sequence(s);
    for (const std::string& ds : slab_datasets(si)) {
      const int heads = ds == "q" ? static_cast<int>(si.q_heads.size()) : r.info().num_kv_heads;
      for (int l = 0; l < r.info().num_captured_layers(); ++l) {
        for (int h = 0; h < heads; ++h) {
          const StoredSlab direct = r.read_stored(s, ds, l, h);
          const StoredSlab plain = r.read_stored(s, ds, l, h, SlabRead::kHdf5);
          EXPECT_EQ(plain.chunk_tokens, 0);
          if (expect_direct >= 0) {
            EXPECT_EQ(direct.chunk_tokens > 0, expect_direct == 1) << ds;
          }
          EXPECT_TRUE(same_bits(decode_slab(direct), decode_slab(plain)))
              << path << " " << si.name << "/" << ds << " layer " << l << " head " << h;
          ++n;
        }
      }
    }
  }
  return n;
}

class TileSlabTest : public kvarn::testing::TempDirTest {
 protected:
  // Random fp16 values of mixed magnitude (normals and subnormals, both signs, zeros).
  static std::vector<float> random_halfs(std::size_t n, unsigned seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 3.0f);
    std::uniform_int_distribution<int> kind(0, 15);
    std::vector<float> x(n);
    for (auto& v : x) {
      const int k = kind(rng);
      const float y = k == 0 ? dist(rng) * 1e-6f : k == 1 ? 0.0f : dist(rng);
      v = h5::half_to_float(h5::float_to_half(y));
    }
    return x;
  }

  // Two sequences: 600 tokens (chunks of 256, 256, 88) with k_pre_rope and q, and 37 tokens.
  // Gzip unless asked otherwise: the whole filter pipeline for the tests that damage chunks.
  fs::path write_file(const std::string& name = "tiles.h5",
                      TileCompression compression = TileCompression::kGzip) {
    TileFileInfo info;
    info.model = "test-model";
    info.num_layers = 4;
    info.num_kv_heads = kH;
    info.num_q_heads = 4;
    info.head_dim = kD;
    info.source = "unit test";
    info.layers = {0, 2};
    const fs::path p = dir_ / name;
    TileWriter w(p, info, false, compression);
    values_.clear();
    unsigned seed = 1;
    for (int T : {600, 37}) {
      SequenceData s;
      s.prompt_id = "p" + std::to_string(T);
      s.token_ids.assign(T, 7);
      const std::size_t n = static_cast<std::size_t>(kL) * kH * T * kD;
      s.k = random_halfs(n, seed++);
      s.v = random_halfs(n, seed++);
      if (T == 600) {
        s.k_pre_rope = random_halfs(n, seed++);
        s.q_heads = {3, 1, 0};
        s.q = random_halfs(static_cast<std::size_t>(kL) * 3 * T * kD, seed++);
      }
      values_.push_back(s);
      w.add_sequence(s);
    }
    w.finish();
    return p;
  }

  // The written values of one slab.
  TileMatrix written(int seq, const std::string& ds, int layer, int head) const {
    const SequenceData& s = values_.at(seq);
    const int T = static_cast<int>(s.token_ids.size());
    const std::vector<float>& all = ds == "k"   ? s.k
                                    : ds == "v" ? s.v
                                    : ds == "q" ? s.q
                                                : s.k_pre_rope;
    const int heads = ds == "q" ? static_cast<int>(s.q_heads.size()) : kH;
    TileMatrix m(T, kD);
    const std::size_t off = (static_cast<std::size_t>(layer) * heads + head) * T * kD;
    std::memcpy(m.data(), all.data() + off, sizeof(float) * T * kD);
    return m;
  }

  static void expect_error(const std::function<void()>& f,
                           std::initializer_list<std::string> parts) {
    try {
      f();
      FAIL() << "no error";
    } catch (const Error& e) {
      const std::string msg = e.what();
      for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << msg;
    }
  }

  // read_stored + decode_slab, the HDF5 path and the written values agree on every slab of p.
  void expect_direct_path_reads_the_written_values(const fs::path& p);

  std::vector<SequenceData> values_;
};

TEST_F(TileSlabTest, DirectPathEqualsHdf5AndTheWrittenValues) {
  for (const TileCompression c : {TileCompression::kNone, TileCompression::kGzip})
    expect_direct_path_reads_the_written_values(
        write_file(c == TileCompression::kGzip ? "gzip.h5" : "plain.h5", c));
}

void TileSlabTest::expect_direct_path_reads_the_written_values(const fs::path& p) {
  SCOPED_TRACE(p.string());
  const TileReader r(p);
  for (int s = 0; s < 2; ++s) {
    for (const std::string& ds : slab_datasets(r.sequence(s))) {
      const int heads = ds == "q" ? 3 : kH;
      for (int l = 0; l < kL; ++l) {
        for (int h = 0; h < heads; ++h) {
          const StoredSlab direct = r.read_stored(s, ds, l, h);
          ASSERT_EQ(direct.chunk_tokens, s == 0 ? 256 : 37) << "the writer's layout is direct";
          EXPECT_EQ(direct.chunk_end.size(), s == 0 ? 3u : 1u);
          const TileMatrix got = decode_slab(direct);
          EXPECT_TRUE(same_bits(got, written(s, ds, l, h))) << ds << " " << l << " " << h;
          EXPECT_TRUE(same_bits(got, r.read(s, ds, l, h)));
        }
      }
    }
  }
  EXPECT_EQ(expect_paths_agree(p, 1), 2 * kL * kH + kL * kH + kL * 3 + 2 * kL * kH);
}

TEST_F(TileSlabTest, EveryStorageLayoutReadsTheSame) {
  struct Layout {
    const char* name;
    bool direct;
    std::function<void(H5::DSetCreatPropList&)> set;
  };
  const hsize_t c100[4] = {1, 1, 100, kD}, c_half_d[4] = {1, 1, 64, kD / 2},
                c_heads[4] = {1, 2, 32, kD};
  const std::vector<Layout> layouts = {
      {"contiguous", false, [](H5::DSetCreatPropList&) {}},
      {"chunks without filters", true, [&](H5::DSetCreatPropList& p) { p.setChunk(4, c100); }},
      {"deflate only", true,
       [&](H5::DSetCreatPropList& p) {
         p.setChunk(4, c100);
         p.setDeflate(9);
       }},
      {"shuffle only", true,
       [&](H5::DSetCreatPropList& p) {
         p.setChunk(4, c100);
         p.setShuffle();
       }},
      {"deflate then shuffle", false,
       [&](H5::DSetCreatPropList& p) {
         p.setChunk(4, c100);
         p.setDeflate(1);
         p.setShuffle();
       }},
      {"half-width chunks", false,
       [&](H5::DSetCreatPropList& p) {
         p.setChunk(4, c_half_d);
         p.setDeflate(4);
       }},
      {"two heads per chunk", false,
       [&](H5::DSetCreatPropList& p) {
         p.setChunk(4, c_heads);
         p.setShuffle();
         p.setDeflate(4);
       }},
      {"fletcher32", false,
       [&](H5::DSetCreatPropList& p) {
         p.setChunk(4, c100);
         p.setShuffle();
         p.setDeflate(4);
         p.setFletcher32();
       }},
      {"unfiltered partial edge chunks", false,
       [&](H5::DSetCreatPropList& p) {
         p.setChunk(4, c100);
         p.setShuffle();
         p.setDeflate(4);
         H5Pset_chunk_opts(p.getId(), H5D_CHUNK_DONT_FILTER_PARTIAL_CHUNKS);
       }},
  };
  for (const Layout& layout : layouts) {
    SCOPED_TRACE(layout.name);
    values_.clear();
    const fs::path p = write_file(std::string(layout.name) + ".h5");
    try {
      testing::restore_all_slabs(p, layout.set);
    } catch (const H5::Exception& e) {
      FAIL() << "cannot write the layout: " << e.getFuncName() << ": " << e.getDetailMsg();
    }
    EXPECT_GT(expect_paths_agree(p, layout.direct ? 1 : 0), 0);
    const TileReader r(p);
    EXPECT_TRUE(same_bits(r.read(0, "k", 1, 1), written(0, "k", 1, 1)));
    EXPECT_TRUE(same_bits(r.read(0, "q", 1, 2), written(0, "q", 1, 2)));
    EXPECT_TRUE(same_bits(r.read(1, "v", 0, 1), written(1, "v", 0, 1)));
  }
}

// Stored chunk i of /sequences/000000/k [layer, head] replaced by `bytes` with filter mask `mask`.
void write_chunk(const fs::path& p, int layer, int head, int token, std::uint32_t mask,
                 const std::vector<std::uint8_t>& bytes) {
  H5::H5File f(p.string(), H5F_ACC_RDWR);
  H5::DataSet ds = f.openDataSet("/sequences/000000/k");
  const hsize_t offset[4] = {static_cast<hsize_t>(layer), static_cast<hsize_t>(head),
                             static_cast<hsize_t>(token), 0};
  ASSERT_GE(H5Dwrite_chunk(ds.getId(), H5P_DEFAULT, mask, offset, bytes.size(), bytes.data()), 0);
}

// The [256, kD] halfs of tokens [first, first + 256) of `m` as little-endian bytes, and shuffled.
void chunk_bytes(const TileMatrix& m, int first, std::vector<std::uint8_t>* raw,
                 std::vector<std::uint8_t>* shuffled) {
  const std::size_t n = 256 * kD;
  raw->resize(2 * n);
  shuffled->resize(2 * n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint16_t h = h5::float_to_half(m.data()[first * kD + i]);
    (*raw)[2 * i] = h & 0xff;
    (*raw)[2 * i + 1] = h >> 8;
    (*shuffled)[i] = h & 0xff;
    (*shuffled)[n + i] = h >> 8;
  }
}

TEST_F(TileSlabTest, FiltersSkippedForOneChunkAreHonoured) {
  const fs::path p = write_file();
  const TileMatrix want = written(0, "k", 1, 0);
  std::vector<std::uint8_t> raw, shuffled;
  chunk_bytes(want, 256, &raw, &shuffled);
  write_chunk(p, 1, 0, 256, 0x2u, shuffled);  // deflate (filter 1) skipped
  chunk_bytes(want, 0, &raw, &shuffled);
  std::vector<std::uint8_t> deflated(compressBound(raw.size()));
  uLongf size = deflated.size();
  ASSERT_EQ(compress2(deflated.data(), &size, raw.data(), raw.size(), 6), Z_OK);
  deflated.resize(size);
  write_chunk(p, 1, 0, 0, 0x1u, deflated);  // shuffle (filter 0) skipped
  const TileReader r(p);
  const StoredSlab s = r.read_stored(0, "k", 1, 0);
  ASSERT_GT(s.chunk_tokens, 0);
  EXPECT_EQ(s.filter_mask, (std::vector<std::uint32_t>{0x1u, 0x2u, 0u}));
  EXPECT_TRUE(same_bits(decode_slab(s), want));
  EXPECT_EQ(expect_paths_agree(p, 1), 2 * kL * kH + kL * kH + kL * 3 + 2 * kL * kH);
}

TEST_F(TileSlabTest, DamagedChunksAreLocatedErrors) {
  const fs::path p = write_file();
  std::vector<std::uint8_t> garbage(300);
  for (std::size_t i = 0; i < garbage.size(); ++i) garbage[i] = static_cast<std::uint8_t>(i * 37);
  write_chunk(p, 1, 0, 256, 0, garbage);
  std::vector<std::uint8_t> short_raw(100, 0);
  write_chunk(p, 0, 1, 512, 0x3u, short_raw);  // unfiltered but too short
  const TileReader r(p);
  expect_error([&] { r.read(0, "k", 1, 0); },
               {p.string(), "/sequences/000000/k", "[layer 1, head 0]", "stored chunk at token 256",
                "does not inflate", "corrupt file"});
  expect_error([&] { r.read(0, "k", 0, 1); },
               {p.string(), "/sequences/000000/k", "[layer 0, head 1]", "stored chunk at token 512",
                "holds 100 bytes, expected 8192"});
  EXPECT_NO_THROW(r.read(0, "k", 0, 0));
  expect_error([&] { r.validate_values(); }, {"/sequences/000000/k"});
}

TEST_F(TileSlabTest, NonFiniteValuesNameTheirIndexInAnyChunk) {
  const fs::path p = write_file();
  {
    H5::H5File f(p.string(), H5F_ACC_RDWR);
    H5::DataSet ds = f.openDataSet("/sequences/000000/v");
    H5::DataSpace space = ds.getSpace();
    const hsize_t start[4] = {1, 0, 530, 9}, count[4] = {1, 1, 1, 1};
    space.selectHyperslab(H5S_SELECT_SET, count, start);
    const std::uint16_t inf = 0xfc00;
    const hsize_t one = 1;
    ds.write(&inf, h5::f16_type(), H5::DataSpace(1, &one), space);
  }
  const TileReader r(p);
  for (SlabRead how : {SlabRead::kAuto, SlabRead::kHdf5}) {
    expect_error([&] { decode_slab(r.read_stored(0, "v", 1, 0, how)); },
                 {p.string(), "/sequences/000000/v: non-finite value (-inf)",
                  "[layer 1, head 0, token 530, channel 9]"});
  }
  EXPECT_NO_THROW(r.read(0, "v", 1, 1));
}

TEST_F(TileSlabTest, DecodingOnManyThreadsGivesTheSameFloats) {
  const fs::path p = write_file();
  const TileReader r(p);
  std::vector<StoredSlab> slabs;
  std::vector<TileMatrix> serial;
  for (int l = 0; l < kL; ++l) {
    for (int h = 0; h < kH; ++h) {
      for (const char* ds : {"k", "v", "k_pre_rope"}) {
        slabs.push_back(r.read_stored(0, ds, l, h));
        serial.push_back(decode_slab(slabs.back()));
      }
    }
  }
  std::vector<TileMatrix> parallel(slabs.size());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (std::size_t i = t; i < slabs.size(); i += 4) parallel[i] = decode_slab(slabs[i]);
    });
  }
  for (auto& t : threads) t.join();
  for (std::size_t i = 0; i < slabs.size(); ++i)
    EXPECT_TRUE(same_bits(parallel[i], serial[i])) << i;
}

// Every finite fp16 value, [496, 128], decoded from each form a slab can come in: read through
// HDF5, and stored chunks of 64 tokens (a partial edge chunk among them) unfiltered, shuffled
// (the byte planes the F16C conversion reads directly) and shuffled then deflated. Each gives
// h5::half_to_float's value, bit for bit.
TEST(TileSlabDecode, EveryFiniteHalfDecodesExactlyFromEveryForm) {
  constexpr int kT = 496, kDim = 128, kChunk = 64;
  std::vector<std::uint16_t> halfs;
  for (std::uint32_t h = 0; h < 0x10000u; ++h) {
    if (h5::half_is_finite(static_cast<std::uint16_t>(h))) halfs.push_back(h);
  }
  ASSERT_EQ(halfs.size(), static_cast<std::size_t>(kT) * kDim);
  StoredSlab base;
  base.where = "every half";
  base.num_tokens = kT;
  base.head_dim = kDim;
  StoredSlab whole = base;
  whole.halfs = halfs;
  const auto chunked = [&](std::vector<StoredSlab::Filter> filters) {
    StoredSlab s = base;
    s.chunk_tokens = kChunk;
    s.filters = filters;
    const std::size_t n = static_cast<std::size_t>(kChunk) * kDim;
    for (std::size_t first = 0; first < halfs.size(); first += n) {
      std::vector<std::uint8_t> raw(2 * n, 0), out;
      for (std::size_t j = 0; j < n && first + j < halfs.size(); ++j) {
        raw[2 * j] = halfs[first + j] & 0xffu;
        raw[2 * j + 1] = halfs[first + j] >> 8;
      }
      out = raw;
      if (!filters.empty()) {  // shuffle: all low bytes, then all high bytes
        for (std::size_t j = 0; j < n; ++j) {
          out[j] = raw[2 * j];
          out[n + j] = raw[2 * j + 1];
        }
      }
      if (filters.size() == 2) {
        std::vector<std::uint8_t> z(compressBound(out.size()));
        uLongf size = z.size();
        EXPECT_EQ(compress2(z.data(), &size, out.data(), out.size(), 4), Z_OK);
        z.resize(size);
        out = z;
      }
      s.bytes.insert(s.bytes.end(), out.begin(), out.end());
      s.chunk_end.push_back(s.bytes.size());
      s.filter_mask.push_back(0);
    }
    return s;
  };
  using F = StoredSlab::Filter;
  for (const StoredSlab& s :
       {whole, chunked({}), chunked({F::kShuffle}), chunked({F::kShuffle, F::kDeflate})}) {
    SCOPED_TRACE(s.filters.size());
    const TileMatrix m = decode_slab(s);
    ASSERT_EQ(m.size(), static_cast<long>(halfs.size()));
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < halfs.size(); ++i) {
      const float want = h5::half_to_float(halfs[i]);
      wrong += std::memcmp(&want, m.data() + i, sizeof(float)) != 0;
    }
    EXPECT_EQ(wrong, 0u);
  }
}

TEST(TileSlabRealTiles, DirectPathEqualsHdf5OnEveryCommittedTileFile) {
  for (const char* name :
       {"sample.h5", "fixture_heldout.h5", "smollm2_sample.h5", "smollm2_long.h5"}) {
    SCOPED_TRACE(name);
    const fs::path p = fs::path(KVARN_SOURCE_DIR) / "data" / "tiles" / name;
    ASSERT_TRUE(fs::exists(p)) << p << " is committed: missing means a broken checkout";
    EXPECT_GT(expect_paths_agree(p, 1), 0);
  }
}

}  // namespace
}  // namespace kvarn
