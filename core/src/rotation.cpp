#include "kvarn/core/rotation.hpp"

#include <Eigen/Dense>
#include <cmath>

#include "kvarn/core/half_array.hpp"
#include "kvarn/core/rng.hpp"
#include "kvarn/data/error.hpp"
#include "simd.hpp"

namespace kvarn {

std::string to_string(RotationKind kind) {
  switch (kind) {
    case RotationKind::kNone:
      return "none";
    case RotationKind::kHadamard:
      return "hadamard";
    case RotationKind::kHaar:
      return "haar";
  }
  return "?";
}

RotationKind parse_rotation(const std::string& name) {
  if (name == "none") return RotationKind::kNone;
  if (name == "hadamard") return RotationKind::kHadamard;
  if (name == "haar") return RotationKind::kHaar;
  fail("unknown rotation '", name, "' (valid: hadamard, haar, none)");
}

bool is_pow2(int n) { return n > 0 && (n & (n - 1)) == 0; }

namespace {

// Quadratic character mod prime q: 0, +1 (residue), -1 (non-residue).
int legendre(int a, int q) {
  a %= q;
  if (a < 0) a += q;
  if (a == 0) return 0;
  for (int x = 1; x < q; ++x) {
    if ((x * x) % q == a) return 1;
  }
  return -1;
}

// Jacobsthal-based conference core of order q+1: C[0][j]=1 (j>0), C[i][0]=sign, C[i][j]=chi(j-i).
std::vector<int> conference(int q, bool skew) {
  int n = q + 1;
  std::vector<int> c(n * n, 0);
  for (int j = 1; j < n; ++j) {
    c[j] = 1;
    c[j * n] = skew ? -1 : 1;
  }
  for (int i = 1; i < n; ++i) {
    for (int j = 1; j < n; ++j) c[i * n + j] = legendre(j - i, q);
  }
  return c;
}

std::vector<float> paley1(int q) {  // q = 3 mod 4 prime -> order q+1: H = I + C (C skew)
  int n = q + 1;
  std::vector<int> c = conference(q, true);
  std::vector<float> h(n * n);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) h[i * n + j] = static_cast<float>(c[i * n + j] + (i == j ? 1 : 0));
  return h;
}

std::vector<float> paley2(int q) {  // q = 1 mod 4 prime -> order 2(q+1), C symmetric
  int n = q + 1;
  std::vector<int> c = conference(q, false);
  int m = 2 * n;
  std::vector<float> h(m * m);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      int v = c[i * n + j];
      // 0 -> [[1,-1],[-1,-1]];  +-1 -> +-[[1,1],[1,-1]]
      float b[2][2];
      if (v == 0) {
        b[0][0] = 1, b[0][1] = -1, b[1][0] = -1, b[1][1] = -1;
      } else {
        b[0][0] = v, b[0][1] = v, b[1][0] = v, b[1][1] = -v;
      }
      for (int a = 0; a < 2; ++a)
        for (int bb = 0; bb < 2; ++bb) h[(2 * i + a) * m + 2 * j + bb] = b[a][bb];
    }
  }
  return h;
}

// Split dim = k * p with k in {1, 12, 20, 28} and p a power of two; false if impossible.
bool split_dim(int dim, int* k, int* p) {
  for (int kk : {1, 12, 20, 28}) {
    if (dim % kk == 0 && is_pow2(dim / kk)) {
      *k = kk;
      *p = dim / kk;
      return true;
    }
  }
  return false;
}

std::vector<float> small_hadamard(int k) {
  switch (k) {
    case 1:
      return {1.0f};
    case 12:
      return paley1(11);
    case 20:
      return paley1(19);
    case 28:
      return paley2(13);
  }
  fail("no Hadamard matrix of order ", k);
}

}  // namespace

bool hadamard_supported(int dim) {
  int k, p;
  return split_dim(dim, &k, &p);
}

std::vector<float> hadamard_matrix(int n) {
  int k, p;
  KVARN_CHECK(split_dim(n, &k, &p), "no Hadamard matrix of order ", n,
              " (supported: 2^m, 12*2^m, 20*2^m, 28*2^m)");
  std::vector<float> hk = small_hadamard(k);
  std::vector<float> h(static_cast<size_t>(n) * n);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      int a = i / p, b = i % p, a2 = j / p, b2 = j % p;
      float hp = (__builtin_popcount(b & b2) & 1) ? -1.0f : 1.0f;
      h[static_cast<size_t>(i) * n + j] = hk[a * k + a2] * hp;
    }
  }
  return h;
}

KVARN_SIMD_CLONES void fwht(float* x, int n) {
  for (int h = 1; h < n; h <<= 1) {
    for (int i = 0; i < n; i += 2 * h) {
      for (int j = i; j < i + h; ++j) {
        float a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
    }
  }
}

Rotation::Rotation(RotationKind kind, int dim, std::uint64_t seed)
    : kind_(kind), dim_(dim), seed_(seed) {
  KVARN_CHECK(dim > 0, "rotation dimension must be positive, got ", dim);
  if (kind == RotationKind::kHadamard) {
    KVARN_CHECK(split_dim(dim, &k_, &p_), "Hadamard rotation does not support head_dim ", dim,
                " (supported: 2^m, 12*2^m, 20*2^m, 28*2^m, e.g. 64, 80, 96, 112, 128, 192, 256)");
    dense_ = small_hadamard(k_);
    scale_ = static_cast<float>(1.0 / std::sqrt(static_cast<double>(dim)));
  } else if (kind == RotationKind::kHaar) {
    // Gaussian matrix from a portable generator; QR in double; Q * diag(sign(diag(R))) is Haar.
    Rng rng(seed);
    Eigen::MatrixXd g(dim, dim);
    for (int i = 0; i < dim; ++i)
      for (int j = 0; j < dim; ++j) g(i, j) = rng.normal();
    Eigen::HouseholderQR<Eigen::MatrixXd> qr(g);
    Eigen::MatrixXd q = qr.householderQ();
    Eigen::MatrixXd r = qr.matrixQR().triangularView<Eigen::Upper>();
    for (int j = 0; j < dim; ++j) {
      if (r(j, j) < 0) q.col(j) = -q.col(j);
    }
    dense_.resize(static_cast<size_t>(dim) * dim);
    for (int i = 0; i < dim; ++i)
      for (int j = 0; j < dim; ++j) dense_[static_cast<size_t>(i) * dim + j] = static_cast<float>(q(i, j));
  }
}

void Rotation::forward(float* x, int rows) const { apply(x, rows, false); }

namespace {
KVARN_SIMD_CLONES void fwht_columns(float* xt, int d, int n, float scale) {
  for (int h = 1; h < d; h <<= 1) {
    for (int i = 0; i < d; i += 2 * h) {
      for (int j = i; j < i + h; ++j) {
        float* a = xt + static_cast<size_t>(j) * n;
        float* b = xt + static_cast<size_t>(j + h) * n;
        for (int c = 0; c < n; ++c) {
          const float x = a[c], y = b[c];
          a[c] = x + y;
          b[c] = x - y;
        }
      }
    }
  }
  for (size_t i = 0; i < static_cast<size_t>(d) * n; ++i) xt[i] *= scale;
}
}  // namespace

void Rotation::forward_columns(float* xt, int n) const {
  if (kind_ == RotationKind::kNone) return;
  if (kind_ == RotationKind::kHadamard && k_ == 1) {
    fwht_columns(xt, dim_, n, scale_);
    return;
  }
  std::vector<float> rows(static_cast<size_t>(dim_) * n);
  transpose(xt, dim_, n, rows.data());
  forward(rows.data(), n);
  transpose(rows.data(), n, dim_, xt);
}
void Rotation::inverse(float* x, int rows) const { apply(x, rows, true); }

void Rotation::apply(float* x, int rows, bool transpose) const {
  const int d = dim_;
  if (kind_ == RotationKind::kNone) return;
  std::vector<float> tmp(d);
  if (kind_ == RotationKind::kHaar) {
    // forward: y_j = sum_i x_i R[i][j];  inverse: y_i = sum_j x_j R[i][j]
    for (int r = 0; r < rows; ++r) {
      float* row = x + static_cast<size_t>(r) * d;
      std::fill(tmp.begin(), tmp.end(), 0.0f);
      if (!transpose) {
        for (int i = 0; i < d; ++i) {
          const float xi = row[i];
          const float* rr = dense_.data() + static_cast<size_t>(i) * d;
          for (int j = 0; j < d; ++j) tmp[j] += xi * rr[j];
        }
      } else {
        for (int i = 0; i < d; ++i) {
          const float* rr = dense_.data() + static_cast<size_t>(i) * d;
          float acc = 0.0f;
          for (int j = 0; j < d; ++j) acc += row[j] * rr[j];
          tmp[i] = acc;
        }
      }
      std::copy(tmp.begin(), tmp.end(), row);
    }
    return;
  }
  // Hadamard: row viewed as X[k_][p_]; forward X' = H_K^T X H_P / sqrt(D), inverse X = H_K X' H_P
  // / sqrt(D) (H_P symmetric). For k_ == 1 both are the plain FWHT.
  for (int r = 0; r < rows; ++r) {
    float* row = x + static_cast<size_t>(r) * d;
    for (int a = 0; a < k_; ++a) fwht(row + a * p_, p_);
    if (k_ > 1) {
      for (int a2 = 0; a2 < k_; ++a2) {
        float* out = tmp.data() + a2 * p_;
        for (int b = 0; b < p_; ++b) out[b] = 0.0f;
        for (int a = 0; a < k_; ++a) {
          // forward uses H_K[a][a2] (H^T X), inverse H_K[a2][a] (H X)
          float h = transpose ? dense_[a2 * k_ + a] : dense_[a * k_ + a2];
          const float* in = row + a * p_;
          for (int b = 0; b < p_; ++b) out[b] += h * in[b];
        }
      }
      std::copy(tmp.begin(), tmp.end(), row);
    }
    for (int i = 0; i < d; ++i) row[i] *= scale_;
  }
}

std::vector<float> Rotation::matrix() const {
  const int d = dim_;
  std::vector<float> m(static_cast<size_t>(d) * d, 0.0f);
  for (int i = 0; i < d; ++i) m[static_cast<size_t>(i) * d + i] = 1.0f;
  forward(m.data(), d);  // row i of I R = row i of R
  return m;
}

}  // namespace kvarn
