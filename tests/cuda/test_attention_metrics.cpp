// kvarn::cuda::attention_rows: argument errors, host vs device inputs, the KL-only pass. The
// comparison with the CPU reference is in tests/eval/test_attention_gpu.cpp.
#include "kvarn/cuda/attention_metrics.hpp"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "cuda_test_util.hpp"
#include "kvarn/core/rng.hpp"
#include "kvarn/data/error.hpp"

namespace kvarn {
namespace {

struct Arrays {
  std::vector<std::vector<float>> q, k, v, kh, vh;
};

Arrays make_arrays(int hq, int hkv, int t, int tq, int d, std::uint64_t seed) {
  Rng rng(seed);
  auto fill = [&](std::size_t n, double noise_of, const std::vector<float>* base) {
    std::vector<float> x(n);
    for (std::size_t i = 0; i < n; ++i)
      x[i] = static_cast<float>((base ? (*base)[i] : 0.0) + noise_of * rng.normal());
    return x;
  };
  Arrays a;
  for (int h = 0; h < hq; ++h) a.q.push_back(fill(static_cast<std::size_t>(tq) * d, 1.0, nullptr));
  for (int g = 0; g < hkv; ++g) {
    a.k.push_back(fill(static_cast<std::size_t>(t) * d, 1.0, nullptr));
    a.v.push_back(fill(static_cast<std::size_t>(t) * d, 1.0, nullptr));
    a.kh.push_back(fill(a.k.back().size(), 0.1, &a.k.back()));
    a.vh.push_back(fill(a.v.back().size(), 0.1, &a.v.back()));
  }
  return a;
}

cuda::AttentionRowsInput host_input(const Arrays& a) {
  cuda::AttentionRowsInput in;
  for (const auto& x : a.q) in.q.push_back(x.data());
  for (std::size_t g = 0; g < a.k.size(); ++g) {
    in.k.push_back(a.k[g].data());
    in.v.push_back(a.v[g].data());
    in.k_hat.push_back(a.kh[g].data());
    in.v_hat.push_back(a.vh[g].data());
  }
  return in;
}

cuda::AttentionRowsProblem problem(int hq, int hkv, int t, int tq, int d) {
  cuda::AttentionRowsProblem p;
  p.q_heads = hq;
  p.kv_heads = hkv;
  p.tokens = t;
  p.queries = tq;
  p.head_dim = d;
  p.topk = {1, 8, 32};
  return p;
}

void expect_error(const cuda::AttentionRowsProblem& p, const cuda::AttentionRowsInput& in,
                  const std::string& part) {
  try {
    cuda::attention_rows(p, in);
    ADD_FAILURE() << "expected kvarn::Error containing '" << part << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST(AttentionRows, BadArgumentsAreErrors) {
  const Arrays a = make_arrays(4, 2, 40, 40, 16, 1);
  const cuda::AttentionRowsInput in = host_input(a);
  auto p = problem(4, 2, 40, 40, 16);
  p.kv_heads = 3;
  expect_error(p, in, "not a multiple of 3 KV heads");
  p = problem(4, 2, 40, 41, 16);
  expect_error(p, in, "41 queries from position");
  p = problem(4, 2, 40, 40, 16);
  p.topk = {1, 0};
  expect_error(p, in, "top-k 0");
  p = problem(4, 2, 40, 40, cuda::kAttentionMaxHeadDim + 1);
  expect_error(p, in, "head_dim");
  p = problem(4, 2, 40, 40, 16);
  cuda::AttentionRowsInput missing = in;
  missing.v_hat[1] = nullptr;
  expect_error(p, missing, "v_hat head 1 is null");
  missing.q.pop_back();
  expect_error(p, missing, "3 q heads, expected 4");
}

TEST(AttentionRows, NoDeviceIsAnError) {
  if (cuda::device_count() > 0) GTEST_SKIP() << "a CUDA device is present";
  const Arrays a = make_arrays(2, 1, 20, 20, 8, 2);
  expect_error(problem(2, 1, 20, 20, 8), host_input(a), "no CUDA device");
}

TEST(AttentionRows, DeviceInputsGiveTheHostInputsBits) {
  KVARN_REQUIRE_GPU();
  const int hq = 4, hkv = 2, t = 300, tq = 120, d = 64;
  const Arrays a = make_arrays(hq, hkv, t, tq, d, 3);
  const auto p = problem(hq, hkv, t, tq, d);
  const cuda::AttentionRows from_host = cuda::attention_rows(p, host_input(a));

  std::vector<std::unique_ptr<DeviceBuffer<float>>> bufs;
  cuda::AttentionRowsInput dev;
  dev.on_device = true;
  auto up = [&](const std::vector<float>& x) {
    bufs.push_back(std::make_unique<DeviceBuffer<float>>(x));
    return static_cast<const float*>(bufs.back()->get());
  };
  for (const auto& x : a.q) dev.q.push_back(up(x));
  for (int g = 0; g < hkv; ++g) {
    dev.k.push_back(up(a.k[g]));
    dev.v.push_back(up(a.v[g]));
    dev.k_hat.push_back(up(a.kh[g]));
    dev.v_hat.push_back(up(a.vh[g]));
  }
  const cuda::AttentionRows from_dev = cuda::attention_rows(p, dev);
  ASSERT_EQ(from_host.kl.size(), static_cast<std::size_t>(hq * tq));
  EXPECT_EQ(from_dev.kl, from_host.kl);
  EXPECT_EQ(from_dev.js, from_host.js);
  EXPECT_EQ(from_dev.logit_mae, from_host.logit_mae);
  EXPECT_EQ(from_dev.logit_rmse, from_host.logit_rmse);
  EXPECT_EQ(from_dev.output_nmse, from_host.output_nmse);
  EXPECT_EQ(from_dev.topk_overlap, from_host.topk_overlap);
  double kl_sum = 0;
  for (double x : from_host.kl) kl_sum += x;
  EXPECT_GT(kl_sum, 0.0);

  // KL only (outlier importance): the same KL bits, nothing else, no values needed.
  auto pk = p;
  pk.kl_only = true;
  cuda::AttentionRowsInput kin = host_input(a);
  kin.v.clear();
  kin.v_hat.clear();
  const cuda::AttentionRows kl_only = cuda::attention_rows(pk, kin);
  EXPECT_EQ(kl_only.kl, from_host.kl);
  EXPECT_TRUE(kl_only.js.empty());
  EXPECT_TRUE(kl_only.topk_overlap.empty());
}

}  // namespace
}  // namespace kvarn
