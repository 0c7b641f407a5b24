// The runner's GPU paged KV cache (KvPlacement::kDevice) against the host cache of the same
// method on the same CUDA model (the fixture Qwen3, head_dim 128, GQA 4/2) over real held-out
// text: pseudo-decode blocks and teacher-forced decode steps.
//
// Tolerances: the GPU path stores K/V in fp16 before quantizing (the host quantizes the fp32
// rows; both round the rotated rows to fp16, so a code flips only where the two roundings of a
// rotated value differ), feeds fp16 queries to tensor cores with fp32 accumulation and writes an
// fp16 output, and under kExact the chunk sees its own K/V in fp16 instead of fp32. Each is a
// ~2^-11 relative perturbation; over 8 layers the logits move by ~1e-3 (fp16) and by a little
// more where a flipped code adds a quantization step (KVarN). Bounds: fp16 5e-3, KVarN 2e-2
// relative (Frobenius), and the GPU-vs-host difference must be smaller than the method's own
// error against the exact fp16 cache: the GPU cache is the same quantizer, not a different one.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cuda_load.hpp"
#include "kvarn/data/error.hpp"
#include "kvarn/data/tile_file.hpp"
#include "kvarn/runner/kv_cache.hpp"
#include "kvarn/runner/model.hpp"

namespace kvarn {
namespace {

std::filesystem::path fixture_dir() {
  return std::filesystem::path(KVARN_SOURCE_DIR) / "data/models/fixture-qwen3-h128";
}

// Real text: the 480 token ids of fixture_heldout.h5's first sequence (the fixture's tokenizer).
std::vector<std::int32_t> heldout_tokens() {
  const TileReader r(std::filesystem::path(KVARN_SOURCE_DIR) / "data/tiles/fixture_heldout.h5");
  return r.token_ids(0);
}

// The fixture on CUDA: a skip without a device (the GPU KV cache needs one), a failure otherwise.
#define KVARN_CUDA_MODEL(var) KVARN_CUDA_MODEL_OR_SKIP(var, fixture_dir())

double rel(const Matrix& a, const Matrix& b) { return (a - b).norm() / std::max(1e-30f, b.norm()); }

void append_rows(Matrix& all, const Matrix& rows) {
  all.conservativeResize(all.rows() + rows.rows(), rows.cols());
  all.bottomRows(rows.rows()) = rows;
}

// Pseudo-decode (blocks of `block`, logits of every token), then `steps` teacher-forced decode
// steps; returns [context + steps, vocab] logits.
Matrix run(const Model& m, ModelKvCache& cache, std::span<const std::int32_t> tokens, int context,
           int block, ChunkAttention mode) {
  Matrix all(0, 0);
  ForwardOptions fo;
  fo.logits = LogitsMode::kAll;
  fo.chunk_attention = mode;
  for (int s = 0; s < context; s += block) {
    const int len = std::min(block, context - s);
    append_rows(all, m.forward(cache, tokens.subspan(s, len), fo).logits);
  }
  for (std::size_t t = context; t < tokens.size(); ++t) {
    append_rows(all, m.forward(cache, tokens.subspan(t, 1), fo).logits);
  }
  return all;
}

int argmax_agreement(const Matrix& a, const Matrix& b) {
  int same = 0;
  for (Eigen::Index r = 0; r < a.rows(); ++r) {
    Eigen::Index ia = 0, ib = 0;
    a.row(r).maxCoeff(&ia);
    b.row(r).maxCoeff(&ib);
    same += ia == ib;
  }
  return same;
}

struct GpuCase {
  std::string spec;
  ChunkAttention mode;
  int block;
  double tolerance;
};

class GpuCache : public ::testing::TestWithParam<GpuCase> {};

TEST_P(GpuCache, MatchesHostCacheOnTheSameDevice) {
  KVARN_CUDA_MODEL(model);
  const GpuCase c = GetParam();
  const auto all_tokens = heldout_tokens();
  const int context = 400, steps = 48;
  const std::span<const std::int32_t> tokens(all_tokens.data(), context + steps);

  auto gpu = model->make_cache(c.spec);  // kAuto: the GPU paged cache on a CUDA model
  auto host = model->make_cache(c.spec);
  host.set_placement(KvPlacement::kHost);
  auto exact = model->make_cache("exact_fp16");
  const Matrix lg = run(*model, gpu, tokens, context, c.block, c.mode);
  const Matrix lh = run(*model, host, tokens, context, c.block, c.mode);
  const Matrix le = run(*model, exact, tokens, context, c.block, c.mode);
  ASSERT_TRUE(gpu.on_device()) << gpu.placement_note();
  ASSERT_FALSE(host.on_device());
  EXPECT_NE(gpu.placement_note().find("GPU paged cache"), std::string::npos);
  ASSERT_TRUE(lg.allFinite());

  const double e_gpu = rel(lg, lh), e_method = rel(lh, le);
  const int agree = argmax_agreement(lg.bottomRows(steps), lh.bottomRows(steps));
  std::printf(
      "[ gpu cache ] %-16s %s block %3d: GPU vs host logits rel %.2e (method vs exact "
      "fp16 %.2e), decode argmax %d/%d\n",
      c.spec.c_str(), c.mode == ChunkAttention::kExact ? "kExact" : "kCache", c.block, e_gpu,
      e_method, agree, steps);
  EXPECT_LE(e_gpu, c.tolerance) << c.spec;
  if (c.spec != "fp16") {
    EXPECT_LT(e_gpu, e_method) << c.spec;
  }
  EXPECT_GE(agree, steps * 9 / 10) << c.spec;

  // Same policy and bytes as the host cache: the GPU seals exactly the tokens the CPU quantized.
  EXPECT_EQ(gpu.size(), host.size());
  EXPECT_EQ(gpu.stored_bytes(), host.stored_bytes());
  const auto& g = model->config();
  for (int l = 0; l < g.num_layers; l += 3)
    for (int h = 0; h < g.num_kv_heads; ++h)
      for (int t = 0; t < gpu.size(); ++t)
        ASSERT_EQ(gpu.quantized(l, h, StreamKind::kKey, t),
                  host.quantized(l, h, StreamKind::kKey, t))
            << c.spec << " layer " << l << " head " << h << " token " << t;
  EXPECT_THROW(gpu.keys(0, 0), Error);  // host rows do not exist
  EXPECT_THROW(gpu.set_placement(KvPlacement::kHost), Error);
}

INSTANTIATE_TEST_SUITE_P(
    Fixture, GpuCache,
    ::testing::Values(GpuCase{"kvarn_k4v2_g64", ChunkAttention::kExact, 64, 2e-2},
                      GpuCase{"kvarn_k4v2_g128", ChunkAttention::kExact, 100, 2e-2},
                      GpuCase{"kvarn_k4v4_g64", ChunkAttention::kCache, 32, 2e-2},
                      GpuCase{"fp16", ChunkAttention::kExact, 64, 5e-3}),
    [](const auto& info) {
      std::string n =
          info.param.spec + (info.param.mode == ChunkAttention::kExact ? "_exact" : "_cache");
      return n;
    });

// Placement decisions that need no device: a CPU model keeps every cache on the host; the support
// reasons name what the GPU lacks.
TEST(GpuCachePlacement, CpuModelKeepsTheHostCache) {
  const auto model = Model::load(fixture_dir());
  const std::int32_t tok[2] = {5, 6};
  auto c = model->make_cache("kvarn_k4v2_g64");
  EXPECT_EQ(c.placement(), KvPlacement::kAuto);
  EXPECT_TRUE(c.placement_note().empty());
  model->forward(c, tok);
  EXPECT_FALSE(c.on_device());
  EXPECT_EQ(c.placement(), KvPlacement::kHost);
  EXPECT_NE(c.placement_note().find("model on cpu"), std::string::npos) << c.placement_note();
  EXPECT_EQ(c.keys(0, 0).rows(), 2);
  EXPECT_THROW(c.set_placement(KvPlacement::kDevice), Error);  // decided
  auto forced = model->make_cache("kvarn_k4v2_g64");
  forced.set_placement(KvPlacement::kDevice);
  EXPECT_THROW(model->forward(forced, tok), Error);
  EXPECT_NE(model->make_cache("kivi_2bit").device_unsupported().find("kivi"), std::string::npos);
  EXPECT_NE(model->make_cache("exact").device_unsupported(), "");
#if KVARN_RUNNER_GPU_CACHE
  EXPECT_EQ(model->make_cache("kvarn_k4v2_g64").device_unsupported(), "");
  EXPECT_EQ(model->make_cache("fp16").device_unsupported(), "");
  EXPECT_NE(model->make_cache("kvarn:k=4,v=2,g=64,sink=3").device_unsupported().find("sink 3"),
            std::string::npos);
#else
  EXPECT_NE(model->make_cache("fp16").device_unsupported().find("without kvarn_cuda"),
            std::string::npos);
#endif
}

// Unsupported methods stay on the host (noted); placement kDevice makes that an error.
TEST(GpuCachePlacement, UnsupportedMethodsStayOnTheHost) {
  KVARN_CUDA_MODEL(model);
  const std::int32_t tok[3] = {5, 6, 7};
  for (const std::string spec : {"kivi_2bit", "kvarn:k=4,v=2,g=128,sink=5", "exact"}) {
    auto c = model->make_cache(spec);
    model->forward(c, tok);
    EXPECT_FALSE(c.on_device()) << spec;
    EXPECT_NE(c.placement_note().find("host cache"), std::string::npos) << c.placement_note();
    EXPECT_EQ(c.keys(0, 0).rows(), 3) << spec;
  }
  auto forced = model->make_cache("kivi_2bit");
  forced.set_placement(KvPlacement::kDevice);
  EXPECT_THROW(model->forward(forced, tok), Error);
}

// Host rows appended into a GPU cache (the static protocol) equal a host cache's state.
TEST(GpuCachePlacement, HostAppendIntoGpuCache) {
  KVARN_CUDA_MODEL(model);
  const auto tokens = heldout_tokens();
  const std::span<const std::int32_t> ctx(tokens.data(), 200);
  auto exact = model->make_cache("exact");
  model->forward(exact, ctx);
  auto gpu = model->make_cache("kvarn_k4v2_g64");
  gpu.set_placement(KvPlacement::kDevice);
  gpu.bind_device(-1);
  auto host = model->make_cache("kvarn_k4v2_g64");
  const auto& g = model->config();
  for (int l = 0; l < g.num_layers; ++l) {
    std::vector<float> k, v;
    for (int h = 0; h < g.num_kv_heads; ++h) {
      const MatrixMap km = exact.keys(l, h), vm = exact.values(l, h);
      k.insert(k.end(), km.data(), km.data() + km.size());
      v.insert(v.end(), vm.data(), vm.data() + vm.size());
    }
    gpu.append(l, k.data(), v.data(), 200);
    host.append(l, k.data(), v.data(), 200);
  }
  EXPECT_EQ(gpu.size(), 200);
  EXPECT_EQ(gpu.stored_bytes(), host.stored_bytes());
  const std::int32_t next = tokens[200];
  ForwardOptions fo;
  const Matrix a = model->forward(gpu, std::span(&next, 1), fo).logits;
  const Matrix b = model->forward(host, std::span(&next, 1), fo).logits;
  EXPECT_LE(rel(a, b), 2e-2);
}

// Decode-step latency (printed; the H200 script shows it): GPU cache vs host cache + mirror.
TEST(GpuCacheTiming, DecodeStepLatency) {
  KVARN_CUDA_MODEL(model);
  const auto tokens = heldout_tokens();
  std::vector<std::int32_t> long_ctx;
  while (static_cast<int>(long_ctx.size()) < 1000)
    long_ctx.insert(long_ctx.end(), tokens.begin(), tokens.end());
  for (int ctx : {128, 512, 960}) {
    double ms[2] = {0, 0};
    for (int which = 0; which < 2; ++which) {
      auto c = model->make_cache("kvarn_k4v2_g64");
      if (which == 1) c.set_placement(KvPlacement::kHost);
      model->prefill(c, std::span<const std::int32_t>(long_ctx.data(), ctx));
      ASSERT_EQ(c.on_device(), which == 0);
      const int warm = 3, steps = 32;
      for (int s = 0; s < warm; ++s) model->decode_step(c, long_ctx[ctx + s]);
      const auto t0 = std::chrono::steady_clock::now();
      for (int s = 0; s < steps; ++s) {
        const auto lg = model->decode_step(c, long_ctx[ctx + warm + s]);  // logits: synchronizes
        ASSERT_TRUE(std::isfinite(lg[0]));
      }
      ms[which] =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() /
          steps;
    }
    std::printf(
        "[ timing ] kvarn_k4v2_g64 decode step at context %4d: GPU cache %.3f ms, host "
        "cache + mirror %.3f ms (x%.1f)\n",
        ctx, ms[0], ms[1], ms[1] / ms[0]);
  }
}

}  // namespace
}  // namespace kvarn
