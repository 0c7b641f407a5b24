// Regression compare: tolerance syntax, family matching, direction, missing rows.
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>

#include "kvarn/data/error.hpp"
#include "kvarn/sweeps/compare.hpp"
#include "sweep_test_util.hpp"

namespace kvarn {
namespace {

using nlohmann::json;
using testing_util::TempDirTest;
namespace fs = std::filesystem;
using testing_util::write_file;

std::string row(const std::string& metric, const json& value, const std::string& spec = "fp8") {
  return json{{"case_id", "c0"},  {"method", spec},        {"spec", spec},     {"family", "f"},
              {"data", "sample"}, {"bits_per_element", 8}, {"metric", metric}, {"scope", "key"},
              {"layer", "all"},   {"head", "all"},         {"value", value}}
             .dump() +
         "\n";
}

TEST(Tolerance, ParsesFamiliesAndMatchesByComponentPrefix) {
  const ToleranceSpec t =
      parse_tolerance("default:rel=1e-6,abs=1e-9;nmse:rel=0.01;kl:rel=0.05,abs=1e-6");
  EXPECT_DOUBLE_EQ(t.fallback.rel, 1e-6);
  EXPECT_DOUBLE_EQ(t.lookup("key.end_to_end.nmse").rel, 0.01);
  EXPECT_DOUBLE_EQ(t.lookup("key.end_to_end.nmse").abs, 1e-9);  // inherited from default
  EXPECT_DOUBLE_EQ(t.lookup("attention.kl.mean").rel, 0.05);
  EXPECT_DOUBLE_EQ(t.lookup("attention.js.mean").rel, 1e-6);
  const ToleranceSpec longest = parse_tolerance("key:rel=0.5;key.stage:rel=0.25");
  EXPECT_DOUBLE_EQ(longest.lookup("key.stage.rotation.nmse").rel, 0.25);
  EXPECT_THROW(parse_tolerance("nmse:rel=x"), Error);
  EXPECT_THROW(parse_tolerance("nmse:speed=1"), Error);
  EXPECT_THROW(parse_tolerance("nmse"), Error);
}

// A row carrying a bootstrap CI (summary columns ci_lo, ci_hi, ci_units).
std::string ci_row(const std::string& metric, double value, double lo, double hi) {
  json j = json::parse(row(metric, value));
  j["ci_lo"] = lo;
  j["ci_hi"] = hi;
  j["ci_units"] = 16;
  return j.dump() + "\n";
}

TEST(Tolerance, CiEntryParses) {
  EXPECT_FALSE(parse_tolerance("default:rel=1e-6").use_ci);
  const ToleranceSpec t = parse_tolerance("ci;kl:rel=0.05");
  EXPECT_TRUE(t.use_ci);
  EXPECT_DOUBLE_EQ(t.lookup("attention.kl.mean").rel, 0.05);
  EXPECT_TRUE(parse_tolerance("ci").use_ci);
  EXPECT_DOUBLE_EQ(parse_tolerance("ci").fallback.rel, 1e-6);
}

TEST(Tolerance, Directions) {
  EXPECT_EQ(metric_direction("key.end_to_end.nmse"), Direction::kLowerIsBetter);
  EXPECT_EQ(metric_direction("attention.kl.mean"), Direction::kLowerIsBetter);
  EXPECT_EQ(metric_direction("key.end_to_end.snr_db"), Direction::kHigherIsBetter);
  EXPECT_EQ(metric_direction("key.end_to_end.cos_mean"), Direction::kHigherIsBetter);
  EXPECT_EQ(metric_direction("attention.topk_overlap.8"), Direction::kHigherIsBetter);
  EXPECT_EQ(metric_direction("key.stage.imbalance_raw"), Direction::kNeutral);
}

class CompareTest : public TempDirTest {};

TEST_F(CompareTest, CiToleranceFlagsOnlyValuesOutsideTheBaseInterval) {
  // Base KL 0.10 with CI [0.08, 0.12]: 0.115 is inside (noise), 0.13 is outside (regression),
  // 0.07 outside on the good side (improvement); a row without a CI keeps the numeric rule.
  write_file(dir_ / "a" / "summary.jsonl",
             ci_row("attention.kl.mean", 0.10, 0.08, 0.12) +
                 ci_row("attention.headline.kl.mean", 0.10, 0.08, 0.12) +
                 ci_row("attention.js.mean", 0.10, 0.08, 0.12) + row("attention.kl.max", 1.0) +
                 ci_row("key.end_to_end.nmse", 0.0, 0.0, 0.0));
  write_file(dir_ / "b" / "summary.jsonl",
             ci_row("attention.kl.mean", 0.115, 0.09, 0.14) +
                 ci_row("attention.headline.kl.mean", 0.13, 0.11, 0.15) +
                 ci_row("attention.js.mean", 0.07, 0.05, 0.09) + row("attention.kl.max", 1.001) +
                 ci_row("key.end_to_end.nmse", 1e-12, 0.0, 0.0));
  const CompareResult ci = compare_runs(dir_ / "a", dir_ / "b", parse_tolerance("ci"));
  EXPECT_EQ(ci.within_ci, 1u);         // kl.mean
  EXPECT_EQ(ci.within_tolerance, 1u);  // nmse: degenerate CI, change within abs=1e-9
  std::map<std::string, bool> regressed;
  for (const CompareRow& c : ci.changed) regressed[c.metric] = c.regressed;
  ASSERT_EQ(regressed.size(), 3u);
  EXPECT_TRUE(regressed.at("attention.headline.kl.mean"));
  EXPECT_FALSE(regressed.at("attention.js.mean"));
  EXPECT_TRUE(regressed.at("attention.kl.max"));  // no CI: 0.1 % beyond rel=1e-6
  EXPECT_TRUE(ci.regressed());
  EXPECT_EQ(ci.to_json()["within_ci"], 1);
  // Without the ci entry the in-CI change is a regression too.
  const CompareResult plain = compare_runs(dir_ / "a", dir_ / "b", parse_tolerance(""));
  EXPECT_EQ(plain.within_ci, 0u);
  int plain_regressed = 0;
  for (const CompareRow& c : plain.changed) plain_regressed += c.regressed;
  EXPECT_EQ(plain_regressed, 3);
}

TEST_F(CompareTest, RegressionsImprovementsAndMissingRows) {
  write_file(dir_ / "a" / "summary.jsonl",
             row("key.end_to_end.nmse", 0.1) + row("key.end_to_end.snr_db", 10.0) +
                 row("attention.kl.mean", 0.01) + row("key.end_to_end.mse", 1.0) +
                 row("key.end_to_end.max_abs", "inf") + row("gone", 1.0));
  write_file(dir_ / "b" / "summary.jsonl",
             row("key.end_to_end.nmse", 0.1005) +      // +0.5%: within nmse rel=0.01
                 row("key.end_to_end.snr_db", 11.0) +  // better
                 row("attention.kl.mean", 0.02) +      // worse beyond 5%
                 row("key.end_to_end.mse", 1.0) + row("key.end_to_end.max_abs", "inf") +
                 row("fresh", 1.0));
  const CompareResult r =
      compare_runs(dir_ / "a", dir_ / "b", parse_tolerance("nmse:rel=0.01;kl:rel=0.05"));
  EXPECT_TRUE(r.regressed());
  EXPECT_EQ(r.matched, 5u);
  EXPECT_EQ(r.unchanged, 2u);
  EXPECT_EQ(r.within_tolerance, 1u);
  int regressed = 0, improved = 0, missing = 0, only_new = 0;
  for (const CompareRow& c : r.changed) {
    if (!c.in_new) ++missing;
    if (!c.in_base) ++only_new;
    if (c.in_new && c.in_base) (c.regressed ? regressed : improved)++;
  }
  EXPECT_EQ(regressed, 1);  // kl
  EXPECT_EQ(improved, 1);   // snr
  EXPECT_EQ(missing, 1);
  EXPECT_EQ(only_new, 1);
  EXPECT_NE(format_compare_table(r).find("REGRESSED"), std::string::npos);
  EXPECT_TRUE(r.to_json()["regressed"].get<bool>());
  // Identical runs: no regression.
  EXPECT_FALSE(
      compare_runs(dir_ / "a", dir_ / "a", parse_tolerance(kDefaultTolerance)).regressed());
}

TEST_F(CompareTest, SmallerSnrIsARegression) {
  write_file(dir_ / "a.jsonl", row("value.end_to_end.snr_db", 10.0));
  write_file(dir_ / "b.jsonl", row("value.end_to_end.snr_db", 9.0));
  EXPECT_TRUE(compare_runs(dir_ / "a.jsonl", dir_ / "b.jsonl", parse_tolerance("")).regressed());
  EXPECT_FALSE(compare_runs(dir_ / "b.jsonl", dir_ / "a.jsonl", parse_tolerance("")).regressed());
}

}  // namespace
}  // namespace kvarn
