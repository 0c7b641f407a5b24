// Tile file (HDF5 "kvarn-tiles" v1): round trip, h5py compatibility, validation errors, atomicity.
#include <H5Cpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "kvarn/data/atomic_file.hpp"
#include "kvarn/data/error.hpp"
#include "kvarn/data/h5_io.hpp"
#include "kvarn/data/tile_file.hpp"
#include "temp_dir_test.hpp"

namespace kvarn {
namespace {

namespace fs = std::filesystem;

constexpr int kL = 2, kH = 2, kD = 16;

class TileFileTest : public kvarn::testing::TempDirTest {
 protected:
  static TileFileInfo make_info() {
    TileFileInfo info;
    info.model = "test-model";
    info.num_layers = 12;
    info.num_kv_heads = kH;
    info.num_q_heads = 4;
    info.head_dim = kD;
    info.rope_theta = 10000.0;
    info.source = "unit test";
    info.provenance = R"({"tool":"test"})";
    info.layers = {3, 7};
    return info;
  }

  // Values already representable in fp16, so the round trip must be bit-identical.
  static std::vector<float> random_halfs(std::size_t n, unsigned seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 3.0f);
    std::vector<float> x(n);
    for (auto& v : x) v = h5::half_to_float(h5::float_to_half(dist(rng)));
    return x;
  }

  static SequenceData make_seq(int T, unsigned seed, bool optional) {
    SequenceData s;
    s.prompt_id = "prompt-" + std::to_string(seed);
    for (int t = 0; t < T; ++t) s.token_ids.push_back(1000 + t);
    const std::size_t n = static_cast<std::size_t>(kL) * kH * T * kD;
    s.k = random_halfs(n, seed);
    s.v = random_halfs(n, seed + 1);
    if (optional) {
      s.k_pre_rope = random_halfs(n, seed + 2);
      s.q_heads = {1, 3, 0};
      s.q = random_halfs(static_cast<std::size_t>(kL) * 3 * T * kD, seed + 3);
    }
    return s;
  }

  fs::path write_sample(const std::string& name = "tiles.h5",
                        TileCompression compression = TileCompression::kNone) {
    const fs::path p = dir_ / name;
    TileWriter w(p, make_info(), false, compression);
    w.add_sequence(make_seq(37, 1, true));
    w.add_sequence(make_seq(5, 9, false));
    w.finish();
    return p;
  }

  // Reads back the file write_sample wrote (any storage): attributes and values bit for bit.
  static void expect_round_trip(const fs::path& p);

  // Expects TileReader(p) (and, if given, an action on it) to throw a kvarn::Error whose message
  // contains every string in `parts`.
  template <typename F>
  static void expect_error(F&& f, std::initializer_list<std::string> parts) {
    try {
      f();
      FAIL() << "no error";
    } catch (const Error& e) {
      const std::string msg = e.what();
      for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << msg;
    }
  }
};

TEST_F(TileFileTest, HalfConversionRoundTripsEveryFiniteHalf) {
  for (std::uint32_t h = 0; h < 0x10000u; ++h) {
    const auto bits = static_cast<std::uint16_t>(h);
    if (!h5::half_is_finite(bits)) continue;
    ASSERT_EQ(h5::float_to_half(h5::half_to_float(bits)), bits) << h;
  }
  // Ties round to even; overflow goes to Inf; tiny values to (signed) zero or subnormals.
  EXPECT_EQ(h5::float_to_half(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  EXPECT_EQ(h5::float_to_half(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_EQ(h5::float_to_half(65520.0f), 0x7c00);
  EXPECT_EQ(h5::float_to_half(65519.0f), 0x7bff);
  EXPECT_EQ(h5::float_to_half(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(h5::float_to_half(std::ldexp(1.0f, -25)), 0x0000);
  EXPECT_EQ(h5::float_to_half(-std::ldexp(1.5f, -25)), 0x8001);
}

TEST_F(TileFileTest, RoundTripIsBitIdentical) {
  expect_round_trip(write_sample());
  expect_round_trip(write_sample("gzip.h5", TileCompression::kGzip));
}

// The filters of /sequences/000000/`name`: their count, and whether deflate is among them.
std::pair<int, bool> filters_of(const fs::path& p, const std::string& name) {
  H5::H5File f(p.string(), H5F_ACC_RDONLY);
  const H5::DSetCreatPropList pl = f.openDataSet("/sequences/000000/" + name).getCreatePlist();
  const int n = pl.getNfilters();
  bool deflate = false;
  for (int i = 0; i < n; ++i) {
    unsigned flags = 0, config = 0;
    std::size_t cd_n = 0;
    char fname[32];
    deflate |=
        pl.getFilter(i, flags, cd_n, nullptr, sizeof(fname), fname, config) == H5Z_FILTER_DEFLATE;
  }
  return {n, deflate};
}

TEST_F(TileFileTest, WritesUnfilteredChunksUnlessAskedToCompress) {
  const fs::path plain = dir_ / "plain.h5";
  {
    TileWriter w(plain, make_info());  // the default
    w.add_sequence(make_seq(37, 1, true));
    w.finish();
  }
  const fs::path gzip = write_sample("gzip.h5", TileCompression::kGzip);
  for (const char* name : {"k", "v", "k_pre_rope", "q"}) {
    EXPECT_EQ(filters_of(plain, name), std::make_pair(0, false)) << name;
    EXPECT_EQ(filters_of(gzip, name), std::make_pair(2, true)) << name;  // shuffle, deflate
  }
  // The same values either way.
  TileReader a(plain), b(gzip);
  for (const char* name : {"k", "v"})
    for (int l = 0; l < kL; ++l)
      for (int h = 0; h < kH; ++h) {
        const TileMatrix x = a.read(0, name, l, h), y = b.read(0, name, l, h);
        ASSERT_EQ(x.rows(), y.rows());
        for (Eigen::Index i = 0; i < x.size(); ++i)
          ASSERT_EQ(h5::float_to_half(x.data()[i]), h5::float_to_half(y.data()[i])) << name;
      }
}

void TileFileTest::expect_round_trip(const fs::path& p) {
  SCOPED_TRACE(p.string());
  TileReader r(p);
  const TileFileInfo& info = r.info();
  EXPECT_EQ(info.model, "test-model");
  EXPECT_EQ(info.num_layers, 12);
  EXPECT_EQ(info.num_kv_heads, kH);
  EXPECT_EQ(info.num_q_heads, 4);
  EXPECT_EQ(info.head_dim, kD);
  ASSERT_TRUE(info.rope_theta.has_value());
  EXPECT_EQ(*info.rope_theta, 10000.0);
  EXPECT_EQ(info.source, "unit test");
  EXPECT_EQ(info.provenance, R"({"tool":"test"})");
  EXPECT_EQ(info.layers, (std::vector<int>{3, 7}));
  ASSERT_EQ(r.num_sequences(), 2);

  const int Ts[2] = {37, 5};
  const unsigned seeds[2] = {1, 9};
  for (int s = 0; s < 2; ++s) {
    const SequenceData want = make_seq(Ts[s], seeds[s], s == 0);
    const SequenceInfo& si = r.sequence(s);
    EXPECT_EQ(si.name, sequence_name(s));
    EXPECT_EQ(si.num_tokens, Ts[s]);
    EXPECT_EQ(si.prompt_id, want.prompt_id);
    EXPECT_EQ(si.has_k_pre_rope, s == 0);
    EXPECT_EQ(si.has_q, s == 0);
    EXPECT_EQ(si.q_heads, want.q_heads);
    EXPECT_EQ(r.token_ids(s), want.token_ids);
    auto check = [&](const std::string& ds, const std::vector<float>& x, int heads) {
      for (int l = 0; l < kL; ++l) {
        for (int h = 0; h < heads; ++h) {
          const TileMatrix m = r.read(s, ds, l, h);
          ASSERT_EQ(m.rows(), Ts[s]);
          ASSERT_EQ(m.cols(), kD);
          const float* src = x.data() + (static_cast<std::size_t>(l) * heads + h) * Ts[s] * kD;
          for (int i = 0; i < Ts[s] * kD; ++i) {
            ASSERT_EQ(h5::float_to_half(m.data()[i]), h5::float_to_half(src[i]))
                << ds << " seq " << s << " layer " << l << " head " << h << " i " << i;
          }
        }
      }
    };
    check("k", want.k, kH);
    check("v", want.v, kH);
    if (s == 0) {
      check("k_pre_rope", want.k_pre_rope, kH);
      check("q", want.q, 3);
    }
  }
  EXPECT_NO_THROW(r.validate_values());
}

TEST_F(TileFileTest, StoredAsHdf5HalfThatH5pyReadsAsFloat16) {
  const fs::path p = write_sample();
  {
    H5::H5File f(p.string(), H5F_ACC_RDONLY);
    H5::DataSet ds = f.openDataSet("/sequences/000000/k");
    EXPECT_TRUE(h5::is_f16(ds.getDataType()));
    H5::DSetCreatPropList pl = ds.getCreatePlist();
    ASSERT_EQ(pl.getLayout(), H5D_CHUNKED);
    hsize_t chunk[4];
    pl.getChunk(4, chunk);
    EXPECT_EQ(chunk[0], 1u);
    EXPECT_EQ(chunk[1], 1u);
    EXPECT_EQ(chunk[2], 37u);
    EXPECT_EQ(chunk[3], static_cast<hsize_t>(kD));
  }
  if (std::system("python3 -c 'import h5py' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "h5py not available";
  }
  const fs::path out = dir_ / "py.txt";
  const std::string cmd = "python3 -c \"import h5py; f = h5py.File('" + p.string() +
                          "', 'r'); d = f['sequences/000000/k']; "
                          "print(d.dtype, d.shape, float(d[1, 1, 2, 3]), f.attrs['format'])\" > " +
                          out.string();
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  std::ifstream is(out);
  std::string line;
  std::getline(is, line);
  TileReader r(p);
  const float x = r.read(0, "k", 1, 1)(2, 3);
  // Compare numerically rather than by text formatting.
  EXPECT_EQ(line.rfind("float16 (2, 2, 37, 16) ", 0), 0u) << line;
  const double py = std::stod(line.substr(std::string("float16 (2, 2, 37, 16) ").size()));
  EXPECT_EQ(py, static_cast<double>(x)) << line;
  EXPECT_NE(line.find("kvarn-tiles"), std::string::npos) << line;
}

TEST_F(TileFileTest, MissingFile) {
  const fs::path p = dir_ / "nope.h5";
  expect_error([&] { TileReader r(p); }, {p.string(), "no such file"});
}

TEST_F(TileFileTest, EmptyFile) {
  const fs::path p = dir_ / "empty.h5";
  std::ofstream(p).close();
  expect_error([&] { TileReader r(p); }, {p.string(), "empty file"});
}

TEST_F(TileFileTest, NotHdf5) {
  const fs::path p = dir_ / "text.h5";
  std::ofstream(p) << "this is not an HDF5 file\n";
  expect_error([&] { TileReader r(p); }, {p.string(), "not an HDF5 file"});
}

TEST_F(TileFileTest, TruncatedFile) {
  const fs::path p = write_sample();
  fs::resize_file(p, fs::file_size(p) / 2);
  expect_error([&] { TileReader r(p); }, {p.string(), "truncated"});
}

// Rewrites one attribute of an existing file.
template <typename Fn>
void patch(const fs::path& p, Fn&& fn) {
  H5::H5File f(p.string(), H5F_ACC_RDWR);
  fn(f);
}

TEST_F(TileFileTest, WrongFormat) {
  const fs::path p = write_sample();
  patch(p, [](H5::H5File& f) {
    f.removeAttr("format");
    h5::write_string_attr(f, "format", "something-else");
  });
  expect_error([&] { TileReader r(p); }, {p.string(), "'format'", "something-else", "kvarn-tiles"});
}

TEST_F(TileFileTest, WrongVersion) {
  const fs::path p = write_sample();
  patch(p, [](H5::H5File& f) {
    f.removeAttr("format_version");
    h5::write_int_attr(f, "format_version", 2);
  });
  expect_error([&] { TileReader r(p); }, {p.string(), "unsupported format_version 2"});
}

TEST_F(TileFileTest, MissingAttribute) {
  const fs::path p = write_sample();
  patch(p, [](H5::H5File& f) { f.removeAttr("head_dim"); });
  expect_error([&] { TileReader r(p); }, {p.string(), "missing attribute 'head_dim'"});
}

TEST_F(TileFileTest, WrongShape) {
  const fs::path p = write_sample();
  patch(p, [](H5::H5File& f) {
    H5::Group g = f.openGroup("/sequences/000001");
    g.unlink("v");
    std::vector<std::uint16_t> zeros(kL * kH * 4 * kD, 0);
    h5::write_dataset(g, "v", h5::f16_type(), h5::f16_type(), {kL, kH, 4, kD}, zeros.data());
  });
  expect_error([&] { TileReader r(p); },
               {p.string(), "/sequences/000001/v", "shape is [2, 2, 4, 16]", "[2, 2, 5, 16]"});
}

TEST_F(TileFileTest, WrongDtype) {
  const fs::path p = write_sample();
  patch(p, [](H5::H5File& f) {
    H5::Group g = f.openGroup("/sequences/000001");
    g.unlink("k");
    std::vector<float> zeros(kL * kH * 5 * kD, 0.0f);
    h5::write_dataset(g, "k", H5::PredType::IEEE_F32LE, H5::PredType::NATIVE_FLOAT, {kL, kH, 5, kD},
                      zeros.data());
  });
  expect_error([&] { TileReader r(p); },
               {p.string(), "/sequences/000001/k", "32-bit float", "expected float16"});
}

TEST_F(TileFileTest, MissingDataset) {
  const fs::path p = write_sample();
  patch(p, [](H5::H5File& f) { f.openGroup("/sequences/000000").unlink("token_ids"); });
  expect_error([&] { TileReader r(p); },
               {p.string(), "/sequences/000000/token_ids: missing dataset"});
}

TEST_F(TileFileTest, NonFiniteValueNamesTheIndex) {
  const fs::path p = write_sample();
  patch(p, [](H5::H5File& f) {
    H5::DataSet ds = f.openDataSet("/sequences/000000/k");
    H5::DataSpace fs = ds.getSpace();
    const hsize_t start[4] = {1, 1, 17, 5}, count[4] = {1, 1, 1, 1};
    fs.selectHyperslab(H5S_SELECT_SET, count, start);
    const std::uint16_t nan = 0x7e00;
    const hsize_t one = 1;
    ds.write(&nan, h5::f16_type(), H5::DataSpace(1, &one), fs);
  });
  TileReader r(p);  // structure is fine; values are checked as they are streamed
  EXPECT_NO_THROW(r.read(0, "k", 1, 0));
  expect_error([&] { r.read(0, "k", 1, 1); }, {p.string(), "/sequences/000000/k: non-finite value",
                                               "[layer 1, head 1, token 17, channel 5]"});
  expect_error([&] { r.validate_values(); }, {"[layer 1, head 1, token 17, channel 5]"});
}

TEST_F(TileFileTest, UnknownOrAbsentDatasetAndBadIndices) {
  const fs::path p = write_sample();
  TileReader r(p);
  expect_error([&] { r.read(0, "keys", 0, 0); },
               {p.string(), "/sequences/000000", "unknown dataset 'keys'"});
  expect_error([&] { r.read(1, "q", 0, 0); }, {"/sequences/000001/q", "not present"});
  expect_error([&] { r.read(0, "k", 2, 0); }, {"layer index 2 out of range"});
  expect_error([&] { r.read(0, "v", 0, 2); }, {"head 2 out of range"});
  expect_error([&] { r.read(0, "q", 0, 3); }, {"head 3 out of range"});
  expect_error([&] { r.read(2, "k", 0, 0); }, {"sequence index 2 out of range"});
}

TEST_F(TileFileTest, WriterWithoutFinishLeavesNoFile) {
  const fs::path p = dir_ / "unfinished.h5";
  {
    TileWriter w(p, make_info());
    w.add_sequence(make_seq(8, 3, false));
    EXPECT_TRUE(fs::exists(temp_path_for(p)));
  }
  EXPECT_FALSE(fs::exists(p));
  EXPECT_FALSE(fs::exists(temp_path_for(p)));
  EXPECT_TRUE(fs::is_empty(dir_));
}

TEST_F(TileFileTest, WriterRefusesOverwriteAndNonFiniteInput) {
  const fs::path p = write_sample();
  const auto size = fs::file_size(p);
  expect_error([&] { TileWriter w(p, make_info()); }, {p.string(), "refusing to overwrite"});
  EXPECT_EQ(fs::file_size(p), size);

  const fs::path q = dir_ / "nan.h5";
  {
    TileWriter w(q, make_info());
    SequenceData s = make_seq(6, 4, false);
    s.v[((1 * kH + 0) * 6 + 2) * kD + 7] = NAN;
    expect_error([&] { w.add_sequence(s); },
                 {"/sequences/000000/v", "[layer 1, head 0, token 2, channel 7]"});
  }
  EXPECT_FALSE(fs::exists(q));
}

TEST_F(TileFileTest, SampleFileIsValid) {
  const fs::path p = fs::path(KVARN_SOURCE_DIR) / "data" / "tiles" / "sample.h5";
  ASSERT_TRUE(fs::exists(p)) << p << " is committed: missing means a broken checkout";
  TileReader r(p);
  EXPECT_EQ(r.info().head_dim, 128);
  EXPECT_EQ(r.num_sequences(), 2);
  EXPECT_EQ(r.sequence(0).num_tokens, 300);
  EXPECT_EQ(r.sequence(1).num_tokens, 200);
  EXPECT_NE(r.info().source.find("synthetic"), std::string::npos);
  EXPECT_NO_THROW(r.validate_values());
}

}  // namespace
}  // namespace kvarn
