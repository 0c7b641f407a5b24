#include "kvarn/eval/attention.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "kvarn/core/attention_ref.hpp"
#include "kvarn/core/attention_row.hpp"
#include "kvarn/data/error.hpp"
#include "kvarn/eval/gemm.hpp"
#include "kvarn/eval/metrics.hpp"
#if defined(KVARN_EVAL_HAVE_CUDA)
#include "kvarn/cuda/api.hpp"
#include "kvarn/cuda/attention_metrics.hpp"
#endif

namespace kvarn {
namespace {

namespace ar = attention_row;

struct RowStats {
  double mae = 0, rmse = 0, kl = 0, js = 0;
};

// Softmax of both rows into p, ph (length n) and the logit / distribution metrics of the row, the
// per-key terms summed in key order (formulas: kvarn/core/attention_row.hpp). full = false: KL
// only; p̂ (ph may be null), JS and the logit errors are not computed.
RowStats row_stats(const double* s, const double* sh, int n, double* p, double* ph, bool full) {
  RowStats r;
  const double lse = log_sum_exp(s, n), lseh = log_sum_exp(sh, n);
  double kl = 0;
  if (!full) {
    for (int j = 0; j < n; ++j) {
      const double ls = s[j] - lse;
      p[j] = std::exp(ls);
      kl += ar::kl_term(p[j], ls, sh[j] - lseh);
    }
    r.kl = ar::finish_kl(kl);
    return r;
  }
  double abs_sum = 0, sq_sum = 0, js = 0;
  const double l2 = ar::ln2();
  for (int j = 0; j < n; ++j) {
    const double ls = s[j] - lse, lsh = sh[j] - lseh;
    p[j] = std::exp(ls);
    ph[j] = std::exp(lsh);
    kl += ar::kl_term(p[j], ls, lsh);
    js += ar::js_term(p[j], ph[j], ls, lsh, l2);
    const double d = sh[j] - s[j];
    abs_sum += std::fabs(d);
    sq_sum += d * d;
  }
  r.kl = ar::finish_kl(kl);
  r.mae = ar::finish_mae(abs_sum, n);
  r.rmse = ar::finish_rmse(sq_sum, n);
  r.js = ar::finish_js(js, l2);
  return r;
}

// First m indices of s in the top-k ranking order, into idx[0..m).
void top_indices(const double* s, int n, int m, std::vector<int>& idx) {
  idx.resize(n);
  std::iota(idx.begin(), idx.end(), 0);
  auto larger = [s](int a, int b) { return ar::ranks_before(s[a], a, s[b], b); };
  if (m < n) std::nth_element(idx.begin(), idx.begin() + (m - 1), idx.end(), larger);
  std::sort(idx.begin(), idx.begin() + std::min(m, n), larger);
}

// Rankings a, b of a row of n keys (each at least min(k, n) long).
double overlap_of_prefix(const std::vector<int>& a, const std::vector<int>& b, int k, int n) {
  const int common = n > k ? ar::overlap_count(a.data(), b.data(), k) : 0;
  return ar::topk_overlap_value(common, k, n);
}

MatrixD to_double(const Matrix& m) { return m.cast<double>(); }

// Scratch of one block of query rows, one per worker thread.
struct BlockScratch {
  MatrixD s, sh, p, ph, o, oh;
  std::vector<int> ia, ib;
};

// The inputs of one query head against its KV head.
struct HeadRows {
  const MatrixD &q, &k, &v, &kh, &vh;
  int q_first;
  const AttentionOptions& opts;
  bool full;
  int max_k;
};

// Rows [r0, r0 + rows) of a row-major matrix.
gemm::View rows_of(const MatrixD& m, Eigen::Index r0, Eigen::Index rows) {
  const int cols = static_cast<int>(m.cols());
  return {m.data() + r0 * m.cols(), static_cast<int>(rows), cols, cols};
}

// Query rows [i0, i0 + b) of one head into pm (rows are independent: any block order gives the
// same values).
void run_block(const HeadRows& in, int i0, int b, BlockScratch& w, PositionMetrics* pm) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(in.q.cols()));
  const int n = in.q_first + i0 + b;  // keys visible to the last row of the block
  const gemm::View qb = rows_of(in.q, i0, b);
  w.s.resize(b, n);
  w.sh.resize(b, n);
  gemm::scaled_abt(qb, rows_of(in.k, 0, n), scale, w.s.data());
  gemm::scaled_abt(qb, rows_of(in.kh, 0, n), scale, w.sh.data());
  w.p.setZero(b, n);
  if (in.full) w.ph.setZero(b, n);
  const int nk = static_cast<int>(in.opts.topk.size());
  for (int r = 0; r < b; ++r) {
    const int i = i0 + r, ni = in.q_first + i + 1;  // causal: keys 0..position
    const RowStats st = row_stats(w.s.row(r).data(), w.sh.row(r).data(), ni, w.p.row(r).data(),
                                  in.full ? w.ph.row(r).data() : nullptr, in.full);
    pm->kl[i] = st.kl;
    if (!in.full) continue;
    pm->logit_mae[i] = st.mae;
    pm->logit_rmse[i] = st.rmse;
    pm->js[i] = st.js;
    if (in.max_k > 0) {
      top_indices(w.s.row(r).data(), ni, in.max_k, w.ia);
      top_indices(w.sh.row(r).data(), ni, in.max_k, w.ib);
      for (int t = 0; t < nk; ++t) {
        const int kk = in.opts.topk[t];
        pm->topk_overlap[t][i] = overlap_of_prefix(w.ia, w.ib, kk, ni);
      }
    }
  }
  if (!in.full) return;
  w.o.resize(b, in.v.cols());
  w.oh.resize(b, in.v.cols());
  gemm::ab(rows_of(w.p, 0, b), rows_of(in.v, 0, n), w.o.data());
  gemm::ab(rows_of(w.ph, 0, b), rows_of(in.vh, 0, n), w.oh.data());
  for (int r = 0; r < b; ++r) {
    pm->output_nmse[i0 + r] =
        ar::output_nmse((w.oh.row(r) - w.o.row(r)).squaredNorm(), w.o.row(r).squaredNorm());
  }
}

int worker_threads(const AttentionOptions& opts) {
#ifdef _OPENMP
  return opts.threads > 0 ? opts.threads : omp_get_max_threads();
#else
  return 1;
#endif
}

// Per-position metrics of one query head against its KV head. full = false: KL only. Blocks of
// query rows run in parallel; each row's values are computed the same way whatever the thread.
void run_head(const MatrixD& q, const MatrixD& k, const MatrixD& v, const MatrixD& kh,
              const MatrixD& vh, int q_first, const AttentionOptions& opts, bool full,
              PositionMetrics* pm) {
  const int tq = static_cast<int>(q.rows());
  const int nk = static_cast<int>(opts.topk.size());
  const int max_k = nk ? *std::max_element(opts.topk.begin(), opts.topk.end()) : 0;
  pm->kl.assign(tq, 0);
  if (full) {
    pm->logit_mae.assign(tq, 0);
    pm->logit_rmse.assign(tq, 0);
    pm->js.assign(tq, 0);
    pm->output_nmse.assign(tq, 0);
    pm->topk_overlap.assign(nk, std::vector<double>(tq, 0));
  }
  const HeadRows in{q, k, v, kh, vh, q_first, opts, full, max_k};
  const int block = std::max(1, opts.block);
  const int blocks = (tq + block - 1) / block;
  const int threads = std::max(1, std::min(worker_threads(opts), blocks));
  std::vector<BlockScratch> scratch(threads);
  // Later blocks see more keys: hand them out one at a time, the largest first.
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (threads > 1)
  for (int bi = blocks - 1; bi >= 0; --bi) {
#ifdef _OPENMP
    BlockScratch& w = scratch[static_cast<std::size_t>(omp_get_thread_num())];
#else
    BlockScratch& w = scratch[0];
#endif
    const int i0 = bi * block;
    run_block(in, i0, std::min(block, tq - i0), w, pm);
  }
}

// Adds rows [a, b) of pm to the summary (as sums; finish() turns them into means).
void accumulate(const PositionMetrics& pm, int a, int b, AttentionSummary* s) {
  if (s->topk_overlap.size() != pm.topk_overlap.size())
    s->topk_overlap.assign(pm.topk_overlap.size(), 0);
  for (int i = a; i < b; ++i) {
    s->logit_mae += pm.logit_mae[i];
    s->logit_rmse += pm.logit_rmse[i];
    s->kl += pm.kl[i];
    s->kl_max = std::max(s->kl_max, pm.kl[i]);
    s->js += pm.js[i];
    s->output_nmse += pm.output_nmse[i];
    for (std::size_t t = 0; t < pm.topk_overlap.size(); ++t)
      s->topk_overlap[t] += pm.topk_overlap[t][i];
  }
  s->count += std::max(0, b - a);
}

void merge_sums(const AttentionSummary& from, AttentionSummary* to) {
  if (to->topk_overlap.size() != from.topk_overlap.size())
    to->topk_overlap.assign(from.topk_overlap.size(), 0);
  to->count += from.count;
  to->logit_mae += from.logit_mae;
  to->logit_rmse += from.logit_rmse;
  to->kl += from.kl;
  to->kl_max = std::max(to->kl_max, from.kl_max);
  to->js += from.js;
  to->output_nmse += from.output_nmse;
  for (std::size_t t = 0; t < from.topk_overlap.size(); ++t)
    to->topk_overlap[t] += from.topk_overlap[t];
}

void finish(AttentionSummary* s) {
  if (s->count == 0) return;
  const double n = static_cast<double>(s->count);
  s->logit_mae /= n;
  s->logit_rmse /= n;
  s->kl /= n;
  s->js /= n;
  s->output_nmse /= n;
  for (double& x : s->topk_overlap) x /= n;
}

std::vector<int> default_edges(int tokens) {
  std::vector<int> e = {0};
  for (long long x = 1; x < tokens; x *= 2) e.push_back(static_cast<int>(x));
  e.push_back(std::max(tokens, 1));
  // The last edge must exceed the last position (tokens - 1).
  if (e.size() >= 2 && e[e.size() - 2] == e.back()) e.pop_back();
  return e;
}

// Per-position metrics of every query head [Hq] against K̂ = k_hat (full = false: KL only).
using RowRunner = std::function<void(const std::vector<Matrix>& k_hat, bool full,
                                     std::vector<PositionMetrics>* out)>;

// The GPU runner (kvarn_cuda's attention_rows); the arguments must outlive it.
RowRunner cuda_rows(const std::vector<Matrix>& q, const std::vector<Matrix>& k,
                    const std::vector<Matrix>& v, const std::vector<Matrix>& v_hat, int q_first,
                    const AttentionOptions& opts) {
#if defined(KVARN_EVAL_HAVE_CUDA)
  KVARN_CHECK(cuda::device_count() > 0,
              "attention_metrics: device cuda requested, but no CUDA device is visible");
  return [&, q_first](const std::vector<Matrix>& kh, bool full, std::vector<PositionMetrics>* out) {
    const int hq = static_cast<int>(q.size()), tq = static_cast<int>(q[0].rows());
    cuda::AttentionRowsProblem p;
    p.q_heads = hq;
    p.kv_heads = static_cast<int>(k.size());
    p.tokens = static_cast<int>(k[0].rows());
    p.queries = tq;
    p.head_dim = static_cast<int>(k[0].cols());
    p.q_first = q_first;
    p.topk = opts.topk;
    p.kl_only = !full;
    cuda::AttentionRowsInput in;
    for (const Matrix& m : q) in.q.push_back(m.data());
    for (std::size_t g = 0; g < k.size(); ++g) {
      in.k.push_back(k[g].data());
      in.k_hat.push_back(kh[g].data());
      in.v.push_back(v[g].data());
      in.v_hat.push_back(v_hat[g].data());
    }
    const cuda::AttentionRows r = cuda::attention_rows(p, in);
    auto slice = [tq](const std::vector<double>& all, int h) {
      return all.empty()
                 ? std::vector<double>()
                 : std::vector<double>(all.begin() + static_cast<std::ptrdiff_t>(h) * tq,
                                       all.begin() + static_cast<std::ptrdiff_t>(h + 1) * tq);
    };
    out->assign(hq, {});
    for (int h = 0; h < hq; ++h) {
      PositionMetrics& pm = (*out)[h];
      pm.kl = slice(r.kl, h);
      if (!full) continue;
      pm.logit_mae = slice(r.logit_mae, h);
      pm.logit_rmse = slice(r.logit_rmse, h);
      pm.js = slice(r.js, h);
      pm.output_nmse = slice(r.output_nmse, h);
      for (const auto& tk : r.topk_overlap) pm.topk_overlap.push_back(slice(tk, h));
    }
  };
#else
  static_cast<void>(q);
  static_cast<void>(k);
  static_cast<void>(v);
  static_cast<void>(v_hat);
  static_cast<void>(q_first);
  static_cast<void>(opts);
  fail(
      "attention_metrics: device cuda requested, but kvarn_eval was built without kvarn_cuda "
      "(configure with -DKVARN_ENABLE_CUDA=ON where nvcc is installed)");
#endif
}

}  // namespace

bool attention_cuda_built() {
#if defined(KVARN_EVAL_HAVE_CUDA)
  return true;
#else
  return false;
#endif
}

int attention_cuda_devices() {
#if defined(KVARN_EVAL_HAVE_CUDA)
  return cuda::device_count();
#else
  return 0;
#endif
}

double kl_from_logits(std::span<const double> s, std::span<const double> s_hat) {
  KVARN_CHECK(s.size() == s_hat.size() && !s.empty(), "kl_from_logits: sizes ", s.size(), " and ",
              s_hat.size());
  std::vector<double> p(s.size()), ph(s.size());
  return row_stats(s.data(), s_hat.data(), static_cast<int>(s.size()), p.data(), ph.data(), false)
      .kl;
}

double js_from_logits(std::span<const double> s, std::span<const double> s_hat) {
  KVARN_CHECK(s.size() == s_hat.size() && !s.empty(), "js_from_logits: sizes ", s.size(), " and ",
              s_hat.size());
  std::vector<double> p(s.size()), ph(s.size());
  return row_stats(s.data(), s_hat.data(), static_cast<int>(s.size()), p.data(), ph.data(), true)
      .js;
}

double topk_overlap(std::span<const double> s, std::span<const double> s_hat, int k) {
  KVARN_CHECK(s.size() == s_hat.size() && k > 0, "topk_overlap: sizes ", s.size(), " and ",
              s_hat.size(), ", k = ", k);
  const int n = static_cast<int>(s.size());
  if (n <= k) return 1.0;
  std::vector<int> a, b;
  top_indices(s.data(), n, k, a);
  top_indices(s_hat.data(), n, k, b);
  return overlap_of_prefix(a, b, k, n);
}

MatrixD reference_attention(const Matrix& q, const Matrix& k, const Matrix& v, int q_first) {
  const int tq = static_cast<int>(q.rows()), t = static_cast<int>(k.rows());
  if (q_first < 0) q_first = t - tq;
  KVARN_CHECK(q.cols() == k.cols() && k.rows() == v.rows() && q_first >= 0 && q_first + tq <= t,
              "reference_attention: q ", q.rows(), "x", q.cols(), ", k ", k.rows(), "x", k.cols(),
              ", v ", v.rows(), "x", v.cols(), ", q_first ", q_first);
  return attention_head_ref(to_double(q), to_double(k), to_double(v), q_first,
                            1.0 / std::sqrt(static_cast<double>(q.cols())));
}

namespace {

// Shapes: hq query heads of tq rows over hkv KV heads of t tokens, all of head_dim d.
void check_attention_inputs(const std::vector<Matrix>& q, const std::vector<Matrix>& k,
                            const std::vector<Matrix>& v, const std::vector<Matrix>& k_hat,
                            const std::vector<Matrix>& v_hat,
                            const std::vector<std::vector<std::uint8_t>>* k_quantized) {
  const int hq = static_cast<int>(q.size()), hkv = static_cast<int>(k.size());
  KVARN_CHECK(hq > 0 && hkv > 0 && hq % hkv == 0, "attention_metrics: ", hq,
              " query heads are not a multiple of ", hkv, " KV heads");
  KVARN_CHECK(v.size() == k.size() && k_hat.size() == k.size() && v_hat.size() == k.size(),
              "attention_metrics: K, V, K̂, V̂ head counts ", k.size(), ", ", v.size(), ", ",
              k_hat.size(), ", ", v_hat.size());
  const int t = static_cast<int>(k[0].rows()), d = static_cast<int>(k[0].cols());
  const int tq = static_cast<int>(q[0].rows());
  for (int g = 0; g < hkv; ++g) {
    for (const Matrix* m : {&k[g], &v[g], &k_hat[g], &v_hat[g]})
      KVARN_CHECK(m->rows() == t && m->cols() == d, "attention_metrics: KV head ", g, " has a ",
                  m->rows(), "x", m->cols(), " array, expected ", t, "x", d);
    if (k_quantized)
      KVARN_CHECK(static_cast<int>((*k_quantized)[g].size()) == t, "attention_metrics: KV head ", g,
                  " has ", (*k_quantized)[g].size(), " quantized flags for ", t, " tokens");
  }
  for (int h = 0; h < hq; ++h)
    KVARN_CHECK(q[h].rows() == tq && q[h].cols() == d, "attention_metrics: query head ", h, " is ",
                q[h].rows(), "x", q[h].cols(), ", expected ", tq, "x", d);
  if (k_quantized)
    KVARN_CHECK(static_cast<int>(k_quantized->size()) == hkv,
                "attention_metrics: ", k_quantized->size(), " quantized masks for ", hkv,
                " KV heads");
}

// The report's shape fields, query window and position buckets.
AttentionReport empty_report(int hq, int hkv, int t, int tq, int d, const AttentionOptions& opts) {
  const int q_first = opts.q_first < 0 ? t - tq : opts.q_first;
  KVARN_CHECK(tq > 0 && q_first >= 0 && q_first + tq <= t, "attention_metrics: ", tq,
              " queries from position ", q_first, " exceed ", t, " tokens");
  for (int kk : opts.topk) KVARN_CHECK(kk > 0, "attention_metrics: top-k must be > 0, got ", kk);
  AttentionReport rep;
  rep.q_heads = hq;
  rep.kv_heads = hkv;
  rep.tokens = t;
  rep.queries = tq;
  rep.head_dim = d;
  rep.q_first = q_first;
  rep.topk = opts.topk;
  rep.bucket_edges = opts.bucket_edges.empty() ? default_edges(t) : opts.bucket_edges;
  KVARN_CHECK(rep.bucket_edges.size() >= 2 &&
                  std::is_sorted(rep.bucket_edges.begin(), rep.bucket_edges.end()),
              "attention_metrics: bucket edges must be ascending, at least two");
  rep.heads.resize(hq);
  rep.buckets.assign(rep.bucket_edges.size() - 1, {});
  return rep;
}

// Per-position metrics of every query head against a K̂ on the CPU (double precision).
RowRunner cpu_rows(const std::vector<Matrix>& k, const std::vector<Matrix>& v,
                   const std::vector<Matrix>& v_hat, const std::vector<MatrixD>& qd, int q_first,
                   const AttentionOptions& opts) {
  return [&k, &v, &v_hat, &qd, q_first, &opts](const std::vector<Matrix>& kh, bool full,
                                               std::vector<PositionMetrics>* out) {
    const int hq = static_cast<int>(qd.size()), hkv = static_cast<int>(k.size());
    const int group = hq / hkv;
    out->resize(hq);
    for (int g = 0; g < hkv; ++g) {
      const MatrixD kd = to_double(k[g]), khd = to_double(kh[g]);
      const MatrixD vd = full ? to_double(v[g]) : MatrixD();  // KL only reads no values
      const MatrixD vhd = full ? to_double(v_hat[g]) : MatrixD();
      for (int h = g * group; h < (g + 1) * group; ++h)
        run_head(qd[h], kd, vd, khd, vhd, q_first, opts, full, &(*out)[h]);
    }
  };
}

// Summaries of every head, overall and per position bucket, from the per-position metrics.
void summarize_heads(std::vector<PositionMetrics>& pm, bool keep_positions, AttentionReport* rep) {
  const int hq = rep->q_heads, hkv = rep->kv_heads, tq = rep->queries, group = hq / hkv;
  const std::vector<int>& edges = rep->bucket_edges;
  const int nb = static_cast<int>(edges.size()) - 1;
  for (int g = 0; g < hkv; ++g) {
    for (int h = g * group; h < (g + 1) * group; ++h) {
      HeadAttentionMetrics& hm = rep->heads[h];
      hm.q_head = h;
      hm.kv_head = g;
      hm.positions = std::move(pm[h]);
      accumulate(hm.positions, 0, tq, &hm.summary);
      hm.buckets.assign(nb, {});
      for (int bk = 0; bk < nb; ++bk) {
        // Query rows whose position falls in [edges[bk], edges[bk+1]).
        const int a = std::clamp(edges[bk] - rep->q_first, 0, tq);
        const int b = std::clamp(edges[bk + 1] - rep->q_first, 0, tq);
        accumulate(hm.positions, a, b, &hm.buckets[bk]);
        merge_sums(hm.buckets[bk], &rep->buckets[bk]);
        finish(&hm.buckets[bk]);
      }
      merge_sums(hm.summary, &rep->summary);
      finish(&hm.summary);
      if (!keep_positions) hm.positions = {};
    }
  }
  finish(&rep->summary);
  for (auto& b : rep->buckets) finish(&b);
}

std::size_t outlier_count(double pct, std::size_t candidates) {
  const double c = std::ceil(pct / 100.0 * static_cast<double>(candidates));
  return std::min(candidates, static_cast<std::size_t>(std::max(0.0, c)));
}

// Per KV head: the entries of K that may be patched (tokens the method quantized), the worst
// outlier_count(max_pct) first in ranking order (|k − k̂| descending, index ascending on ties);
// *total_err gets Σ (k − k̂)² over all entries.
std::vector<std::vector<int>> rank_key_errors(
    const std::vector<Matrix>& k, const std::vector<Matrix>& k_hat, double max_pct,
    const std::vector<std::vector<std::uint8_t>>* k_quantized, double* total_err) {
  const int hkv = static_cast<int>(k.size());
  const int t = static_cast<int>(k[0].rows()), d = static_cast<int>(k[0].cols());
  std::vector<std::vector<int>> ranked(hkv);
  std::vector<float> err(static_cast<std::size_t>(t) * d);
  for (int g = 0; g < hkv; ++g) {
    const float* a = k[g].data();
    const float* b = k_hat[g].data();
    std::vector<int>& cand = ranked[g];
    for (int r = 0; r < t; ++r) {
      const bool use = !k_quantized || (*k_quantized)[g][r];
      for (int c = 0; c < d; ++c) {
        const std::size_t j = static_cast<std::size_t>(r) * d + c;
        const double e = static_cast<double>(a[j]) - b[j];
        err[j] = static_cast<float>(std::fabs(e));
        *total_err += e * e;
        if (use) cand.push_back(static_cast<int>(j));
      }
    }
    auto larger = [&](int x, int y) { return err[x] != err[y] ? err[x] > err[y] : x < y; };
    const std::size_t most = outlier_count(max_pct, cand.size());
    if (most > 0 && most < cand.size())
      std::nth_element(cand.begin(), cand.begin() + (most - 1), cand.end(), larger);
    std::sort(cand.begin(), cand.begin() + most, larger);
  }
  return ranked;
}

// Outlier importance: patch the worst entries of K̂ (by |k − k̂| over the whole K of a KV head,
// tokens the method quantized only) back to exact and measure KL again.
void outlier_importance(const std::vector<Matrix>& k, const std::vector<Matrix>& k_hat,
                        const AttentionOptions& opts,
                        const std::vector<std::vector<std::uint8_t>>* k_quantized,
                        const RowRunner& rows, AttentionReport* rep) {
  const int np = static_cast<int>(opts.outlier_percents.size());
  const int hkv = static_cast<int>(k.size()), hq = rep->q_heads, tq = rep->queries;
  rep->outliers.resize(np);
  for (int i = 0; i < np; ++i) rep->outliers[i].percent = opts.outlier_percents[i];
  if (np == 0) return;
  std::vector<double> err_sum(np, 0.0);
  double total_err = 0;
  std::vector<std::int64_t> kl_count(np, 0);
  const double max_pct =
      *std::max_element(opts.outlier_percents.begin(), opts.outlier_percents.end());
  const std::vector<std::vector<int>> ranked =
      rank_key_errors(k, k_hat, max_pct, k_quantized, &total_err);
  std::vector<Matrix> kp(hkv);
  std::vector<PositionMetrics> pm;
  for (int pi = 0; pi < np; ++pi) {
    for (int g = 0; g < hkv; ++g) {
      const float* a = k[g].data();
      const float* b = k_hat[g].data();
      const std::size_t cnt = outlier_count(opts.outlier_percents[pi], ranked[g].size());
      kp[g] = k_hat[g];
      for (std::size_t j = 0; j < cnt; ++j) {
        const int idx = ranked[g][j];
        kp[g].data()[idx] = a[idx];
        const double e = static_cast<double>(a[idx]) - b[idx];
        err_sum[pi] += e * e;
      }
      rep->outliers[pi].patched_entries += static_cast<std::int64_t>(cnt);
    }
    rows(kp, false, &pm);
    for (int h = 0; h < hq; ++h) {
      rep->outliers[pi].kl += std::accumulate(pm[h].kl.begin(), pm[h].kl.end(), 0.0);
      kl_count[pi] += tq;
    }
  }
  for (int pi = 0; pi < np; ++pi) {
    if (kl_count[pi] > 0) rep->outliers[pi].kl /= static_cast<double>(kl_count[pi]);
    rep->outliers[pi].k_err_share = total_err > 0 ? err_sum[pi] / total_err : 0.0;
  }
}

}  // namespace

AttentionReport attention_metrics(const std::vector<Matrix>& q, const std::vector<Matrix>& k,
                                  const std::vector<Matrix>& v, const std::vector<Matrix>& k_hat,
                                  const std::vector<Matrix>& v_hat, const AttentionOptions& opts,
                                  const std::vector<std::vector<std::uint8_t>>* k_quantized) {
  check_attention_inputs(q, k, v, k_hat, v_hat, k_quantized);
  const int hq = static_cast<int>(q.size()), hkv = static_cast<int>(k.size());
  AttentionReport rep =
      empty_report(hq, hkv, static_cast<int>(k[0].rows()), static_cast<int>(q[0].rows()),
                   static_cast<int>(k[0].cols()), opts);
  // Per-position metrics of every query head against a K̂ (full = false: KL only), on the CPU or
  // the GPU; everything after it (summaries, buckets, outlier ranking) is shared host code.
  std::vector<MatrixD> qd;
  RowRunner rows;
  if (opts.device == AttentionDevice::kCuda) {
    rows = cuda_rows(q, k, v, v_hat, rep.q_first, opts);
  } else {
    qd.resize(hq);
    for (int h = 0; h < hq; ++h) qd[h] = to_double(q[h]);
    rows = cpu_rows(k, v, v_hat, qd, rep.q_first, opts);
  }
  std::vector<PositionMetrics> pm;
  rows(k_hat, true, &pm);
  summarize_heads(pm, opts.per_position, &rep);
  outlier_importance(k, k_hat, opts, k_quantized, rows, &rep);
  return rep;
}

AttentionReport attention_metrics(const std::vector<Matrix>& q, const std::vector<Matrix>& k,
                                  const std::vector<Matrix>& v,
                                  const std::vector<SequenceResult>& quantized,
                                  const AttentionOptions& opts) {
  KVARN_CHECK(quantized.size() == k.size(), "attention_metrics: ", quantized.size(),
              " quantized KV heads for ", k.size());
  std::vector<Matrix> kh, vh;
  std::vector<std::vector<std::uint8_t>> mask;
  for (const SequenceResult& r : quantized) {
    kh.push_back(r.k_hat);
    vh.push_back(r.v_hat);
    mask.push_back(r.k_quantized);
  }
  return attention_metrics(q, k, v, kh, vh, opts, &mask);
}

AttentionReport attention_metrics(const Method& method, const std::vector<Matrix>& q,
                                  const std::vector<Matrix>& k, const std::vector<Matrix>& v,
                                  const LayerContext& layer, const AttentionOptions& opts) {
  KVARN_CHECK(k.size() == v.size(), "attention_metrics: ", k.size(), " K heads but ", v.size(),
              " V heads");
  std::vector<SequenceResult> quantized;
  for (std::size_t g = 0; g < k.size(); ++g)
    quantized.push_back(quantize_sequence(method, k[g], v[g], layer));
  return attention_metrics(q, k, v, quantized, opts);
}

void to_json(nlohmann::json& j, const AttentionSummary& s) {
  j = nlohmann::json{{"count", s.count},
                     {"logit_mae", json_number(s.logit_mae)},
                     {"logit_rmse", json_number(s.logit_rmse)},
                     {"kl", json_number(s.kl)},
                     {"kl_max", json_number(s.kl_max)},
                     {"js", json_number(s.js)},
                     {"output_nmse", json_number(s.output_nmse)},
                     {"topk_overlap", s.topk_overlap}};
}

void to_json(nlohmann::json& j, const HeadAttentionMetrics& h) {
  auto arr = [](const std::vector<double>& v) {
    nlohmann::json a = nlohmann::json::array();
    for (double x : v) a.push_back(json_number(x));
    return a;
  };
  j = nlohmann::json{
      {"q_head", h.q_head}, {"kv_head", h.kv_head}, {"summary", h.summary}, {"buckets", h.buckets}};
  if (!h.positions.kl.empty()) {
    nlohmann::json topk = nlohmann::json::array();
    for (const auto& v : h.positions.topk_overlap) topk.push_back(arr(v));
    j["positions"] = {{"logit_mae", arr(h.positions.logit_mae)},
                      {"logit_rmse", arr(h.positions.logit_rmse)},
                      {"kl", arr(h.positions.kl)},
                      {"js", arr(h.positions.js)},
                      {"output_nmse", arr(h.positions.output_nmse)},
                      {"topk_overlap", topk}};
  }
}

void to_json(nlohmann::json& j, const OutlierImportance& o) {
  j = nlohmann::json{{"percent", o.percent},
                     {"patched_entries", o.patched_entries},
                     {"kl", json_number(o.kl)},
                     {"k_err_share", json_number(o.k_err_share)}};
}

void to_json(nlohmann::json& j, const AttentionReport& r) {
  j = nlohmann::json{{"q_heads", r.q_heads},   {"kv_heads", r.kv_heads},
                     {"tokens", r.tokens},     {"queries", r.queries},
                     {"head_dim", r.head_dim}, {"q_first", r.q_first},
                     {"topk", r.topk},         {"bucket_edges", r.bucket_edges},
                     {"summary", r.summary},   {"buckets", r.buckets},
                     {"heads", r.heads},       {"outliers", r.outliers}};
}

}  // namespace kvarn
