// Regression compare: tolerance syntax, family matching, direction, missing rows.
#include <gtest/gtest.h>

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

TEST(Tolerance, Directions) {
  EXPECT_EQ(metric_direction("key.end_to_end.nmse"), Direction::kLowerIsBetter);
  EXPECT_EQ(metric_direction("attention.kl.mean"), Direction::kLowerIsBetter);
  EXPECT_EQ(metric_direction("key.end_to_end.snr_db"), Direction::kHigherIsBetter);
  EXPECT_EQ(metric_direction("key.end_to_end.cos_mean"), Direction::kHigherIsBetter);
  EXPECT_EQ(metric_direction("attention.topk_overlap.8"), Direction::kHigherIsBetter);
  EXPECT_EQ(metric_direction("key.stage.imbalance_raw"), Direction::kNeutral);
}

class CompareTest : public TempDirTest {};

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
