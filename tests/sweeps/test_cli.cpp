// The kvarn-eval CLI, run as a process: `methods` accounting, `quantize` on the sample tiles,
// and the error contract (one line on stderr, exit code 2, no output file left behind).
#include <H5Cpp.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "kvarn/data/h5_io.hpp"
#include "kvarn/data/tile_file.hpp"
#include "temp_dir_test.hpp"

#ifndef KVARN_EVAL_BIN
#error "tests/CMakeLists.txt must define KVARN_EVAL_BIN (path of the kvarn-eval binary)"
#endif

namespace kvarn {
namespace {

namespace fs = std::filesystem;

struct RunResult {
  int rc = -1;
  std::string out, err;
};

std::string slurp(const fs::path& p) {
  std::ifstream is(p, std::ios::binary);
  std::stringstream ss;
  ss << is.rdbuf();
  return ss.str();
}

class CliTest : public kvarn::testing::TempDirTest {
 protected:
  RunResult run(const std::string& args) {
    const fs::path out = dir_ / "stdout.txt", err = dir_ / "stderr.txt";
    const std::string cmd = std::string("'") + KVARN_EVAL_BIN + "' " + args + " >'" + out.string() +
                            "' 2>'" + err.string() + "'";
    RunResult r;
    const int status = std::system(cmd.c_str());
    r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = slurp(out);
    r.err = slurp(err);
    fs::remove(out);
    fs::remove(err);
    return r;
  }

  static fs::path sample() { return fs::path(KVARN_SOURCE_DIR) / "data" / "tiles" / "sample.h5"; }
};

TEST_F(CliTest, MethodsJsonHasExactBytesPerToken) {
  const RunResult r = run("methods --json --head-dim 128");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_TRUE(j.is_array());
  std::map<std::string, nlohmann::json> by_name;
  for (const auto& m : j) by_name[m.at("name").get<std::string>()] = m;
  ASSERT_TRUE(by_name.count("kvarn_k4v2_g128")) << r.out;
  ASSERT_TRUE(by_name.count("fp16")) << r.out;
  EXPECT_EQ(by_name["kvarn_k4v2_g128"].at("bytes_per_token").get<double>(), 108.0);
  EXPECT_EQ(by_name["kvarn_k4v2_g128"].at("key_code_bits").get<double>(), 4.0);
  EXPECT_EQ(by_name["kvarn_k4v2_g128"].at("value_code_bits").get<double>(), 2.0);
  EXPECT_EQ(by_name["fp16"].at("bytes_per_token").get<double>(), 512.0);
  EXPECT_EQ(by_name["fp16"].at("sequence_bytes").get<std::uint64_t>(), 512u * 4096u);
  // KVarN at T = 4096: sink of 128 fp16 tokens, 31 quantized tiles of 13,824 B, no tail.
  EXPECT_EQ(by_name["kvarn_k4v2_g128"].at("sequence_bytes").get<std::uint64_t>(),
            128u * 512u + 31u * 13824u);
  // Baselines registered by other modules; checked once they exist.
  const std::map<std::string, double> expected = {{"turboquant_4bit_nc", 134},
                                                  {"turboquant_3bit_nc", 102},
                                                  {"turboquant_k8v4", 196},
                                                  {"fp8", 256},
                                                  {"fp8_e4m3", 256}};
  for (const auto& [name, bytes] : expected) {
    if (by_name.count(name)) {
      EXPECT_EQ(by_name[name].at("bytes_per_token").get<double>(), bytes) << name;
    }
  }
}

TEST_F(CliTest, MethodsTableListsPresets) {
  const RunResult r = run("methods --context 1000");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("kvarn_k4v2_g128"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("108.00"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("512.00"), std::string::npos) << r.out;
}

// Model-level effective bits: turboquant_3bit_nc on 8 layers keeps 4 fp16 (boundary=2):
// (4 * 16 + 4 * 3.1875) / 8 = 9.59375; KVarN k4v2 at T = 768, D = 64 stores 69248 B per
// (layer, head): 5.6354 bits, the same at model level.
TEST_F(CliTest, MethodsPrintsModelLevelEffectiveBits) {
  const RunResult r = run("methods --json --head-dim 64 --context 768 --layers 8");
  ASSERT_EQ(r.rc, 0) << r.err;
  std::map<std::string, nlohmann::json> by_name;
  for (const auto& m : nlohmann::json::parse(r.out)) by_name[m.at("name").get<std::string>()] = m;
  EXPECT_DOUBLE_EQ(by_name.at("kvarn_k4v2_g128").at("effective_bits").get<double>(),
                   69248.0 * 8 / (768 * 128));
  EXPECT_DOUBLE_EQ(by_name.at("kvarn_k4v2_g128").at("bits_per_element").get<double>(), 3.5625);
  const RunResult t = run("methods --json --head-dim 128 --context 100 --layers 8");
  ASSERT_EQ(t.rc, 0) << t.err;
  for (const auto& m : nlohmann::json::parse(t.out)) by_name[m.at("name").get<std::string>()] = m;
  EXPECT_DOUBLE_EQ(by_name.at("turboquant_3bit_nc").at("effective_bits").get<double>(), 9.59375);
  EXPECT_EQ(by_name.at("turboquant_3bit_nc").at("layers").get<int>(), 8);
  const RunResult table = run("methods --context 768 --layers 8");
  ASSERT_EQ(table.rc, 0) << table.err;
  EXPECT_NE(table.out.find("eff@T,L"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("kvarn_paper_k2v2"), std::string::npos) << table.out;
  EXPECT_NE(run("methods --layers 0").rc, 0);
}

TEST_F(CliTest, QuantizeSampleWritesConsistentFile) {
  ASSERT_TRUE(fs::exists(sample())) << sample();
  const fs::path out = dir_ / "q.h5";
  const RunResult r = run("quantize --method kvarn_k4v2_g128 --reconstruction --in '" +
                          sample().string() + "' --out '" + out.string() + "'");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("NMSE"), std::string::npos) << r.out;
  ASSERT_TRUE(fs::exists(out));

  TileReader tiles(sample());
  h5::silence_errors();
  H5::H5File f(out.string(), H5F_ACC_RDONLY);
  auto str_attr = [](const H5::H5Object& o, const char* n) {
    std::string s;
    H5::Attribute a = o.openAttribute(n);
    a.read(a.getStrType(), s);
    return s;
  };
  auto int_attr = [](const H5::H5Object& o, const char* n) {
    long long v = 0;
    o.openAttribute(n).read(H5::PredType::NATIVE_LLONG, &v);
    return v;
  };
  EXPECT_EQ(str_attr(f, "format"), "kvarn-quantized");
  EXPECT_EQ(int_attr(f, "format_version"), 2);
  EXPECT_EQ(int_attr(f, "reconstruction"), 1);
  EXPECT_EQ(str_attr(f, "method"), "kvarn_k4v2_g128");
  const auto prov = nlohmann::json::parse(str_attr(f, "provenance"));
  EXPECT_EQ(prov.at("tool"), "kvarn-eval quantize");
  EXPECT_EQ(prov.at("input").at("source"), "synthetic (data/make_sample_tiles.py)");
  int groups = 0;
  for (int s = 0; s < tiles.num_sequences(); ++s) {
    const int T = tiles.sequence(s).num_tokens;
    for (int li = 0; li < tiles.info().num_captured_layers(); ++li) {
      for (int h = 0; h < tiles.info().num_kv_heads; ++h) {
        char path[96];
        std::snprintf(path, sizeof(path), "/sequences/%s/layer_%02d/head_%02d",
                      sequence_name(s).c_str(), tiles.info().layers[li], h);
        SCOPED_TRACE(path);
        H5::Group g = f.openGroup(path);
        const long long stored = int_attr(g, "stored_bytes");
        EXPECT_EQ(stored, int_attr(g, "accounted_bytes"));
        TileMatrix k_hat(T, 128);
        g.openDataSet("k_hat").read(k_hat.data(), H5::PredType::NATIVE_FLOAT);
        const TileMatrix k = tiles.read(s, "k", li, h);
        const double nmse = (k_hat - k).squaredNorm() / k.squaredNorm();
        EXPECT_LT(nmse, 0.1);
        // 128-token fp16 sink, then whole tiles of 128 (T = 300: one tile; T = 200: none).
        const int tiles_expected = std::max(0, (T - 128) / 128);
        EXPECT_EQ(int_attr(g.openGroup("k"), "num_chunks"), tiles_expected);
        if (tiles_expected > 0) {
          EXPECT_LT(stored, 4LL * T * 128);
          EXPECT_GT(nmse, 0.0);  // it really was quantized
          H5::DataSet codes = g.openDataSet("k/k_codes");
          hsize_t dims[3];
          ASSERT_EQ(codes.getSpace().getSimpleExtentDims(dims), 3);
          EXPECT_EQ(dims[0], static_cast<hsize_t>(tiles_expected));
          EXPECT_EQ(dims[1], 128u);
          EXPECT_EQ(dims[2], 64u);
        } else {
          EXPECT_EQ(stored, 4LL * T * 128);
          EXPECT_FALSE(g.nameExists("k/k_codes"));
        }
        ++groups;
      }
    }
  }
  EXPECT_EQ(groups, 2 * 2 * 2);
}

TEST_F(CliTest, QuantizeSelection) {
  const fs::path out = dir_ / "sel.h5";
  const RunResult r = run("quantize --method fp16 --in '" + sample().string() + "' --out '" +
                          out.string() + "' --layers 5 --heads 0 --sequences 1");
  ASSERT_EQ(r.rc, 0) << r.err;
  H5::H5File f(out.string(), H5F_ACC_RDONLY);
  EXPECT_TRUE(f.nameExists("/sequences/000001/layer_05/head_00"));
  EXPECT_FALSE(f.nameExists("/sequences/000000"));
  EXPECT_FALSE(f.nameExists("/sequences/000001/layer_02"));
  EXPECT_FALSE(f.nameExists("/sequences/000001/layer_05/head_01"));
}

TEST_F(CliTest, BadMethodNameSuggestsNearest) {
  const fs::path out = dir_ / "bad.h5";
  const RunResult r = run("quantize --method kvran_k4v2 --in '" + sample().string() + "' --out '" +
                          out.string() + "'");
  EXPECT_EQ(r.rc, 2);
  EXPECT_EQ(r.err.rfind("kvarn-eval: error: ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find("nearest valid"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(out));
}

TEST_F(CliTest, ExistingOutputIsNotOverwrittenWithoutForce) {
  const fs::path out = dir_ / "keep.h5";
  std::ofstream(out) << "precious";
  RunResult r =
      run("quantize --method fp16 --in '" + sample().string() + "' --out '" + out.string() + "'");
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.err.find("--force"), std::string::npos) << r.err;
  EXPECT_EQ(slurp(out), "precious");
  r = run("quantize --method fp16 --in '" + sample().string() + "' --out '" + out.string() +
          "' --force --sequences 1 --layers 2 --heads 0");
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(slurp(out), "precious");
}

TEST_F(CliTest, BadInputFileIsOneLineErrorAndNoOutput) {
  const fs::path in = dir_ / "trunc.h5", out = dir_ / "o.h5";
  {
    const std::string bytes = slurp(sample());
    std::ofstream(in, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  }
  RunResult r =
      run("quantize --method fp16 --in '" + in.string() + "' --out '" + out.string() + "'");
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.err.find(in.string()), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("truncated"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_FALSE(fs::exists(out));

  r = run("quantize --method fp16 --in '" + sample().string() + "' --out '" + out.string() +
          "' --heads 7");
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.err.find("--heads: index 7 out of range"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(out));
  // Nothing but the copied input is left in the directory (no temporaries either).
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);
}

TEST_F(CliTest, UsageErrorExitsTwo) {
  const RunResult r = run("quantize --method fp16");
  EXPECT_EQ(r.rc, 2);
  EXPECT_EQ(run("no-such-command").rc, 2);
  EXPECT_EQ(run("methods --help").rc, 0);
}

}  // namespace
}  // namespace kvarn
