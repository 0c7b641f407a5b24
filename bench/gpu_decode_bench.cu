// H200 decode benchmarks: device read/copy bandwidth (the roofline), KVarN store throughput, and
// the paged decode sweep (KVarN k4v2/k4v4, FP16, FP8, TurboQuant 4bit_nc / 3bit_nc / k8v4). Manual timing with CUDA events, median of
// repetitions, L2 flushed between repetitions when the working set is small. Everything runs on
// one created stream; each decode step (split kernel + programmatic-dependent combine) is
// captured once into a CUDA graph and replayed, as a serving loop would.
// Env: KVARN_BENCH_BUDGET_S (default 300) stops registering new decode work past the budget.
#include <benchmark/benchmark.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "kvarn/cuda/api.hpp"

namespace {

using kvarn::cuda::DecodeFormat;
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
__global__ void fill_random_bytes(unsigned char* p, long long n, unsigned seed) {
  for (long long i = blockIdx.x * 256LL + threadIdx.x; i < n; i += 256LL * gridDim.x)
    p[i] = static_cast<unsigned char>(hash32(i * 2654435761ULL + seed));
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
__global__ void read_kernel(const float4* p, long long n, float* out) {
  float4 acc = make_float4(0, 0, 0, 0);
  for (long long i = blockIdx.x * 256LL + threadIdx.x; i < n; i += 256LL * gridDim.x) {
    const float4 v = __ldcs(p + i);
    acc.x += v.x;
    acc.y += v.y;
    acc.z += v.z;
    acc.w += v.w;
  }
  if (acc.x + acc.y + acc.z + acc.w == 1.2345f) out[0] = acc.x;
}
__global__ void copy_kernel(const float4* a, float4* b, long long n) {
  for (long long i = blockIdx.x * 256LL + threadIdx.x; i < n; i += 256LL * gridDim.x)
    __stcs(b + i, __ldcs(a + i));
}

template <typename T>
struct Dev {
  T* p = nullptr;
  explicit Dev(std::size_t n) { KVARN_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(T) + 16)); }
  ~Dev() { cudaFree(p); }
};

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

// Runs f() `reps` times between events, median in seconds. flush: write a 256 MiB buffer first.
template <typename F>
double time_median(F f, int reps, bool flush) {
  static Dev<unsigned char> l2(256u << 20);
  const cudaStream_t st = bench_stream();
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (int i = 0; i < 2; ++i) f();
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i) {
    if (flush) cudaMemsetAsync(l2.p, i & 0xff, 256u << 20, st);
    cudaEventRecord(a, st);
    f();
    cudaEventRecord(b, st);
    cudaEventSynchronize(b);
    float t;
    cudaEventElapsedTime(&t, a, b);
    ms.push_back(t);
  }
  KVARN_CUDA_CHECK(cudaGetLastError());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2] * 1e-3;
}

void BM_ReadBandwidth(benchmark::State& st) {
  const long long bytes = 4LL << 30, n = bytes / 16;
  Dev<float4> buf(n);
  Dev<float> out(1);
  fill_random_bytes<<<grid(), 256>>>(reinterpret_cast<unsigned char*>(buf.p), bytes, 1);
  KVARN_CUDA_CHECK(cudaDeviceSynchronize());
  for (auto _ : st) {
    const double t = time_median([&] { read_kernel<<<grid(), 256, 0, bench_stream()>>>(buf.p, n, out.p); }, 20, false);
    st.SetIterationTime(t);
    st.counters["bytes_read"] = static_cast<double>(bytes);
    st.counters["TBps"] = bytes / t * 1e-12;
  }
}
void BM_CopyBandwidth(benchmark::State& st) {
  const long long bytes = 2LL << 30, n = bytes / 16;
  Dev<float4> a(n), b(n);
  fill_random_bytes<<<grid(), 256>>>(reinterpret_cast<unsigned char*>(a.p), bytes, 2);
  KVARN_CUDA_CHECK(cudaDeviceSynchronize());
  for (auto _ : st) {
    const double t = time_median([&] { copy_kernel<<<grid(), 256, 0, bench_stream()>>>(a.p, b.p, n); }, 20, false);
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
void BM_Store(benchmark::State& st, int kb, int vb, int blocks = 1024) {
  const auto cfg = kvarn_cfg(kb, vb);
  const int d = 128, g = 128, heads = 8;
  const auto lay = kvarn::kvarn_record_layout(d, cfg);
  const long long elems = static_cast<long long>(blocks) * g * heads * d;
  Dev<__half> k(elems), v(elems);
  Dev<unsigned char> rec(static_cast<std::size_t>(blocks) * heads * lay.aligned);
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
  for (auto _ : st) {
    const double s = time_median([&] { kvarn::cuda::kvarn_store(cfg, d, t, bench_stream()); },
                                 blocks >= 1024 ? 5 : 15, false);
    st.SetIterationTime(s);
    st.counters["tiles"] = t.num_tiles;
    st.counters["tiles_per_s"] = t.num_tiles / s;
    st.counters["us_per_tile_x1000"] = s / t.num_tiles * 1e9;
  }
}

struct DecodeCaseB {
  std::string fmt;  // k4v2 k4v4 fp16 fp8 tq4 tq3 tqk8v4
  int hq, hkv, batch, ctx;
};

kvarn::cuda::TqDecodeConfig tq_cfg(const std::string& f) {
  if (f == "tq3") return {3, 3, true};
  if (f == "tqk8v4") return {8, 4, false};
  return {4, 4, true};
}

// TurboQuant: vLLM's block size 16, one slot per (token, KV head), no fp16 region.
void BM_DecodeTq(benchmark::State& st, DecodeCaseB c) {
  const int d = 128, page = 16;
  const int nb = (c.ctx + page - 1) / page;
  kvarn::cuda::DecodeProblem p;
  p.format = DecodeFormat::kTurboQuant;
  p.batch = c.batch;
  p.num_q_heads = c.hq;
  p.num_kv_heads = c.hkv;
  p.head_dim = d;
  p.block_size = page;
  p.max_blocks = nb;
  p.tq = tq_cfg(c.fmt);
  const int slot = kvarn::cuda::turboquant_slot_bytes(d, p.tq);
  const long long num_blocks = static_cast<long long>(c.batch) * nb;
  const long long n_slots = num_blocks * c.hkv * page;
  Dev<unsigned char> cache(n_slots * slot);
  fill_random_bytes<<<grid(), 256>>>(cache.p, n_slots * slot, 9);
  const int kb = p.tq.key_bits, vb = p.tq.value_bits;
  const int key_bytes = kb == 8 ? d : d * kb / 8 + 2;
  fill_tq_slots<<<grid(), 256>>>(cache.p, n_slots, slot, kb == 8 ? -1 : d * kb / 8,
                                 kb == 8 ? d : 0, key_bytes + d * vb / 8);
  std::vector<int> table(num_blocks), lens(c.batch, c.ctx);
  for (long long i = 0; i < num_blocks; ++i) table[i] = static_cast<int>(i);
  Dev<int> dtable(table.size()), dlens(lens.size());
  cudaMemcpy(dtable.p, table.data(), table.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(dlens.p, lens.data(), lens.size() * 4, cudaMemcpyHostToDevice);
  const long long qe = static_cast<long long>(c.batch) * c.hq * d;
  Dev<__half> q(qe), out(qe);
  fill_random_half<<<grid(), 256>>>(q.p, qe, 8);
  Dev<unsigned char> ws(kvarn::cuda::decode_workspace_bytes(p));
  kvarn::cuda::DecodeBuffers bf;
  bf.q = reinterpret_cast<const std::uint16_t*>(q.p);
  bf.out = reinterpret_cast<std::uint16_t*>(out.p);
  bf.block_table = dtable.p;
  bf.seq_lens = dlens.p;
  bf.k_pool = cache.p;
  bf.workspace = ws.p;
  KVARN_CUDA_CHECK(cudaDeviceSynchronize());
  const double kv_bytes = static_cast<double>(c.batch) * c.hkv * c.ctx * slot;
  const double bytes = kv_bytes + qe * 2.0 * 2 + num_blocks * 4.0;
  const bool flush = bytes < 200e6;
  const int reps = bytes > 20e9 ? 7 : 25;
  const cudaStream_t s = bench_stream();
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  KVARN_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  kvarn::cuda::paged_decode(p, bf, s);
  KVARN_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  KVARN_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (auto _ : st) {
    const double t = time_median([&] { cudaGraphLaunch(exec, s); }, reps, flush);
    st.SetIterationTime(t);
    st.counters["bytes_read"] = bytes;
    st.counters["kv_bytes"] = kv_bytes;
    st.counters["TBps"] = bytes / t * 1e-12;
    st.counters["fp16_kv_bytes"] = static_cast<double>(c.batch) * c.hkv * c.ctx * d * 4.0;
    st.counters["splits"] = kvarn::cuda::decode_num_splits(p);
  }
  KVARN_CUDA_CHECK(cudaStreamSynchronize(s));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

void BM_Decode(benchmark::State& st, DecodeCaseB c) {
  if (c.fmt.rfind("tq", 0) == 0) return BM_DecodeTq(st, c);
  const int d = 128, g = 128;
  const bool kv = c.fmt[0] == 'k';
  const int nb = (c.ctx + g - 1) / g;
  kvarn::cuda::DecodeProblem p;
  p.format = kv ? DecodeFormat::kKvarn : c.fmt == "fp16" ? DecodeFormat::kFp16 : DecodeFormat::kFp8;
  p.batch = c.batch;
  p.num_q_heads = c.hq;
  p.num_kv_heads = c.hkv;
  p.head_dim = d;
  p.block_size = g;
  p.max_blocks = nb;
  if (kv) p.kvarn = kvarn_cfg(4, c.fmt == "k4v2" ? 2 : 4);
  const auto lay = kvarn::kvarn_record_layout(d, p.kvarn);
  const long long num_blocks = static_cast<long long>(c.batch) * nb;
  const int slots = kv ? c.batch : 0;  // sink block of each sequence in the fp16 pool
  const long long page_elems = static_cast<long long>(c.hkv) * g * d;
  const long long pool_blocks = kv ? slots : num_blocks;
  const std::size_t elem = p.format == DecodeFormat::kFp8 ? 1 : 2;
  Dev<unsigned char> kpool(pool_blocks * page_elems * elem), vpool(pool_blocks * page_elems * elem);
  Dev<unsigned char> rec(kv ? num_blocks * c.hkv * lay.aligned : 1);
  if (p.format == DecodeFormat::kFp8) {
    fill_random_bytes<<<grid(), 256>>>(kpool.p, pool_blocks * page_elems, 5);
    fill_random_bytes<<<grid(), 256>>>(vpool.p, pool_blocks * page_elems, 6);
  } else {
    fill_random_half<<<grid(), 256>>>(reinterpret_cast<__half*>(kpool.p), pool_blocks * page_elems, 5);
    fill_random_half<<<grid(), 256>>>(reinterpret_cast<__half*>(vpool.p), pool_blocks * page_elems, 6);
  }
  if (kv) {
    const long long n_rec = num_blocks * c.hkv;
    fill_random_bytes<<<grid(), 256>>>(rec.p, n_rec * lay.aligned, 7);
    fill_scales<<<grid(), 256>>>(rec.p, n_rec, lay.aligned, lay.s_col_k, lay.v_codes);
    fill_scales<<<grid(), 256>>>(rec.p, n_rec, lay.aligned, lay.s_col_v, lay.end);
  }
  std::vector<int> table(num_blocks), lens(c.batch, c.ctx), to_slot(kv ? num_blocks : 1, -1);
  for (long long i = 0; i < num_blocks; ++i) table[i] = static_cast<int>(i);
  if (kv)
    for (int b = 0; b < c.batch; ++b) to_slot[static_cast<long long>(b) * nb] = b;
  Dev<int> dtable(table.size()), dlens(lens.size()), dslot(to_slot.size());
  cudaMemcpy(dtable.p, table.data(), table.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(dlens.p, lens.data(), lens.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(dslot.p, to_slot.data(), to_slot.size() * 4, cudaMemcpyHostToDevice);
  std::vector<float> scales(c.hkv, 0.01f);
  Dev<float> ksc(c.hkv), vsc(c.hkv);
  cudaMemcpy(ksc.p, scales.data(), c.hkv * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(vsc.p, scales.data(), c.hkv * 4, cudaMemcpyHostToDevice);
  const long long qe = static_cast<long long>(c.batch) * c.hq * d;
  Dev<__half> q(qe), out(qe);
  fill_random_half<<<grid(), 256>>>(q.p, qe, 8);
  Dev<unsigned char> ws(kvarn::cuda::decode_workspace_bytes(p));
  kvarn::cuda::DecodeBuffers bf;
  bf.q = reinterpret_cast<const std::uint16_t*>(q.p);
  bf.out = reinterpret_cast<std::uint16_t*>(out.p);
  bf.block_table = dtable.p;
  bf.seq_lens = dlens.p;
  bf.records = rec.p;
  bf.block_to_slot = dslot.p;
  bf.k_pool = kpool.p;
  bf.v_pool = vpool.p;
  bf.k_scale = ksc.p;
  bf.v_scale = vsc.p;
  bf.workspace = ws.p;
  KVARN_CUDA_CHECK(cudaDeviceSynchronize());
  // bytes the kernel must read: KV (records + fp16 sink) + q + table
  double kv_bytes;
  if (kv) {
    kv_bytes = static_cast<double>(c.batch) * c.hkv *
               ((nb - 1) * static_cast<double>(lay.aligned) + 2.0 * std::min(c.ctx, g) * d * 2);
  } else {
    kv_bytes = static_cast<double>(c.batch) * c.hkv * c.ctx * d * 2.0 * elem;
  }
  const double bytes = kv_bytes + qe * 2.0 * 2 + num_blocks * 4.0;
  const bool flush = bytes < 200e6;
  const int reps = bytes > 20e9 ? 7 : 25;
  const cudaStream_t s = bench_stream();
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  KVARN_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  kvarn::cuda::paged_decode(p, bf, s);
  KVARN_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  KVARN_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (auto _ : st) {
    const double t = time_median([&] { cudaGraphLaunch(exec, s); }, reps, flush);
    st.SetIterationTime(t);
    st.counters["bytes_read"] = bytes;
    st.counters["kv_bytes"] = kv_bytes;
    st.counters["TBps"] = bytes / t * 1e-12;
    st.counters["fp16_kv_bytes"] = static_cast<double>(c.batch) * c.hkv * c.ctx * d * 4.0;
    st.counters["splits"] = kvarn::cuda::decode_num_splits(p);
  }
  KVARN_CUDA_CHECK(cudaStreamSynchronize(s));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

}  // namespace

int main(int argc, char** argv) {
  if (kvarn::cuda::device_count() == 0) {
    std::fprintf(stderr, "no CUDA device\n");
    return 0;
  }
  benchmark::RegisterBenchmark("roofline/read", BM_ReadBandwidth)->UseManualTime()->Iterations(1)->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("roofline/copy", BM_CopyBandwidth)->UseManualTime()->Iterations(1)->Unit(benchmark::kMicrosecond);
  for (auto [kb, vb] : std::vector<std::pair<int, int>>{{4, 2}, {4, 4}})
    benchmark::RegisterBenchmark(("store/k" + std::to_string(kb) + "v" + std::to_string(vb)).c_str(),
                                 [kb, vb](benchmark::State& s) { BM_Store(s, kb, vb); })
        ->UseManualTime()->Iterations(1)->Unit(benchmark::kMicrosecond);
  for (int batch : {1, 8, 32, 128, 1024})
    benchmark::RegisterBenchmark(("store_launch/k4v2/b" + std::to_string(batch)).c_str(),
                                 [batch](benchmark::State& s) { BM_Store(s, 4, 2, batch); })
        ->UseManualTime()->Iterations(1)->Unit(benchmark::kMicrosecond);
  const double max_bytes = 100.0 * (1ULL << 30);
  for (auto [hq, hkv] : std::vector<std::pair<int, int>>{{32, 8}, {64, 8}})
    for (int batch : {1, 8, 32, 128})
      for (int ctx : {1024, 2048, 4096, 16384, 32768, 65536, 131072})
        for (const char* f : {"fp16", "k4v2", "k4v4", "fp8", "tq4", "tq3", "tqk8v4"}) {
          const double fp16_bytes = static_cast<double>(batch) * hkv * ctx * 128 * 4.0;
          if (fp16_bytes > max_bytes) continue;
          DecodeCaseB c{f, hq, hkv, batch, ctx};
          const std::string name = std::string("decode/") + f + "/hq" + std::to_string(hq) +
                                   "/hkv" + std::to_string(hkv) + "/b" + std::to_string(batch) +
                                   "/ctx" + std::to_string(ctx);
          benchmark::RegisterBenchmark(name.c_str(), [c](benchmark::State& s) {
            if (elapsed_s() > budget_s()) {
              s.SkipWithError("time budget exhausted");
              for (auto _ : s) {
              }
              return;
            }
            BM_Decode(s, c);
          })->UseManualTime()->Iterations(1)->Unit(benchmark::kMicrosecond);
        }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
