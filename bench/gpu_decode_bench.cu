// H200 decode benchmarks: device read/copy bandwidth (the roofline), KVarN store throughput, and
// the paged decode sweep (KVarN k4v2/k4v4, FP16, FP8, TurboQuant 4bit_nc / 3bit_nc / k8v4), fixed
// split counts at batch 1 (splits/), each KVarN G 128 warp count per CTA (warps/) and each
// TurboQuant warp count per CTA (tqwarps/).
// Manual timing with CUDA events, median of repetitions. Before every timed repetition the L2 is
// flushed by READING a buffer of three times its size (a memset would leave dirty lines whose
// write-back lands in the timed kernel). Everything runs on one created stream; each decode step
// (split kernel + programmatic-dependent combine) is captured once into a CUDA graph and replayed,
// as a serving loop would.
// After timing, every decode case is checked: the timed output must be finite, and the same graph
// replayed over a cache of constant K rows (uniform attention) must give the closed-form output
// (the mean of the V rows) within a small bound; a case that fails reports an error instead of a
// time.
// Env: KVARN_BENCH_BUDGET_S (default 300) stops registering new decode work past the budget;
// KVARN_BENCH_GRID=1 adds the KVarN split x warp grid and FP16 batch-8 split counts (grid/).
#include <benchmark/benchmark.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "kvarn/core/kvarn.hpp"
#include "kvarn/core/portable_math.hpp"
#include "kvarn/core/rotation.hpp"
#include "kvarn/core/turboquant.hpp"
#include "kvarn/cuda/api.hpp"
#include "kvarn/cuda/decode_instances.hpp"

namespace {

using kvarn::cuda::DecodeFormat;
constexpr int kHeadDim = 128;
const auto g_start = std::chrono::steady_clock::now();
double budget_s() {
  const char* e = std::getenv("KVARN_BENCH_BUDGET_S");
  return e ? std::atof(e) : 300.0;
}
double elapsed_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - g_start).count();
}

__device__ __forceinline__ unsigned hash32(unsigned long long x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return static_cast<unsigned>(x);
}
// mask: AND-ed into every byte (0xFE keeps fp8 e4m3 bytes off NaN)
__global__ void fill_random_bytes(unsigned char* p, long long n, unsigned seed,
                                  unsigned char mask = 0xFF) {
  for (long long i = blockIdx.x * 256LL + threadIdx.x; i < n; i += 256LL * gridDim.x)
    p[i] = static_cast<unsigned char>(hash32(i * 2654435761ULL + seed)) & mask;
}
__global__ void fill_random_half(__half* p, long long n, unsigned seed) {
  for (long long i = blockIdx.x * 256LL + threadIdx.x; i < n; i += 256LL * gridDim.x)
    p[i] = __float2half((hash32(i + seed * 0x9e3779b97ULL) & 0xffff) / 32768.0f - 1.0f);
}
// valid fp16 scales/zero-points inside each record: [from, to) bytes of every record
__global__ void fill_scales(unsigned char* rec, long long n_rec, long long rec_bytes, int from,
                            int to) {
  const int words = (to - from) / 2;
  for (long long i = blockIdx.x * 256LL + threadIdx.x; i < n_rec * words; i += 256LL * gridDim.x) {
    const long long r = i / words, w = i % words;
    reinterpret_cast<__half*>(rec + r * rec_bytes + from)[w] =
        __float2half(0.05f + (hash32(i) & 255) / 4096.0f);
  }
}
// valid TurboQuant slots: fp16 norm in [0.5, 1.5), value scale and zero; fp8 keys without NaN
__global__ void fill_tq_slots(unsigned char* cache, long long n_slots, int slot, int norm_off,
                              int fp8_bytes, int sz_off) {
  for (long long i = blockIdx.x * 256LL + threadIdx.x; i < n_slots; i += 256LL * gridDim.x) {
    unsigned char* s = cache + i * slot;
    const unsigned hsh = hash32(i * 77 + 11);
    if (norm_off >= 0)
      *reinterpret_cast<__half*>(s + norm_off) = __float2half(0.5f + (hsh & 1023) / 1024.0f);
    for (int j = 0; j < fp8_bytes; ++j) s[j] &= 0xFE;
    *reinterpret_cast<__half*>(s + sz_off) = __float2half(0.01f + ((hsh >> 10) & 255) / 4096.0f);
    *reinterpret_cast<__half*>(s + sz_off + 2) = __float2half(-0.5f + ((hsh >> 18) & 255) / 512.0f);
  }
}
// dst[i] = unit[i % unit_bytes] for i < n (a cache made of one repeated row/record/slot)
__global__ void replicate_unit(unsigned char* dst, long long n, const unsigned char* unit,
                               int unit_bytes) {
  for (long long i = blockIdx.x * 256LL + threadIdx.x; i < n; i += 256LL * gridDim.x)
    dst[i] = unit[i % unit_bytes];
}
// Streams p once; each thread keeps kUnroll independent 16-byte loads in flight.
template <int kUnroll>
__global__ void read_kernel(const float4* p, long long n, float* out) {
  float4 acc = make_float4(0, 0, 0, 0);
  auto add = [&](const float4& v) {
    acc.x += v.x;
    acc.y += v.y;
    acc.z += v.z;
    acc.w += v.w;
  };
  const long long stride = 256LL * gridDim.x;
  long long i = blockIdx.x * 256LL + threadIdx.x;
  for (; i + (kUnroll - 1) * stride < n; i += kUnroll * stride) {
    float4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = __ldcs(p + i + u * stride);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) add(v[u]);
  }
  for (; i < n; i += stride) add(__ldcs(p + i));
  if (acc.x + acc.y + acc.z + acc.w == 1.2345f) out[0] = acc.x;
}
__global__ void copy_kernel(const float4* a, float4* b, long long n) {
  for (long long i = blockIdx.x * 256LL + threadIdx.x; i < n; i += 256LL * gridDim.x)
    __stcs(b + i, __ldcs(a + i));
}

template <typename T>
struct Dev {
  T* p = nullptr;
  std::size_t n = 0;
  explicit Dev(std::size_t count) : n(count) {
    KVARN_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(T) + 16));
  }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  unsigned char* bytes() const { return reinterpret_cast<unsigned char*>(p); }
};
using Bytes = Dev<unsigned char>;

int grid() {
  int sms = 132;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  return sms * 8;
}

cudaStream_t bench_stream() {
  static cudaStream_t s = [] {
    cudaStream_t x;
    KVARN_CUDA_CHECK(cudaStreamCreateWithFlags(&x, cudaStreamNonBlocking));
    return x;
  }();
  return s;
}

// Reads a buffer of three times the L2 (at least 2x, as the flush must) on the bench stream.
void flush_l2_by_reading() {
  static const long long bytes = [] {
    int l2 = 50 << 20;
    cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0);
    return (3LL * l2 + 15) / 16 * 16;
  }();
  static Dev<float4> buf(bytes / 16);
  static Dev<float> sink(1);
  static const bool filled = [] {
    fill_random_bytes<<<grid(), 256>>>(buf.bytes(), bytes, 99);
    KVARN_CUDA_CHECK(cudaDeviceSynchronize());
    return true;
  }();
  (void)filled;
  read_kernel<4><<<grid(), 256, 0, bench_stream()>>>(buf.p, bytes / 16, sink.p);
}
long long flush_bytes() {
  int l2 = 50 << 20;
  cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0);
  return 3LL * l2;
}

// Runs f() `reps` times between events, median in seconds; with flush, the L2 is flushed by
// reading before every repetition (outside the events).
template <typename F>
double time_median(F f, int reps, bool flush) {
  const cudaStream_t st = bench_stream();
  cudaEvent_t a, b;
  KVARN_CUDA_CHECK(cudaEventCreate(&a));
  KVARN_CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 2; ++i) f();
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i) {
    if (flush) flush_l2_by_reading();
    KVARN_CUDA_CHECK(cudaEventRecord(a, st));
    f();
    KVARN_CUDA_CHECK(cudaEventRecord(b, st));
    KVARN_CUDA_CHECK(cudaEventSynchronize(b));
    float t;
    KVARN_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  KVARN_CUDA_CHECK(cudaGetLastError());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2] * 1e-3;
}

// The roofline: the fastest of several read kernels (1-8 loads in flight per thread), so that
// "% of read bandwidth" is against the best read this device was seen to do, not a weak one.
void BM_ReadBandwidth(benchmark::State& st) {
  const long long bytes = 4LL << 30, n = bytes / 16;
  Dev<float4> buf(n);
  Dev<float> out(1);
  fill_random_bytes<<<grid(), 256>>>(buf.bytes(), bytes, 1);
  KVARN_CUDA_CHECK(cudaDeviceSynchronize());
  for (auto _ : st) {
    auto timed = [&](auto kernel) {
      return time_median([&] { kernel<<<grid(), 256, 0, bench_stream()>>>(buf.p, n, out.p); }, 20,
                         true);
    };
    const double t1 = timed(read_kernel<1>), t2 = timed(read_kernel<2>), t4 = timed(read_kernel<4>),
                 t8 = timed(read_kernel<8>);
    const double t = std::min({t1, t2, t4, t8});
    st.SetIterationTime(t);
    st.counters["bytes_read"] = static_cast<double>(bytes);
    st.counters["TBps"] = bytes / t * 1e-12;
    for (auto [u, tu] : {std::pair<int, double>{1, t1}, {2, t2}, {4, t4}, {8, t8}})
      st.counters["TBps_unroll" + std::to_string(u)] = bytes / tu * 1e-12;
  }
}
void BM_CopyBandwidth(benchmark::State& st) {
  const long long bytes = 2LL << 30, n = bytes / 16;
  Dev<float4> a(n), b(n);
  fill_random_bytes<<<grid(), 256>>>(a.bytes(), bytes, 2);
  KVARN_CUDA_CHECK(cudaDeviceSynchronize());
  for (auto _ : st) {
    const double t = time_median(
        [&] { copy_kernel<<<grid(), 256, 0, bench_stream()>>>(a.p, b.p, n); }, 20, true);
    st.SetIterationTime(t);
    st.counters["bytes_moved"] = 2.0 * bytes;
    st.counters["TBps"] = 2.0 * bytes / t * 1e-12;
  }
}

kvarn::KvarnConfig kvarn_cfg(int kb, int vb) {
  kvarn::KvarnConfig c;
  c.key_bits = kb;
  c.value_bits = vb;
  c.group = 128;
  return c;
}

// blocks = 1024: throughput (8192 tiles); blocks = batch: one launch of the tiles a batch
// produces every 128 generated tokens (one per sequence and KV head), i.e. its real latency.
// kernel: kAuto is what kvarn_store picks; store_kernel/{tile,cluster}/... time each kernel.
void BM_Store(benchmark::State& st, int kb, int vb, int blocks = 1024,
              kvarn::cuda::StoreKernel kernel = kvarn::cuda::StoreKernel::kAuto) {
  const auto cfg = kvarn_cfg(kb, vb);
  const int d = kHeadDim, g = 128, heads = 8;
  const auto lay = kvarn::kvarn_record_layout(d, cfg);
  const long long elems = static_cast<long long>(blocks) * g * heads * d;
  Dev<__half> k(elems), v(elems);
  Bytes rec(static_cast<std::size_t>(blocks) * heads * lay.aligned);
  fill_random_half<<<grid(), 256>>>(k.p, elems, 3);
  fill_random_half<<<grid(), 256>>>(v.p, elems, 4);
  KVARN_CUDA_CHECK(cudaDeviceSynchronize());
  kvarn::cuda::StoreTiles t;
  t.k = reinterpret_cast<const std::uint16_t*>(k.p);
  t.v = reinterpret_cast<const std::uint16_t*>(v.p);
  t.num_tiles = blocks * heads;
  t.num_heads = heads;
  t.row_stride = heads * d;
  t.head_stride = d;
  t.block_stride = static_cast<long long>(g) * heads * d;
  t.records = rec.p;
  t.kernel = kernel;
  for (auto _ : st) {
    const double s = time_median([&] { kvarn::cuda::kvarn_store(cfg, d, t, bench_stream()); },
                                 blocks >= 1024 ? 5 : 15, true);
    st.SetIterationTime(s);
    st.counters["tiles"] = t.num_tiles;
    st.counters["tiles_per_s"] = t.num_tiles / s;
    st.counters["us_per_tile_x1000"] = s / t.num_tiles * 1e9;
  }
}

struct DecodeCaseB {
  std::string fmt;  // k4v2 k4v4 fp16 fp8 tq4 tq3 tqk8v4
  int hq, hkv, batch, ctx;
  int splits = 0;  // 0: decode_num_splits' choice
  int warps = 0;   // KVarN G 128 / TurboQuant warps per CTA; 0: paged_decode's choice
};

// One region of the cache: random content for timing, constant content for the closed form.
struct Region {
  unsigned char* p;
  long long bytes;
  std::vector<std::uint8_t> unit;  // the repeated unit of the constant cache
};

// One benchmarked decode shape: problem, device buffers, bytes read, and the closed form.
struct DecodeSetup {
  kvarn::cuda::DecodeProblem p;
  kvarn::cuda::DecodeBuffers bf;
  std::vector<std::unique_ptr<Bytes>> keep;
  std::vector<Region> regions;
  std::vector<float> expected;  // [D]: every output row of the constant cache
  double kv_bytes = 0;
  long long out_elems = 0;

  unsigned char* alloc(long long bytes) {
    keep.push_back(std::make_unique<Bytes>(static_cast<std::size_t>(bytes)));
    return keep.back()->p;
  }
  template <typename T>
  T* upload(const std::vector<T>& h) {
    auto* d = reinterpret_cast<T*>(alloc(static_cast<long long>(h.size() * sizeof(T))));
    KVARN_CUDA_CHECK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
  }
};

std::vector<std::uint8_t> half_row(const std::vector<float>& x) {
  std::vector<std::uint8_t> out(x.size() * 2);
  for (std::size_t i = 0; i < x.size(); ++i) {
    const std::uint16_t h = kvarn::float_to_half_bits(x[i]);
    out[2 * i] = h & 0xff;
    out[2 * i + 1] = h >> 8;
  }
  return out;
}

// Channel pattern of the constant caches: smooth, signed, not constant.
std::vector<float> channel_pattern(int d, float phase) {
  std::vector<float> v(d);
  for (int x = 0; x < d; ++x) v[x] = 0.8f * std::sin(0.37f * x + phase) + 0.1f;
  return v;
}

// Block table (identity), lengths, query, output and workspace: common to every format.
void setup_common(DecodeSetup& s, int nb) {
  const auto& p = s.p;
  std::vector<int> table(static_cast<std::size_t>(p.batch) * nb);
  for (std::size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int>(i);
  s.bf.block_table = s.upload(table);
  s.out_elems = static_cast<long long>(p.batch) * p.num_q_heads * p.head_dim;
  auto* q = reinterpret_cast<__half*>(s.alloc(s.out_elems * 2));
  fill_random_half<<<grid(), 256>>>(q, s.out_elems, 8);
  s.bf.q = reinterpret_cast<const std::uint16_t*>(q);
  s.bf.out = reinterpret_cast<std::uint16_t*>(s.alloc(s.out_elems * 2));
  s.bf.workspace = s.alloc(static_cast<long long>(kvarn::cuda::decode_workspace_bytes(p)));
}

// TurboQuant: vLLM's block size 16, one slot per (token, KV head), no fp16 region.
void setup_tq(DecodeSetup& s, const DecodeCaseB& c) {
  const int d = kHeadDim, page = 16, nb = (c.ctx + page - 1) / page;
  auto& p = s.p;
  p.format = DecodeFormat::kTurboQuant;
  p.block_size = page;
  p.max_blocks = nb;
  p.tq = c.fmt == "tq3"      ? kvarn::cuda::TqDecodeConfig{3, 3, true}
         : c.fmt == "tqk8v4" ? kvarn::cuda::TqDecodeConfig{8, 4, false}
                             : kvarn::cuda::TqDecodeConfig{4, 4, true};
  const int slot = kvarn::cuda::turboquant_slot_bytes(d, p.tq);
  const long long n_slots = static_cast<long long>(c.batch) * nb * c.hkv * page;
  unsigned char* cache = s.alloc(n_slots * slot);
  const int kb = p.tq.key_bits, vb = p.tq.value_bits;
  fill_random_bytes<<<grid(), 256>>>(cache, n_slots * slot, 9);
  const int key_bytes = kb == 8 ? d : d * kb / 8 + 2;
  fill_tq_slots<<<grid(), 256>>>(cache, n_slots, slot, kb == 8 ? -1 : d * kb / 8, kb == 8 ? d : 0,
                                 key_bytes + d * vb / 8);
  s.bf.k_pool = cache;
  s.kv_bytes = static_cast<double>(c.batch) * c.hkv * c.ctx * slot;
  // closed form: one slot encoded by core's codecs, repeated; the output is its V reconstruction
  kvarn::TurboQuantConfig tc;
  tc.key_bits = kb;
  tc.value_bits = vb;
  tc.norm_correction = p.tq.nc;
  tc.boundary = 0;
  const kvarn::TurboQuantMethod method(tc);
  const kvarn::LayerContext layer{0, 1};
  std::vector<std::uint8_t> unit;
  std::vector<float> krec(d);
  s.expected.assign(d, 0.0f);
  for (auto kind : {kvarn::StreamKind::kKey, kvarn::StreamKind::kValue}) {
    const bool key = kind == kvarn::StreamKind::kKey;
    auto codec = method.make_codec(kind, d, layer);
    const auto row = channel_pattern(d, key ? 0.3f : 1.1f);
    kvarn::Chunk ch;
    codec->encode(row.data(), 1, &ch, key ? krec.data() : s.expected.data());
    for (const auto& f : ch.fields) unit.insert(unit.end(), f.bytes.begin(), f.bytes.end());
  }
  unit.resize(slot, 0);
  s.regions.push_back({cache, n_slots * slot, unit});
  setup_common(s, nb);
}

// KVarN records (block 0 of each sequence in the fp16 sink pool), FP16 or FP8 pages.
void setup_kvarn_fp(DecodeSetup& s, const DecodeCaseB& c) {
  const int d = kHeadDim, g = 128, nb = (c.ctx + g - 1) / g;
  auto& p = s.p;
  const bool kv = c.fmt[0] == 'k';
  p.format = kv ? DecodeFormat::kKvarn : c.fmt == "fp16" ? DecodeFormat::kFp16 : DecodeFormat::kFp8;
  p.block_size = g;
  p.max_blocks = nb;
  if (kv) p.kvarn = kvarn_cfg(4, c.fmt == "k4v2" ? 2 : 4);
  const auto lay = kvarn::kvarn_record_layout(d, p.kvarn);
  const long long num_blocks = static_cast<long long>(c.batch) * nb;
  const long long page_elems = static_cast<long long>(c.hkv) * g * d;
  const long long pool_blocks = kv ? c.batch : num_blocks;  // KVarN: one sink slot per sequence
  const bool fp8 = p.format == DecodeFormat::kFp8;
  const long long pool_bytes = pool_blocks * page_elems * (fp8 ? 1 : 2);
  unsigned char* kpool = s.alloc(pool_bytes);
  unsigned char* vpool = s.alloc(pool_bytes);
  if (fp8) {
    fill_random_bytes<<<grid(), 256>>>(kpool, pool_bytes, 5, 0xFE);
    fill_random_bytes<<<grid(), 256>>>(vpool, pool_bytes, 6, 0xFE);
  } else {
    fill_random_half<<<grid(), 256>>>(reinterpret_cast<__half*>(kpool), pool_bytes / 2, 5);
    fill_random_half<<<grid(), 256>>>(reinterpret_cast<__half*>(vpool), pool_bytes / 2, 6);
  }
  s.bf.k_pool = kpool;
  s.bf.v_pool = vpool;
  const std::vector<float> scales(c.hkv, 0.01f);
  s.bf.k_scale = s.upload(scales);
  s.bf.v_scale = s.upload(scales);
  const auto kc = channel_pattern(d, 0.3f), vc = channel_pattern(d, 1.1f);
  if (!kv) {
    s.kv_bytes = static_cast<double>(c.batch) * c.hkv * c.ctx * d * 2.0 * (fp8 ? 1 : 2);
    std::vector<std::uint8_t> ku, vu;
    s.expected.assign(d, 0.0f);
    if (fp8) {
      for (int x = 0; x < d; ++x) {
        ku.push_back(kvarn::float_to_fp8_bits(kc[x] / 0.01f, kvarn::Fp8Format::kE4M3));
        vu.push_back(kvarn::float_to_fp8_bits(vc[x] / 0.01f, kvarn::Fp8Format::kE4M3));
        s.expected[x] = kvarn::fp8_bits_to_float(vu.back(), kvarn::Fp8Format::kE4M3) * 0.01f;
      }
    } else {
      ku = half_row(kc);
      vu = half_row(vc);
      for (int x = 0; x < d; ++x) s.expected[x] = kvarn::round_to_half(vc[x]);
    }
    s.regions.push_back({kpool, pool_bytes, ku});
    s.regions.push_back({vpool, pool_bytes, vu});
    setup_common(s, nb);
    return;
  }
  const long long n_rec = num_blocks * c.hkv;
  unsigned char* rec = s.alloc(n_rec * lay.aligned);
  fill_random_bytes<<<grid(), 256>>>(rec, n_rec * lay.aligned, 7);
  fill_scales<<<grid(), 256>>>(rec, n_rec, lay.aligned, lay.s_col_k, lay.v_codes);
  fill_scales<<<grid(), 256>>>(rec, n_rec, lay.aligned, lay.s_col_v, lay.end);
  std::vector<int> to_slot(num_blocks, -1);
  for (int b = 0; b < c.batch; ++b) to_slot[static_cast<long long>(b) * nb] = b;
  s.bf.records = rec;
  s.bf.block_to_slot = s.upload(to_slot);
  s.kv_bytes = static_cast<double>(c.batch) * c.hkv *
               ((nb - 1) * static_cast<double>(lay.aligned) + 2.0 * std::min(c.ctx, g) * d * 2);
  // closed form: one record of equal K codes and constant K scales (identical K rows, so the
  // attention is uniform), V scales with a channel pattern; the sink pool holds the record's own
  // decoded rows in fp16. Output = inverse rotation of the mean decoded V row.
  std::vector<std::uint8_t> r(lay.aligned, 0);
  std::fill(r.begin(), r.begin() + lay.s_col_k, 0x55);  // every K code equal, any width
  std::fill(r.begin() + lay.v_codes, r.begin() + lay.s_col_v, 0xA5);
  auto put = [&](std::size_t from, std::size_t to, bool pattern) {
    for (std::size_t o = from, i = 0; o + 1 < to; o += 2, ++i) {
      const float v = pattern ? 0.05f + 0.03f * std::fabs(vc[i % d]) : 0.07f;
      const std::uint16_t h = kvarn::float_to_half_bits(v);
      r[o] = h & 0xff;
      r[o + 1] = h >> 8;
    }
  };
  put(lay.s_col_k, lay.v_codes, false);
  put(lay.s_col_v, lay.end, true);
  std::vector<float> kd(static_cast<std::size_t>(g) * d), vd(kd.size());
  kvarn::kvarn_decode_stream(kvarn::StreamKind::kKey, lay, r.data(), kd.data());
  kvarn::kvarn_decode_stream(kvarn::StreamKind::kValue, lay, r.data(), vd.data());
  std::vector<float> mean(d, 0.0f);
  for (int t = 0; t < g; ++t)
    for (int x = 0; x < d; ++x) mean[x] += kvarn::round_to_half(vd[t * d + x]) / g;
  const kvarn::Rotation rot(p.kvarn.rotation, d);
  rot.inverse(mean.data(), 1);
  s.expected = mean;
  // the sink pool repeats the decoded rows: page unit = [g, d] fp16
  s.regions.push_back({rec, n_rec * static_cast<long long>(lay.aligned), r});
  s.regions.push_back({kpool, pool_bytes, half_row(kd)});
  s.regions.push_back({vpool, pool_bytes, half_row(vd)});
  setup_common(s, nb);
}

// Finite output; with constant caches, every row equal to `expected` within the bound.
std::string check_output(const DecodeSetup& s, bool closed_form, double* max_err) {
  std::vector<std::uint16_t> out(s.out_elems);
  KVARN_CUDA_CHECK(cudaMemcpy(out.data(), s.bf.out, out.size() * 2, cudaMemcpyDeviceToHost));
  const int d = s.p.head_dim;
  double emax = 0;
  for (float e : s.expected) emax = std::max(emax, std::fabs(double(e)));
  const double bound = 4e-3 * emax + 1e-4;
  *max_err = 0;
  for (long long i = 0; i < s.out_elems; ++i) {
    const float v = kvarn::half_bits_to_float(out[i]);
    if (!std::isfinite(v)) return "non-finite output at element " + std::to_string(i);
    if (closed_form) *max_err = std::max(*max_err, std::fabs(double(v) - s.expected[i % d]));
  }
  if (closed_form && *max_err > bound)
    return "closed-form output off by " + std::to_string(*max_err) + " > " + std::to_string(bound);
  return "";
}

void BM_Decode(benchmark::State& st, const DecodeCaseB& c) {
  DecodeSetup s;
  s.p.batch = c.batch;
  s.p.num_q_heads = c.hq;
  s.p.num_kv_heads = c.hkv;
  s.p.head_dim = kHeadDim;
  s.p.num_splits = c.splits;
  s.p.warps = c.warps;
  if (c.fmt.rfind("tq", 0) == 0) {
    setup_tq(s, c);
  } else {
    setup_kvarn_fp(s, c);
  }
  std::vector<int> lens(c.batch, c.ctx);
  s.bf.seq_lens = s.upload(lens);
  KVARN_CUDA_CHECK(cudaDeviceSynchronize());
  const double q_out_table = s.out_elems * 2.0 * 2 + 4.0 * c.batch * s.p.max_blocks;
  const double bytes = s.kv_bytes + q_out_table;
  const int reps = bytes > 20e9 ? 7 : 25;
  const cudaStream_t stream = bench_stream();
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  KVARN_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  kvarn::cuda::paged_decode(s.p, s.bf, stream);
  KVARN_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  KVARN_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  double t = 0;
  for (auto _ : st) {
    t = time_median([&] { KVARN_CUDA_CHECK(cudaGraphLaunch(exec, stream)); }, reps, true);
    st.SetIterationTime(t);
  }
  KVARN_CUDA_CHECK(cudaStreamSynchronize(stream));
  double err = 0;
  std::string bad = check_output(s, false, &err);
  if (bad.empty()) {
    for (Region& r : s.regions) {
      Bytes unit(r.unit.size());
      KVARN_CUDA_CHECK(cudaMemcpy(unit.p, r.unit.data(), r.unit.size(), cudaMemcpyHostToDevice));
      replicate_unit<<<grid(), 256>>>(r.p, r.bytes, unit.p, static_cast<int>(r.unit.size()));
      KVARN_CUDA_CHECK(cudaDeviceSynchronize());
    }
    KVARN_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    KVARN_CUDA_CHECK(cudaStreamSynchronize(stream));
    bad = check_output(s, true, &err);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  if (!bad.empty()) {
    std::fprintf(stderr, "decode/%s hq%d b%d ctx%d: %s\n", c.fmt.c_str(), c.hq, c.batch, c.ctx,
                 bad.c_str());
    st.SkipWithError(("output check failed: " + bad).c_str());
    return;
  }
  st.counters["bytes_read"] = bytes;
  st.counters["kv_bytes"] = s.kv_bytes;
  st.counters["TBps"] = bytes / t * 1e-12;
  st.counters["fp16_kv_bytes"] = static_cast<double>(c.batch) * c.hkv * c.ctx * kHeadDim * 4.0;
  st.counters["splits"] = kvarn::cuda::decode_num_splits(s.p);
  st.counters["warps"] = kvarn::cuda::decode_num_warps(s.p);
  st.counters["spread_sink"] = kvarn::cuda::decode_spread_sink_blocks(s.p);
  st.counters["closed_form_max_err"] = err;
  st.counters["flush_bytes"] = static_cast<double>(flush_bytes());
}

// BM_Decode while the sweep's time budget (KVARN_BENCH_BUDGET_S) lasts; a skip after it.
void BM_DecodeBudgeted(benchmark::State& st, const DecodeCaseB& c) {
  if (elapsed_s() > budget_s()) {
    st.SkipWithError("time budget exhausted");
    for (auto _ : st) {
    }
    return;
  }
  BM_Decode(st, c);
}

}  // namespace

int main(int argc, char** argv) {
  if (kvarn::cuda::device_count() == 0) {
    std::fprintf(stderr, "no CUDA device\n");
    return 0;
  }
  auto reg = [](const std::string& name, auto fn) {
    benchmark::RegisterBenchmark(name.c_str(), fn)
        ->UseManualTime()
        ->Iterations(1)
        ->Unit(benchmark::kMicrosecond);
  };
  reg("roofline/read", BM_ReadBandwidth);
  reg("roofline/copy", BM_CopyBandwidth);
  for (auto [kb, vb] : std::vector<std::pair<int, int>>{{4, 2}, {4, 4}})
    reg("store/k" + std::to_string(kb) + "v" + std::to_string(vb),
        [kb, vb](benchmark::State& s) { BM_Store(s, kb, vb); });
  for (int batch : {1, 8, 32, 128, 1024})
    reg("store_launch/k4v2/b" + std::to_string(batch),
        [batch](benchmark::State& s) { BM_Store(s, 4, 2, batch); });
  for (auto [name, kernel] : std::vector<std::pair<std::string, kvarn::cuda::StoreKernel>>{
           {"tile", kvarn::cuda::StoreKernel::kTile},
           {"cluster", kvarn::cuda::StoreKernel::kCluster}})
    for (int batch : {1, 8, 32, 128, 1024})
      reg("store_kernel/" + name + "/k4v2/b" + std::to_string(batch),
          [batch, kernel = kernel](benchmark::State& s) { BM_Store(s, 4, 2, batch, kernel); });
  const double max_bytes = 100.0 * (1ULL << 30);
  for (auto [hq, hkv] : std::vector<std::pair<int, int>>{{32, 8}, {64, 8}})
    for (int batch : {1, 8, 32, 128})
      for (int ctx : {1024, 2048, 4096, 16384, 32768, 65536, 131072})
        for (const char* f : {"fp16", "k4v2", "k4v4", "fp8", "tq4", "tq3", "tqk8v4"}) {
          const double fp16_bytes = static_cast<double>(batch) * hkv * ctx * kHeadDim * 4.0;
          if (fp16_bytes > max_bytes) continue;
          const DecodeCaseB c{f, hq, hkv, batch, ctx};
          reg(std::string("decode/") + f + "/hq" + std::to_string(hq) + "/hkv" +
                  std::to_string(hkv) + "/b" + std::to_string(batch) + "/ctx" + std::to_string(ctx),
              [c](benchmark::State& s) { BM_DecodeBudgeted(s, c); });
        }
  // Split count at batch 1 (few CTAs, many splits): fixed counts next to the automatic one.
  for (const char* f : {"fp16", "k4v2", "tq4"})
    for (int ctx : {2048, 4096, 16384, 32768, 131072})
      for (int splits : {4, 8, 16, 32, 64}) {
        if (splits > ctx / 128 || (ctx > 4096 && splits < 8)) continue;  // >= 1 block per split
        const DecodeCaseB c{f, 32, 8, 1, ctx, splits};
        reg(std::string("splits/") + f + "/hq32/hkv8/b1/ctx" + std::to_string(ctx) + "/s" +
                std::to_string(splits),
            [c](benchmark::State& s) { BM_Decode(s, c); });
      }
  // KVarN G 128 on each compiled warp count per CTA, next to the automatic choice (decode/).
  for (const char* f : {"k4v2", "k4v4"})
    for (int batch : {1, 8, 32, 128})
      for (int ctx : {2048, 4096, 16384, 32768, 131072})
        for (int warps : {1, 2}) {
          const DecodeCaseB c{f, 32, 8, batch, ctx, 0, warps};
          reg(std::string("warps/") + f + "/hq32/hkv8/b" + std::to_string(batch) + "/ctx" +
                  std::to_string(ctx) + "/w" + std::to_string(warps),
              [c](benchmark::State& s) { BM_DecodeBudgeted(s, c); });
        }
  // KVARN_BENCH_GRID=1: KVarN split count x warps per CTA at batch 1 and 8, the data behind
  // decode_num_splits / decode_num_warps for KVarN (not in the default sweep: ~400 cases).
  const char* grid_env = std::getenv("KVARN_BENCH_GRID");
  const bool grid = grid_env != nullptr && std::string(grid_env) == "1";
  if (grid)
    for (const char* f : {"k4v2", "k4v4"})
      for (int hq : {32, 64})
        for (int batch : {1, 8})
          for (int ctx : {2048, 4096, 16384, 32768, 65536, 131072})
            for (int warps : {1, 2})
              for (int splits : {4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256}) {
                if (splits > ctx / 128) continue;  // >= 1 record per split
                if (batch > 1 && (splits > 32 || ctx < 16384)) continue;
                if (batch == 1 && splits < 8) continue;
                const DecodeCaseB c{f, hq, 8, batch, ctx, splits, warps};
                reg(std::string("grid/") + f + "/hq" + std::to_string(hq) + "/hkv8/b" +
                        std::to_string(batch) + "/ctx" + std::to_string(ctx) + "/s" +
                        std::to_string(splits) + "/w" + std::to_string(warps),
                    [c](benchmark::State& s) { BM_Decode(s, c); });
              }
  // ... KVarN at batch 32 and 128, where one wave of CTAs leaves the SMs unevenly loaded (1024
  // one-warp CTAs on 132 x 8 slots) ...
  if (grid)
    for (const char* f : {"k4v2", "k4v4"})
      for (int batch : {32, 128})
        for (int ctx : {16384, 32768, 131072})
          for (int splits : {1, 2, 3, 4, 6, 8, 12, 16}) {
            if (batch == 32 ? splits < 4 : splits > 8) continue;  // 4-16 / 1-8
            const DecodeCaseB c{f, 32, 8, batch, ctx, splits};
            reg(std::string("grid/") + f + "/hq32/hkv8/b" + std::to_string(batch) + "/ctx" +
                    std::to_string(ctx) + "/s" + std::to_string(splits),
                [c](benchmark::State& s) { BM_Decode(s, c); });
          }
  // ... and FP16 split counts at batch 8 from 16K (the only batch with a choice there: 4 splits).
  if (grid)
    for (int hq : {32, 64})
      for (int ctx : {16384, 32768, 65536, 131072})
        for (int splits : {2, 3, 4, 5, 6, 8, 12, 16}) {
          const DecodeCaseB c{"fp16", hq, 8, 8, ctx, splits};
          reg(std::string("grid/fp16/hq") + std::to_string(hq) + "/hkv8/b8/ctx" +
                  std::to_string(ctx) + "/s" + std::to_string(splits),
              [c](benchmark::State& s) { BM_Decode(s, c); });
        }
  // TurboQuant on each compiled warp count per CTA, next to the automatic choice (decode/).
  for (auto [hq, hkv] : std::vector<std::pair<int, int>>{{32, 8}, {64, 8}})
    for (int batch : {1, 8, 32, 128})
      for (int ctx : {2048, 16384, 32768, 131072})
        for (const char* f : {"tq4", "tq3"})
          for (int warps : kvarn::cuda::kTqCompiledWarps) {
            const DecodeCaseB c{f, hq, hkv, batch, ctx, 0, warps};
            reg(std::string("tqwarps/") + f + "/hq" + std::to_string(hq) + "/hkv" +
                    std::to_string(hkv) + "/b" + std::to_string(batch) + "/ctx" +
                    std::to_string(ctx) + "/w" + std::to_string(warps),
                [c](benchmark::State& s) { BM_DecodeBudgeted(s, c); });
          }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
