// GPU attention metrics: one thread block per (query head, position) row, grid-stride over rows.
// Per row: logits in double (one warp per key), lse, top-k rankings (selection passes in the
// tie-rule order), the per-key terms of attention_row.hpp summed in a fixed tree, and the output
// NMSE. Every reduction has one fixed order, so a row's result never depends on the schedule.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstddef>
#include <string>

#include "kvarn/core/attention_row.hpp"
#include "kvarn/cuda/api.hpp"
#include "kvarn/cuda/attention_metrics.hpp"
#include "kvarn/cuda/error.hpp"
#include "kvarn/data/error.hpp"

namespace kvarn::cuda {
namespace {

namespace ar = ::kvarn::attention_row;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kFixedMetrics = 5;  // logit_mae, logit_rmse, kl, js, output_nmse
constexpr unsigned kFullMask = 0xffffffffu;

// Device memory owned by the call; allocation failure is a kvarn::Error (sizes come from data).
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(std::size_t n, const char* what) : n_(n) {
    if (n == 0) return;
    const cudaError_t err = cudaMalloc(reinterpret_cast<void**>(&p_), n * sizeof(T));
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      fail("attention_rows: cannot allocate ", n * sizeof(T), " bytes of device memory for ", what,
           ": ", cudaGetErrorString(err));
    }
  }
  ~DeviceArray() {
    if (p_) cudaFree(p_);
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  T* get() const { return p_; }

 private:
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

struct RowArgs {
  const float* const* q;  // [Hq] of [Tq, D]
  const float* const* k;  // [Hkv] of [T, D]
  const float* const* v;
  const float* const* kh;
  const float* const* vh;
  int rows, tq, d, group, q_first, tokens;
  double scale;
  const int* topk;  // [ntopk]
  int ntopk, max_sel;
  bool kl_only;
  double* scratch;  // [gridDim.x][2][tokens]: s, ŝ, later p, p̂
  double* out;      // [kFixedMetrics + ntopk][rows]
};

__device__ double warp_sum(double x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(kFullMask, x, o);
  return x;
}

// Block sum in one fixed order (warp butterfly, then the warp totals in index order); every thread
// gets the same value. `red` holds kWarps doubles.
__device__ double block_sum(double x, double* red) {
  x = warp_sum(x);
  __syncthreads();  // red may still be read by the previous reduction
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = x;
  __syncthreads();
  double t = 0;
  for (int w = 0; w < kWarps; ++w) t += red[w];
  return t;
}

__device__ double block_max(double x, double* red) {
  for (int o = 16; o > 0; o >>= 1) x = ar::max_of(x, __shfl_xor_sync(kFullMask, x, o));
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = x;
  __syncthreads();
  double t = red[0];
  for (int w = 1; w < kWarps; ++w) t = ar::max_of(t, red[w]);
  return t;
}

// (v, i) that ranks first under the top-k tie rule; i < 0: no candidate.
__device__ void take_better(double& v, int& i, double ov, int oi) {
  if (oi >= 0 && (i < 0 || ar::ranks_before(ov, oi, v, i))) {
    v = ov;
    i = oi;
  }
}

__device__ void block_best(double& v, int& i, double* red, int* red_i) {
  for (int o = 16; o > 0; o >>= 1) {
    const double ov = __shfl_xor_sync(kFullMask, v, o);
    const int oi = __shfl_xor_sync(kFullMask, i, o);
    take_better(v, i, ov, oi);
  }
  __syncthreads();
  if ((threadIdx.x & 31) == 0) {
    red[threadIdx.x >> 5] = v;
    red_i[threadIdx.x >> 5] = i;
  }
  __syncthreads();
  v = red[0];
  i = red_i[0];
  for (int w = 1; w < kWarps; ++w) take_better(v, i, red[w], red_i[w]);
}

__global__ void __launch_bounds__(kThreads) attention_rows_kernel(RowArgs a) {
  extern __shared__ double smem[];
  double* qs = smem;                                         // [d]
  double* red = qs + a.d;                                    // [kWarps]
  double* part = red + kWarps;                               // [2][kThreads]
  int* red_i = reinterpret_cast<int*>(part + 2 * kThreads);  // [kWarps]
  int* sel = red_i + kWarps;                                 // [2][max_sel]: rankings of s and ŝ
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  double* s = a.scratch + static_cast<long long>(blockIdx.x) * 2 * a.tokens;
  double* sh = s + a.tokens;
  const double inf = bits_double(0x7ff0000000000000ULL);

  for (int row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const int h = row / a.tq, i = row - h * a.tq, g = h / a.group;
    const int n = a.q_first + i + 1;  // causal: keys 0..position
    const float* q = a.q[h] + static_cast<long long>(i) * a.d;
    const float* k = a.k[g];
    const float* kh = a.kh[g];
    __syncthreads();  // the previous row is done with qs, s, ŝ, sel
    for (int c = tid; c < a.d; c += kThreads) qs[c] = static_cast<double>(q[c]);
    __syncthreads();

    // Logits, one warp per key: s_j = (q·k_j) / sqrt(D), as the CPU's (q k^T) * scale.
    for (int j = warp; j < n; j += kWarps) {
      const float* kr = k + static_cast<long long>(j) * a.d;
      const float* khr = kh + static_cast<long long>(j) * a.d;
      double x = 0, y = 0;
      for (int c = lane; c < a.d; c += 32) {
        x += qs[c] * static_cast<double>(kr[c]);
        y += qs[c] * static_cast<double>(khr[c]);
      }
      x = warp_sum(x);
      y = warp_sum(y);
      if (lane == 0) {
        s[j] = x * a.scale;
        sh[j] = y * a.scale;
      }
    }
    __syncthreads();

    double mx = -inf, mxh = -inf;
    for (int j = tid; j < n; j += kThreads) {
      mx = ar::max_of(mx, s[j]);
      mxh = ar::max_of(mxh, sh[j]);
    }
    mx = block_max(mx, red);
    mxh = block_max(mxh, red);
    double se = 0, seh = 0;
    for (int j = tid; j < n; j += kThreads) {
      se += exp(s[j] - mx);
      seh += exp(sh[j] - mxh);
    }
    const double lse = ar::lse_finish(mx, block_sum(se, red));
    const double lseh = ar::lse_finish(mxh, block_sum(seh, red));

    // Top-k rankings: pass t picks the key ranked right after the one pass t-1 picked.
    const int m = a.kl_only ? 0 : min(a.max_sel, n);
    double lv = inf, lvh = inf;  // (+inf, -1) ranks before every finite logit
    int li = -1, lih = -1;
    for (int t = 0; t < m; ++t) {
      double bv = 0, bvh = 0;
      int bi = -1, bih = -1;
      for (int j = tid; j < n; j += kThreads) {
        if (ar::ranks_before(lv, li, s[j], j)) take_better(bv, bi, s[j], j);
        if (ar::ranks_before(lvh, lih, sh[j], j)) take_better(bvh, bih, sh[j], j);
      }
      block_best(bv, bi, red, red_i);
      block_best(bvh, bih, red, red_i);
      if (tid == 0) {
        sel[t] = bi;
        sel[a.max_sel + t] = bih;
      }
      lv = bv;
      li = bi;
      lvh = bvh;
      lih = bih;
    }
    __syncthreads();  // rankings in sel; every read of s, ŝ above is done

    // Per-key terms; p, p̂ replace s, ŝ for the output (each thread rewrites its own keys).
    const double l2 = ar::ln2();
    double kl = 0, abs_sum = 0, sq_sum = 0, js = 0;
    for (int j = tid; j < n; j += kThreads) {
      const double ls = s[j] - lse, lsh = sh[j] - lseh;
      const double p = exp(ls), ph = exp(lsh);
      kl += ar::kl_term(p, ls, lsh);
      if (a.kl_only) continue;
      const double dl = sh[j] - s[j];
      abs_sum += fabs(dl);
      sq_sum += dl * dl;
      js += ar::js_term(p, ph, ls, lsh, l2);
      s[j] = p;
      sh[j] = ph;
    }
    kl = block_sum(kl, red);
    if (a.kl_only) {
      if (tid == 0) a.out[2LL * a.rows + row] = ar::finish_kl(kl);
      continue;
    }
    abs_sum = block_sum(abs_sum, red);
    sq_sum = block_sum(sq_sum, red);
    js = block_sum(js, red);

    // Output o = p·V, ô = p̂·V̂: thread (group gi, channel c) sums keys gi, gi + ng, ...; the
    // groups are then added in index order.
    const float* v = a.v[g];
    const float* vh = a.vh[g];
    const int cw = min(a.d, kThreads), ng = kThreads / cw;
    const int cl = tid % cw, gi = tid / cw;
    double err = 0, ref = 0;
    for (int c0 = 0; c0 < a.d; c0 += cw) {
      const int c = c0 + cl;
      double o = 0, oh = 0;
      if (gi < ng && c < a.d) {
        for (int j = gi; j < n; j += ng) {
          o += s[j] * static_cast<double>(v[static_cast<long long>(j) * a.d + c]);
          oh += sh[j] * static_cast<double>(vh[static_cast<long long>(j) * a.d + c]);
        }
      }
      part[tid] = o;
      part[kThreads + tid] = oh;
      __syncthreads();
      if (tid < cw && c < a.d) {
        double ot = 0, oht = 0;
        for (int x = 0; x < ng; ++x) {
          ot += part[x * cw + tid];
          oht += part[kThreads + x * cw + tid];
        }
        const double e = oht - ot;
        err += e * e;
        ref += ot * ot;
      }
      __syncthreads();
    }
    err = block_sum(err, red);
    ref = block_sum(ref, red);

    // Top-k overlaps: count of ranking(s)[0..kk) found in ranking(ŝ)[0..kk), in parallel.
    for (int t = 0; t < a.ntopk; ++t) {
      const int kk = a.topk[t];
      double common = 0;
      if (n > kk)
        for (int x = tid; x < kk; x += kThreads)
          common += ar::prefix_contains(sel + a.max_sel, kk, sel[x]) ? 1.0 : 0.0;
      common = block_sum(common, red);  // integer-valued, exact
      if (tid == 0)
        a.out[static_cast<long long>(kFixedMetrics + t) * a.rows + row] =
            ar::topk_overlap_value(static_cast<int>(common), kk, n);
    }
    if (tid == 0) {
      a.out[row] = ar::finish_mae(abs_sum, n);
      a.out[1LL * a.rows + row] = ar::finish_rmse(sq_sum, n);
      a.out[2LL * a.rows + row] = ar::finish_kl(kl);
      a.out[3LL * a.rows + row] = ar::finish_js(js, l2);
      a.out[4LL * a.rows + row] = ar::output_nmse(err, ref);
    }
  }
}

}  // namespace

AttentionRows attention_rows(const AttentionRowsProblem& p, const AttentionRowsInput& in) {
  const int hq = p.q_heads, hkv = p.kv_heads, t = p.tokens, tq = p.queries, d = p.head_dim;
  KVARN_CHECK(hq > 0 && hkv > 0 && hq % hkv == 0, "attention_rows: ", hq,
              " query heads are not a multiple of ", hkv, " KV heads");
  KVARN_CHECK(d > 0 && d <= kAttentionMaxHeadDim, "attention_rows: head_dim ", d, " outside [1, ",
              kAttentionMaxHeadDim, "]");
  const int q_first = p.q_first < 0 ? t - tq : p.q_first;
  KVARN_CHECK(tq > 0 && q_first >= 0 && q_first + tq <= t, "attention_rows: ", tq,
              " queries from position ", q_first, " exceed ", t, " tokens");
  KVARN_CHECK(static_cast<long long>(hq) * tq <= INT_MAX, "attention_rows: ", hq, " x ", tq,
              " rows is too many");
  int max_k = 0;
  for (int kk : p.topk) {
    KVARN_CHECK(kk >= 1 && kk <= kAttentionMaxTopk, "attention_rows: top-k ", kk, " outside [1, ",
                kAttentionMaxTopk, "]");
    max_k = std::max(max_k, kk);
  }
  auto check_heads = [&](const std::vector<const float*>& v, int want, const char* name) {
    KVARN_CHECK(static_cast<int>(v.size()) == want, "attention_rows: ", v.size(), " ", name,
                " heads, expected ", want);
    for (std::size_t h = 0; h < v.size(); ++h)
      KVARN_CHECK(v[h] != nullptr, "attention_rows: ", name, " head ", h, " is null");
  };
  check_heads(in.q, hq, "q");
  check_heads(in.k, hkv, "k");
  check_heads(in.k_hat, hkv, "k_hat");
  if (!p.kl_only) {
    check_heads(in.v, hkv, "v");
    check_heads(in.v_hat, hkv, "v_hat");
  }
  KVARN_CHECK(device_count() > 0,
              "attention_rows: no CUDA device (metrics.device: cuda needs one)");

  const std::size_t q_elems = static_cast<std::size_t>(tq) * d;
  const std::size_t kv_elems = static_cast<std::size_t>(t) * d;
  const bool host = !in.on_device;
  const int nkv_tensors = p.kl_only ? 2 : 4;
  DeviceArray<float> q_store(host ? hq * q_elems : 0, "q");
  DeviceArray<float> kv_store(host ? nkv_tensors * hkv * kv_elems : 0, "k, v, k_hat, v_hat");
  DeviceArray<const float*> tables(hq + 4 * hkv, "head tables");
  // Pointer tables live in one array: [q | k | k_hat | v | v_hat]; host heads are copied into
  // q_store / kv_store, device heads are used in place.
  auto table_at = [&](std::size_t off) { return tables.get() + off; };
  auto stage = [&](const std::vector<const float*>& heads, std::size_t elems, float* store,
                   const float** table) {
    std::vector<const float*> ptrs(heads.size());
    for (std::size_t h = 0; h < heads.size(); ++h) {
      if (!host) {
        ptrs[h] = heads[h];
        continue;
      }
      float* dst = store + h * elems;
      KVARN_CUDA_CHECK(cudaMemcpy(dst, heads[h], elems * sizeof(float), cudaMemcpyHostToDevice));
      ptrs[h] = dst;
    }
    KVARN_CUDA_CHECK(
        cudaMemcpy(table, ptrs.data(), ptrs.size() * sizeof(const float*), cudaMemcpyHostToDevice));
    return static_cast<const float* const*>(table);
  };
  auto kv_slot = [&](int i) { return host ? kv_store.get() + i * hkv * kv_elems : nullptr; };

  RowArgs a{};
  a.q = stage(in.q, q_elems, q_store.get(), table_at(0));
  a.k = stage(in.k, kv_elems, kv_slot(0), table_at(hq));
  a.kh = stage(in.k_hat, kv_elems, kv_slot(1), table_at(hq + hkv));
  a.v = a.vh = nullptr;
  if (!p.kl_only) {
    a.v = stage(in.v, kv_elems, kv_slot(2), table_at(hq + 2 * hkv));
    a.vh = stage(in.v_hat, kv_elems, kv_slot(3), table_at(hq + 3 * hkv));
  }
  a.rows = hq * tq;
  a.tq = tq;
  a.d = d;
  a.group = hq / hkv;
  a.q_first = q_first;
  a.tokens = t;
  a.scale = 1.0 / std::sqrt(static_cast<double>(d));
  a.kl_only = p.kl_only;
  a.ntopk = p.kl_only ? 0 : static_cast<int>(p.topk.size());
  a.max_sel = p.kl_only ? 0 : std::min(max_k, t);

  DeviceArray<int> topk(p.topk.size(), "top-k levels");
  if (!p.topk.empty())
    KVARN_CUDA_CHECK(
        cudaMemcpy(topk.get(), p.topk.data(), p.topk.size() * sizeof(int), cudaMemcpyHostToDevice));
  a.topk = topk.get();

  // Enough blocks to fill the device; each owns 2·T doubles of scratch.
  int dev = 0, sms = 0;
  KVARN_CUDA_CHECK(cudaGetDevice(&dev));
  KVARN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const int blocks = std::max(1, std::min(a.rows, 8 * std::max(1, sms)));
  DeviceArray<double> scratch(static_cast<std::size_t>(blocks) * 2 * t, "logit scratch");
  const int nout = kFixedMetrics + a.ntopk;
  DeviceArray<double> out(static_cast<std::size_t>(nout) * a.rows, "results");
  a.scratch = scratch.get();
  a.out = out.get();

  const std::size_t shmem = (static_cast<std::size_t>(d) + kWarps + 2 * kThreads) * sizeof(double) +
                            (kWarps + 2 * static_cast<std::size_t>(a.max_sel)) * sizeof(int);
  attention_rows_kernel<<<blocks, kThreads, shmem>>>(a);
  KVARN_CUDA_CHECK_LAUNCH("attention_rows_kernel");
  std::vector<double> host_out(static_cast<std::size_t>(nout) * a.rows);
  KVARN_CUDA_CHECK(cudaMemcpy(host_out.data(), out.get(), host_out.size() * sizeof(double),
                              cudaMemcpyDeviceToHost));

  AttentionRows r;
  auto column = [&](int m) {
    const auto* b = host_out.data() + static_cast<std::size_t>(m) * a.rows;
    return std::vector<double>(b, b + a.rows);
  };
  r.kl = column(2);
  if (p.kl_only) return r;
  r.logit_mae = column(0);
  r.logit_rmse = column(1);
  r.js = column(3);
  r.output_nmse = column(4);
  for (int tk = 0; tk < a.ntopk; ++tk) r.topk_overlap.push_back(column(kFixedMetrics + tk));
  return r;
}

}  // namespace kvarn::cuda
