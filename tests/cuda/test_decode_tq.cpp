// TurboQuant paged decode against a CPU reference attention over the same packed cache: the
// slot bytes come from core's TurboQuant codecs (vLLM layout), the reference uses the codecs'
// reconstruction (original frame, fp64 accumulation).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "cuda_test_util.hpp"
#include "kvarn/core/portable_math.hpp"
#include "kvarn/core/rng.hpp"
#include "kvarn/core/turboquant.hpp"
#include "kvarn/cuda/decode_instances.hpp"
#include "kvarn/data/tile_file.hpp"

namespace kvarn {
namespace {

// One case of the table below: its parameters, its name (tq_name) and its own NMSE bound against
// the CPU reference.
struct TqCase {
  int kb, vb;
  bool nc;
  int d, hq, hkv, batch, max_len, page;
  int splits = 0;
  std::uint64_t seed = 1;
  std::string file =
      {};  // "" = random rows; else real K/V/q of a shipped tile file (layer index 0)
  double max_nmse = 1e-5;
  int warps = 0;  // warps per CTA; 0: automatic
};

std::string tq_name(const TqCase& c) {
  std::ostringstream o;
  o << "tq_k" << c.kb << "v" << c.vb << (c.nc ? "_nc" : "") << "_d" << c.d << "_hq" << c.hq
    << "_hkv" << c.hkv << "_b" << c.batch << "_L" << c.max_len << "_P" << c.page << "_s" << c.splits
    << "_seed" << c.seed;
  if (c.warps > 0) o << "_w" << c.warps;
  if (!c.file.empty()) o << "_" << c.file.substr(0, c.file.find('.'));
  return o.str();
}

class TqDecode : public ::testing::TestWithParam<TqCase> {};

TEST_P(TqDecode, MatchesCpuReference) {
  KVARN_REQUIRE_GPU();
  const TqCase c = GetParam();
  const int d = c.d, hkv = c.hkv, hq = c.hq, qpk = hq / hkv, P = c.page;
  // Real data: sequence b % S of the file, rows K/V of layer index 0 and the captured query of the
  // sequence's last used token (one query head per KV head: qpk 1).
  std::vector<TileMatrix> fk, fv, fq;
  int file_seqs = 0;
  if (!c.file.empty()) {
    const TileReader r(std::filesystem::path(KVARN_SOURCE_DIR) / "data/tiles" / c.file);
    ASSERT_EQ(r.info().head_dim, d);
    ASSERT_EQ(r.info().num_kv_heads, hkv);
    ASSERT_EQ(qpk, 1);
    file_seqs = r.num_sequences();
    for (int sq = 0; sq < file_seqs; ++sq) {
      ASSERT_GE(r.sequence(sq).num_tokens, c.max_len);
      for (int h = 0; h < hkv; ++h) {
        fk.push_back(r.read(sq, "k", 0, h));
        fv.push_back(r.read(sq, "v", 0, h));
        fq.push_back(r.read(sq, "q", 0, h));
      }
    }
  }

  Rng rng(c.seed * 9173 + 5);
  TurboQuantConfig tcfg;
  tcfg.key_bits = c.kb;
  tcfg.value_bits = c.vb;
  tcfg.norm_correction = c.nc;
  tcfg.boundary = 0;
  const TurboQuantMethod method(tcfg);
  const LayerContext layer{0, 1};
  auto kcodec = method.make_codec(StreamKind::kKey, d, layer);
  auto vcodec = method.make_codec(StreamKind::kValue, d, layer);
  cuda::TqDecodeConfig qc{c.kb, c.vb, c.nc};
  const int slot = cuda::turboquant_slot_bytes(d, qc);
  ASSERT_EQ(static_cast<std::size_t>(slot), kcodec->chunk_bytes() + vcodec->chunk_bytes());

  const PagedLayout layout = random_paged_layout(c.batch, c.max_len, P, rng, true);
  const std::vector<int>& lens = layout.lens;
  const int max_blocks = layout.max_blocks, num_phys = layout.num_phys;
  const std::vector<int>& perm = layout.perm;
  std::vector<int> table(static_cast<std::size_t>(c.batch) * max_blocks, -1);
  std::vector<std::uint8_t> cache(static_cast<std::size_t>(num_phys) * hkv * P * slot, 0xFF);
  std::vector<std::vector<float>> kref(c.batch * hkv), vref(c.batch * hkv);
  int next_phys = 0;
  std::vector<float> row(d), krec(d), vrec(d), chan(d);
  for (int b = 0; b < c.batch; ++b) {
    const int L = lens[b];
    for (int j = 0; j < (L + P - 1) / P; ++j)
      table[static_cast<std::size_t>(b) * max_blocks + j] = perm[next_phys++];
    for (int h = 0; h < hkv; ++h) {
      auto& kr = kref[b * hkv + h];
      auto& vr = vref[b * hkv + h];
      kr.assign(static_cast<std::size_t>(L) * d, 0.0f);
      vr.assign(static_cast<std::size_t>(L) * d, 0.0f);
      for (auto& ch : chan) ch = static_cast<float>(std::exp(0.7 * rng.normal()));
      for (int t = 0; t < L; ++t) {
        const int phys = table[static_cast<std::size_t>(b) * max_blocks + t / P];
        std::uint8_t* dst =
            cache.data() + ((static_cast<std::size_t>(phys) * hkv + h) * P + t % P) * slot;
        std::size_t off = 0;
        const int fi = file_seqs > 0 ? (b % file_seqs) * hkv + h : -1;
        for (int x = 0; x < d; ++x)
          row[x] = fi >= 0 ? fk[fi](t, x) : static_cast<float>(rng.normal()) * chan[x] + 0.3f;
        Chunk kc;
        kcodec->encode(row.data(), 1, &kc, krec.data());
        for (int x = 0; x < d; ++x)
          row[x] = fi >= 0 ? fv[fi](t, x) : static_cast<float>(rng.normal()) * 1.5f - 0.2f;
        Chunk vc;
        vcodec->encode(row.data(), 1, &vc, vrec.data());
        for (const Chunk* ch : {&kc, &vc})
          for (const Field& f : ch->fields) {
            std::copy(f.bytes.begin(), f.bytes.end(), dst + off);
            off += f.bytes.size();
          }
        ASSERT_EQ(off, static_cast<std::size_t>(slot));
        std::copy(krec.begin(), krec.end(), kr.begin() + static_cast<std::size_t>(t) * d);
        std::copy(vrec.begin(), vrec.end(), vr.begin() + static_cast<std::size_t>(t) * d);
      }
    }
  }
  std::vector<std::uint16_t> q(static_cast<std::size_t>(c.batch) * hq * d);
  for (auto& x : q) x = float_to_half_bits(static_cast<float>(rng.normal()));
  if (file_seqs > 0) {  // stored fp16: exact
    for (int b = 0; b < c.batch; ++b)
      for (int h = 0; h < hq; ++h)
        for (int x = 0; x < d; ++x)
          q[(static_cast<std::size_t>(b) * hq + h) * d + x] =
              float_to_half_bits(fq[(b % file_seqs) * hkv + h](lens[b] - 1, x));
  }

  const std::vector<float> ref = decode_reference(q, c.batch, hq, hkv, d, kref, vref, lens);

  DeviceBuffer<std::uint16_t> dq(q), dout(q.size());
  DeviceBuffer<int> dtable(table), dlens(lens);
  DeviceBuffer<std::uint8_t> dcache(cache);
  cuda::DecodeProblem p =
      decode_problem(cuda::DecodeFormat::kTurboQuant, c.batch, hq, hkv, d, P, max_blocks, c.splits);
  p.tq = qc;
  p.warps = c.warps;
  DeviceBuffer<std::uint8_t> ws(cuda::decode_workspace_bytes(p));
  cuda::DecodeBuffers bufs;
  bufs.q = dq.get();
  bufs.out = dout.get();
  bufs.block_table = dtable.get();
  bufs.seq_lens = dlens.get();
  bufs.k_pool = dcache.get();
  bufs.workspace = ws.get();
  expect_decode_matches(p, bufs, dout, ws, ref, tq_name(c), c.max_nmse);
}

std::vector<TqCase> tq_cases() {
  std::vector<TqCase> v;
  for (const cuda::DecodeInstance& i : cuda::kDecodeInstances) {  // every compiled preset
    if (i.format != cuda::DecodeFormat::kTurboQuant) continue;
    const int kb = i.key_bits, vb = i.value_bits;
    const bool nc = kb != 8;  // norm correction needs Lloyd-Max keys
    v.push_back({kb, vb, nc, 128, 32, 8, 3, 700, 16});
    v.push_back({kb, vb, nc, 128, 32, 8, 4, 900, 64});
    v.push_back({kb, vb, nc, 64, 12, 4, 5, 400, 32});        // D 64, qpk 3 (padded)
    v.push_back({kb, vb, nc, 128, 16, 2, 1, 1, 16});         // a single token
    v.push_back({kb, vb, nc, 128, 64, 8, 2, 3000, 16, 40});  // qpk 8, many explicit splits
    v.push_back({kb, vb, nc, 128, 32, 8, 1, 5000, 128});     // long, automatic splits
  }
  v.push_back({4, 4, false, 128, 32, 8, 3, 500, 16});  // Lloyd-Max keys without nc
  // Every compiled warp count per CTA (warps past the last split only help fill the table):
  // 7 splits, a partial last item, D 128 and 64
  for (const cuda::DecodeInstance& i : cuda::kDecodeInstances) {
    if (i.format != cuda::DecodeFormat::kTurboQuant) continue;
    for (int w : cuda::kTqCompiledWarps) {
      v.push_back(
          {i.key_bits, i.value_bits, i.key_bits != 8, 128, 32, 8, 3, 1000, 16, 7, 2, {}, 1e-5, w});
      v.push_back(
          {i.key_bits, i.value_bits, i.key_bits != 8, 64, 12, 4, 2, 700, 32, 0, 3, {}, 1e-5, w});
    }
  }
  v.push_back({3, 3, true, 64, 8, 8, 7, 300, 16, 0, 3});     // MHA, D 64, 3-bit (odd lane bytes)
  v.push_back({4, 4, true, 128, 40, 8, 6, 1200, 32, 0, 4});  // qpk 5, ragged
  // Real captured K/V and queries (fixture Qwen3, D 128, 2 KV heads; SmolLM2, D 64, 3 KV heads)
  for (const cuda::DecodeInstance& i : cuda::kDecodeInstances) {
    if (i.format != cuda::DecodeFormat::kTurboQuant) continue;
    const int kb = i.key_bits, vb = i.value_bits;
    const bool nc = kb != 8;
    v.push_back({kb, vb, nc, 128, 2, 2, 4, 480, 16, 0, 5, "fixture_heldout.h5"});
    v.push_back({kb, vb, nc, 64, 3, 3, 3, 700, 32, 0, 6, "smollm2_long.h5"});
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Cuda, TqDecode, ::testing::ValuesIn(tq_cases()),
                         [](const auto& info) { return tq_name(info.param); });

// Automatic split count of TurboQuant: one split per warp (the CTAs take W consecutive item
// streams of batch x Hkv x splits, so they stay full), one wave of resident warps (the CTAs per SM
// that shared memory and __launch_bounds__ allow, times the warps per CTA), at most
// max_blocks / 2, and past 64 splits (batch 1) at least 256 tokens per split. Needs no device
// (132 SMs without one).
TEST(TqDecodeSplits, OneWaveCappedByTokensPastSixtyFour) {
  int sms = 132;
  if (cuda::device_count() > 0)
    KVARN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  auto problem = [](int kb, int batch, int max_blocks, int warps) {
    cuda::DecodeProblem p =
        decode_problem(cuda::DecodeFormat::kTurboQuant, batch, 32, 8, 128, 16, max_blocks);
    p.tq = cuda::TqDecodeConfig{kb, kb, true};
    p.warps = warps;
    return p;
  };
  auto expected = [sms](int per_sm, int batch, int max_blocks) {
    int s = std::max(1, per_sm * sms / (batch * 8));
    if (s > 64) s = std::min(s, std::max(64, max_blocks * 16 / 256));
    return std::min(s, std::max(1, max_blocks / 2));
  };
  // resident warps per SM at D 128: min(228 KiB / (CTA shared memory + 1 KiB), the
  // __launch_bounds__ CTAs) x warps; 4-bit slots 134 bytes (stage 2,176), 3-bit 102 (1,664)
  struct Row {
    int kb, warps, per_sm;
  };
  for (const Row r :
       {Row{4, 1, 16}, Row{3, 1, 12}, Row{3, 4, 20}, Row{4, 4, 20}, Row{4, 8, 16}, Row{3, 8, 16}}) {
    for (int blocks : {64, 128, 256, 1024, 2048, 4096, 8192}) {  // 1K .. 128K tokens
      for (int batch : {1, 8, 32}) {
        EXPECT_EQ(cuda::decode_num_splits(problem(r.kb, batch, blocks, r.warps)),
                  expected(r.per_sm, batch, blocks))
            << r.kb << " " << r.warps << " " << batch << " " << blocks;
      }
    }
  }
  // automatic: eight warps from 2^17 cached tokens over sequences x KV heads (Lloyd-Max keys)
  // when eight-warp CTAs cover at least half the SMs
  EXPECT_EQ(cuda::decode_num_warps(problem(3, 8, 2048, 0)), 8);  // batch 8 x 32K
  EXPECT_EQ(cuda::decode_num_warps(problem(4, 8, 128, 0)), 8);   // batch 8 x 2K
  EXPECT_EQ(cuda::decode_num_warps(problem(4, 8, 127, 0)), 1);   // below 2^17 tokens
  EXPECT_EQ(cuda::decode_num_warps(problem(4, 1, 8192, 0)), 8);  // batch 1 x 128K
  EXPECT_EQ(cuda::decode_num_warps(problem(3, 1, 128, 0)), 1);   // batch 1 x 2K
  EXPECT_EQ(cuda::decode_num_warps(problem(4, 8, 2048, 1)), 1);  // explicit
  EXPECT_EQ(cuda::decode_num_warps(problem(4, 8, 2048, 8)), 8);
  cuda::DecodeProblem k8 = problem(4, 8, 2048, 0);
  k8.tq = cuda::TqDecodeConfig{8, 4, false};
  EXPECT_EQ(cuda::decode_num_warps(k8), 1);                           // fp8 keys: one warp
  if (sms == 132) {                                                   // H200
    EXPECT_EQ(cuda::decode_num_splits(problem(4, 1, 128, 1)), 64);    // 2K: two blocks a split
    EXPECT_EQ(cuda::decode_num_splits(problem(4, 1, 1024, 1)), 64);   // 16K: the token floor
    EXPECT_EQ(cuda::decode_num_splits(problem(4, 1, 8192, 1)), 264);  // 128K: one wave
    EXPECT_EQ(cuda::decode_num_splits(problem(3, 1, 8192, 1)), 198);  // 3-bit: 12 per SM
    EXPECT_EQ(cuda::decode_num_splits(problem(3, 8, 2048, 4)), 41);   // batch 8: 20 warps per SM
    // batch 1 x 16K: 64 splits, so 64 eight-warp CTAs on 132 SMs: one warp; 32K: 128 CTAs
    EXPECT_EQ(cuda::decode_num_splits(problem(4, 1, 1024, 8)), 64);
    EXPECT_EQ(cuda::decode_num_warps(problem(4, 1, 1024, 0)), 1);
    EXPECT_EQ(cuda::decode_num_warps(problem(3, 1, 1024, 0)), 1);
    EXPECT_EQ(cuda::decode_num_splits(problem(4, 1, 2048, 8)), 128);
    EXPECT_EQ(cuda::decode_num_warps(problem(4, 1, 2048, 0)), 8);
  }
}

}  // namespace
}  // namespace kvarn
