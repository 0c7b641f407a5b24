// Bootstrap confidence intervals for metrics measured over several prompts or windows
// (docs/metrics.md, "Confidence intervals").
//
//  * bootstrap_mean_ci: percentile bootstrap of the mean. Resample b draws n indices with
//    replacement from its own generator, Rng(stream_seed(seed, b)), so the result depends on the
//    seed only, never on the thread count or on how resamples are split among threads. The CI is
//    [q(alpha/2), q(1 - alpha/2)] of the B resampled means, quantiles by linear interpolation
//    between order statistics (Hyndman-Fan type 7).
//  * paired_bootstrap: the same on the per-sample differences a_i - b_i of two methods measured
//    on the same prompts and positions (pairing removes the prompt-to-prompt variance both
//    share). "Significant" means the CI of the mean difference excludes 0.
//
// Every result records the seed, resamples and level it was made with.
#ifndef KVARN_EVAL_BOOTSTRAP_HPP_
#define KVARN_EVAL_BOOTSTRAP_HPP_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>

namespace kvarn {

struct BootstrapOptions {
  int resamples = 2000;
  double level = 0.95;     // two-sided coverage, in (0, 1)
  std::uint64_t seed = 0;  // recorded in every result
  int threads = 1;         // resamples computed in parallel; results do not depend on it
};

struct BootstrapCi {
  double estimate = 0;  // the sample mean
  double lo = 0, hi = 0;
  int samples = 0;
  int resamples = 0;
  double level = 0;
  std::uint64_t seed = 0;
};

struct PairedComparison {
  BootstrapCi difference;    // of mean(a - b)
  bool significant = false;  // difference CI excludes 0
  // Two-sided bootstrap p-value: 2 * min(share of resampled means <= 0, share >= 0), capped at 1.
  double p_value = 1;
};

// Throws kvarn::Error when x has fewer than 2 samples, holds a NaN/Inf (naming its index), or
// the options are out of range.
BootstrapCi bootstrap_mean_ci(std::span<const double> x, const BootstrapOptions& options = {});

// Percentile bootstrap of a pooled ratio sum(num) / sum(den) over units (e.g. a metric's sum and
// row count per (sequence, layer, KV head) slab, or NMSE's error and reference energy): each
// resample draws n units with replacement (the same index streams as bootstrap_mean_ci) and takes
// the ratio of the drawn sums, so the interval brackets the pooled value a summary row reports.
// With every den equal it is bootstrap_mean_ci of num / den exactly. Resamples whose drawn den sums
// to 0 count as the pooled value. Throws kvarn::Error as bootstrap_mean_ci, and when the sizes
// differ, a den is negative or every den is 0.
BootstrapCi bootstrap_ratio_ci(std::span<const double> num, std::span<const double> den,
                               const BootstrapOptions& options = {});

// a and b: the same prompts/positions in the same order (equal sizes, >= 2, finite).
PairedComparison paired_bootstrap(std::span<const double> a, std::span<const double> b,
                                  const BootstrapOptions& options = {});

// The seed of resample b's generator (splitmix64 of seed and b).
std::uint64_t bootstrap_stream_seed(std::uint64_t seed, std::uint64_t resample);

nlohmann::json to_json(const BootstrapCi& ci);
nlohmann::json to_json(const PairedComparison& c);

}  // namespace kvarn

#endif  // KVARN_EVAL_BOOTSTRAP_HPP_
