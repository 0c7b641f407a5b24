#include "kvarn/core/attention_ref.hpp"

#include <algorithm>
#include <cmath>

#include "kvarn/core/attention_row.hpp"
#include "kvarn/data/error.hpp"

namespace kvarn {

double log_sum_exp(const double* s, int n) {
  namespace ar = attention_row;
  double mx = s[0];
  for (int j = 1; j < n; ++j) mx = ar::max_of(mx, s[j]);
  double sum = 0;
  for (int j = 0; j < n; ++j) sum += std::exp(s[j] - mx);
  return ar::lse_finish(mx, sum);
}

MatrixD attention_head_ref(const MatrixD& q, const MatrixD& k, const MatrixD& v, int q_first,
                           double scale) {
  const int tq = static_cast<int>(q.rows());
  MatrixD out(tq, v.cols());
  std::vector<double> row;
  for (int i = 0; i < tq; ++i) {
    const int n = q_first + i + 1;
    row.resize(n);
    for (int j = 0; j < n; ++j) row[j] = q.row(i).dot(k.row(j)) * scale;
    const double lse = log_sum_exp(row.data(), n);
    out.row(i).setZero();
    for (int j = 0; j < n; ++j) out.row(i) += std::exp(row[j] - lse) * v.row(j);
  }
  return out;
}

void attention_ref(const float* q, int num_queries, int num_q_heads, int head_dim,
                   const std::vector<KvRows>& kv, double scale, float* out) {
  const int hkv = static_cast<int>(kv.size());
  KVARN_CHECK(hkv > 0 && num_q_heads % hkv == 0, "attention_ref: Hq ", num_q_heads,
              " not a multiple of Hkv ", hkv);
  const int qpk = num_q_heads / hkv, d = head_dim;
  if (scale <= 0) scale = 1.0 / std::sqrt(static_cast<double>(d));
  for (int h = 0; h < hkv; ++h) {
    KVARN_CHECK(kv[h].len >= num_queries && kv[h].k.size() >= static_cast<std::size_t>(kv[h].len) * d &&
                    kv[h].v.size() >= static_cast<std::size_t>(kv[h].len) * d,
                "attention_ref: KV head ", h, " holds ", kv[h].len, " tokens for ", num_queries,
                " queries");
  }
  using RowsF = Eigen::Map<const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;
  for (int h = 0; h < hkv; ++h) {
    const KvRows& rows = kv[h];
    const MatrixD k = RowsF(rows.k.data(), rows.len, d).cast<double>();
    const MatrixD v = RowsF(rows.v.data(), rows.len, d).cast<double>();
    for (int hh = h * qpk; hh < (h + 1) * qpk; ++hh) {
      MatrixD qh(num_queries, d);
      for (int i = 0; i < num_queries; ++i)
        for (int x = 0; x < d; ++x)
          qh(i, x) = q[(static_cast<std::size_t>(i) * num_q_heads + hh) * d + x];
      const MatrixD o = attention_head_ref(qh, k, v, rows.len - num_queries, scale);
      for (int i = 0; i < num_queries; ++i)
        for (int x = 0; x < d; ++x)
          out[(static_cast<std::size_t>(i) * num_q_heads + hh) * d + x] = static_cast<float>(o(i, x));
    }
  }
}

KvRows gather_paged(const int* block_table, int len, int block_size, int head_dim, int kv_head,
                    const BlockRowsReader& read_block) {
  KvRows r;
  r.len = len;
  const int nb = (len + block_size - 1) / block_size;
  const std::size_t block_elems = static_cast<std::size_t>(block_size) * head_dim;
  r.k.assign(nb * block_elems, 0.0f);
  r.v.assign(nb * block_elems, 0.0f);
  for (int j = 0; j < nb; ++j)
    read_block(block_table[j], kv_head, r.k.data() + j * block_elems, r.v.data() + j * block_elems);
  r.k.resize(static_cast<std::size_t>(len) * head_dim);
  r.v.resize(static_cast<std::size_t>(len) * head_dim);
  return r;
}

}  // namespace kvarn
