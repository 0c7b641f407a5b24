#include "kvarn/core/registry.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <utility>

#include "test_util.hpp"

namespace kvarn {
namespace {

std::string error_of(const std::string& spec) {
  try {
    make_method(spec);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(Registry, EveryPresetBuildsAndItsSpecRoundTrips) {
  ASSERT_FALSE(Registry::instance().presets().empty());
  for (const auto& p : Registry::instance().presets()) {
    auto m = make_method(p.name);
    ASSERT_TRUE(m) << p.name;
    auto again = make_method(m->spec());
    EXPECT_EQ(again->spec(), m->spec()) << p.name;
    EXPECT_EQ(again->name(), m->name()) << p.name;
  }
}

TEST(Registry, KvarnPresetsAndPatternNames) {
  for (const char* n : {"kvarn_k4v2_g128", "kvarn_k4v4_g128", "kvarn_k4v2_g64", "kvarn_k4v4_g64"})
    EXPECT_EQ(make_method(n)->name(), n);
  EXPECT_EQ(make_method("kvarn_k3v2_g32")->name(), "kvarn_k3v2_g32");
  EXPECT_EQ(make_method("kvarn:k=4,v=2,g=128")->name(), "kvarn_k4v2_g128");
  auto m = make_method("kvarn:k=3,v=2,g=64,iters=16,rotation=none");
  EXPECT_EQ(m->spec(), "kvarn:k=3,v=2,g=64,iters=16,rotation=none,scales=fp16,sink=64");
}

TEST(Registry, UnknownNamesAndParametersListNearestValid) {
  std::string e = error_of("kvarn_k4v2_g128x");
  EXPECT_NE(e.find("nearest valid"), std::string::npos) << e;
  EXPECT_NE(e.find("kvarn_k4v2_g128"), std::string::npos) << e;
  e = error_of("kvarn:k=4,iter=3");
  EXPECT_NE(e.find("unknown parameter 'iter'"), std::string::npos) << e;
  EXPECT_NE(e.find("iters"), std::string::npos) << e;
  EXPECT_NE(error_of("kvarn:k=9").find("1..8"), std::string::npos);
  EXPECT_NE(error_of("kvarn:g=100").find("group"), std::string::npos);
  EXPECT_NE(error_of("kvarn:k=four").find("not a valid integer"), std::string::npos);
  EXPECT_NE(error_of("kvarn:k=4,k=2").find("twice"), std::string::npos);
  EXPECT_NE(error_of("nosuch").find("unknown method"), std::string::npos);
  EXPECT_FALSE(error_of("").empty());
}

TEST(Registry, Fp16IsExactAndCosts512BytesPerToken) {
  auto m = make_method("fp16");
  EXPECT_DOUBLE_EQ(m->accounting(128).bytes_per_token(), 512.0);
  Matrix k = testing::random_kv(50, 128, 1), v = testing::random_kv(50, 128, 2);
  auto r = quantize_sequence(*m, k, v);
  EXPECT_EQ(r.k_hat, k);
  EXPECT_EQ(r.v_hat, v);
  EXPECT_EQ(r.stored_bytes, 50u * 512u);
  EXPECT_EQ(r.stored_bytes, m->sequence_bytes(50, 128));
}

// Every registered method, on several lengths: measured stored bytes equal accounted bytes and
// the reconstruction is finite.
TEST(Registry, EveryMethodStoresExactlyItsAccountedBytes) {
  for (const auto& p : Registry::instance().presets()) {
    auto m = make_method(p.name);
    for (int d : {64, 128}) {
      for (int t : {1, 33, 128, 300}) {
        Matrix k = testing::random_kv(t, d, t * 3 + d), v = testing::random_kv(t, d, t, false);
        LayerContext layer{5, 12};
        auto r = quantize_sequence(*m, k, v, layer);
        ASSERT_EQ(r.stored_bytes, m->sequence_bytes(t, d, layer)) << p.name << " T=" << t << " D=" << d;
        ASSERT_TRUE(r.k_hat.allFinite() && r.v_hat.allFinite()) << p.name;
      }
    }
  }
}

// Rows the caller has checked (FiniteRows::kKnown) build the same cache, bit for bit; unchecked
// rows with a NaN are an error naming the token and channel.
TEST(Registry, KnownFiniteRowsGiveTheSameCacheAndCheckedRowsRejectNan) {
  for (const auto& p : Registry::instance().presets()) {
    auto m = make_method(p.name);
    const Matrix k = testing::random_kv(300, 128, 7), v = testing::random_kv(300, 128, 8, false);
    const LayerContext layer{5, 12};
    const auto checked = sequence_cache(*m, k, v, layer, "test");
    const auto known = sequence_cache(*m, k, v, layer, "test", FiniteRows::kKnown);
    ASSERT_EQ(checked->stored_bytes(), known->stored_bytes()) << p.name;
    for (const auto& [a, b] :
         {std::pair{checked->keys(), known->keys()}, std::pair{checked->values(), known->values()}})
      ASSERT_EQ(0, std::memcmp(a.data(), b.data(), sizeof(float) * a.size())) << p.name;
    Matrix bad = v;
    bad(130, 9) = std::numeric_limits<float>::quiet_NaN();
    try {
      sequence_cache(*m, k, bad, layer, "test");
      FAIL() << p.name << ": NaN accepted";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("values appended at token 0: non-finite value nan at "
                                           "row 130, column 9"),
                std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace kvarn
