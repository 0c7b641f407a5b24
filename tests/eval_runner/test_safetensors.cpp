// The safetensors reader on files written by the python package and on corrupt files.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "kvarn/data/error.hpp"
#include "kvarn/runner/safetensors.hpp"
#include "runner_test_util.hpp"
#include "temp_dir_test.hpp"

namespace kvarn {
namespace {

namespace fs = std::filesystem;

class SafetensorsCorrupt : public kvarn::testing::TempDirTest {
 protected:
  // Writes [u64 len][header][data] and returns the path.
  fs::path write(const std::string& name, const std::string& header, std::size_t data_bytes,
                 std::uint64_t len_override = 0) {
    const auto p = dir_ / name;
    std::ofstream out(p, std::ios::binary);
    std::uint64_t n = len_override ? len_override : header.size();
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
    out << header;
    for (std::size_t i = 0; i < data_bytes; ++i) out.put(static_cast<char>(i));
    return p;
  }

  // Expects the open to fail with a message containing the file name and `needle`.
  void expect_error(const fs::path& p, const std::string& needle) {
    try {
      SafetensorsFile f(p);
      ADD_FAILURE() << p << " opened but should fail with '" << needle << "'";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(p.string()), std::string::npos) << msg;
      EXPECT_NE(msg.find(needle), std::string::npos) << "wanted '" << needle << "' in: " << msg;
    }
  }
};

TEST_F(SafetensorsCorrupt, ValidHandWrittenFile) {
  const auto p = write("ok.safetensors",
                       R"({"__metadata__":{"format":"pt"},"b":{"dtype":"F16","shape":[2,3],)"
                       R"("data_offsets":[16,28]},"a":{"dtype":"F32","shape":[4],)"
                       R"("data_offsets":[0,16]},"e":{"dtype":"BF16","shape":[0,5],)"
                       R"("data_offsets":[28,28]}})",
                       28);
  SafetensorsFile f(p);
  ASSERT_EQ(f.tensors().size(), 3u);
  EXPECT_EQ(f.tensors()[0].name, "a");  // ordered by offset
  EXPECT_EQ(f.info("b").dtype, StDtype::kF16);
  EXPECT_EQ(f.info("b").numel(), 6u);
  EXPECT_EQ(f.info("e").numel(), 0u);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.data(f.info("b"))[0], 16);
  EXPECT_THROW(f.info("zzz"), Error);
}

TEST_F(SafetensorsCorrupt, TruncatedBeforeHeaderLength) {
  const auto p = dir_ / "tiny.safetensors";
  std::ofstream(p, std::ios::binary) << "abc";
  expect_error(p, "truncated");
}

TEST_F(SafetensorsCorrupt, HeaderLengthBeyondFile) {
  expect_error(write("len.safetensors", R"({})", 0, 1000), "exceeds the file");
  expect_error(write("huge.safetensors", R"({})", 0, std::numeric_limits<std::uint64_t>::max()),
               "exceeds the file");
}

TEST_F(SafetensorsCorrupt, InvalidJson) {
  expect_error(write("json.safetensors", R"({"a": {"dtype": )", 0), "invalid JSON");
  expect_error(write("arr.safetensors", R"([1, 2])", 0), "not a JSON object");
}

TEST_F(SafetensorsCorrupt, TruncatedData) {
  expect_error(
      write("data.safetensors", R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8),
      "beyond the data section");
}

TEST_F(SafetensorsCorrupt, OverlappingOffsets) {
  expect_error(write("ov.safetensors",
                     R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                     R"("b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})",
                     24),
               "overlap");
}

TEST_F(SafetensorsCorrupt, WrongDtypeSize) {
  expect_error(
      write("sz.safetensors", R"({"a":{"dtype":"F16","shape":[4],"data_offsets":[0,16]}})", 16),
      "needs 8");
}

TEST_F(SafetensorsCorrupt, HugeNumbers) {
  expect_error(write("ovf.safetensors",
                     R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,16],)"
                     R"("data_offsets":[0,16]}})",
                     16),
               "overflows");
  expect_error(write("big.safetensors",
                     R"({"a":{"dtype":"F32","shape":[4],)"
                     R"("data_offsets":[18446744073709551600,18446744073709551615]}})",
                     16),
               "beyond the data section");
  expect_error(
      write("neg.safetensors", R"({"a":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}})", 16),
      "non-negative");
  expect_error(
      write("flt.safetensors", R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,1e30]}})", 16),
      "non-negative integer");
}

TEST_F(SafetensorsCorrupt, BadEntries) {
  expect_error(
      write("dt.safetensors", R"({"a":{"dtype":"F12","shape":[4],"data_offsets":[0,16]}})", 16),
      "unknown dtype");
  expect_error(
      write("rev.safetensors", R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[9,8]}})", 16),
      "reversed");
  expect_error(write("miss.safetensors", R"({"a":{"dtype":"F32","shape":[4]}})", 16),
               "missing 'data_offsets'");
  expect_error(write("dup.safetensors",
                     R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                     R"("a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                     2),
               "appears twice");
}

TEST(Safetensors, FilesWrittenByPython) {
  KVARN_REFERENCE_DIR(ref);
  SafetensorsFile f(ref / "models/llama3/reference.safetensors");
  const auto& info = f.info("logits");
  EXPECT_EQ(info.dtype, StDtype::kF32);
  ASSERT_EQ(info.shape.size(), 2u);
  EXPECT_EQ(info.shape[1], 512);
  // bf16 and fp16 checkpoints, the fp16 one sharded with an index.
  SafetensorsCheckpoint bf16(ref / "models/qwen3");
  EXPECT_EQ(bf16.file_of("model.norm.weight").info("model.norm.weight").dtype, StDtype::kBF16);
  SafetensorsCheckpoint sharded(ref / "models/mistral");
  EXPECT_TRUE(sharded.contains("model.layers.1.mlp.down_proj.weight"));
  EXPECT_EQ(sharded.file_of("model.embed_tokens.weight").info("model.embed_tokens.weight").dtype,
            StDtype::kF16);
  EXPECT_THROW(sharded.file_of("nope"), Error);
}

TEST(Safetensors, ShardIndexErrors) {
  const auto d = fs::temp_directory_path() / ("kvarn_st_idx_" + std::to_string(::getpid()));
  fs::create_directories(d);
  std::ofstream(d / "model.safetensors.index.json")
      << R"({"weight_map": {"a": "model-00001-of-00002.safetensors"}})";
  try {
    SafetensorsCheckpoint c(d);
    ADD_FAILURE() << "missing shard accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing"), std::string::npos) << e.what();
  }
  std::ofstream(d / "model.safetensors.index.json") << R"({"weight_map": {"a": "../x"}})";
  EXPECT_THROW(SafetensorsCheckpoint{d}, Error);
  fs::remove(d / "model.safetensors.index.json");
  EXPECT_THROW(SafetensorsCheckpoint{d}, Error);  // neither file
  fs::remove_all(d);
}

}  // namespace
}  // namespace kvarn
