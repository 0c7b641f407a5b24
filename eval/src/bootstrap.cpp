#include "kvarn/eval/bootstrap.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "kvarn/core/rng.hpp"
#include "kvarn/data/error.hpp"

namespace kvarn {

namespace {

void check_options(const BootstrapOptions& o) {
  KVARN_CHECK(o.resamples >= 10 && o.resamples <= 10'000'000,
              "bootstrap: resamples must be in [10, 10000000], got ", o.resamples);
  KVARN_CHECK(o.level > 0 && o.level < 1, "bootstrap: level must be in (0, 1), got ", o.level);
  KVARN_CHECK(o.threads >= 1 && o.threads <= 1024, "bootstrap: threads must be in [1, 1024], got ",
              o.threads);
}

void check_samples(std::span<const double> x, const char* what) {
  KVARN_CHECK(x.size() >= 2, "bootstrap: ", what, " needs at least 2 samples, got ", x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    KVARN_CHECK(std::isfinite(x[i]), "bootstrap: ", what, " sample ", i, " is ", x[i],
                " (not finite)");
  }
}

double mean(std::span<const double> x) {
  double s = 0;
  for (double v : x) s += v;
  return s / static_cast<double>(x.size());
}

// Ratios sum(num[j]) / sum(den[j]) over `resamples` resamples j of n units (den empty: every
// den is 1, i.e. the resampled mean); resample b uses its own generator, so any split of the range
// among threads gives the same vector. `fallback`: the value of a resample whose den sums to 0.
std::vector<double> resampled_ratios(std::span<const double> num, std::span<const double> den,
                                     double fallback, const BootstrapOptions& o) {
  const std::size_t n = num.size();
  std::vector<double> out(static_cast<std::size_t>(o.resamples));
  auto run = [&](std::size_t first, std::size_t last) {
    for (std::size_t b = first; b < last; ++b) {
      Rng rng(bootstrap_stream_seed(o.seed, b));
      double s = 0, w = 0;
      for (std::size_t i = 0; i < n; ++i) {
        const auto j = std::min(n - 1, static_cast<std::size_t>(rng.uniform() * n));
        s += num[j];
        w += den.empty() ? 1.0 : den[j];
      }
      out[b] = w > 0 ? s / w : fallback;
    }
  };
  const std::size_t threads = std::min<std::size_t>(o.threads, out.size());
  if (threads <= 1) {
    run(0, out.size());
    return out;
  }
  std::vector<std::thread> pool;
  const std::size_t per = (out.size() + threads - 1) / threads;
  for (std::size_t t = 0; t < threads; ++t) {
    const std::size_t first = t * per, last = std::min(out.size(), first + per);
    if (first < last) pool.emplace_back(run, first, last);
  }
  for (auto& th : pool) th.join();
  return out;
}

// Type-7 quantile of sorted values.
double quantile(const std::vector<double>& sorted, double p) {
  const double h = (static_cast<double>(sorted.size()) - 1) * p;
  const auto lo = static_cast<std::size_t>(std::floor(h));
  const std::size_t hi = std::min(sorted.size() - 1, lo + 1);
  return sorted[lo] + (h - static_cast<double>(lo)) * (sorted[hi] - sorted[lo]);
}

std::vector<double> resampled_means(std::span<const double> x, const BootstrapOptions& o) {
  return resampled_ratios(x, {}, 0.0, o);
}

BootstrapCi ci_of(double estimate, std::size_t samples, std::vector<double>& means,
                  const BootstrapOptions& o) {
  std::sort(means.begin(), means.end());
  const double alpha = 1 - o.level;
  BootstrapCi ci;
  ci.estimate = estimate;
  ci.lo = quantile(means, alpha / 2);
  ci.hi = quantile(means, 1 - alpha / 2);
  ci.samples = static_cast<int>(samples);
  ci.resamples = o.resamples;
  ci.level = o.level;
  ci.seed = o.seed;
  return ci;
}

}  // namespace

std::uint64_t bootstrap_stream_seed(std::uint64_t seed, std::uint64_t resample) {
  std::uint64_t z = seed ^ (resample * 0x9e3779b97f4a7c15ULL + 0x632be59bd9b4e019ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

BootstrapCi bootstrap_mean_ci(std::span<const double> x, const BootstrapOptions& o) {
  check_options(o);
  check_samples(x, "mean CI");
  std::vector<double> means = resampled_means(x, o);
  return ci_of(mean(x), x.size(), means, o);
}

BootstrapCi bootstrap_ratio_ci(std::span<const double> num, std::span<const double> den,
                               const BootstrapOptions& o) {
  check_options(o);
  KVARN_CHECK(num.size() == den.size(), "bootstrap: ratio CI has ", num.size(), " numerators but ",
              den.size(), " denominators");
  check_samples(num, "ratio CI (numerator)");
  check_samples(den, "ratio CI (denominator)");
  double s = 0, w = 0;
  for (std::size_t i = 0; i < num.size(); ++i) {
    KVARN_CHECK(den[i] >= 0, "bootstrap: ratio CI denominator ", i, " is negative (", den[i], ")");
    s += num[i];
    w += den[i];
  }
  KVARN_CHECK(w > 0, "bootstrap: ratio CI: every denominator is 0");
  std::vector<double> ratios = resampled_ratios(num, den, s / w, o);
  return ci_of(s / w, num.size(), ratios, o);
}

PairedComparison paired_bootstrap(std::span<const double> a, std::span<const double> b,
                                  const BootstrapOptions& o) {
  check_options(o);
  KVARN_CHECK(a.size() == b.size(), "paired bootstrap: the two methods have ", a.size(), " and ",
              b.size(), " samples (pairs need the same prompts and positions)");
  check_samples(a, "paired comparison (first method)");
  check_samples(b, "paired comparison (second method)");
  std::vector<double> diff(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) diff[i] = a[i] - b[i];
  std::vector<double> means = resampled_means(diff, o);
  std::size_t le = 0, ge = 0;
  for (double m : means) {
    le += m <= 0;
    ge += m >= 0;
  }
  PairedComparison c;
  c.difference = ci_of(mean(diff), diff.size(), means, o);
  c.significant = c.difference.lo > 0 || c.difference.hi < 0;
  const double share = static_cast<double>(std::min(le, ge)) / static_cast<double>(means.size());
  c.p_value = std::min(1.0, 2 * share);
  return c;
}

nlohmann::json to_json(const BootstrapCi& ci) {
  return {{"estimate", ci.estimate},
          {"lo", ci.lo},
          {"hi", ci.hi},
          {"samples", ci.samples},
          {"resamples", ci.resamples},
          {"level", ci.level},
          {"seed", ci.seed},
          {"method", "percentile bootstrap of the mean"}};
}

nlohmann::json to_json(const PairedComparison& c) {
  nlohmann::json j = to_json(c.difference);
  j["method"] = "paired percentile bootstrap of the mean difference";
  j["significant"] = c.significant;
  j["p_value"] = c.p_value;
  return j;
}

}  // namespace kvarn
