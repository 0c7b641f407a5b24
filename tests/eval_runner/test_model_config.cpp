// config.json parsing (load_model_config) on hand-written files: numbers that do not fit their
// field are one error naming the file and the key, never a silent conversion.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "kvarn/data/error.hpp"
#include "kvarn/runner/model.hpp"
#include "temp_dir_test.hpp"

namespace kvarn {
namespace {

namespace fs = std::filesystem;

class ModelConfigFile : public kvarn::testing::TempDirTest {
 protected:
  // A Llama config with llama3 RoPE scaling whose original_max_position_embeddings is `omp`.
  fs::path write(const std::string& omp) {
    const fs::path p = dir_ / "config.json";
    std::ofstream(p) << R"({"vocab_size": 100, "hidden_size": 64, "intermediate_size": 128,
      "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
      "architectures": ["LlamaForCausalLM"], "max_position_embeddings": 4096,
      "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                       "high_freq_factor": 4.0)"
                     << (omp.empty() ? "" : ", \"original_max_position_embeddings\": " + omp)
                     << "}}";
    return p;
  }
  std::string error_of(const fs::path& p) {
    try {
      load_model_config(p);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
};

TEST_F(ModelConfigFile, Llama3OriginalPositionsAreAnIntegerInRange) {
  EXPECT_EQ(load_model_config(write("8192")).rope.original_max_position_embeddings, 8192);
  // Absent: the model's own max_position_embeddings.
  EXPECT_EQ(load_model_config(write("")).rope.original_max_position_embeddings, 4096);
  // Found by fuzzing: a double past INT_MAX was converted to int (undefined behaviour).
  const fs::path huge = write("8100000000000092");
  EXPECT_EQ(error_of(huge), huge.string() +
                                ": 'original_max_position_embeddings' = 8100000000000092 is out "
                                "of range");
  const fs::path frac = write("8192.5");
  EXPECT_EQ(error_of(frac), frac.string() +
                                ": 'original_max_position_embeddings' must be an integer, got "
                                "8192.5");
  EXPECT_NE(error_of(write("-1")).find("is out of range"), std::string::npos);
}

}  // namespace
}  // namespace kvarn
