#include "kvarn/core/rotation.hpp"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>

#include "kvarn/core/hadamard_fp16.hpp"
#include "kvarn/core/half_array.hpp"
#include "kvarn/core/portable_math.hpp"
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
    case RotationKind::kHadamardFp16:
      return "hadamard_fp16";
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

RotationKind parse_kvarn_rotation(const std::string& name) {
  if (name == "hadamard") return RotationKind::kHadamardFp16;
  if (name == "hadamard_exact") return RotationKind::kHadamard;
  if (name == "none") return RotationKind::kNone;
  if (name == "haar") return RotationKind::kHaar;
  fail("unknown rotation '", name, "' (valid: hadamard, hadamard_exact, haar, none)");
}

std::string kvarn_rotation_name(RotationKind kind) {
  if (kind == RotationKind::kHadamardFp16) return "hadamard";
  if (kind == RotationKind::kHadamard) return "hadamard_exact";
  return to_string(kind);
}

bool is_pow2(int n) { return n > 0 && (n & (n - 1)) == 0; }

std::uint16_t hadamard_fp16_scale_bits(int dim) {
  return float_to_half_bits(static_cast<float>(1.0 / std::sqrt(static_cast<double>(dim))));
}

float hadamard_fp16_entry(int dim) { return half_bits_to_float(hadamard_fp16_scale_bits(dim)); }

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
  } else if (kind == RotationKind::kHadamardFp16) {
    KVARN_CHECK(split_dim(dim, &k_, &p_) && dim <= kHadamardFp16MaxDim,
                "fp16 Hadamard rotation does not support head_dim ", dim, " (supported up to ",
                kHadamardFp16MaxDim, ": 2^m, 12*2^m, 20*2^m, 28*2^m)");
    dense_ = small_hadamard(k_);
    scale_ = hadamard_fp16_entry(dim);
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
      for (int j = 0; j < dim; ++j)
        dense_[static_cast<size_t>(i) * dim + j] = static_cast<float>(q(i, j));
  }
}

namespace {
// Butterflies of the FWHT along the d rows of xt [d, n]: each row of n values is one step of n
// independent transforms, so the inner loop vectorizes. Two stages (h, 2h) go per pass over the
// block, in registers: the same additions in the same order as two radix-2 passes, with half the
// trips through memory. Inlined into each SIMD clone.
template <typename T>
[[gnu::always_inline]] inline void butterflies(T* xt, int d, int n) {
  int h = 1;
  for (; 4 * h <= d; h *= 4) {
    for (int i = 0; i < d; i += 4 * h) {
      for (int j = i; j < i + h; ++j) {
        T* a = xt + static_cast<size_t>(j) * n;
        T* b = a + static_cast<size_t>(h) * n;
        T* c = b + static_cast<size_t>(h) * n;
        T* e = c + static_cast<size_t>(h) * n;
        for (int k = 0; k < n; ++k) {
          const T a1 = a[k] + b[k], b1 = a[k] - b[k], c1 = c[k] + e[k], e1 = c[k] - e[k];
          a[k] = a1 + c1;
          c[k] = a1 - c1;
          b[k] = b1 + e1;
          e[k] = b1 - e1;
        }
      }
    }
  }
  for (; h < d; h *= 2) {
    for (int i = 0; i < d; i += 2 * h) {
      for (int j = i; j < i + h; ++j) {
        T* a = xt + static_cast<size_t>(j) * n;
        T* b = xt + static_cast<size_t>(j + h) * n;
        for (int k = 0; k < n; ++k) {
          const T x = a[k], y = b[k];
          a[k] = x + y;
          b[k] = x - y;
        }
      }
    }
  }
}

KVARN_SIMD_CLONES void fwht_columns(float* xt, int d, int n, float scale) {
  butterflies(xt, d, n);
  for (size_t i = 0; i < static_cast<size_t>(d) * n; ++i) xt[i] *= scale;
}

// The same butterflies in double on fp16 values: exact (every partial sum is a multiple of 2^-24
// below 2^51 * 2^-24 for D <= 2048, within double's 53 bits), so the order does not matter.
KVARN_SIMD_CLONES void fwht_columns_exact(double* xt, int d, int n) { butterflies(xt, d, n); }

// fp16 inputs (rounded in place) -> exact doubles; false if one is beyond the fp16 range.
KVARN_SIMD_CLONES bool load_fp16_exact(float* x, std::size_t n, double* out) {
  round_to_half_inplace(x, n);
  std::uint32_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    bad |= (float_bits(x[i]) & 0x7fffffffu) > 0x477fe000u;  // beyond 65504: inf (or NaN)
    out[i] = static_cast<double>(x[i]);
  }
  return bad == 0;
}

// out = c * s rounded to odd in fp32 (hadamard_fp16.hpp). Fast path: |s| < 2^18 makes p = s * c
// exact in double (42 + 11 significant bits); round-to-odd of p is its truncation to fp32 with
// the last bit set when bits were dropped (the odd one of the two neighbours), done on the bits
// (p is 0 or within the fp32 normal range). Returns false when some |s| is larger (those elements
// are then redone by the int64 path).
KVARN_SIMD_CLONES bool scale_round_odd_fast(const double* s, std::size_t n, double cd, float* out) {
  std::uint64_t big = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t b = double_bits(s[i] * cd);
    const std::uint64_t mag = b & 0x7fffffffffffffffull;
    const std::uint64_t trunc = (mag >> 29) - (std::uint64_t{896} << 23);  // rebias 1023 -> 127
    const std::uint64_t odd = (mag & 0x1fffffffull) != 0 ? 1u : 0u;
    const std::uint64_t f = ((b >> 32) & 0x80000000u) | (trunc | odd);
    out[i] = bits_float(mag == 0 ? 0u : static_cast<std::uint32_t>(f));  // +-0 -> +0
    big |= (double_bits(s[i]) & 0x7fffffffffffffffull) >= 0x4110000000000000ull ? 1u : 0u;
  }
  return big == 0;
}

// out = fp16(c * s) (round to nearest even) as float in one pass: the value of
// round_to_half(scale_round_odd(...)), since rounding to odd with at least two extra bits makes
// the second rounding the direct one (Boldo and Melquiond). Fast path: |s| < 2^18 (p = s * c
// exact in double) and |p| < 65520 (no fp16 overflow); p = +-0 gives +0 as scale_round_odd.
// Returns false when some element is outside it (the caller then takes the two-step path).
KVARN_SIMD_CLONES bool scale_round_fp16_fast(const double* s, std::size_t n, double cd,
                                             float* out) {
  constexpr std::uint64_t kAbs = 0x7fffffffffffffffull, kDrop = (std::uint64_t{1} << 42) - 1;
  constexpr std::uint64_t kMinNormal = 0x3f10000000000000ull;  // 2^-14
  constexpr std::uint64_t kOverflow = 0x40effe0000000000ull;   // 65520
  constexpr double k2p28 = 268435456.0;  // (|p| + 2^28) - 2^28 rounds to a multiple of 2^-24
  std::uint64_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t b = double_bits(s[i] * cd), mag = b & kAbs;
    const std::uint64_t normal = (mag + (kDrop >> 1) + ((mag >> 42) & 1)) & ~kDrop;
    const std::uint64_t sub = double_bits((bits_double(mag) + k2p28) - k2p28);
    // Masks instead of selects: the loop stays free of branches (it vectorizes).
    const std::uint64_t small = 0 - static_cast<std::uint64_t>(mag < kMinNormal);
    const std::uint64_t nonzero = 0 - static_cast<std::uint64_t>(mag != 0);
    const std::uint64_t r = (((sub & small) | (normal & ~small)) | (b & ~kAbs)) & nonzero;
    out[i] = static_cast<float>(bits_double(r));
    bad |= static_cast<std::uint64_t>((double_bits(s[i]) & kAbs) >= 0x4110000000000000ull);
    bad |= static_cast<std::uint64_t>(mag >= kOverflow);
  }
  return bad == 0;
}

void scale_round_odd(const double* s, std::size_t n, Fp16Scale c, double cd, float* out) {
  if (scale_round_odd_fast(s, n, cd, out)) return;
  for (std::size_t i = 0; i < n; ++i) {
    if (std::fabs(s[i]) >= 262144.0)
      out[i] = hadamard_fp16_scale(static_cast<std::int64_t>(s[i] * 16777216.0), c);
  }
}

// Rows of a [d, n] channel-major block are channels, columns are vectors (rows of the caller).
// row0: row number of column 0 in the caller's rows (for the message).
[[noreturn]] void fail_fp16_range(const char* what, float value, std::size_t i, int n, int row0) {
  fail("fp16 rotation: ", what, " ", value, " at row (token) ", row0 + static_cast<int>(i % n),
       ", channel ", i / n,
       " is beyond the fp16 range (|x| <= 65504): the rotated fp16 cache cannot hold it (the "
       "published fp16 pipeline would store inf and produce NaN)");
}

// Rounds xt [d, n] to fp16 in place; throws on a value that would round to +-inf (or NaN).
KVARN_SIMD_CLONES bool all_below_fp16_overflow(const float* x, std::size_t n) {
  std::uint32_t bad = 0;  // |x| >= 65520 (rounds to inf) or NaN, on the bits: vectorizes
  for (std::size_t i = 0; i < n; ++i) bad |= (float_bits(x[i]) & 0x7fffffffu) >= 0x477ff000u;
  return bad == 0;
}

void round_columns_to_fp16(float* xt, int d, int n, int row0) {
  const std::size_t total = static_cast<std::size_t>(d) * n;
  if (!all_below_fp16_overflow(xt, total)) {
    for (std::size_t i = 0; i < total; ++i)
      if (!(std::fabs(xt[i]) < 65520.0f)) fail_fp16_range("rotated value", xt[i], i, n, row0);
  }
  round_to_half_inplace(xt, total);
}

// Rows [rows, d] <-> channel-major [d, rows] around a column operation.
template <typename Op>
void on_columns(float* x, int rows, int d, Op op) {
  thread_local std::vector<float> cols;
  constexpr int kBlock = 64;  // rows per block: the block stays in L1/L2
  for (int r0 = 0; r0 < rows; r0 += kBlock) {
    const int nb = std::min(kBlock, rows - r0);
    float* blk = x + static_cast<std::size_t>(r0) * d;
    cols.resize(static_cast<std::size_t>(d) * nb);
    transpose(blk, nb, d, cols.data());
    op(cols.data(), nb, r0);
    transpose(cols.data(), d, nb, blk);
  }
}
}  // namespace

void Rotation::hadamard_fp16_columns(float* xt, int n, int row0, bool to_fp16) const {
  const int d = dim_;
  const std::size_t total = static_cast<std::size_t>(d) * n;
  thread_local std::vector<double> acc;
  acc.resize(total);
  if (!load_fp16_exact(xt, total, acc.data())) {
    for (std::size_t i = 0; i < total; ++i)
      if (!(std::fabs(xt[i]) <= 65504.0f)) fail_fp16_range("input value", xt[i], i, n, row0);
  }
  // X' = H_K^T X H_P on each column viewed as X[k_][p_]: FWHT of every block of p_ channels,
  // then the H_K mix across blocks, all exact.
  for (int a = 0; a < k_; ++a)
    fwht_columns_exact(acc.data() + static_cast<std::size_t>(a) * p_ * n, p_, n);
  if (k_ > 1) {
    thread_local std::vector<double> mixed;
    mixed.assign(total, 0.0);
    const std::size_t block = static_cast<std::size_t>(p_) * n;
    for (int a2 = 0; a2 < k_; ++a2)
      for (int a = 0; a < k_; ++a) {
        const double h = dense_[a * k_ + a2];
        const double* in = acc.data() + a * block;
        double* out = mixed.data() + a2 * block;
        for (std::size_t i = 0; i < block; ++i) out[i] += h * in[i];  // h = +-1: exact
      }
    acc.swap(mixed);
  }
  const std::uint16_t cb = hadamard_fp16_scale_bits(d);
  const double cd = static_cast<double>(half_bits_to_float(cb));
  if (to_fp16 && scale_round_fp16_fast(acc.data(), total, cd, xt)) return;
  scale_round_odd(acc.data(), total, fp16_scale(cb), cd, xt);
  if (to_fp16) round_columns_to_fp16(xt, d, n, row0);
}

void Rotation::columns_fp16(float* xt, int n, int row0) const {
  if (kind_ == RotationKind::kHadamardFp16) return hadamard_fp16_columns(xt, n, row0, true);
  columns(xt, n, row0);
  round_columns_to_fp16(xt, dim_, n, row0);
}

void Rotation::forward_columns(float* xt, int n) const { columns(xt, n, 0); }

void Rotation::columns(float* xt, int n, int row0) const {
  if (kind_ == RotationKind::kNone) return;
  if (kind_ == RotationKind::kHadamardFp16) {
    hadamard_fp16_columns(xt, n, row0, false);
    return;
  }
  if (kind_ == RotationKind::kHadamard && k_ == 1) {
    fwht_columns(xt, dim_, n, scale_);  // bit-identical to the row-wise FWHT
    return;
  }
  std::vector<float> rows(static_cast<size_t>(dim_) * n);
  transpose(xt, dim_, n, rows.data());
  forward(rows.data(), n);
  transpose(rows.data(), n, dim_, xt);
}

void Rotation::forward_columns_fp16(float* xt, int n) const { columns_fp16(xt, n, 0); }

void Rotation::inverse_columns(float* xt, int n) const {
  if (kind_ == RotationKind::kNone) return;
  if ((kind_ == RotationKind::kHadamard || kind_ == RotationKind::kHadamardFp16) && k_ == 1) {
    fwht_columns(xt, dim_, n, scale_);  // apply()'s inverse, on the same columns
    return;
  }
  std::vector<float> rows(static_cast<size_t>(dim_) * n);
  transpose(xt, dim_, n, rows.data());
  inverse(rows.data(), n);
  transpose(rows.data(), n, dim_, xt);
}

void Rotation::fp16_round_trip(const float* in, int rows, float* out) const {
  thread_local std::vector<float> cols;
  constexpr int kBlock = 64;  // as on_columns
  for (int r0 = 0; r0 < rows; r0 += kBlock) {
    const int nb = std::min(kBlock, rows - r0);
    const std::size_t offset = static_cast<std::size_t>(r0) * dim_;
    cols.resize(static_cast<std::size_t>(dim_) * nb);
    transpose(in + offset, nb, dim_, cols.data());
    columns_fp16(cols.data(), nb, r0);
    inverse_columns(cols.data(), nb);
    transpose(cols.data(), dim_, nb, out + offset);
  }
}

void Rotation::forward_fp16(float* x, int rows, int first_row) const {
  on_columns(x, rows, dim_,
             [&](float* xt, int nb, int r0) { columns_fp16(xt, nb, first_row + r0); });
}

void Rotation::forward(float* x, int rows) const { apply(x, rows, false); }
void Rotation::inverse(float* x, int rows) const { apply(x, rows, true); }

void Rotation::apply(float* x, int rows, bool transpose) const {
  const int d = dim_;
  if (kind_ == RotationKind::kNone) return;
  if (kind_ == RotationKind::kHadamardFp16 && !transpose) {
    on_columns(x, rows, d,
               [&](float* xt, int nb, int r0) { hadamard_fp16_columns(xt, nb, r0, false); });
    return;
  }
  if ((kind_ == RotationKind::kHadamard || kind_ == RotationKind::kHadamardFp16) && k_ == 1) {
    // Symmetric: forward == inverse. The butterflies of a block of rows run channel-major.
    on_columns(x, rows, d, [&](float* xt, int nb, int) { fwht_columns(xt, d, nb, scale_); });
    return;
  }
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
