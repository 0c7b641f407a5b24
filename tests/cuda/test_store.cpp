// The GPU store kernel must produce exactly the bytes of kvarn_encode_record.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "cuda_test_util.hpp"
#include "kvarn/core/kvarn.hpp"
#include "kvarn/core/portable_math.hpp"
#include "kvarn/core/registry.hpp"
#include "kvarn/core/rng.hpp"
#include "kvarn/data/error.hpp"
#include "kvarn/data/tile_file.hpp"

namespace kvarn {
namespace {

// Real-like rows: per-channel scales spanning 3 decades, a few outlier channels, fp16 values.
std::vector<std::uint16_t> make_rows(Rng& rng, std::size_t tokens, int heads, int d, bool spiky) {
  std::vector<float> chan(static_cast<std::size_t>(heads) * d);
  for (auto& c : chan) c = spiky ? static_cast<float>(std::exp(2.0 * rng.normal())) : 1.0f;
  std::vector<std::uint16_t> out(tokens * heads * d);
  for (std::size_t t = 0; t < tokens; ++t)
    for (std::size_t i = 0; i < chan.size(); ++i)
      out[t * chan.size() + i] = float_to_half_bits(static_cast<float>(rng.normal()) * chan[i] +
                                                    (spiky ? 0.3f * chan[i] : 0.0f));
  return out;
}

// Exact zeros of both signs (ties of +0/-0 in RTN's min/max, zero rows, zero stds): every 5th
// token all zero, every 3rd element of the others +0 or -0.
void add_zeros(std::vector<std::uint16_t>& rows, std::size_t row_elems) {
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const std::size_t t = i / row_elems;
    if (t % 5 == 2 || i % 3 == 0) rows[i] = (i / 3) % 2 ? 0x8000 : 0x0000;
  }
}

const char* store_kernel_name(cuda::StoreKernel k) {
  return k == cuda::StoreKernel::kTile      ? "tile kernel"
         : k == cuda::StoreKernel::kCluster ? "cluster kernel"
                                            : "automatic kernel choice";
}

// Runs one store kernel on rows [blocks, G, heads, D] (fp16 bits; each token row padded by `pad`
// elements, so pad % 8 != 0 takes the store's unaligned row loads) and counts tiles whose record
// bytes differ from kvarn_encode_record (printing the differing byte count). `reversed`: input
// block b goes to cache block blocks - 1 - b (dst_block), else to block b (no table).
std::size_t kernel_mismatched_tiles(cuda::StoreKernel kernel, bool reversed, const KvarnConfig& cfg,
                                    int d, int g, int heads, int blocks,
                                    const std::vector<std::uint16_t>& k,
                                    const std::vector<std::uint16_t>& v, int pad) {
  const KvarnRecordLayout lay = kvarn_record_layout(d, cfg);
  DeviceBuffer<std::uint16_t> dk(k), dv(v);
  std::vector<int> dst(static_cast<std::size_t>(blocks));
  for (int b = 0; b < blocks; ++b) dst[static_cast<std::size_t>(b)] = blocks - 1 - b;
  DeviceBuffer<int> ddst(dst);
  DeviceBuffer<std::uint8_t> rec(static_cast<std::size_t>(blocks) * heads * lay.aligned);
  DeviceBuffer<int> overflow(std::vector<int>{0});
  rec.fill_bytes(0xA5);  // poison: every byte must be written
  cuda::StoreTiles t;
  t.k = dk.get();
  t.v = dv.get();
  t.num_tiles = blocks * heads;
  t.num_heads = heads;
  t.row_stride = static_cast<long long>(heads) * d + pad;
  t.head_stride = d;
  t.block_stride = static_cast<long long>(g) * t.row_stride;
  t.records = rec.get();
  t.overflow = overflow.get();
  t.kernel = kernel;
  if (reversed) t.dst_block = ddst.get();
  cuda::kvarn_store(cfg, d, t);
  KVARN_CUDA_CHECK(cudaDeviceSynchronize());
  const auto got = rec.download();
  EXPECT_EQ(overflow.download()[0], 0);
  const Rotation rot(cfg.rotation, d, 0);
  std::size_t bad_tiles = 0, bad_bytes = 0;
  for (int bl = 0; bl < blocks; ++bl) {
    for (int h = 0; h < heads; ++h) {
      std::vector<float> kr(static_cast<std::size_t>(g) * d), vr(kr.size());
      for (int r = 0; r < g; ++r)
        for (int x = 0; x < d; ++x) {
          const std::size_t src = (static_cast<std::size_t>(bl) * g + r) * t.row_stride +
                                  static_cast<std::size_t>(h) * d + x;
          kr[static_cast<std::size_t>(r) * d + x] = half_bits_to_float(k[src]);
          vr[static_cast<std::size_t>(r) * d + x] = half_bits_to_float(v[src]);
        }
      const auto want = kvarn_encode_record(cfg, rot, kr.data(), vr.data());
      const int cache_block = reversed ? blocks - 1 - bl : bl;
      const std::uint8_t* g0 =
          got.data() + (static_cast<std::size_t>(cache_block) * heads + h) * lay.aligned;
      std::size_t diff = 0;
      for (std::size_t i = 0; i < lay.aligned; ++i) diff += g0[i] != want[i];
      bad_bytes += diff;
      bad_tiles += diff != 0;
    }
  }
  if (bad_tiles)
    ADD_FAILURE() << store_kernel_name(kernel) << (reversed ? " (reversed blocks)" : "") << ": "
                  << bad_bytes << " differing bytes of " << got.size();
  return bad_tiles;
}

// Both store kernels (one CTA per tile stream, and a cluster of 8 CTAs per tile stream), with
// and without a block table, and kvarn_store's own choice.
std::size_t store_mismatched_tiles(const KvarnConfig& cfg, int d, int g, int heads, int blocks,
                                   const std::vector<std::uint16_t>& k,
                                   const std::vector<std::uint16_t>& v, int pad = 0) {
  std::size_t bad = 0;
  for (auto kernel : {cuda::StoreKernel::kTile, cuda::StoreKernel::kCluster})
    for (bool reversed : {false, true})
      bad += kernel_mismatched_tiles(kernel, reversed, cfg, d, g, heads, blocks, k, v, pad);
  bad +=
      kernel_mismatched_tiles(cuda::StoreKernel::kAuto, false, cfg, d, g, heads, blocks, k, v, pad);
  return bad;
}

struct StoreCase {
  int kb, vb, g, d;
  bool fp8 = false;
  RotationKind rot = RotationKind::kHadamardFp16;  // the default (published fp16 matrix)
  int iters = 8;
  bool zeros = false;
  float log_max = VarnParams{}.log_max;  // 45: scales beyond 2^60, the store divides by the divider
  int pad = 0;  // elements after each token row (4: rows not 16-byte aligned)
  int blocks = 3;  // of 2 heads: 3 (6 tiles) or many (the cluster kernel's CTAs in several waves)
};

std::string case_name(const StoreCase& c) {
  std::ostringstream o;
  o << "k" << c.kb << "v" << c.vb << "_g" << c.g << "_d" << c.d << (c.fp8 ? "_fp8" : "")
    << (c.rot == RotationKind::kNone       ? "_norot"
        : c.rot == RotationKind::kHadamard ? "_exact"
                                           : "")
    << "_it" << c.iters << (c.zeros ? "_zeros" : "")
    << (c.log_max != VarnParams{}.log_max ? "_divider" : "")
    << (c.pad ? "_pad" + std::to_string(c.pad) : "")
    << (c.blocks != 3 ? "_b" + std::to_string(c.blocks) : "");
  return o.str();
}

class StoreBitIdentity : public ::testing::TestWithParam<StoreCase> {};

TEST_P(StoreBitIdentity, RecordBytesMatchCpu) {
  KVARN_REQUIRE_GPU();
  const StoreCase c = GetParam();
  KvarnConfig cfg;
  cfg.key_bits = c.kb;
  cfg.value_bits = c.vb;
  cfg.group = c.g;
  cfg.rotation = c.rot;
  cfg.varn.iters = c.iters;
  cfg.varn.log_max = c.log_max;
  cfg.scales = c.fp8 ? ScaleStorage::kFp8E4M3 : ScaleStorage::kFp16;
  const int d = c.d, g = c.g, heads = 2, blocks = c.blocks;
  Rng rng(1234 + c.kb * 100 + c.vb * 10 + g + d);
  // input layout [blocks, G, heads, D] (+ pad per token row: heads * D + pad as heads * 1 "head"
  // rows of make_rows, the pad elements random and never read)
  auto k = make_rows(rng, static_cast<std::size_t>(blocks) * g, 1, heads * d + c.pad, true);
  auto v = make_rows(rng, static_cast<std::size_t>(blocks) * g, 1, heads * d + c.pad, false);
  if (c.zeros) {
    add_zeros(k, static_cast<std::size_t>(heads) * d + c.pad);
    add_zeros(v, static_cast<std::size_t>(heads) * d + c.pad);
  }
  EXPECT_EQ(store_mismatched_tiles(cfg, d, g, heads, blocks, k, v, c.pad), 0u) << case_name(c);
}

std::vector<StoreCase> store_cases() {
  std::vector<StoreCase> v;
  for (auto [kb, vb] : std::vector<std::pair<int, int>>{{4, 2}, {4, 4}, {2, 2}, {8, 8}, {3, 2}})
    for (int g : {32, 64, 128, 256})
      for (int d : {64, 128}) v.push_back({kb, vb, g, d});
  v.push_back({4, 2, 128, 128, true});
  v.push_back({4, 2, 128, 128, false, RotationKind::kNone});
  v.push_back({1, 5, 64, 128});
  v.push_back({6, 7, 128, 128});
  v.push_back({7, 3, 64, 64});
  v.push_back({5, 6, 32, 128});
  // 192 tiles: 3,072 cluster CTAs in several waves, 20 iterations (CTAs of a cluster out of step)
  {
    StoreCase many{4, 2, 128, 128, false, RotationKind::kHadamardFp16, 20};
    many.blocks = 96;
    v.push_back(many);
  }
  v.push_back({4, 2, 128, 128, false, RotationKind::kHadamardFp16, 0});
  v.push_back({4, 2, 128, 128, false, RotationKind::kHadamardFp16, 20});
  v.push_back({4, 2, 128, 128, false, RotationKind::kHadamardFp16, 8, true});
  // rotation=hadamard_exact (exact-scale fp32 FWHT)
  for (int g : {32, 128, 256})
    for (int d : {64, 128}) v.push_back({4, 2, g, d, false, RotationKind::kHadamard});
  v.push_back({4, 2, 128, 128, true, RotationKind::kHadamard, 20});
  v.push_back({4, 2, 128, 128, false, RotationKind::kNone, 8, true});
  v.push_back({4, 4, 64, 64, false, RotationKind::kNone, 8, true});
  v.push_back({8, 8, 256, 128, true, RotationKind::kNone, 8, true});
  v.push_back({4, 2, 32, 128, false, RotationKind::kHadamard, 8, true});
  // divisions by a scale: the divider-free path on every tile above without -0 (the default
  // scale range); the IEEE divider where the scale range rules it out, and on the -0 tiles
  v.push_back({4, 2, 128, 128, false, RotationKind::kHadamardFp16, 8, false, 45.0f});
  v.push_back({4, 4, 256, 128, true, RotationKind::kHadamard, 20, false, 45.0f});
  v.push_back({3, 2, 64, 64, false, RotationKind::kNone, 8, false, 45.0f});
  // padded token rows: 16-byte row loads (pad 8) and element loads (pad 4, 3)
  const float lmax = VarnParams{}.log_max;
  v.push_back({4, 2, 128, 128, false, RotationKind::kHadamardFp16, 8, false, lmax, 8});
  v.push_back({4, 2, 128, 128, false, RotationKind::kHadamardFp16, 8, false, lmax, 4});
  v.push_back({4, 4, 64, 64, false, RotationKind::kHadamardFp16, 8, true, lmax, 3});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Cuda, StoreBitIdentity, ::testing::ValuesIn(store_cases()),
                         [](const auto& info) { return case_name(info.param); });

// Real KV at D 128 (fixture model) and D 64 (SmolLM2): every full tile of a few (layer, head)
// slabs, both rotation modes.
TEST(CudaStoreRealTiles, RecordBytesMatchCpu) {
  KVARN_REQUIRE_GPU();
  for (const char* file : {"fixture_heldout.h5", "smollm2_sample.h5"}) {
    const TileReader reader(std::string(KVARN_SOURCE_DIR) + "/data/tiles/" + file);
    const int d = reader.info().head_dim, layers = reader.info().num_captured_layers();
    for (const char* spec :
         {"kvarn_k4v2_g128", "kvarn:rotation=hadamard_exact", "kvarn_k4v4_g64"}) {
      const KvarnConfig cfg = dynamic_cast<const KvarnMethod&>(*make_method(spec)).config();
      const int g = cfg.group;
      for (int s = 0; s < reader.num_sequences(); ++s)
        for (int li : {0, layers - 1})
          for (int h = 0; h < reader.info().num_kv_heads; ++h) {
            const Matrix km = reader.read(s, "k", li, h), vm = reader.read(s, "v", li, h);
            const int blocks = static_cast<int>(km.rows()) / g;
            if (blocks == 0) continue;
            std::vector<std::uint16_t> k(static_cast<std::size_t>(blocks) * g * d), v(k.size());
            for (std::size_t i = 0; i < k.size(); ++i) {
              k[i] = float_to_half_bits(km.data()[i]);
              v[i] = float_to_half_bits(vm.data()[i]);
            }
            EXPECT_EQ(store_mismatched_tiles(cfg, d, g, 1, blocks, k, v), 0u)
                << file << " " << spec << " seq " << s << " layer " << li << " head " << h;
          }
    }
  }
}

// Tiles at the fp16 limit: the rotated values overflow fp16 (the CPU reference throws); the
// store reports it through the overflow flag in both rotation modes, never without rotation.
TEST(CudaStore, Fp16LimitTilesSetTheOverflowFlag) {
  KVARN_REQUIRE_GPU();
  const int d = 128, g = 128;
  std::vector<std::uint16_t> rows(static_cast<std::size_t>(g) * d, float_to_half_bits(65504.0f));
  rows[3 * d + 5] = float_to_half_bits(-65504.0f);
  for (auto kernel : {cuda::StoreKernel::kTile, cuda::StoreKernel::kCluster})
    for (auto rot : {RotationKind::kHadamardFp16, RotationKind::kHadamard, RotationKind::kNone}) {
      KvarnConfig cfg;
      cfg.rotation = rot;
      const KvarnRecordLayout lay = kvarn_record_layout(d, cfg);
      DeviceBuffer<std::uint16_t> dk(rows), dv(rows);
      DeviceBuffer<std::uint8_t> rec(lay.aligned);
      DeviceBuffer<int> overflow(std::vector<int>{0});
      cuda::StoreTiles t;
      t.k = dk.get();
      t.v = dv.get();
      t.num_tiles = 1;
      t.row_stride = d;
      t.head_stride = d;
      t.block_stride = static_cast<long long>(g) * d;
      t.records = rec.get();
      t.overflow = overflow.get();
      t.kernel = kernel;
      cuda::kvarn_store(cfg, d, t);
      KVARN_CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_EQ(overflow.download()[0], rot == RotationKind::kNone ? 0 : 1)
          << to_string(rot) << " " << store_kernel_name(kernel);
      const Rotation r(rot, d);
      std::vector<float> x(rows.size());
      for (std::size_t i = 0; i < x.size(); ++i) x[i] = half_bits_to_float(rows[i]);
      if (rot == RotationKind::kNone) {
        EXPECT_NO_THROW(kvarn_encode_record(cfg, r, x.data(), x.data()));
      } else {
        EXPECT_THROW(kvarn_encode_record(cfg, r, x.data(), x.data()), Error);
      }
    }
}

class CudaAppend : public ::testing::TestWithParam<RotationKind> {};

TEST_P(CudaAppend, RotatedFp16RowsMatchCpu) {
  KVARN_REQUIRE_GPU();
  KvarnConfig cfg;
  cfg.rotation = GetParam();
  const int d = 128, heads = 4, n = 37, g = cfg.group, slots = 3;
  Rng rng(77);
  auto k = make_rows(rng, n, heads, d, true);
  auto v = make_rows(rng, n, heads, d, false);
  std::vector<long long> pos(n);
  for (int i = 0; i < n; ++i) pos[i] = (i * 7919LL) % (static_cast<long long>(slots) * g);
  DeviceBuffer<std::uint16_t> dk(k), dv(v);
  DeviceBuffer<long long> dpos(pos);
  const std::size_t pool_elems = static_cast<std::size_t>(slots) * heads * g * d;
  DeviceBuffer<std::uint16_t> kp(pool_elems), vp(pool_elems);
  kp.fill_bytes(0xFF);
  vp.fill_bytes(0xFF);
  cuda::kvarn_append(cfg, d, n, heads, dk.get(), dv.get(), dpos.get(), kp.get(), vp.get());
  KVARN_CUDA_CHECK(cudaDeviceSynchronize());
  const auto hk = kp.download(), hv = vp.download();
  const Rotation rot(cfg.rotation, d);
  std::size_t bad = 0;
  for (int i = 0; i < n; ++i)
    for (int h = 0; h < heads; ++h)
      for (int s = 0; s < 2; ++s) {
        std::vector<float> row(d);
        const auto& src = s == 0 ? k : v;
        for (int x = 0; x < d; ++x)
          row[x] = half_bits_to_float(src[(static_cast<std::size_t>(i) * heads + h) * d + x]);
        rot.forward_fp16(row.data(), 1);
        const long long slot = pos[i] / g, off = pos[i] % g;
        const auto& pool = s == 0 ? hk : hv;
        for (int x = 0; x < d; ++x)
          bad += pool[((slot * heads + h) * g + off) * d + x] != float_to_half_bits(row[x]);
      }
  EXPECT_EQ(bad, 0u);
}

INSTANTIATE_TEST_SUITE_P(Rotations, CudaAppend,
                         ::testing::Values(RotationKind::kHadamardFp16, RotationKind::kHadamard,
                                           RotationKind::kNone),
                         [](const auto& info) { return to_string(info.param); });

}  // namespace
}  // namespace kvarn
