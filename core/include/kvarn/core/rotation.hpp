// Orthogonal rotations along head_dim, applied to row vectors (x' = x R; inverse x = x' R^T).
//
// kHadamard: normalized Sylvester H/sqrt(D) through a fast Walsh-Hadamard transform (symmetric,
//   self-inverse). For D = K * 2^m that is not a power of two (80, 96, 112, 192, ...):
//   (H_K kron H_{2^m}) / sqrt(D) with H_12, H_20 (Paley I) or H_28 (Paley II) built here; an
//   orthogonal matrix, never a truncated one.
// kHadamardFp16: the published KVarN arithmetic (D up to 2048; the same Sylvester or Kronecker
//   +-1 matrix as kHadamard): fp16 inputs times the fp16 matrix with entries +-c,
//   c = fp16(1/sqrt(D)) (hadamard_fp16.hpp: exact sums, one correct rounding). The matrix is
//   symmetric but not exactly orthogonal (c^2 D != 1 when D is not a power of four); the inverse
//   applies the same matrix (as upstream un-rotates outputs): x <- fp32 FWHT of x, times c.
// kHaar: a seeded Haar-random orthogonal matrix (QR of a Gaussian matrix, signs fixed by diag(R)).
// kNone: identity.
#ifndef KVARN_CORE_ROTATION_HPP_
#define KVARN_CORE_ROTATION_HPP_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kvarn {

enum class RotationKind { kNone, kHadamard, kHadamardFp16, kHaar };

std::string to_string(RotationKind kind);
RotationKind parse_rotation(const std::string& name);  // "none" | "hadamard" | "haar"

// KVarN's rotation option: "hadamard" (default) is the published fp16 arithmetic
// (kHadamardFp16), "hadamard_exact" the exact-scale fp32 FWHT (kHadamard); "none", "haar".
RotationKind parse_kvarn_rotation(const std::string& name);
std::string kvarn_rotation_name(RotationKind kind);

bool is_pow2(int n);

// +-1 Hadamard matrix of order n (row-major), n in {1, 2, 4, ...} (Sylvester), 12, 20 (Paley I)
// or 28 (Paley II), times powers of two. Unnormalized: H H^T = n I.
std::vector<float> hadamard_matrix(int n);

// True when hadamard rotation supports this head_dim.
bool hadamard_supported(int dim);

class Rotation {
 public:
  Rotation(RotationKind kind, int dim, std::uint64_t seed = 0);

  RotationKind kind() const { return kind_; }
  int dim() const { return dim_; }
  std::uint64_t seed() const { return seed_; }

  // In place on `rows` contiguous rows of length dim: x <- x R (forward) or x <- x R^T (inverse).
  // kHadamardFp16: forward rounds the inputs to fp16 and returns c * S rounded to odd in fp32
  // (its fp16 rounding is the published value); inverse is the fp32 FWHT times c.
  void forward(float* x, int rows) const;
  void inverse(float* x, int rows) const;
  // Same results as forward(), on a channel-major block xt [dim, n] (column j is one vector):
  // the butterflies then run on whole rows of n values, which vectorizes.
  void forward_columns(float* xt, int n) const;
  // forward() / forward_columns(), then rounded to fp16 (the stored rotated values). Throws when
  // a rotated value is beyond the fp16 range (|y| >= 65520 rounds to inf), naming the row,
  // channel and value, instead of storing inf (first_row: the number of x's first row there).
  void forward_fp16(float* x, int rows, int first_row = 0) const;
  void forward_columns_fp16(float* xt, int n) const;
  // Same results as inverse(), on a channel-major block xt [dim, n].
  void inverse_columns(float* xt, int n) const;
  // out = inverse(forward_fp16(in)) for `rows` rows (in and out may not overlap): what a row kept
  // rotated in fp16 reconstructs to, in one pass over channel-major blocks.
  void fp16_round_trip(const float* in, int rows, float* out) const;

  // The dense D x D matrix R (row-major), for tests and for kernels that use a GEMM.
  std::vector<float> matrix() const;

 private:
  void apply(float* x, int rows, bool transpose) const;
  // forward_columns with row0 = the caller's row number of column 0 (error messages).
  void columns(float* xt, int n, int row0) const;
  // to_fp16: also round the result to fp16 (forward_columns_fp16), in the same pass where it can.
  void hadamard_fp16_columns(float* xt, int n, int row0, bool to_fp16) const;
  // columns() then the rounding to fp16 with its range check.
  void columns_fp16(float* xt, int n, int row0) const;

  RotationKind kind_;
  int dim_;
  std::uint64_t seed_;
  int k_ = 1;  // Hadamard: D = k_ * p_, p_ a power of two
  int p_ = 1;
  std::vector<float> dense_;  // H_K (k_ x k_, +-1) for Hadamard, R (D x D) for Haar
  float scale_ = 1.0f;        // 1/sqrt(D) (kHadamard), fp16(1/sqrt(D)) (kHadamardFp16)
};

// Fast Walsh-Hadamard transform of n = 2^m contiguous floats (unnormalized butterflies,
// natural order, stage h = 1, 2, 4, ...: a+b, a-b).
void fwht(float* x, int n);

// fp16(1/sqrt(D)) as fp16 bits: the entries' magnitude of the published rotation matrix.
std::uint16_t hadamard_fp16_scale_bits(int dim);
float hadamard_fp16_entry(int dim);  // the same value as a float

}  // namespace kvarn

#endif  // KVARN_CORE_ROTATION_HPP_
