// Orthogonal rotations along head_dim, applied to row vectors (x' = x R; inverse x = x' R^T).
//
// kHadamard: normalized Sylvester H/sqrt(D) through a fast Walsh-Hadamard transform (symmetric,
//   self-inverse). For D = K * 2^m that is not a power of two (80, 96, 112, 192, ...):
//   (H_K kron H_{2^m}) / sqrt(D) with H_12, H_20 (Paley I) or H_28 (Paley II) built here; an
//   orthogonal matrix, never a truncated one.
// kHaar: a seeded Haar-random orthogonal matrix (QR of a Gaussian matrix, signs fixed by diag(R)).
// kNone: identity.
#ifndef KVARN_CORE_ROTATION_HPP_
#define KVARN_CORE_ROTATION_HPP_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kvarn {

enum class RotationKind { kNone, kHadamard, kHaar };

std::string to_string(RotationKind kind);
RotationKind parse_rotation(const std::string& name);  // "none" | "hadamard" | "haar"

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
  void forward(float* x, int rows) const;
  void inverse(float* x, int rows) const;
  // Same results as forward(), on a channel-major block xt [dim, n] (column j is one vector):
  // the butterflies then run on whole rows of n values, which vectorizes.
  void forward_columns(float* xt, int n) const;

  // The dense D x D matrix R (row-major), for tests and for kernels that use a GEMM.
  std::vector<float> matrix() const;

 private:
  void apply(float* x, int rows, bool transpose) const;

  RotationKind kind_;
  int dim_;
  std::uint64_t seed_;
  int k_ = 1;                  // Hadamard: D = k_ * p_, p_ a power of two
  int p_ = 1;
  std::vector<float> dense_;   // H_K (k_ x k_, +-1) for Hadamard, R (D x D) for Haar
  float scale_ = 1.0f;         // 1/sqrt(D) for Hadamard
};

// Fast Walsh-Hadamard transform of n = 2^m contiguous floats (unnormalized butterflies,
// natural order, stage h = 1, 2, 4, ...: a+b, a-b).
void fwht(float* x, int n);

}  // namespace kvarn

#endif  // KVARN_CORE_ROTATION_HPP_
