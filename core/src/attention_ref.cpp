#include "kvarn/core/attention_ref.hpp"

#include <algorithm>
#include <cmath>

#include "kvarn/data/error.hpp"

namespace kvarn {

namespace {

// softmax(scale * q . K[0..n)) V[0..n) for one query row, fp64 accumulation.
void attend_row(const float* q, const KvRows& kv, int n, int d, double scale, float* out) {
  std::vector<double> s(n);
  double m = -INFINITY;
  for (int t = 0; t < n; ++t) {
    const float* k = kv.k.data() + static_cast<std::size_t>(t) * d;
    double acc = 0;
    for (int x = 0; x < d; ++x) acc += double(q[x]) * k[x];
    s[t] = acc * scale;
    m = std::max(m, s[t]);
  }
  double l = 0;
  std::vector<double> o(d, 0.0);
  for (int t = 0; t < n; ++t) {
    const double p = std::exp(s[t] - m);
    l += p;
    const float* v = kv.v.data() + static_cast<std::size_t>(t) * d;
    for (int x = 0; x < d; ++x) o[x] += p * v[x];
  }
  for (int x = 0; x < d; ++x) out[x] = static_cast<float>(o[x] / l);
}

}  // namespace

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
  for (int i = 0; i < num_queries; ++i)
    for (int hh = 0; hh < num_q_heads; ++hh) {
      const KvRows& rows = kv[hh / qpk];
      const int visible = rows.len - num_queries + i + 1;
      const std::size_t at = (static_cast<std::size_t>(i) * num_q_heads + hh) * d;
      attend_row(q + at, rows, visible, d, scale, out + at);
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
