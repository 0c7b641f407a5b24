// The CPU attention reference (paged, causal, GQA) that every GPU attention kernel and the eval
// attention metrics are checked against: exact softmax attention with fp64 accumulation.
#ifndef KVARN_CORE_ATTENTION_REF_HPP_
#define KVARN_CORE_ATTENTION_REF_HPP_

#include <Eigen/Core>
#include <cstdint>
#include <functional>
#include <vector>

namespace kvarn {

using MatrixD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// log sum_j exp(s_j) of n > 0 finite logits: max first, then the shifted sum in index order
// (the per-row formulas of kvarn/core/attention_row.hpp).
double log_sum_exp(const double* s, int n);

// Causal attention of one query head, fp64: q [Tq, D], k and v [T, D]; query row i sits at
// position q_first + i and sees keys 0..q_first + i. scale multiplies the logits. Returns
// [Tq, D]. The computation every reference below is built on.
MatrixD attention_head_ref(const MatrixD& q, const MatrixD& k, const MatrixD& v, int q_first,
                           double scale);

// K and V rows of one sequence and one KV head, [len, D] each, in the frame the queries use.
struct KvRows {
  std::vector<float> k, v;
  int len = 0;
};

// Attention of `num_queries` query rows of one sequence: query i sits at position
// len - num_queries + i and sees keys 0..position (causal). q: [num_queries, Hq, D] row-major;
// kv: one entry per KV head (Hq a multiple of Hkv; query head h reads KV head h / (Hq / Hkv));
// scale: softmax scale (<= 0: 1/sqrt(D)). out: [num_queries, Hq, D].
void attention_ref(const float* q, int num_queries, int num_q_heads, int head_dim,
                   const std::vector<KvRows>& kv, double scale, float* out);

// Block j (0-based, in sequence order) of one sequence and KV head stored at physical block
// `phys`: writes block_size rows of K and of V ([block_size, D] each) into k_rows / v_rows.
using BlockRowsReader =
    std::function<void(int phys, int kv_head, float* k_rows, float* v_rows)>;

// Gathers the first `len` tokens of one sequence and KV head from a paged cache: block j of the
// sequence is physical block block_table[j].
KvRows gather_paged(const int* block_table, int len, int block_size, int head_dim, int kv_head,
                    const BlockRowsReader& read_block);

}  // namespace kvarn

#endif  // KVARN_CORE_ATTENTION_REF_HPP_
