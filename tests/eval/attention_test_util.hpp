// Random attention layers shared by the CPU and GPU attention tests.
#ifndef KVARN_TESTS_EVAL_ATTENTION_TEST_UTIL_HPP_
#define KVARN_TESTS_EVAL_ATTENTION_TEST_UTIL_HPP_

#include <cstdint>
#include <vector>

#include "test_util.hpp"

namespace kvarn::testing {

struct AttentionLayer {
  std::vector<Matrix> q, k, v, kh, vh;
};

// Hq query heads of Tq rows over Hkv KV heads of T tokens; reconstruction = exact + noise.
inline AttentionLayer make_attention_layer(int hq, int hkv, int t, int tq, int d, double noise,
                                           std::uint64_t seed) {
  AttentionLayer l;
  for (int h = 0; h < hq; ++h) l.q.push_back(random_kv(tq, d, seed + 100 + h, false, 0.7f));
  for (int g = 0; g < hkv; ++g) {
    l.k.push_back(random_kv(t, d, seed + 200 + g, true, 0.3f));
    l.v.push_back(random_kv(t, d, seed + 300 + g, false));
    l.kh.push_back(noise > 0 ? add_noise(l.k[g], noise, seed + 400 + g) : l.k[g]);
    l.vh.push_back(noise > 0 ? add_noise(l.v[g], noise, seed + 500 + g) : l.v[g]);
  }
  return l;
}

}  // namespace kvarn::testing

#endif  // KVARN_TESTS_EVAL_ATTENTION_TEST_UTIL_HPP_
