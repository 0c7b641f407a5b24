// PagedCache (GPU-resident paged cache) against core's CPU cache of the same method: the
// attention of fp16 queries over the CPU reconstruction (double accumulation) must match the
// fused decode over the GPU records/pool, NMSE <= 1e-5 (the kernel's fp16 operands and output);
// quantized flags and byte counts must agree exactly.
#include "kvarn/core/attention_ref.hpp"
#include "kvarn/cuda/paged_cache.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "cuda_test_util.hpp"
#include "kvarn/core/portable_math.hpp"
#include "kvarn/core/registry.hpp"
#include "kvarn/core/rng.hpp"
#include "kvarn/data/error.hpp"
#include "kvarn/data/tile_file.hpp"

namespace kvarn {
namespace {

using cuda::CacheFormat;
using cuda::PagedCache;
using cuda::PagedCacheConfig;

// Rows of one sequence: per KV head [T, D] fp16-rounded floats, queries per KV head [T, D].
struct Source {
  int d = 0, hkv = 0, qpk = 1, tokens = 0;
  std::vector<Matrix> k, v, q;  // q: [hkv * qpk] of [T, D]
};

Source random_source(int d, int hkv, int qpk, int tokens, std::uint64_t seed) {
  Rng rng(seed);
  Source s{d, hkv, qpk, tokens, {}, {}, {}};
  auto fill = [&](Matrix& m, bool outlier_channels) {
    m.resize(tokens, d);
    std::vector<double> chan(d, 1.0);
    if (outlier_channels)
      for (auto& c : chan) c = std::exp(rng.normal());
    for (int t = 0; t < tokens; ++t)
      for (int x = 0; x < d; ++x)
        m(t, x) = round_to_half(
            static_cast<float>(rng.normal() * chan[x] + (outlier_channels ? 0.3 : 0)));
  };
  for (int h = 0; h < hkv; ++h) {
    s.k.emplace_back();
    s.v.emplace_back();
    fill(s.k.back(), true);
    fill(s.v.back(), false);
    for (int r = 0; r < qpk; ++r) {
      s.q.emplace_back();
      fill(s.q.back(), false);
    }
  }
  return s;
}

// Real KV of one captured layer; the captured query heads are one per GQA group (qpk 1).
Source file_source(const std::string& file, int layer_index) {
  const TileReader r(std::filesystem::path(KVARN_SOURCE_DIR) / "data/tiles" / file);
  const TileFileInfo& info = r.info();
  const SequenceInfo& seq = r.sequence(0);
  KVARN_CHECK(seq.has_q && static_cast<int>(seq.q_heads.size()) == info.num_kv_heads, file,
              ": expected one query head per KV head");
  Source s{info.head_dim, info.num_kv_heads, 1, seq.num_tokens, {}, {}, {}};
  for (int h = 0; h < info.num_kv_heads; ++h) {
    s.k.push_back(r.read(0, "k", layer_index, h));
    s.v.push_back(r.read(0, "v", layer_index, h));
    s.q.push_back(r.read(0, "q", layer_index, h));  // stored fp16: exact in fp16
  }
  return s;
}

struct Case {
  std::string name, spec;
  std::string file;  // "" = random
  int layer_index = 0;
  int d = 128, hkv = 2, qpk = 2;
  std::vector<int> chunks;  // tokens per append
  bool staged = false;      // stage, attend, commit (ChunkAttention::kExact) instead of append
};

double attention_nmse(const std::vector<std::uint16_t>& got, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double g = half_bits_to_float(got[i]), e = g - ref[i];
    num += std::isfinite(g) ? e * e : 1e30;
    den += double(ref[i]) * ref[i];
  }
  return num / std::max(den, 1e-30);
}

class PagedCacheVsCpu : public ::testing::TestWithParam<Case> {};

TEST_P(PagedCacheVsCpu, AttentionMatchesCpuCache) {
  KVARN_REQUIRE_GPU();
  const Case c = GetParam();
  int total = 0;
  for (int n : c.chunks) total += n;
  const Source src = c.file.empty() ? random_source(c.d, c.hkv, c.qpk, total, 17)
                                    : file_source(c.file, c.layer_index);
  ASSERT_LE(total, src.tokens);
  const int d = src.d, hkv = src.hkv, hq = hkv * src.qpk;
  const auto method = make_method(c.spec);
  PagedCacheConfig pc;
  std::string why;
  ASSERT_TRUE(cuda::paged_cache_config_of(*method, hkv, d, &pc, &why)) << why;
  PagedCache gpu(pc);
  std::vector<std::unique_ptr<KvCache>> cpu;
  std::vector<std::unique_ptr<StreamCodec>> keep_k, keep_v;  // the fp16 pool's transform
  for (int h = 0; h < hkv; ++h) {
    cpu.push_back(method->make_cache(d));
    keep_k.push_back(method->make_codec(StreamKind::kKey, d, {}));
    keep_v.push_back(method->make_codec(StreamKind::kValue, d, {}));
  }
  Rng pick(99);
  int p0 = 0, checks = 0;
  double worst = 0;
  for (int n : c.chunks) {
    // head-major fp16 rows of the chunk, and the same rows as floats for the CPU cache
    std::vector<std::uint16_t> kh(static_cast<std::size_t>(hkv) * n * d), vh(kh.size());
    for (int h = 0; h < hkv; ++h)
      for (int t = 0; t < n; ++t)
        for (int x = 0; x < d; ++x) {
          const std::size_t i = (static_cast<std::size_t>(h) * n + t) * d + x;
          kh[i] = float_to_half_bits(src.k[h](p0 + t, x));
          vh[i] = float_to_half_bits(src.v[h](p0 + t, x));
        }
    DeviceBuffer<std::uint16_t> dk(kh), dv(vh);
    // Rows attention sees, per head [p0 + n, D]: CPU reconstruction (+ staged chunk rows).
    std::vector<Matrix> ks(hkv), vs(hkv);
    if (c.staged) {
      gpu.stage(dk.get(), dv.get(), n);
      for (int h = 0; h < hkv; ++h) {
        Matrix kk(p0 + n, d), vv(p0 + n, d);
        if (p0) {
          kk.topRows(p0) = cpu[h]->keys();
          vv.topRows(p0) = cpu[h]->values();
        }
        Matrix rk = src.k[h].middleRows(p0, n), rv = src.v[h].middleRows(p0, n);
        keep_k[h]->keep(rk.data(), n, kk.data() + static_cast<std::size_t>(p0) * d);
        keep_v[h]->keep(rv.data(), n, vv.data() + static_cast<std::size_t>(p0) * d);
        ks[h] = kk;
        vs[h] = vv;
      }
    }
    for (int h = 0; h < hkv; ++h) {
      const Matrix rk = src.k[h].middleRows(p0, n), rv = src.v[h].middleRows(p0, n);
      cpu[h]->append(rk.data(), rv.data(), n);
    }
    if (c.staged && pc.format == CacheFormat::kFp8) {  // quantized on arrival: no fp16 stage
      for (int h = 0; h < hkv; ++h) {
        ks[h] = cpu[h]->keys();
        vs[h] = cpu[h]->values();
      }
    }
    if (!c.staged) {
      gpu.append(dk.get(), dv.get(), n);
      for (int h = 0; h < hkv; ++h) {
        ks[h] = cpu[h]->keys();
        vs[h] = cpu[h]->values();
      }
    }
    const int size = p0 + n;
    // Queries: the chunk's first and last positions, up to 6 more inside it, 3 anywhere.
    std::vector<int> pos = {p0, size - 1};
    for (int i = 0; i < 6 && i < n - 2; ++i) pos.push_back(p0 + static_cast<int>(pick.next() % n));
    for (int i = 0; i < 3; ++i) pos.push_back(static_cast<int>(pick.next() % size));
    std::vector<std::uint16_t> q(pos.size() * hq * d);
    std::vector<float> ref(q.size());
    // CPU reference (core's attention_head_ref) over the rows the cache holds
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    std::vector<MatrixD> kd(hkv), vd(hkv);
    for (int h = 0; h < hkv; ++h) {
      kd[h] = ks[h].cast<double>();
      vd[h] = vs[h].cast<double>();
    }
    for (std::size_t i = 0; i < pos.size(); ++i)
      for (int hh = 0; hh < hq; ++hh) {
        const int h = hh / src.qpk;
        const Matrix& qm = src.q[hh];
        const std::size_t o = (i * hq + hh) * d;
        MatrixD qr(1, d);
        for (int x = 0; x < d; ++x) {
          q[o + x] = float_to_half_bits(qm(pos[i], x));
          qr(0, x) = half_bits_to_float(q[o + x]);
        }
        const MatrixD out = attention_head_ref(qr, kd[h], vd[h], pos[i], scale);
        for (int x = 0; x < d; ++x) ref[o + x] = static_cast<float>(out(0, x));
      }
    DeviceBuffer<std::uint16_t> dq(q), dout(q.size());
    dout.fill_bytes(0xFF);  // NaN poison: every output must be written
    gpu.attend(dq.get(), hq, pos, dout.get());
    if (c.staged) gpu.commit();
    KVARN_CUDA_CHECK(cudaDeviceSynchronize());
    const double nmse = attention_nmse(dout.download(), ref);
    worst = std::max(worst, nmse);
    EXPECT_LE(nmse, 1e-5) << c.name << ": chunk ending at " << size;
    ++checks;
    // Policy and bytes: the GPU seals exactly the tokens the CPU cache quantized.
    ASSERT_EQ(gpu.size(), size);
    for (int t = 0; t < size; ++t)
      ASSERT_EQ(gpu.quantized(t), cpu[0]->quantized(StreamKind::kKey, t))
          << c.name << ": token " << t << " of " << size;
    std::size_t cpu_bytes = 0;
    for (const auto& h : cpu) cpu_bytes += h->stored_bytes();
    EXPECT_EQ(gpu.stored_bytes(), cpu_bytes) << c.name << " at " << size;
    p0 = size;
  }
  std::printf("[ nmse ] %s: %d checks, worst %.3e, device bytes %zu\n", c.name.c_str(), checks,
              worst, gpu.device_bytes());
}

std::vector<Case> cases() {
  std::vector<Case> v;
  const std::vector<int> mixed = {1, 1, 37, 90, 1, 128, 300, 5, 1};  // 564 tokens
  v.push_back({"kvarn_k4v2_g128_mixed", "kvarn_k4v2_g128", "", 0, 128, 2, 2, mixed});
  v.push_back({"kvarn_k4v2_g128_staged", "kvarn_k4v2_g128", "", 0, 128, 2, 2, mixed, true});
  v.push_back(
      {"kvarn_k4v2_g64_one_token", "kvarn_k4v2_g64", "", 0, 128, 2, 2, std::vector<int>(200, 1)});
  v.push_back({"kvarn_k4v2_g128_single", "kvarn_k4v2_g128", "", 0, 128, 2, 2, {1}});
  v.push_back({"kvarn_k4v2_g128_sink_only", "kvarn_k4v2_g128", "", 0, 128, 2, 2, {3, 60, 64}});
  v.push_back(
      {"kvarn_g64_sink0", "kvarn:k=4,v=2,g=64,sink=0", "", 0, 128, 2, 4, {63, 1, 1, 64, 100}});
  v.push_back(
      {"kvarn_g32_sink96", "kvarn:k=4,v=4,g=32,sink=96", "", 0, 64, 4, 2, {50, 50, 50, 33}});
  v.push_back({"kvarn_k2v2_g32_d64", "kvarn:k=2,v=2,g=32", "", 0, 64, 3, 3, {70, 1, 31, 1, 64}});
  v.push_back({"kvarn_k8v8_g64", "kvarn:k=8,v=8,g=64", "", 0, 128, 1, 8, {130, 2, 61}});
  v.push_back({"kvarn_k3v2_g128", "kvarn:k=3,v=2,g=128", "", 0, 128, 2, 1, {257, 128, 1}});
  v.push_back({"fp16", "fp16", "", 0, 128, 2, 2, {1, 130, 1, 300}});
  v.push_back({"fp16_staged", "fp16", "", 0, 64, 3, 1, {65, 1, 64}, true});
  v.push_back({"fp8_e4m3", "fp8_e4m3", "", 0, 128, 2, 2, {1, 200, 1, 60}});
  v.push_back(
      {"fp8_scale_staged", "fp8:format=e4m3,scale=0.5", "", 0, 64, 2, 4, {33, 1, 100}, true});
  // Real KV: the fixture model (D 128, GQA group heads) and SmolLM2 (D 64), prefill + decode.
  v.push_back({"fixture_l6_kvarn_k4v2_g128",
               "kvarn_k4v2_g128",
               "fixture_heldout.h5",
               2,
               0,
               0,
               0,
               {300, 1, 1, 50, 127, 1}});
  v.push_back({"fixture_l0_kvarn_k4v4_g64_staged",
               "kvarn_k4v4_g64",
               "fixture_heldout.h5",
               0,
               0,
               0,
               0,
               {200, 1, 64, 100},
               true});
  v.push_back({"smollm2_kvarn_k4v2_g64",
               "kvarn_k4v2_g64",
               "smollm2_long.h5",
               3,
               0,
               0,
               0,
               {1, 127, 1, 200, 439}});
  v.push_back({"smollm2_fp8", "fp8_e4m3", "smollm2_long.h5", 1, 0, 0, 0, {500, 1}});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Cuda, PagedCacheVsCpu, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

// Support decisions need no device: unsupported configs are named, never crash.
TEST(PagedCacheSupport, NamesWhatTheGpuCannotHold) {
  std::string why;
  PagedCacheConfig cfg;
  EXPECT_TRUE(cuda::paged_cache_config_of(*make_method("kvarn_k4v2_g128"), 2, 128, &cfg, &why))
      << why;
  EXPECT_EQ(cfg.format, CacheFormat::kKvarn);
  EXPECT_EQ(cfg.kvarn.group, 128);
  EXPECT_TRUE(cuda::paged_cache_config_of(*make_method("fp16"), 2, 64, &cfg, &why)) << why;
  EXPECT_EQ(cfg.format, CacheFormat::kFp16);
  EXPECT_TRUE(
      cuda::paged_cache_config_of(*make_method("fp8:format=e4m3,scale=0.25"), 2, 64, &cfg, &why));
  EXPECT_EQ(cfg.format, CacheFormat::kFp8);
  EXPECT_FLOAT_EQ(cfg.fp8_scale, 0.25f);
  const std::vector<std::pair<std::string, std::string>> no = {
      {"kvarn:k=4,v=2,g=128,sink=4", "sink 4"},
      {"kvarn:k=4,v=2,g=256", "group 256"},
      {"kvarn:k=4,v=3,g=128", "k4v3"},
      {"kvarn:k=4,v=2,g=128,quantile=0.01", "quantile"},
      {"fp8:format=e5m2", "e5m2"},
      {"fp8:format=e4m3,scale=calibrated", "calibrated"},
      {"kivi_2bit", "kivi"},
  };
  for (const auto& [spec, expect] : no) {
    EXPECT_FALSE(cuda::paged_cache_config_of(*make_method(spec), 2, 128, &cfg, &why)) << spec;
    EXPECT_NE(why.find(expect), std::string::npos) << spec << ": " << why;
  }
  EXPECT_FALSE(cuda::paged_cache_config_of(*make_method("fp16"), 2, 96, &cfg, &why));
  EXPECT_NE(why.find("head_dim 96"), std::string::npos) << why;
  PagedCacheConfig bad;
  bad.num_kv_heads = 2;
  bad.head_dim = 128;
  bad.kvarn.sink_tokens = 7;
  EXPECT_THROW(PagedCache c(bad), Error);
}

// Every config the GPU cases above use is one the GPU takes (checked here without a device).
TEST(PagedCacheSupport, EveryTestedMethodIsAGpuConfig) {
  for (const Case& c : cases()) {
    int d = c.d, hkv = c.hkv;
    if (!c.file.empty()) {
      const TileReader r(std::filesystem::path(KVARN_SOURCE_DIR) / "data/tiles" / c.file);
      d = r.info().head_dim;
      hkv = r.info().num_kv_heads;
    }
    std::string why;
    EXPECT_TRUE(cuda::paged_cache_config_of(*make_method(c.spec), hkv, d, nullptr, &why))
        << c.name << ": " << why;
  }
}

TEST(PagedCacheErrors, BadQueriesAreErrors) {
  KVARN_REQUIRE_GPU();
  PagedCacheConfig cfg;
  cfg.num_kv_heads = 2;
  cfg.head_dim = 64;
  cfg.kvarn.group = 32;
  PagedCache c(cfg);
  std::vector<float> k(2 * 5 * 64, 0.5f), v(k.size(), -0.25f);
  c.append_host(k.data(), v.data(), 5);
  EXPECT_EQ(c.size(), 5);
  DeviceBuffer<std::uint16_t> q(4 * 64), out(4 * 64);
  const std::vector<int> beyond = {5}, negative = {-1}, ok = {4};
  EXPECT_THROW(c.attend(q.get(), 4, beyond, out.get()), Error);
  EXPECT_THROW(c.attend(q.get(), 4, negative, out.get()), Error);
  EXPECT_THROW(c.attend(q.get(), 3, ok, out.get()), Error);  // not a multiple of Hkv
  k[7] = std::nanf("");
  EXPECT_THROW(c.append_host(k.data(), v.data(), 5), Error);
  EXPECT_EQ(c.size(), 5);
}

}  // namespace
}  // namespace kvarn
