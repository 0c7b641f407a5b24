#include "kvarn/core/lloyd_max.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "kvarn/data/error.hpp"

namespace kvarn {
namespace {

constexpr double kPi = 3.14159265358979323846;  // == Python math.pi

std::vector<double> midpoints(const std::vector<double>& c) {
  std::vector<double> m(c.size() - 1);
  for (std::size_t i = 0; i + 1 < c.size(); ++i) m[i] = (c[i] + c[i + 1]) / 2.0;
  return m;
}

void check_bits(int bits) {
  KVARN_CHECK(bits >= 1 && bits <= 8, "Lloyd-Max: bits must be 1..8, got ", bits);
}

// Composite Simpson on [a, b] with n (even) panels.
template <typename F>
double simpson(F f, double a, double b, int n) {
  const double h = (b - a) / n;
  double s = f(a) + f(b);
  for (int i = 1; i < n; ++i) s += f(a + i * h) * (i % 2 ? 4.0 : 2.0);
  return s * h / 3.0;
}

constexpr int kSpherePanels = 1000;  // per cell; the cells are smooth, this is ~1e-14 accurate

double sphere_log_pdf(int dim, double x) {
  const double t = 1.0 - x * x;
  if (t <= 0) return -INFINITY;
  return 0.5 * (dim - 3) * std::log(t);  // unnormalized; constants cancel in every ratio
}

}  // namespace

LloydMaxResult lloyd_max_vllm_gaussian(int dim, int bits) {
  check_bits(bits);
  KVARN_CHECK(dim >= 1, "Lloyd-Max: dim must be >= 1, got ", dim);
  const int levels = 1 << bits;
  const double sigma2 = 1.0 / dim;
  const double sigma = std::sqrt(sigma2);
  const double norm = 1.0 / std::sqrt(2 * kPi * sigma2);
  auto pdf = [&](double x) { return norm * std::exp(-x * x / (2 * sigma2)); };
  // The same operation order as the Python trapezoid rule (n = 200).
  auto trapz = [](auto f, double a, double b) {
    constexpr int kN = 200;
    const double h = (b - a) / kN;
    double r = 0.5 * (f(a) + f(b));
    for (int i = 1; i < kN; ++i) r += f(a + i * h);
    return r * h;
  };
  const double lo = -3.5 * sigma, hi = 3.5 * sigma;
  std::vector<double> c(levels);
  for (int i = 0; i < levels; ++i) c[i] = lo + (hi - lo) * (i + 0.5) / levels;
  LloydMaxResult r;
  for (int it = 0; it < 200; ++it) {
    r.iterations = it + 1;
    std::vector<double> edges{lo * 3};
    for (double m : midpoints(c)) edges.push_back(m);
    edges.push_back(hi * 3);
    std::vector<double> next(levels);
    double delta = 0;
    for (int i = 0; i < levels; ++i) {
      const double a = edges[i], b = edges[i + 1];
      const double num = trapz([&](double x) { return x * pdf(x); }, a, b);
      const double den = trapz(pdf, a, b);
      next[i] = den > 1e-15 ? num / den : c[i];
      delta = std::max(delta, std::abs(next[i] - c[i]));
    }
    if (delta < 1e-10) break;  // vLLM keeps the previous iterate here
    c = next;
  }
  r.centroids = c;
  r.boundaries = midpoints(c);
  return r;
}

LloydMaxResult lloyd_max_gaussian(int bits, double sigma) {
  check_bits(bits);
  const int levels = 1 << bits;
  const double kInvSqrt2 = 0.70710678118654752440;
  auto phi = [](double z) {
    return std::isinf(z) ? 0.0 : std::exp(-0.5 * z * z) / std::sqrt(2 * kPi);
  };
  std::vector<double> c(levels);  // standardized; start from the uniform grid on +-3 sigma
  for (int i = 0; i < levels; ++i) c[i] = -3.0 + 6.0 * (i + 0.5) / levels;
  LloydMaxResult r;
  for (int it = 0; it < 100000; ++it) {
    r.iterations = it + 1;
    std::vector<double> m = midpoints(c);
    double delta = 0;
    for (int i = 0; i < levels; ++i) {
      const double a = i == 0 ? -INFINITY : m[i - 1];
      const double b = i == levels - 1 ? INFINITY : m[i];
      const double mass = 0.5 * (std::erf(b * kInvSqrt2) - std::erf(a * kInvSqrt2));
      const double next = (phi(a) - phi(b)) / mass;
      delta = std::max(delta, std::abs(next - c[i]));
      c[i] = next;
    }
    if (delta < 1e-15) break;
  }
  for (double& x : c) x *= sigma;
  r.centroids = c;
  r.boundaries = midpoints(c);
  return r;
}

double gaussian_quantizer_mse(const std::vector<double>& centroids, double sigma) {
  const double kInvSqrt2 = 0.70710678118654752440;
  auto phi = [](double z) {
    return std::isinf(z) ? 0.0 : std::exp(-0.5 * z * z) / std::sqrt(2 * kPi);
  };
  auto zphi = [&](double z) { return std::isinf(z) ? 0.0 : z * phi(z); };
  const std::vector<double> m = midpoints(centroids);
  const int n = static_cast<int>(centroids.size());
  double mse = 0;
  for (int i = 0; i < n; ++i) {
    const double a = i == 0 ? -INFINITY : m[i - 1] / sigma;
    const double b = i == n - 1 ? INFINITY : m[i] / sigma;
    const double c = centroids[i] / sigma;
    const double p0 = 0.5 * (std::erf(b * kInvSqrt2) - std::erf(a * kInvSqrt2));
    const double p1 = phi(a) - phi(b);
    const double p2 = p0 + zphi(a) - zphi(b);
    mse += p2 - 2 * c * p1 + c * c * p0;
  }
  return mse * sigma * sigma;
}

LloydMaxResult lloyd_max_sphere(int dim, int bits) {
  check_bits(bits);
  KVARN_CHECK(dim >= 3, "Lloyd-Max (sphere): dim must be >= 3, got ", dim);
  const int levels = 1 << bits;
  // Start from the Gaussian optimum with sigma = 1/sqrt(d), the large-d limit.
  std::vector<double> c =
      lloyd_max_gaussian(bits, 1.0 / std::sqrt(static_cast<double>(dim))).centroids;
  for (double& x : c) x = std::clamp(x, -0.999, 0.999);
  LloydMaxResult r;
  auto f = [dim](double x) { return std::exp(sphere_log_pdf(dim, x)); };
  for (int it = 0; it < 5000; ++it) {
    r.iterations = it + 1;
    std::vector<double> m = midpoints(c);
    double delta = 0;
    std::vector<double> next(levels);
    for (int i = 0; i < levels; ++i) {
      const double a = i == 0 ? -1.0 : m[i - 1];
      const double b = i == levels - 1 ? 1.0 : m[i];
      const double num = simpson([&](double x) { return x * f(x); }, a, b, kSpherePanels);
      const double den = simpson(f, a, b, kSpherePanels);
      next[i] = den > 0 ? num / den : c[i];
      delta = std::max(delta, std::abs(next[i] - c[i]));
    }
    c = next;
    if (delta < 1e-13) break;
  }
  r.centroids = c;
  r.boundaries = midpoints(c);
  return r;
}

double sphere_quantizer_mse(int dim, const std::vector<double>& centroids) {
  KVARN_CHECK(dim >= 3, "Lloyd-Max (sphere): dim must be >= 3, got ", dim);
  auto f = [dim](double x) { return std::exp(sphere_log_pdf(dim, x)); };
  const std::vector<double> m = midpoints(centroids);
  const int n = static_cast<int>(centroids.size());
  double err = 0, total = 0;
  for (int i = 0; i < n; ++i) {
    const double a = i == 0 ? -1.0 : m[i - 1];
    const double b = i == n - 1 ? 1.0 : m[i];
    const double c = centroids[i];
    err += simpson([&](double x) { return (x - c) * (x - c) * f(x); }, a, b, kSpherePanels);
    total += simpson(f, a, b, kSpherePanels);
  }
  return err / total;
}

ScalarCodebook to_codebook(const LloydMaxResult& r, int bits) {
  ScalarCodebook cb;
  cb.bits = bits;
  for (double c : r.centroids) cb.centroids.push_back(static_cast<float>(c));
  for (double m : r.boundaries) cb.midpoints.push_back(static_cast<float>(m));
  return cb;
}

namespace {
template <typename Solve>
const ScalarCodebook& cached(int dim, int bits, Solve solve) {
  static std::mutex mu;
  static std::map<std::pair<int, int>, std::unique_ptr<ScalarCodebook>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = cache[{dim, bits}];
  if (!slot) slot = std::make_unique<ScalarCodebook>(to_codebook(solve(dim, bits), bits));
  return *slot;
}
}  // namespace

// Each solver lambda instantiates its own cache.
const ScalarCodebook& vllm_turboquant_codebook(int dim, int bits) {
  return cached(dim, bits, [](int d, int b) { return lloyd_max_vllm_gaussian(d, b); });
}

const ScalarCodebook& sphere_codebook(int dim, int bits) {
  return cached(dim, bits, [](int d, int b) { return lloyd_max_sphere(d, b); });
}

}  // namespace kvarn
