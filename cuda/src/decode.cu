// Paged decode host entry: argument checks, split choice, split kernel + combine launch
// (the combine is a programmatic dependent launch: its launch overlaps the split kernel's tail).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>

#include "decode_launch.cuh"
#include "kvarn/cuda/api.hpp"
#include "kvarn/cuda/decode_instances.hpp"
#include "kvarn/data/error.hpp"

namespace kvarn::cuda {

namespace {

// Query heads per KV head (the kernels' qpk; it also picks the KVarN G 128 instance).
int queries_per_kv_head(const DecodeProblem& p) {
  return p.num_q_heads / std::max(p.num_kv_heads, 1);
}

KvFormat kernel_format(DecodeFormat f) {
  return f == DecodeFormat::kKvarn  ? KvFormat::kKvarn
         : f == DecodeFormat::kFp16 ? KvFormat::kFp16
                                    : KvFormat::kFp8;
}

// KVarN G 128 warps per CTA (both compiled; H200 numbers in docs/PERFORMANCE.md): p.warps when
// set; else 2 when the cache holds at most kFewRecordsPerSm records per SM (batch 1 at 2K-4K:
// each record's latency is what is left and two warps halve it, k4v2 13.9 -> 12.7 us at 2K);
// else 2 when one-warp CTAs would be split more than kManyWarpSplits ways (few sequences x KV
// heads: batch 1 from 16K, where two warps per record won at every context and both bit pairs,
// k4v2 16K 22.7 -> 17.9 us, 128K 54.4 -> 51.2 us, k4v4 128K 66.4 -> 57.0 us); else the table's
// count for the bit pair (batch >= 8: k4v2 1, k4v4 2), except for records in pieces (k4v4 on one
// warp: 12 CTAs per SM with at most 4 query heads per KV head, 8 with more): one warp where the
// problem is split (Hq 32 at batch 128: one split, 1,024 CTAs for 1,584 slots) and a split holds
// at least kPieceRecords records (H200, against two warps: Hq 32 batch 8 and 32 at 32K-128K
// 1.03-1.07x, batch 32 x 16K 1.00x, batch 8 x 16K with 5 records per split 0.93x, batch 128 x
// 16K-32K 0.95x; Hq 64 batch 8 and 32 at 16K-128K 1.01-1.03x).
int g128_warps(const DecodeProblem& p) {
  if (p.warps > 0) return p.warps;
  constexpr long long kFewRecordsPerSm = 2;
  // many: past batch 8 at Hkv 8, 16 splits with 8 one-warp CTAs per SM (24 with 12, in pieces)
  constexpr int kManyWarpSplits = 16, kManyPieceSplits = 24;
  const long long records =
      static_cast<long long>(p.batch) * p.num_kv_heads * std::max(p.max_blocks, 0);
  if (records <= kFewRecordsPerSm * sm_count()) return 2;
  DecodeProblem one = p;
  one.warps = 1;
  const int splits = decode_num_splits(one);
  const bool pieces =
      record_in_pieces(KvFormat::kKvarn, p.head_dim, 128, p.kvarn.key_bits, p.kvarn.value_bits, 1);
  if (splits > (pieces ? kManyPieceSplits : kManyWarpSplits)) return 2;
  if (pieces) {
    constexpr int kPieceRecords = 8;
    const int per_split = (std::max(p.max_blocks, 0) + splits - 1) / splits;
    return splits >= 2 && per_split >= kPieceRecords ? 1 : 2;
  }
  return decode_table_warps(DecodeFormat::kKvarn, p.kvarn.key_bits, p.kvarn.value_bits) == 2 ? 2
                                                                                             : 1;
}

// KVarN G 128: the sink blocks whose rows the split kernel spreads over the splits (its kSpread
// instance), 0 for none. p.spread_sink when set; else where the cache has a sink, at least 32
// sequences x KV heads, at least 8 splits and at most 32 records per split: at Hkv 8 batch 8 from
// 1K to 64K (k4v2, 16 splits) or 32K (k4v4, 12). There one split read the whole sink (8 row
// items on one warp) and finished last (H200, k4v2 batch 8 x 16K: 43.5 against 35.2 us for the
// other splits). Batch 1 keeps it in one split (a split holds 1-11 records there: spread
// 0.94-1.02x); batch 32-128 have 1-4 splits.
int spread_sink_blocks(const DecodeProblem& p, int splits) {
  const KvarnConfig& c = p.kvarn;
  if (p.format != DecodeFormat::kKvarn || c.group != 128 || c.sink() < c.group) return 0;
  const int sink_blocks = c.sink() / c.group;
  if (p.spread_sink >= 0) return p.spread_sink > 0 ? sink_blocks : 0;
  constexpr long long kMinGroups = 32;
  constexpr int kMinSplits = 8, kMaxRecordsPerSplit = 32;
  const long long groups = static_cast<long long>(p.batch) * p.num_kv_heads;
  const int per_split = (std::max(p.max_blocks, 0) + splits - 1) / splits;
  return groups >= kMinGroups && splits >= kMinSplits && per_split <= kMaxRecordsPerSplit
             ? sink_blocks
             : 0;
}

// The KVarN record a stage holds (nothing for the other formats).
detail::StageRecord stage_record_of(const DecodeProblem& p) {
  if (p.format != DecodeFormat::kKvarn) return {};
  const KvarnRecordLayout lay = kvarn_record_layout(p.head_dim, p.kvarn);
  return {static_cast<long long>(lay.aligned), static_cast<long long>(lay.v_codes),
          p.kvarn.key_bits, p.kvarn.value_bits};
}

int tq_slot(const DecodeProblem& p) {
  return detail::tq_slot_bytes(p.head_dim, p.tq.key_bits, p.tq.value_bits);
}

void launch_combine(const DecodeProblem& p, const float* o_part, const float* lse, int splits,
                    float rot_scale, std::uint16_t* out, cudaStream_t stream) {
  DISPATCH_HEAD_DIM(p.head_dim, kD, {
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(p.num_q_heads, p.batch);
    // Many splits (batch 1 at long context): one wide CTA per row streams the partial outputs
    // with many loads in flight (H200 FP16 B1 x 128K: 154 -> 147 us); few splits (batch >= 8):
    // D threads, each loading its channel of up to kCombineChunk splits at once, cheaper there
    // (B128 x 2K: 305 against 312 us, measured when those threads still went one split after the
    // other). The wide one holds the split weights in shared memory: past kCombineMaxSplits the
    // plain one's loop takes the rest.
    constexpr int kWideFromSplits = kCombineChunk + 1;
    const bool wide = splits >= kWideFromSplits && splits <= kCombineMaxSplits;
    cfg.blockDim = dim3(wide ? kCombineThreads : kD);
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    KVARN_CUDA_CHECK(cudaLaunchKernelEx(&cfg, wide ? combine_wide_kernel<kD> : combine_kernel<kD>,
                                        o_part, lse, p.num_q_heads, splits, rot_scale,
                                        reinterpret_cast<__half*>(out)));
  })
}

}  // namespace

namespace detail {

bool launch_decode_instance(KvFormat f, int kb, int vb, const DecodeArgs& a, const LaunchShape& s,
                            cudaStream_t st) {
#define KVARN_DECODE_DISPATCH_(format, KB, VB, unit, warps) \
  if (f == KvFormat::format && kb == KB && vb == VB) {      \
    launch_decode<KvFormat::format, KB, VB>(a, s, st);      \
    return true;                                            \
  }
  KVARN_DECODE_INSTANCES(KVARN_DECODE_DISPATCH_)
#undef KVARN_DECODE_DISPATCH_
  return false;
}

}  // namespace detail

std::string decode_compiled_list(DecodeFormat format) {
  std::string out;
  for (const DecodeInstance& i : kDecodeInstances) {
    if (i.format != format) continue;
    out += (out.empty() ? "k" : ", k") + std::to_string(i.key_bits) + "v" +
           std::to_string(i.value_bits);
  }
  return out;
}

int turboquant_slot_bytes(int head_dim, const TqDecodeConfig& c) {
  return detail::tq_slot_bytes(head_dim, c.key_bits, c.value_bits);
}

namespace {

// Resident CTAs per SM of the split kernel for this problem (registers and shared memory, from
// the CUDA occupancy calculator); 0 when it cannot be asked (no device).
int resident_ctas(const DecodeProblem& p) {
  if (p.format == DecodeFormat::kTurboQuant || device_count() == 0) return 0;
  int n = 0;
  DecodeArgs a{};
  a.qpk = queries_per_kv_head(p);  // KVarN G 128: the paired instance or not
  const KvFormat f = kernel_format(p.format);
  const int w = decode_num_warps(p);
  a.stage_bytes = detail::decode_stage_bytes(f, p.head_dim, p.block_size, w, stage_record_of(p));
  detail::LaunchShape s{p.head_dim, p.block_size, 1, 1, 1, w, &n};
  const bool kv = f == KvFormat::kKvarn;
  if (!detail::launch_decode_instance(f, kv ? p.kvarn.key_bits : 8, kv ? p.kvarn.value_bits : 8, a,
                                      s, nullptr))
    return 0;
  return n;
}

}  // namespace

// As many split CTAs as are resident on the device at once (occupancy calculator; without a
// device: shared memory bound, 228 KiB per SM, 1 KiB reserved per CTA), split so that
// batch * Hkv * S fills that one wave (FP16: two CTAs per SM), with at least two blocks per split
// (each split writes D floats per head to the workspace; KVarN: one record, whose work outweighs
// that) and, for FP16 and KVarN past 16 splits, a minimum of tokens per split (KVarN G 128 below
// 128K tokens: also at most 64 splits).
int decode_num_splits(const DecodeProblem& p) {
  if (p.num_splits > 0) return p.num_splits;
  const bool tq = p.format == DecodeFormat::kTurboQuant;
  const int warps = decode_num_warps(p);
  const int smem = tq ? tq_smem_bytes(tq_slot(p), p.tq.key_bits, warps)
                      : detail::decode_smem_bytes(kernel_format(p.format), p.head_dim, p.block_size,
                                                  warps, stage_record_of(p));
  // Per device and kernel instantiation (and record layout); asked once per key: this runs on
  // every decode step.
  static thread_local std::map<std::array<int, 9>, int> cache;
  const std::array<int, 9> key = {current_device(),
                                  static_cast<int>(p.format),
                                  p.head_dim,
                                  p.block_size,
                                  p.kvarn.key_bits,
                                  p.kvarn.value_bits,
                                  static_cast<int>(p.kvarn.scales),
                                  warps,
                                  queries_per_kv_head(p)};
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, resident_ctas(p)).first;
  const int resident = it->second;
  long long per_sm = resident > 0 ? resident : std::clamp(233472 / (smem + 1024), 1, tq ? 16 : 32);
  // TurboQuant: a split is one warp; __launch_bounds__ caps the registers at tq_min_ctas CTAs
  if (tq) per_sm = std::clamp(233472 / (smem + 1024), 1, tq_min_ctas(warps)) * warps;
  // FP16: splits for two CTAs per SM, not the four that are resident: fewer concurrent streams
  // read faster (H200: batch 8 1-3 %, batch 1 x 64K-128K and batch 32 x 32K 0.5-1 % faster;
  // batch 128 has one split either way).
  constexpr long long kFp16CtasPerSm = 2;
  if (p.format == DecodeFormat::kFp16) per_sm = std::min(per_sm, kFp16CtasPerSm);
  const long long slots = per_sm * sm_count();
  const long long ctas = std::max(1LL, static_cast<long long>(p.batch) * p.num_kv_heads);
  long long s = std::max(1LL, slots / ctas);
  // KVarN G 128: where one split per sequence and KV head is more than one wave of CTAs (k4v4's
  // two-warp CTAs at batch 128: 1,024 CTAs on 792 slots, 1.3 waves), four splits, so that the last
  // partial wave is a small part of the step (H200, k4v4 batch 128 against one split: 16K 733 ->
  // 626 us, 32K 1,363 -> 1,279 us, 128K 5,640 -> 5,322 us; two to eight splits were all 1.04-1.17x
  // faster than one; k4v2's one-warp CTAs fit one wave at batch 128).
  constexpr long long kKvarnSplitsPastAWave = 4;
  if (p.format == DecodeFormat::kKvarn && p.kvarn.group == 128 && ctas > slots)
    s = kKvarnSplitsPastAWave;
  // FP16 and KVarN beyond 16 splits (few sequences and heads: batch 1): more splits than that
  // cost more in the combine than the extra parallelism gives, so at least 1024 (FP16) / 512
  // (KVarN) tokens per split there (H200, batch 1: 8-17 % faster at 16K-32K, unchanged
  // elsewhere), except that KVarN keeps one record per split up to 32 splits (batch 1 x 4K k4v2:
  // 32 splits 12.2 us, 16 splits 13.2 us), and KVarN G 128 below 128K tokens takes at least 256
  // tokens and at most 64 splits (batch 1, Hkv 8, two-warp CTAs, against 32 at 16K and one wave
  // of 99 at 64K: 16K 1.05-1.08x, 64K 1.02-1.06x faster; 32K already had 64; at 128K one wave
  // beats 64 by 1.01-1.06x). FP8 lost at short context with such a floor and keeps one wave of
  // CTAs.
  constexpr long long kManySplits = 16, kKvarnManySplits = 32;
  constexpr long long kKvarnG128MaxSplitsBelow128K = 64;
  if (s > kManySplits && (p.format == DecodeFormat::kFp16 || p.format == DecodeFormat::kKvarn)) {
    const bool kvarn = p.format == DecodeFormat::kKvarn;
    const long long tokens = static_cast<long long>(p.max_blocks) * p.block_size;
    const bool g128_below_128k = kvarn && p.kvarn.group == 128 && tokens < (1LL << 17);
    const long long min_tokens = !kvarn ? 1024 : g128_below_128k ? 256 : 512;
    s = std::min(s, std::max(kvarn ? kKvarnManySplits : kManySplits, tokens / min_tokens));
    if (g128_below_128k) s = std::min(s, kKvarnG128MaxSplitsBelow128K);
  }
  // TurboQuant past 64 splits (batch 1): at least 256 tokens per split, as the combine's loop
  // over the splits outweighs the parallelism there (H200, batch 1: 4K 1.24-1.27x, 16K
  // 1.23-1.42x, 32K 1.14-1.26x faster, unchanged elsewhere); up to 64 splits short contexts keep
  // one wave (2K: 64 splits of 32 tokens beat 16 splits by 1.14x).
  constexpr long long kTqManySplits = 64, kTqMinTokens = 256;
  if (tq && s > kTqManySplits) {
    const long long tokens = static_cast<long long>(p.max_blocks) * p.block_size;
    s = std::min(s, std::max(kTqManySplits, tokens / kTqMinTokens));
  }
  // KVarN at batch 1 and 2K-4K tokens: one record per split is faster than two (H200, k4v2 B1:
  // 2K 16.1 -> 13.9 us, 4K 21.9 -> 17.2 us)
  const int min_blocks = p.format == DecodeFormat::kKvarn ? 1 : 2;
  s = std::min<long long>(s, std::max(1, p.max_blocks / min_blocks));
  return static_cast<int>(std::clamp<long long>(s, 1, 1024));
}

namespace {

// TurboQuant warps per CTA (each its own split; they share the key centroid table): p.warps when
// set; else, for Lloyd-Max keys (3-/4-bit), a cache of at least kTqManyTokens tokens over all
// sequences and KV heads and eight-warp CTAs for at least half the SMs, eight (H200, Hq 32,
// against one warp at 6342552: 4bit_nc 1.27-1.41x and 3bit_nc 1.19-1.43x at batch 32-128,
// 1.07-1.40x / 1.13-1.27x at batch 8, 1.10-1.34x / 1.05-1.14x at batch 1 x 32K-128K); else one
// (batch 1 x 2K: eight warps 0.89x / 0.96x; batch 1 x 16K, 64 splits in 64 eight-warp CTAs on 132
// SMs: 0.88-0.93x). FP8 keys (k8v4): one (eight not measured).
int tq_warps(const DecodeProblem& p) {
  if (p.warps > 0) return p.warps;
  constexpr long long kTqManyTokens = 1LL << 17;  // batch 1 x 16K or batch 8 x 2K at Hkv 8
  constexpr int kTqWideWarps = 8;
  const long long tokens =
      static_cast<long long>(p.batch) * p.num_kv_heads * std::max(p.max_blocks, 0) * p.block_size;
  if (p.tq.key_bits == 8 || tokens < kTqManyTokens) return 1;
  DecodeProblem wide = p;
  wide.warps = kTqWideWarps;
  const long long streams =
      static_cast<long long>(p.batch) * p.num_kv_heads * decode_num_splits(wide);
  const long long ctas = (streams + kTqWideWarps - 1) / kTqWideWarps;
  return 2 * ctas >= sm_count() ? kTqWideWarps : 1;
}

bool tq_warps_compiled(int warps) {
  for (int w : kTqCompiledWarps)
    if (w == warps) return true;
  return false;
}

}  // namespace

int decode_num_warps(const DecodeProblem& p) {
  if (p.format == DecodeFormat::kTurboQuant) return tq_warps(p);
  const KvFormat f = kernel_format(p.format);
  return decode_warps(f, p.block_size, f == KvFormat::kKvarn ? g128_warps(p) : 1);
}

int decode_spread_sink_blocks(const DecodeProblem& p) {
  return spread_sink_blocks(p, decode_num_splits(p));
}

std::size_t decode_workspace_bytes(const DecodeProblem& p) {
  const std::size_t rows = static_cast<std::size_t>(p.batch) * p.num_q_heads;
  const std::size_t s = static_cast<std::size_t>(decode_num_splits(p));  // a CTA merges its warps
  return rows * s * (static_cast<std::size_t>(p.head_dim) + 1) * sizeof(float);
}

void paged_decode(const DecodeProblem& p, const DecodeBuffers& b, cudaStream_t stream) {
  KVARN_CHECK(p.num_kv_heads > 0 && p.num_q_heads % p.num_kv_heads == 0, "paged_decode: Hq ",
              p.num_q_heads, " not a multiple of Hkv ", p.num_kv_heads);
  KVARN_CHECK(queries_per_kv_head(p) <= kDecodeHeads,
              "paged_decode: Hq / Hkv = ", queries_per_kv_head(p), " > ", kDecodeHeads);
  KVARN_CHECK(b.workspace != nullptr, "paged_decode: workspace required");
  // An explicit warp count must be one that is compiled: 1 or 2 for KVarN G 128, else the fixed
  // one.
  KVARN_CHECK(p.warps == 0 || (p.format == DecodeFormat::kTurboQuant
                                   ? tq_warps_compiled(p.warps)
                                   : (p.warps == 1 || p.warps == 2) &&
                                         p.warps == decode_warps(kernel_format(p.format),
                                                                 p.block_size, p.warps)),
              "paged_decode: warps ", p.warps,
              " not compiled for this format and block size (0: automatic)");
  if (p.batch == 0) return;
  // cp.async copies and float4 workspace stores read/write 16 bytes; q is read as half2
  for (const auto& [ptr, what, align] :
       {std::tuple<const void*, const char*, std::uintptr_t>{b.records, "records", 16},
        {b.k_pool, "k_pool", 16},
        {b.v_pool, "v_pool", 16},
        {b.workspace, "workspace", 16},
        {b.q, "q", 4},
        {b.out, "out", 2}}) {
    KVARN_CHECK(reinterpret_cast<std::uintptr_t>(ptr) % align == 0, "paged_decode: ", what,
                " must be ", align, "-byte aligned, got ", ptr);
  }
  const int splits = decode_num_splits(p);
  const float sm_scale = p.softmax_scale > 0
                             ? p.softmax_scale
                             : static_cast<float>(1.0 / std::sqrt(double(p.head_dim)));
  float out_rot = 0.0f;  // combine: un-rotate the output with this scale (0: no rotation)
  if (p.format == DecodeFormat::kTurboQuant) {
    const TqDecodeConfig& c = p.tq;
    KVARN_CHECK(decode_compiled(DecodeFormat::kTurboQuant, c.key_bits, c.value_bits),
                "paged_decode: TurboQuant k", c.key_bits, "v", c.value_bits, " not compiled (",
                decode_compiled_list(DecodeFormat::kTurboQuant), ")");
    KVARN_CHECK(!(c.key_bits == 8 && c.nc), "paged_decode: TurboQuant nc needs Lloyd-Max keys");
    KVARN_CHECK(p.block_size % 16 == 0 && p.block_size > 0,
                "paged_decode: TurboQuant page size must be a multiple of 16, got ", p.block_size);
    TqDecodeArgs t{};
    t.q = reinterpret_cast<const __half*>(b.q);
    t.block_table = b.block_table;
    t.max_blocks = p.max_blocks;
    t.seq_lens = b.seq_lens;
    t.cache = static_cast<const unsigned char*>(b.k_pool);
    t.batch = p.batch;
    t.num_q_heads = p.num_q_heads;
    t.num_kv_heads = p.num_kv_heads;
    t.qpk = queries_per_kv_head(p);
    t.num_splits = splits;
    t.page = p.block_size;
    t.qk_scale = sm_scale * 1.4426950408889634f;
    t.rot_scale = c.key_bits == 8 ? 0.0f : static_cast<float>(1.0 / std::sqrt(double(p.head_dim)));
    t.nc = c.nc ? 1 : 0;
    detail::fill_tq_tables(p.head_dim, c.key_bits, t);
    t.o_part = static_cast<float*>(b.workspace);
    t.lse = t.o_part + static_cast<std::size_t>(p.batch) * p.num_q_heads * splits * p.head_dim;
    detail::LaunchShape s{p.head_dim, p.block_size,   splits,
                          p.batch,    p.num_kv_heads, decode_num_warps(p)};
    detail::launch_turboquant(c.key_bits, c.value_bits, t, p.head_dim, s, stream);
    launch_combine(p, t.o_part, t.lse, splits, out_rot, b.out, stream);
    return;
  }
  DecodeArgs a{};
  a.q = reinterpret_cast<const __half*>(b.q);
  a.block_table = b.block_table;
  a.max_blocks = p.max_blocks;
  a.seq_lens = b.seq_lens;
  a.records = b.records;
  a.block_to_slot = b.block_to_slot;
  a.k_pool = b.k_pool;
  a.v_pool = b.v_pool;
  a.k_scale = b.k_scale;
  a.v_scale = b.v_scale;
  a.num_q_heads = p.num_q_heads;
  a.num_kv_heads = p.num_kv_heads;
  a.qpk = queries_per_kv_head(p);
  a.num_splits = splits;
  a.qk_scale = sm_scale * 1.4426950408889634f;
  a.o_part = static_cast<float*>(b.workspace);
  const int warps = decode_num_warps(p);
  a.lse = a.o_part + static_cast<std::size_t>(p.batch) * p.num_q_heads * splits * p.head_dim;
  detail::LaunchShape s{p.head_dim, p.block_size, splits, p.batch, p.num_kv_heads, warps};
  if (p.format == DecodeFormat::kKvarn) {
    const KvarnConfig& c = p.kvarn;
    KVARN_CHECK(c.group == p.block_size, "paged_decode: block_size must equal the KVarN group");
    KVARN_CHECK(c.rotation != RotationKind::kHaar,
                "paged_decode: rotation not supported on the GPU");
    const KvarnRecordLayout lay = kvarn_record_layout(p.head_dim, c);
    // the kernel reads the codes and scale fields with loads of up to 16 bytes
    KVARN_CHECK(lay.aligned % 16 == 0 && lay.s_col_k % 32 == 0 && lay.v_codes % 32 == 0 &&
                    lay.s_row_k % 16 == 0 && lay.s_col_v % 16 == 0 && lay.s_row_v % 16 == 0 &&
                    lay.zp_v % 16 == 0 && lay.zp_k % 16 == 0,
                "paged_decode: record layout not 16/32-byte aligned");
    a.record_bytes = static_cast<long long>(lay.aligned);
    // The query and output rotations use the cache's matrix: +-fp16(1/sqrt(D)) by default.
    a.rot_scale = c.rotation == RotationKind::kHadamardFp16 ? hadamard_fp16_entry(p.head_dim)
                  : c.rotation == RotationKind::kHadamard
                      ? static_cast<float>(1.0 / std::sqrt(double(p.head_dim)))
                      : 0.0f;
    a.fp8_scales = c.scales == ScaleStorage::kFp8E4M3 ? 1 : 0;
    a.sink_blocks = spread_sink_blocks(p, splits);  // decode_spread_sink_blocks
    a.s_col_k = static_cast<int>(lay.s_col_k);
    a.zp_k = static_cast<int>(lay.zp_k);
    a.s_row_k = static_cast<int>(lay.s_row_k);
    a.v_codes = static_cast<int>(lay.v_codes);
    a.s_col_v = static_cast<int>(lay.s_col_v);
    a.s_row_v = static_cast<int>(lay.s_row_v);
    a.zp_v = static_cast<int>(lay.zp_v);
    a.stage_bytes =
        detail::decode_stage_bytes(KvFormat::kKvarn, p.head_dim, p.block_size, warps,
                                   {a.record_bytes, a.v_codes, c.key_bits, c.value_bits});
    KVARN_CHECK(
        detail::launch_decode_instance(KvFormat::kKvarn, c.key_bits, c.value_bits, a, s, stream),
        "paged_decode: KVarN k", c.key_bits, "v", c.value_bits, " not compiled (",
        decode_compiled_list(DecodeFormat::kKvarn), ")");
  } else {
    a.rot_scale = 0.0f;
    const KvFormat f = kernel_format(p.format);
    a.stage_bytes = detail::decode_stage_bytes(f, p.head_dim, p.block_size, warps, {});
    KVARN_CHECK(detail::launch_decode_instance(f, 8, 8, a, s, stream),
                "paged_decode: format not compiled");
  }
  out_rot = a.rot_scale;
  launch_combine(p, a.o_part, a.lse, splits, out_rot, b.out, stream);
}

}  // namespace kvarn::cuda
