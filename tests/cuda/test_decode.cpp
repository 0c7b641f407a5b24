// Paged decode (KVarN, FP16, FP8) against a CPU reference attention over the same packed cache.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "cuda_test_util.hpp"
#include "kvarn/core/kvarn.hpp"
#include "kvarn/core/portable_math.hpp"
#include "kvarn/core/rng.hpp"
#include "kvarn/cuda/decode_instances.hpp"

namespace kvarn {
namespace {

using cuda::DecodeFormat;

// One case of the table below: its parameters, its name (case_name) and its own NMSE bound
// against the CPU reference.
struct DecodeCase {
  DecodeFormat fmt;
  int kb, vb, g, d, hq, hkv, batch, max_len;
  int splits = 0;
  bool fp8_scales = false;
  std::uint64_t seed = 1;
  double max_nmse = 1e-5;
  int warps = 0;  // KVarN G 128 warps per CTA; 0: automatic
  // KVarN: the first pool_blocks blocks of a sequence are in the fp16 pool, the rest records
  // (but the tail); the config's sink (-1: one group; the decode spreads those blocks' rows over
  // the splits, and must also be right when they hold records)
  int pool_blocks = 1, sink_tokens = -1;
  int spread = -1;  // DecodeProblem::spread_sink
  // K and V amplitude: far from 1 the records' scale maxima leave the range of the decode's
  // power-of-two normalization (its clamp at 2^-14) or are 0 (fp8 scales)
  float amp = 1.0f;
  // KVarN: a sequence's partial last block as a zero-padded record (the cache keeps it in the
  // pool; the kernel masks the record's tokens past the sequence end)
  bool partial_records = false;
};

std::string fmt_name(DecodeFormat f) {
  return f == DecodeFormat::kKvarn ? "kvarn" : f == DecodeFormat::kFp16 ? "fp16" : "fp8";
}
std::string case_name(const DecodeCase& c) {
  std::ostringstream o;
  o << fmt_name(c.fmt);
  if (c.fmt == DecodeFormat::kKvarn) o << "_k" << c.kb << "v" << c.vb;
  o << "_g" << c.g << "_d" << c.d << "_hq" << c.hq << "_hkv" << c.hkv << "_b" << c.batch << "_L"
    << c.max_len << "_s" << c.splits << (c.fp8_scales ? "_fp8sc" : "") << "_seed" << c.seed;
  if (c.warps > 0) o << "_w" << c.warps;
  if (c.spread >= 0) o << "_spread" << c.spread;
  if (c.pool_blocks != 1 || c.sink_tokens != -1)
    o << "_pool" << c.pool_blocks << "_sink" << (c.sink_tokens < 0 ? "G" : "")
      << (c.sink_tokens < 0 ? 1 : c.sink_tokens);
  if (c.partial_records) o << "_partialrec";
  if (c.amp != 1.0f) {  // "_amp2em16": 2^-16
    const long e = std::lround(std::log2(c.amp));
    o << "_amp2e" << (e < 0 ? "m" : "") << std::labs(e);
  }
  return o.str();
}

class PagedDecode : public ::testing::TestWithParam<DecodeCase> {};

TEST_P(PagedDecode, MatchesCpuReference) {
  KVARN_REQUIRE_GPU();
  const DecodeCase c = GetParam();
  const int d = c.d, g = c.g, hkv = c.hkv, hq = c.hq;
  Rng rng(c.seed * 7777 + 13);
  KvarnConfig cfg;
  cfg.key_bits = c.kb;
  cfg.value_bits = c.vb;
  cfg.group = g;
  cfg.scales = c.fp8_scales ? ScaleStorage::kFp8E4M3 : ScaleStorage::kFp16;
  cfg.sink_tokens = c.sink_tokens;
  const bool kv = c.fmt == DecodeFormat::kKvarn;
  const KvarnRecordLayout lay = kvarn_record_layout(d, cfg);
  const Rotation rot(kv ? RotationKind::kHadamard : RotationKind::kNone, d);

  // ragged lengths: include 1 token, exact multiples of G, and G + 1
  const PagedLayout layout = random_paged_layout(c.batch, c.max_len, g, rng);
  const std::vector<int>& lens = layout.lens;
  const int max_blocks = layout.max_blocks, num_phys = layout.num_phys;
  const std::vector<int>& perm = layout.perm;
  std::vector<int> table(static_cast<std::size_t>(c.batch) * max_blocks, -1);
  std::vector<int> to_slot(num_phys, -1);
  int next_phys = 0, next_slot = 0;
  std::vector<float> k_scale(hkv), v_scale(hkv);
  for (int h = 0; h < hkv; ++h) {
    k_scale[h] = 0.02f + 0.01f * h;
    v_scale[h] = 0.015f + 0.005f * h;
  }
  // per sequence, per KV head: rotated-frame K/V the kernel must see ([L, D] each)
  std::vector<std::vector<float>> kref(c.batch * hkv), vref(c.batch * hkv);
  const std::size_t page = static_cast<std::size_t>(g) * d;
  std::vector<std::uint8_t> records(kv ? static_cast<std::size_t>(num_phys) * hkv * lay.aligned
                                       : 0);
  const std::size_t elem = c.fmt == DecodeFormat::kFp8 ? 1 : 2;
  // pool / pages sized for every physical block (simple; slots < num_phys)
  std::vector<std::uint8_t> kpool(static_cast<std::size_t>(num_phys) * hkv * page * elem, 0xFF),
      vpool(kpool.size(), 0xFF);  // NaN poison in unused rows
  for (int b = 0; b < c.batch; ++b) {
    const int L = lens[b], nb = (L + g - 1) / g;
    for (int h = 0; h < hkv; ++h) {
      kref[b * hkv + h].assign(static_cast<std::size_t>(L) * d, 0);
      vref[b * hkv + h].assign(static_cast<std::size_t>(L) * d, 0);
    }
    for (int j = 0; j < nb; ++j) {
      const int phys = perm[next_phys++];
      table[static_cast<std::size_t>(b) * max_blocks + j] = phys;
      const int n = std::min(g, L - j * g);
      // sink = the first pool_blocks, tail = partial last block, and sometimes a full unflushed
      // last block
      const bool pool = !kv || j < c.pool_blocks || (n < g && !c.partial_records) ||
                        (j == nb - 1 && rng.next() % 3 == 0);
      int slot = phys;
      if (kv && pool) {
        slot = next_slot++;
        to_slot[phys] = slot;
      }
      for (int h = 0; h < hkv; ++h) {
        std::vector<float> kr(page, 0.0f), vr(page, 0.0f);
        std::vector<float> chan(d);
        for (auto& ch : chan) ch = static_cast<float>(std::exp(1.0 * rng.normal()));
        for (int t = 0; t < n; ++t)
          for (int x = 0; x < d; ++x) {
            kr[static_cast<std::size_t>(t) * d + x] =
                round_to_half((static_cast<float>(rng.normal()) * chan[x] + 0.5f) * c.amp);
            vr[static_cast<std::size_t>(t) * d + x] =
                round_to_half(static_cast<float>(rng.normal()) * c.amp);
          }
        std::vector<float> kseen(page), vseen(page);
        if (kv && !pool) {
          const auto rec = kvarn_encode_record(cfg, rot, kr.data(), vr.data());
          std::copy(rec.begin(), rec.end(),
                    records.begin() + (static_cast<std::size_t>(phys) * hkv + h) * lay.aligned);
          kvarn_decode_stream(StreamKind::kKey, lay, rec.data(), kseen.data());
          kvarn_decode_stream(StreamKind::kValue, lay, rec.data(), vseen.data());
        } else {
          kseen = kr;
          vseen = vr;
          if (kv) {
            rot.forward(kseen.data(), n);
            rot.forward(vseen.data(), n);
          }
          for (int t = 0; t < n; ++t)
            for (int x = 0; x < d; ++x) {
              const std::size_t i = static_cast<std::size_t>(t) * d + x;
              const std::size_t o = ((static_cast<std::size_t>(slot) * hkv + h) * g + t) * d + x;
              if (c.fmt == DecodeFormat::kFp8) {
                const std::uint8_t kb8 = float_to_fp8_bits(kseen[i] / k_scale[h], Fp8Format::kE4M3);
                const std::uint8_t vb8 = float_to_fp8_bits(vseen[i] / v_scale[h], Fp8Format::kE4M3);
                kpool[o] = kb8;
                vpool[o] = vb8;
                kseen[i] = fp8_bits_to_float(kb8, Fp8Format::kE4M3) * k_scale[h];
                vseen[i] = fp8_bits_to_float(vb8, Fp8Format::kE4M3) * v_scale[h];
              } else {
                const std::uint16_t kh = float_to_half_bits(kseen[i]),
                                    vh = float_to_half_bits(vseen[i]);
                std::memcpy(&kpool[o * 2], &kh, 2);
                std::memcpy(&vpool[o * 2], &vh, 2);
                kseen[i] = half_bits_to_float(kh);
                vseen[i] = half_bits_to_float(vh);
              }
            }
        }
        for (int t = 0; t < n; ++t)
          for (int x = 0; x < d; ++x) {
            kref[b * hkv + h][static_cast<std::size_t>(j * g + t) * d + x] =
                kseen[static_cast<std::size_t>(t) * d + x];
            vref[b * hkv + h][static_cast<std::size_t>(j * g + t) * d + x] =
                vseen[static_cast<std::size_t>(t) * d + x];
          }
      }
    }
  }
  std::vector<std::uint16_t> q(static_cast<std::size_t>(c.batch) * hq * d);
  for (auto& x : q) x = float_to_half_bits(static_cast<float>(rng.normal()));

  // CPU reference (core's attention_ref): rotated frame, output un-rotated.
  const std::vector<float> ref = decode_reference(q, c.batch, hq, hkv, d, kref, vref, lens, &rot);

  DeviceBuffer<std::uint16_t> dq(q), dout(q.size());
  DeviceBuffer<int> dtable(table), dlens(lens), dslot(to_slot);
  DeviceBuffer<std::uint8_t> drec(records), dkp(kpool), dvp(vpool);
  DeviceBuffer<float> dks(k_scale), dvs(v_scale);
  cuda::DecodeProblem p = decode_problem(c.fmt, c.batch, hq, hkv, d, g, max_blocks, c.splits);
  p.kvarn = cfg;
  p.warps = c.warps;
  p.spread_sink = c.spread;
  DeviceBuffer<std::uint8_t> ws(cuda::decode_workspace_bytes(p));
  cuda::DecodeBuffers bufs;
  bufs.q = dq.get();
  bufs.out = dout.get();
  bufs.block_table = dtable.get();
  bufs.seq_lens = dlens.get();
  bufs.records = drec.get();
  bufs.block_to_slot = dslot.get();
  bufs.k_pool = dkp.get();
  bufs.v_pool = dvp.get();
  bufs.k_scale = dks.get();
  bufs.v_scale = dvs.get();
  bufs.workspace = ws.get();
  expect_decode_matches(p, bufs, dout, ws, ref, case_name(c), c.max_nmse);
}

std::vector<DecodeCase> decode_cases() {
  std::vector<DecodeCase> v;
  using F = DecodeFormat;
  for (const cuda::DecodeInstance& i : cuda::kDecodeInstances)  // every compiled KVarN pair
    if (i.format == F::kKvarn) {
      v.push_back({F::kKvarn, i.key_bits, i.value_bits, 128, 128, 32, 8, 3, 700});
      for (int w : {1, 2})  // G 128 on both compiled warp counts
        v.push_back(
            {F::kKvarn, i.key_bits, i.value_bits, 128, 128, 32, 8, 3, 700, 0, false, 1, 1e-5, w});
    }
  // G 128 warp counts on fp8 scales, qpk 8, many splits and a sequence of pool rows only
  v.push_back({F::kKvarn, 4, 2, 128, 128, 32, 8, 9, 1500, 0, true, 1, 1e-5, 2});
  v.push_back({F::kKvarn, 4, 4, 128, 128, 64, 8, 2, 900, 0, true, 1, 1e-5, 1});
  v.push_back({F::kKvarn, 4, 4, 128, 128, 32, 8, 2, 7000, 0, false, 1, 1e-5, 1});
  v.push_back({F::kKvarn, 4, 2, 128, 128, 32, 8, 2, 7000, 0, false, 1, 1e-5, 2});
  v.push_back({F::kKvarn, 4, 2, 128, 128, 16, 2, 1, 1, 0, false, 1, 1e-5, 2});
  v.push_back({F::kKvarn, 4, 2, 64, 128, 64, 8, 5, 500});
  v.push_back({F::kKvarn, 4, 2, 128, 64, 12, 4, 4, 600});  // qpk 3 (padded)
  // G 128 with 8 query heads per KV head (no column pairing) for every compiled pair and warp
  // count, and qpk 6 with the sink spread
  for (const cuda::DecodeInstance& i : cuda::kDecodeInstances)
    if (i.format == F::kKvarn)
      for (const int w : {1, 2})
        v.push_back(
            {F::kKvarn, i.key_bits, i.value_bits, 128, 128, 64, 8, 3, 2000, 0, false, 9, 1e-5, w});
  {
    DecodeCase k{F::kKvarn, 4, 2, 128, 128, 48, 8, 3, 2500, 6};
    k.spread = 1;
    v.push_back(k);
  }
  // partial last records (masked past the sequence end), paired (qpk 4, 3) and not (qpk 8)
  for (const int w : {1, 2})
    for (const int hq : {32, 24, 64}) {
      DecodeCase k{F::kKvarn, 4, w == 1 ? 2 : 4, 128, 128, hq, 8, 6, 1500, 0, false, 10, 1e-5, w};
      k.partial_records = true;
      v.push_back(k);
    }
  // G 128 with at most 4 query heads per KV head pairs two M-tiles in the mma columns: qpk 2 and 1
  // (more padding), on both warp counts
  for (const int w : {1, 2}) {
    v.push_back({F::kKvarn, 4, 2, 128, 128, 16, 8, 3, 1500, 0, false, 7, 1e-5, w});
    v.push_back({F::kKvarn, 4, 4, 128, 128, 8, 8, 2, 1500, 0, false, 8, 1e-5, w});
  }
  // records in pieces (k4v4 on one warp): partial last records at 4, 3, 2 (paired heads) and 8
  // query heads per KV head, fp8 scales (also flushed to 0), tiny and large K / V
  for (const int hq : {32, 24, 16, 64}) {
    DecodeCase k{F::kKvarn, 4, 4, 128, 128, hq, 8, 5, 1500, 0, false, 11, 1e-5, 1};
    k.partial_records = true;
    v.push_back(k);
  }
  v.push_back({F::kKvarn, 4, 4, 128, 128, 32, 8, 3, 2000, 0, true, 12, 1e-5, 1});
  for (const float amp : {0x1p-16f, 0x1p8f, 0x1p-12f}) {
    DecodeCase k{F::kKvarn, 4, 4, 128, 128, 32, 8, 2, 2000, 0, amp == 0x1p-12f, 13, 1e-5, 1};
    k.amp = amp;
    v.push_back(k);
  }
  {  // two warps, whole records, K / V at 2^-16: bounded by the fp16 output's own rounding
    DecodeCase k{F::kKvarn, 4, 4, 128, 128, 64, 8, 2, 2000, 0, false, 13, 1e-5, 2};
    k.amp = 0x1p-16f;
    v.push_back(k);
  }
  v.push_back({F::kKvarn, 4, 4, 64, 64, 8, 8, 7, 300});    // MHA
  v.push_back({F::kKvarn, 4, 2, 128, 128, 16, 2, 1, 1});   // a single token
  v.push_back({F::kKvarn, 4, 2, 128, 128, 32, 8, 2, 2000, 1});
  v.push_back({F::kKvarn, 4, 2, 128, 128, 32, 8, 2, 2000, 7});
  v.push_back({F::kKvarn, 4, 2, 128, 128, 32, 8, 9, 1500, 0, true});  // fp8 scales
  for (std::uint64_t seed = 2; seed < 5; ++seed)
    v.push_back(
        {F::kKvarn, 4, 2, 128, 128, 32, 8, 1 + static_cast<int>(seed * 3), 1200, 0, false, seed});
  v.push_back({F::kKvarn, 4, 2, 32, 128, 32, 8, 3, 500});            // G 32
  v.push_back({F::kKvarn, 8, 8, 32, 64, 16, 4, 3, 300});             // 8-bit codes, G 32, D 64
  v.push_back({F::kKvarn, 2, 2, 32, 64, 40, 8, 2, 400});             // 2-bit codes, qpk 5 (padded)
  v.push_back({F::kKvarn, 3, 2, 64, 64, 16, 8, 3, 700});             // 3-bit keys, qpk 2
  v.push_back({F::kKvarn, 4, 4, 128, 128, 64, 8, 2, 900, 0, true});  // qpk 8, fp8 scales
  v.push_back({F::kKvarn, 4, 2, 128, 128, 32, 8, 2, 7000});          // long: many automatic splits
  v.push_back({F::kKvarn, 4, 2, 128, 128, 32, 8, 1, 3000, 64});      // more splits than blocks/2
  // tiny and large K / V (core's encoder at 2^-16: s_col_k and s_row_v below 2^-14, where the
  // normalization's clamp holds; fp8 scales at 2^-12 are all 0)
  for (const float amp : {0x1p-16f, 0x1p8f})
    for (const int w : {1, 2}) {
      DecodeCase k{F::kKvarn, 4, 2, 128, 128, 32, 8, 2, 2000, 0, false, 5, 1e-5, w};
      k.amp = amp;
      v.push_back(k);
    }
  for (const int vb : {2, 4}) {
    DecodeCase k{F::kKvarn, 4, vb, 128, 128, 32, 8, 2, 2000, 0, true, 6};
    k.amp = 0x1p-12f;
    v.push_back(k);
  }
  // The sink's row chunks over the splits: more splits than chunks, fewer, on both warp counts;
  // two sink blocks; a config without a sink; sink blocks that hold records (empty chunks).
  for (int w : {1, 2})
    for (int s : {3, 6, 40})
      for (int spread : {0, 1}) {
        DecodeCase k{F::kKvarn, 4, 2, 128, 128, 32, 8, 3, 2500, s};
        k.warps = w;
        k.spread = spread;
        v.push_back(k);
      }
  auto sink_case = [&](int splits, int pool_blocks, int sink_tokens, int warps) {
    DecodeCase k{F::kKvarn, 4, 4, 128, 128, 32, 8, 4, 2000, splits};
    k.pool_blocks = pool_blocks;
    k.sink_tokens = sink_tokens;
    k.warps = warps;
    k.spread = 1;
    v.push_back(k);
  };
  sink_case(5, 2, 256, 1);
  sink_case(0, 2, 256, 2);
  sink_case(4, 0, 0, 1);
  sink_case(7, 0, -1, 1);  // records where the config has its sink
  sink_case(16, 0, 256, 2);
  sink_case(6, 1, 256, 1);  // a sink of a pool block and a record
  sink_case(3, 1, 256, 2);
  // the automatic choice spreads from 32 sequences x KV heads and 8 splits
  v.push_back({F::kKvarn, 4, 2, 128, 128, 32, 8, 4, 3000, 8});
  for (F f : {F::kFp16, F::kFp8}) {
    v.push_back({f, 8, 8, 32, 128, 32, 8, 3, 3000});  // page 32, long, auto splits
    v.push_back({f, 8, 8, 128, 64, 40, 8, 2, 1000});  // qpk 5, D 64
    v.push_back({f, 8, 8, 128, 128, 64, 8, 2, 5000, 40});
    v.push_back({f, 8, 8, 128, 128, 32, 8, 4, 900});
    v.push_back({f, 8, 8, 64, 128, 64, 8, 3, 700, 3});
    v.push_back({f, 8, 8, 64, 64, 12, 4, 5, 400});
    v.push_back({f, 8, 8, 128, 128, 8, 8, 1, 1});
  }
  // more splits than the wide combine holds (2048): the plain combine's loop past its first 16,
  // without and with the output rotation; the wide combine with the rotation at D 64
  v.push_back({F::kFp16, 8, 8, 32, 64, 16, 8, 3, 70000, 2100});
  v.push_back({F::kKvarn, 4, 2, 32, 64, 16, 8, 1, 70000, 2100});
  v.push_back({F::kKvarn, 4, 2, 32, 64, 16, 8, 2, 2000, 40});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Cuda, PagedDecode, ::testing::ValuesIn(decode_cases()),
                         [](const auto& info) { return case_name(info.param); });

// A KVarN decode problem (Hq 32, Hkv 8, D 128) for the host-side choices below.
cuda::DecodeProblem kvarn_problem(int kb, int vb, int batch, int max_blocks, int group = 128) {
  cuda::DecodeProblem p =
      decode_problem(DecodeFormat::kKvarn, batch, 32, 8, 128, group, max_blocks);
  p.kvarn.key_bits = kb;
  p.kvarn.value_bits = vb;
  p.kvarn.group = group;
  return p;
}

// KVarN G 128 warps per CTA: an explicit count wins; a cache of a few records per SM takes two,
// so does one that one-warp CTAs would split more than 16 ways (24 for records in pieces; batch
// 1); else the table's count for the bit pair (k4v2 1, k4v4 2) or, for k4v4 in pieces, one warp
// from 8 records per split; other groups are fixed.
TEST(PagedDecodeWarps, AutomaticChoice) {
  KVARN_REQUIRE_GPU();
  int sms = 0;
  KVARN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  auto warps = [](int kb, int vb, int g, int batch, int max_blocks, int explicit_warps) {
    cuda::DecodeProblem p = kvarn_problem(kb, vb, batch, max_blocks, g);
    p.warps = explicit_warps;
    return cuda::decode_num_warps(p);
  };
  const int few = 2 * sms / 8;  // blocks per sequence at batch 1, Hkv 8: two records per SM
  EXPECT_EQ(warps(4, 2, 128, 1, few, 0), 2);
  EXPECT_EQ(warps(4, 2, 128, 1, few + 1, 0), 2);  // 32 one-warp splits
  EXPECT_EQ(warps(4, 4, 128, 1, few + 1, 0), 2);
  for (int blocks : {128, 256, 1024}) {  // batch 1 x 16K, 32K, 128K: 32 to 132 one-warp splits
    EXPECT_EQ(warps(4, 2, 128, 1, blocks, 0), 2) << blocks;
    EXPECT_EQ(warps(4, 4, 128, 1, blocks, 0), 2) << blocks;
  }
  EXPECT_EQ(warps(4, 2, 128, 8, 256, 0), 1);  // batch 8: 16 one-warp splits, the table's count
  // k4v4 at Hq 32 (records in pieces): one warp where one-warp CTAs are split 2 to 24 ways and a
  // split holds at least 8 records; on 132 SMs batch 8 has 24 splits (32K yes, 16K no), batch 128
  // one split (no)
  auto pieces_warps = [](int batch, int blocks) {
    cuda::DecodeProblem one = kvarn_problem(4, 4, batch, blocks);
    one.warps = 1;
    const int s = cuda::decode_num_splits(one);
    return s >= 2 && s <= 24 && (blocks + s - 1) / s >= 8 ? 1 : 2;
  };
  for (const auto& [batch, blocks] : {std::pair{8, 256}, {8, 128}, {32, 128}, {128, 256}})
    EXPECT_EQ(warps(4, 4, 128, batch, blocks, 0), pieces_warps(batch, blocks)) << batch;
  if (sms == 132) {
    EXPECT_EQ(warps(4, 4, 128, 8, 256, 0), 1);
    EXPECT_EQ(warps(4, 4, 128, 8, 128, 0), 2);
    EXPECT_EQ(warps(4, 4, 128, 32, 128, 0), 1);
    EXPECT_EQ(warps(4, 4, 128, 128, 256, 0), 2);
  }
  EXPECT_EQ(warps(4, 2, 128, 4, 2, 0), 2);  // 64 records: few per SM
  EXPECT_EQ(warps(4, 2, 128, 1, few, 1), 1);
  EXPECT_EQ(warps(4, 4, 128, 8, 256, 1), 1);
  EXPECT_EQ(warps(4, 2, 128, 8, 256, 2), 2);
  EXPECT_EQ(warps(4, 2, 64, 1, few, 0), 2);
  EXPECT_EQ(warps(4, 2, 32, 1, few, 0), 1);
  EXPECT_EQ(cuda::decode_num_warps(decode_problem(DecodeFormat::kFp16, 1, 32, 8, 128, 128, few)),
            2);
}

// Automatic FP16 split count (D 128, page 128, Hkv 8): splits for two CTAs per SM (four are
// resident), past 16 splits at least 1024 tokens per split, at most max_blocks / 2. Needs no
// device (132 SMs without one).
TEST(Fp16DecodeSplits, TwoCtasPerSm) {
  int sms = 132;
  if (cuda::device_count() > 0)
    KVARN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  auto splits = [](int batch, int max_blocks) {
    return cuda::decode_num_splits(
        decode_problem(DecodeFormat::kFp16, batch, 32, 8, 128, 128, max_blocks));
  };
  auto expected = [sms](int batch, int max_blocks) {
    int s = std::max(1, 2 * sms / (batch * 8));
    if (s > 16) s = std::max(16, std::min(s, max_blocks * 128 / 1024));
    return std::min(s, std::max(1, max_blocks / 2));
  };
  for (int batch : {1, 8, 32, 128})
    for (int blocks : {8, 16, 32, 128, 256, 512, 1024})  // 1K .. 128K tokens
      EXPECT_EQ(splits(batch, blocks), expected(batch, blocks)) << batch << " x " << blocks;
  if (sms == 132) {                  // H200: the counts measured in docs/PERFORMANCE.md
    EXPECT_EQ(splits(1, 1024), 33);  // 128K (66 at four CTAs per SM)
    EXPECT_EQ(splits(1, 128), 16);   // 16K: the token floor
    EXPECT_EQ(splits(8, 256), 4);    // 32K (8 before)
    EXPECT_EQ(splits(32, 256), 1);   // (2 before)
  }
}

// Automatic KVarN split count (k4v2, D 128, Hkv 8) at batch 1: one record per split up to 32
// splits, then (G 128 below 128K tokens) at least 256 tokens and at most 64 splits, else at least
// 512 tokens per split; at most one wave of resident CTAs. Needs no device (132 SMs and a
// shared-memory bound without one).
TEST(KvarnDecodeSplits, OneRecordPerSplitUpToThirtyTwo) {
  auto splits = [](int batch, int max_blocks) {
    return cuda::decode_num_splits(kvarn_problem(4, 2, batch, max_blocks));
  };
  const int wave = splits(1, 8192);  // 1M tokens: as many splits as one wave of CTAs holds
  ASSERT_GE(wave, 64);
  EXPECT_EQ(splits(1, 8), 8);                       // 1K: one record per split
  EXPECT_EQ(splits(1, 16), 16);                     // 2K
  EXPECT_EQ(splits(1, 32), 32);                     // 4K (16 with the 256-token floor alone)
  EXPECT_EQ(splits(1, 64), 32);                     // 8K
  EXPECT_EQ(splits(1, 128), 64);                    // 16K: 256 tokens per split
  EXPECT_EQ(splits(1, 256), 64);                    // 32K: at most 64 below 128K
  EXPECT_EQ(splits(1, 512), 64);                    // 64K
  EXPECT_EQ(splits(1, 1024), std::min(wave, 256));  // 128K: 512 tokens per split, one wave
  // Hkv 2 (a wave of four times the splits) from 128K and G 64 below it keep 512 tokens per split
  auto hkv2_splits = [](int max_blocks) {
    cuda::DecodeProblem p = kvarn_problem(4, 2, 1, max_blocks);
    p.num_kv_heads = 2;
    p.num_q_heads = 8;
    return cuda::decode_num_splits(p);
  };
  // 128K: 256 splits, where one wave (1M tokens) holds that many (396 on 132 SMs)
  EXPECT_EQ(hkv2_splits(1024), std::min(hkv2_splits(8192), 256));
  EXPECT_EQ(cuda::decode_num_splits(kvarn_problem(4, 2, 1, 256, 64)), 32);  // G 64 x 16K
}

// Automatic choice of the sink spread (k4v2, Hkv 8): from 32 sequences x KV heads, 8 splits and at
// most 32 records per split; never without a sink or at G 64; the override wins. Needs no device.
TEST(KvarnDecodeSpread, AutomaticChoice) {
  auto spread = [](int batch, int max_blocks, int sink_tokens = -1, int group = 128,
                   int force = -1) {
    cuda::DecodeProblem p = kvarn_problem(4, 2, batch, max_blocks, group);
    p.kvarn.sink_tokens = sink_tokens;
    p.spread_sink = force;
    return cuda::decode_spread_sink_blocks(p);
  };
  EXPECT_EQ(spread(8, 128), 1);     // batch 8 x 16K
  EXPECT_EQ(spread(8, 8), 1);       // batch 8 x 1K: one record per split
  EXPECT_EQ(spread(8, 1024), 0);    // batch 8 x 128K: more than 32 records per split
  EXPECT_EQ(spread(1, 128), 0);     // batch 1: 8 sequences x KV heads
  EXPECT_EQ(spread(32, 128), 0);    // batch 32: fewer than 8 splits
  EXPECT_EQ(spread(8, 128, 0), 0);  // no sink
  EXPECT_EQ(spread(8, 128, 256), 2);
  EXPECT_EQ(spread(8, 256, -1, 64), 0);
  EXPECT_EQ(spread(32, 128, -1, 128, 1), 1);
  EXPECT_EQ(spread(8, 128, -1, 128, 0), 0);
}

// Automatic KVarN split count where one split per sequence and KV head is more than one wave of
// CTAs (k4v4's two-warp CTAs at batch 128): four splits. Needs no device.
TEST(KvarnDecodeSplits, FourPastAWave) {
  auto splits = [](int kb, int vb, int batch, int max_blocks) {
    cuda::DecodeProblem p = kvarn_problem(kb, vb, batch, max_blocks);
    p.warps = vb == 2 ? 1 : 2;  // the automatic choice from batch 8 (g128_warps)
    return cuda::decode_num_splits(p);
  };
  for (auto [kb, vb] : {std::pair{4, 2}, std::pair{4, 4}}) {
    const long long slots = 8LL * splits(kb, vb, 1, 8192);  // batch 1 x 1M tokens: one wave
    for (int batch : {8, 32, 128, 256}) {
      const long long ctas = 8LL * batch;
      const int expected = ctas > slots ? 4 : static_cast<int>(std::max(1LL, slots / ctas));
      EXPECT_EQ(splits(kb, vb, batch, 256), std::min(expected, 256))
          << "k" << kb << "v" << vb << " batch " << batch;
    }
  }
  // at most one split per block
  EXPECT_EQ(splits(4, 4, 128, 3), std::min(splits(4, 4, 128, 256), 3));
}

}  // namespace
}  // namespace kvarn
