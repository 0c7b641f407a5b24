// Bootstrap CIs against closed forms: coverage of the mean of a known distribution over many
// seeds, width against the normal-theory interval, paired detection of a planted difference and
// no detection of a null one, determinism for a seed whatever the thread count.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kvarn/core/rng.hpp"
#include "kvarn/data/error.hpp"
#include "kvarn/eval/bootstrap.hpp"

namespace kvarn {
namespace {

std::vector<double> normal_sample(std::uint64_t seed, int n, double mu, double sigma) {
  Rng rng(seed);
  std::vector<double> x(n);
  for (double& v : x) v = mu + sigma * rng.normal();
  return x;
}

TEST(Bootstrap, CoverageOfAKnownMeanOverSeeds) {
  // x_i ~ N(3, 2^2), n = 40: the 95 % percentile CI should contain 3 in ~95 % of samples
  // (percentile intervals run slightly narrow at small n: ~93-94 % here). 400 samples, binomial
  // s.e. of the coverage ~1.1 %.
  BootstrapOptions o;
  o.resamples = 1000;
  int covered = 0;
  const int trials = 400;
  for (int s = 0; s < trials; ++s) {
    const std::vector<double> x = normal_sample(1000 + s, 40, 3.0, 2.0);
    o.seed = static_cast<std::uint64_t>(s);
    const BootstrapCi ci = bootstrap_mean_ci(x, o);
    covered += ci.lo <= 3.0 && 3.0 <= ci.hi;
  }
  const double coverage = static_cast<double>(covered) / trials;
  EXPECT_GE(coverage, 0.90);
  EXPECT_LE(coverage, 0.985);
}

TEST(Bootstrap, WidthMatchesNormalTheory) {
  // For n = 200 the bootstrap distribution of the mean is ~N(xbar, s^2 / n) with s the plug-in
  // standard deviation: half-width ~1.96 * s / sqrt(n), within 10 %.
  const std::vector<double> x = normal_sample(7, 200, -1.0, 0.5);
  double m = 0, ss = 0;
  for (double v : x) m += v;
  m /= x.size();
  for (double v : x) ss += (v - m) * (v - m);
  const double s = std::sqrt(ss / x.size());
  BootstrapOptions o;
  o.resamples = 20000;
  o.seed = 42;
  const BootstrapCi ci = bootstrap_mean_ci(x, o);
  EXPECT_DOUBLE_EQ(ci.estimate, m);
  EXPECT_NEAR((ci.hi - ci.lo) / 2, 1.959964 * s / std::sqrt(200.0),
              0.1 * 1.96 * s / std::sqrt(200.0));
  EXPECT_NEAR((ci.hi + ci.lo) / 2, m, 0.2 * s / std::sqrt(200.0));
  EXPECT_EQ(ci.seed, 42u);
  EXPECT_EQ(ci.resamples, 20000);
  EXPECT_EQ(ci.samples, 200);
  EXPECT_DOUBLE_EQ(ci.level, 0.95);
}

// a: 16 prompts with a large shared prompt effect; b = a + delta + small independent noise.
std::pair<std::vector<double>, std::vector<double>> paired(std::uint64_t seed, double delta) {
  Rng rng(seed);
  std::vector<double> a(16), b(16);
  for (int i = 0; i < 16; ++i) {
    const double prompt = 5.0 * rng.normal();  // shared by both methods
    a[i] = prompt + 0.1 * rng.normal();
    b[i] = prompt + delta + 0.1 * rng.normal();
  }
  return {a, b};
}

TEST(Bootstrap, PairedDetectsAPlantedDifferenceAndNotANullOne) {
  BootstrapOptions o;
  o.resamples = 1000;
  int planted_hits = 0, null_hits = 0;
  const int trials = 200;
  for (int s = 0; s < trials; ++s) {
    o.seed = static_cast<std::uint64_t>(s);
    auto [a, b] = paired(500 + s, 0.2);  // difference 0.2 hidden under prompt s.d. 5
    const PairedComparison c = paired_bootstrap(a, b, o);
    planted_hits += c.significant;
    EXPECT_LT(c.difference.estimate, 0.0) << s;  // a - b is about -0.2
    auto [a0, b0] = paired(9000 + s, 0.0);
    null_hits += paired_bootstrap(a0, b0, o).significant;
  }
  // Difference s.e. = 0.1 * sqrt(2) / 4 = 0.035: 0.2 is ~5.7 s.e., always detected.
  EXPECT_EQ(planted_hits, trials);
  // Under the null the CI excludes 0 in ~5 % (a bit more: percentile intervals at n = 16).
  EXPECT_LE(null_hits, trials * 12 / 100);
  // Unpaired, the same planted difference is invisible: the marginal CIs overlap.
  auto [a, b] = paired(77, 0.2);
  const BootstrapCi ca = bootstrap_mean_ci(a, o), cb = bootstrap_mean_ci(b, o);
  EXPECT_TRUE(ca.hi > cb.lo && cb.hi > ca.lo);
  const PairedComparison c = paired_bootstrap(a, b, o);
  EXPECT_TRUE(c.significant);
  EXPECT_LT(c.p_value, 0.01);
}

TEST(Bootstrap, DeterministicForASeedWhateverTheThreads) {
  const std::vector<double> x = normal_sample(3, 64, 0.0, 1.0);
  BootstrapOptions o;
  o.resamples = 3001;
  o.seed = 9;
  const BootstrapCi one = bootstrap_mean_ci(x, o);
  for (int t : {2, 3, 8}) {
    o.threads = t;
    const BootstrapCi many = bootstrap_mean_ci(x, o);
    EXPECT_EQ(many.lo, one.lo) << t;  // bit-identical
    EXPECT_EQ(many.hi, one.hi) << t;
  }
  o.threads = 1;
  o.seed = 10;
  const BootstrapCi other = bootstrap_mean_ci(x, o);
  EXPECT_TRUE(other.lo != one.lo || other.hi != one.hi);
}

TEST(Bootstrap, RatioWithUnitWeightsIsTheMeanCi) {
  const std::vector<double> x = normal_sample(11, 24, 1.5, 0.7), ones(24, 1.0);
  BootstrapOptions o;
  o.resamples = 2000;
  o.seed = 5;
  const BootstrapCi mean = bootstrap_mean_ci(x, o), ratio = bootstrap_ratio_ci(x, ones, o);
  EXPECT_EQ(ratio.estimate, mean.estimate);
  EXPECT_EQ(ratio.lo, mean.lo);  // same index streams: bit-identical
  EXPECT_EQ(ratio.hi, mean.hi);
  EXPECT_EQ(ratio.samples, 24);
}

TEST(Bootstrap, RatioCoversThePooledMeanOfUnequalUnits) {
  // 16 units of 8..71 rows, each row ~ N(2, 1) plus a unit effect ~ N(0, 0.5^2): the pooled mean
  // sum(num) / sum(den) estimates 2; its 95 % interval should cover 2 in ~95 % of 300 trials
  // (binomial s.e. ~1.3 %; percentile intervals at 16 units run a little narrow).
  BootstrapOptions o;
  o.resamples = 1000;
  int covered = 0;
  const int trials = 300;
  for (int s = 0; s < trials; ++s) {
    Rng rng(40000 + s);
    std::vector<double> num(16), den(16);
    for (int u = 0; u < 16; ++u) {
      const int rows = 8 + static_cast<int>(rng.uniform() * 64);
      const double unit = 0.5 * rng.normal();
      for (int r = 0; r < rows; ++r) num[u] += 2.0 + unit + rng.normal();
      den[u] = rows;
    }
    o.seed = static_cast<std::uint64_t>(s);
    const BootstrapCi ci = bootstrap_ratio_ci(num, den, o);
    double sn = 0, sd = 0;
    for (int u = 0; u < 16; ++u) sn += num[u], sd += den[u];
    EXPECT_DOUBLE_EQ(ci.estimate, sn / sd);
    EXPECT_LE(ci.lo, ci.estimate);
    EXPECT_GE(ci.hi, ci.estimate);
    covered += ci.lo <= 2.0 && 2.0 <= ci.hi;
  }
  const double coverage = static_cast<double>(covered) / trials;
  EXPECT_GE(coverage, 0.88);
  EXPECT_LE(coverage, 0.985);
  const std::vector<double> n2 = {1, 2}, zero = {0, 0}, neg = {1, -1}, n3 = {1, 2, 3};
  EXPECT_THROW(bootstrap_ratio_ci(n2, zero), Error);
  EXPECT_THROW(bootstrap_ratio_ci(n2, neg), Error);
  EXPECT_THROW(bootstrap_ratio_ci(n3, n2), Error);
}

TEST(Bootstrap, BadInputIsAnError) {
  const std::vector<double> one = {1.0}, bad = {1.0, std::nan(""), 2.0};
  EXPECT_THROW(bootstrap_mean_ci(one), Error);
  try {
    bootstrap_mean_ci(bad);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sample 1"), std::string::npos) << e.what();
  }
  const std::vector<double> a = {1, 2, 3}, b = {1, 2};
  EXPECT_THROW(paired_bootstrap(a, b), Error);
  BootstrapOptions o;
  o.level = 1.0;
  EXPECT_THROW(bootstrap_mean_ci(a, o), Error);
  // A constant sample has a zero-width interval, not a NaN.
  const std::vector<double> c = {2.5, 2.5, 2.5};
  const BootstrapCi ci = bootstrap_mean_ci(c);
  EXPECT_EQ(ci.lo, 2.5);
  EXPECT_EQ(ci.hi, 2.5);
  EXPECT_EQ(to_json(ci)["seed"], 0);
}

}  // namespace
}  // namespace kvarn
