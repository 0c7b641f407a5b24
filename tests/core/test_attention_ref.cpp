// The CPU attention reference against closed forms: uniform attention (equal keys) gives the mean
// of the visible values (causal), GQA maps query heads to KV heads in groups, a dominant key picks
// its value row, and gather_paged follows the block table.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kvarn/core/attention_ref.hpp"

namespace kvarn {
namespace {

TEST(AttentionRef, EqualKeysGiveTheCausalMeanOfValuesPerKvHead) {
  const int d = 4, len = 6, nq = 3, hq = 4, hkv = 2;
  std::vector<KvRows> kv(hkv);
  for (int h = 0; h < hkv; ++h) {
    kv[h].len = len;
    kv[h].k.assign(len * d, 0.5f);
    for (int t = 0; t < len; ++t)
      for (int x = 0; x < d; ++x) kv[h].v.push_back(static_cast<float>(10 * h + t + 0.1 * x));
  }
  std::vector<float> q(nq * hq * d), out(q.size());
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = std::sin(static_cast<float>(i));
  attention_ref(q.data(), nq, hq, d, kv, 0.0, out.data());
  for (int i = 0; i < nq; ++i)
    for (int hh = 0; hh < hq; ++hh) {
      const int h = hh / (hq / hkv), visible = len - nq + i + 1;
      for (int x = 0; x < d; ++x) {
        const double mean = 10 * h + (visible - 1) / 2.0 + 0.1 * x;
        EXPECT_NEAR(out[(i * hq + hh) * d + x], mean, 1e-5) << i << " " << hh << " " << x;
      }
    }
}

TEST(AttentionRef, DominantKeySelectsItsValue) {
  const int d = 2, len = 5;
  std::vector<KvRows> kv(1);
  kv[0].len = len;
  for (int t = 0; t < len; ++t) {
    kv[0].k.insert(kv[0].k.end(), {t == 3 ? 1.0f : 0.0f, 0.0f});
    kv[0].v.insert(kv[0].v.end(), {static_cast<float>(t), -static_cast<float>(t)});
  }
  const std::vector<float> q = {400.0f, 0.0f};
  std::vector<float> out(2);
  attention_ref(q.data(), 1, 1, d, kv, 1.0, out.data());
  EXPECT_NEAR(out[0], 3.0, 1e-6);
  EXPECT_NEAR(out[1], -3.0, 1e-6);
}

TEST(AttentionRef, RejectsBadShapes) {
  std::vector<KvRows> kv(3);
  std::vector<float> q(4 * 2), out(q.size());
  EXPECT_THROW(attention_ref(q.data(), 1, 4, 2, kv, 0.0, out.data()), std::exception);
  kv.resize(1);  // 0 tokens for 1 query
  EXPECT_THROW(attention_ref(q.data(), 1, 4, 2, kv, 0.0, out.data()), std::exception);
}

TEST(AttentionRef, GatherPagedFollowsTheBlockTable) {
  const int g = 2, d = 1, len = 5;
  const std::vector<int> table = {7, 2, 9};
  const KvRows r = gather_paged(table.data(), len, g, d, 3, [](int phys, int h, float* k, float* v) {
    for (int t = 0; t < g; ++t) {
      k[t] = static_cast<float>(phys * 10 + t);
      v[t] = static_cast<float>(h);
    }
  });
  ASSERT_EQ(r.len, len);
  EXPECT_EQ(r.k, (std::vector<float>{70, 71, 20, 21, 90}));
  EXPECT_EQ(r.v, (std::vector<float>(len, 3.0f)));
}

}  // namespace
}  // namespace kvarn
