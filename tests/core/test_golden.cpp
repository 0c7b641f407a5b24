// Golden files: every preset of the registry must reproduce the stored bytes and reconstruction
// hashes committed in tests/golden/*.json (golden_cases.hpp). Any change of numerics shows up in
// review as a diff of those files. This test only compares; scripts/update_goldens.sh rewrites
// the goldens when a change is intended.
#include <gtest/gtest.h>

#include <fstream>

#include "golden_cases.hpp"

namespace kvarn {
namespace {

using golden::json;

json read_json(const std::string& path) {
  std::ifstream is(path);
  if (!is.good()) {
    ADD_FAILURE() << path << " missing (scripts/update_goldens.sh writes it)";
    return nullptr;
  }
  return json::parse(is);
}

TEST(Golden, InputsAreTheCommittedOnes) {
  Matrix k, v;
  golden::make_inputs(&k, &v);
  const json in = read_json(golden::input_path());
  ASSERT_FALSE(in.is_null());
  EXPECT_EQ(in, golden::inputs_json(k, v)) << "the golden inputs no longer match random_kv";
}

TEST(Golden, EveryPresetReproducesItsStoredBytes) {
  const json in = read_json(golden::input_path());
  ASSERT_FALSE(in.is_null());
  const Matrix k = golden::from_bits(in["k_fp16_bits"].get<std::vector<std::uint16_t>>(),
                                     golden::kTokens, golden::kHeadDim);
  const Matrix v = golden::from_bits(in["v_fp16_bits"].get<std::vector<std::uint16_t>>(),
                                     golden::kTokens, golden::kHeadDim);
  int checked = 0;
  for (const auto& preset : Registry::instance().presets()) {
    const json want = read_json(golden::golden_name(preset.name));
    if (want.is_null()) continue;
    const json got = golden::preset_json(preset.name, k, v);
    EXPECT_EQ(got["spec"], want["spec"]) << preset.name;
    EXPECT_EQ(got["stored_bytes"], want["stored_bytes"]) << preset.name;
    EXPECT_EQ(got["k_chunks"], want["k_chunks"]) << preset.name << ": stored K bytes changed";
    EXPECT_EQ(got["v_chunks"], want["v_chunks"]) << preset.name << ": stored V bytes changed";
    EXPECT_EQ(got["k_hat_fnv1a"], want["k_hat_fnv1a"])
        << preset.name << ": K reconstruction changed";
    EXPECT_EQ(got["v_hat_fnv1a"], want["v_hat_fnv1a"])
        << preset.name << ": V reconstruction changed";
    ++checked;
  }
  EXPECT_GE(checked, 4);
}

}  // namespace
}  // namespace kvarn
