// Paired-difference compare: planted differences are flagged, null ones are not; units from tile
// slabs and from the model loop's prompts; between two runs and between two methods of one run.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <random>

#include "cli_test_util.hpp"
#include "kvarn/data/error.hpp"
#include "kvarn/sweeps/compare_paired.hpp"
#include "sweep_test_util.hpp"

namespace kvarn {
namespace {

using nlohmann::json;
using testing_util::TempDirTest;
using testing_util::write_file;
namespace fs = std::filesystem;
using UnitMap = std::map<std::string, double>;

constexpr int kUnits = 16;

std::string unit_name(int i) {
  return "s0/l" + std::to_string(i / 2) + "/h" + std::to_string(i % 2);
}

// 16 units sharing a large unit effect (s.d. 5), each side with its own small noise (s.d. 0.05),
// side b shifted by `shift`: the marginal spread hides a shift the pairing exposes.
std::pair<UnitMap, UnitMap> planted(double shift, std::uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<double> unit(10.0, 5.0), noise(0.0, 0.05);
  UnitMap a, b;
  for (int i = 0; i < kUnits; ++i) {
    const double u = unit(g);
    a[unit_name(i)] = u + noise(g);
    b[unit_name(i)] = u + shift + noise(g);
  }
  return {a, b};
}

TEST(PairedRow, PlantedDifferenceFlaggedNullNot) {
  BootstrapOptions o;
  int planted_hits = 0, null_hits = 0;
  const int trials = 100;
  for (int t = 0; t < trials; ++t) {
    o.seed = static_cast<std::uint64_t>(t);
    const auto [a1, b1] = planted(0.2, 1000u + t);
    const PairedRow p = paired_row(a1, b1, o);
    ASSERT_TRUE(p.test.has_value());
    EXPECT_EQ(p.units, kUnits);
    planted_hits += p.flagged;
    if (p.flagged) {
      EXPECT_LT(p.test->difference.hi, 0.0);  // a - b = -0.2
    }
    // The marginal ranges overlap: the unit effect (s.d. 5) dwarfs the shift.
    const auto [a0, b0] = planted(0.0, 5000u + t);
    null_hits += paired_row(a0, b0, o).flagged;
  }
  EXPECT_EQ(planted_hits, trials);
  EXPECT_LE(null_hits, trials * 12 / 100);
}

TEST(PairedRow, ExactNullAndTooFewUnits) {
  // Differences +-0.1 in equal numbers: mean 0, the CI straddles it.
  UnitMap a, b;
  for (int i = 0; i < kUnits; ++i) {
    a[unit_name(i)] = 3.0 + i;
    b[unit_name(i)] = 3.0 + i + (i % 2 ? 0.1 : -0.1);
  }
  const PairedRow p = paired_row(a, b, {});
  ASSERT_TRUE(p.test.has_value());
  EXPECT_NEAR(p.test->difference.estimate, 0.0, 1e-12);
  EXPECT_LT(p.test->difference.lo, 0.0);
  EXPECT_GT(p.test->difference.hi, 0.0);
  EXPECT_FALSE(p.flagged);
  // Only units both sides hold are paired; one shared unit is untested, never flagged.
  const PairedRow one = paired_row({{"u1", 1.0}, {"u2", 2.0}}, {{"u2", 9.0}, {"u3", 9.0}}, {});
  EXPECT_EQ(one.units, 1);
  EXPECT_FALSE(one.test.has_value());
  EXPECT_FALSE(one.flagged);
  EXPECT_DOUBLE_EQ(one.mean_a - one.mean_b, -7.0);
}

class PairedRunTest : public TempDirTest {
 protected:
  // A run directory holding one case per (spec, units): tile units under data "tiles" for
  // `metric`, and the same values as per-prompt summaries of model "model".
  fs::path write_run(const std::string& name,
                     const std::vector<std::pair<std::string, UnitMap>>& methods,
                     const std::string& metric) {
    const fs::path run = dir_ / name;
    json cases = json::array();
    for (std::size_t i = 0; i < methods.size(); ++i) {
      const std::string id = "c" + std::to_string(i);
      const auto& [spec, units] = methods[i];
      cases.push_back({{"id", id}, {"spec", spec}});
      json u = json::object(), prompts = json::array();
      for (const auto& [unit, v] : units) {
        u[unit] = v;
        prompts.push_back({{"prompt_id", "p-" + unit}, {"summary", {{"decode.kl.mean", v}}}});
      }
      json rec = {{"case_id", id},
                  {"spec", spec},
                  {"name", "name-" + spec},
                  {"units", {{"tiles", {{metric, u}}}}},
                  {"accumulation",
                   {{"models", json::array({{{"model", "model"}, {"prompts", prompts}}})}}}};
      write_file(run / "cases" / (id + ".json"), rec.dump());
    }
    write_file(run / "resolved.json", json{{"cases", cases}}.dump());
    return run;
  }
};

TEST_F(PairedRunTest, BetweenRunsFlagsOnlyWhenTheCiExcludesZero) {
  const auto [base_kl, worse_kl] = planted(0.2, 7);  // the new run's KL is 0.2 higher
  const auto [base_snr, better_snr] = planted(0.2, 8);
  const auto [base_null, same_null] = planted(0.0, 9);
  const fs::path a =
      write_run("base", {{"kvarn:k=4", base_kl}, {"kivi:bits=2", base_null}}, "attention.kl.mean");
  const fs::path b =
      write_run("new", {{"kvarn:k=4", worse_kl}, {"kivi:bits=2", same_null}}, "attention.kl.mean");
  const PairedResult r = compare_paired_runs(load_run_units(a), load_run_units(b), {});
  ASSERT_EQ(r.rows.size(), 4u);  // 2 specs x (tiles KL, model decode KL)
  for (const PairedRow& row : r.rows) {
    EXPECT_EQ(row.units, kUnits);
    if (row.spec_a == "kvarn:k=4") {
      EXPECT_TRUE(row.flagged) << row.data << " " << row.metric;
      EXPECT_TRUE(row.regressed) << row.metric;  // an error metric grew
      EXPECT_GT(row.test->difference.lo, 0.0);
    } else {
      EXPECT_FALSE(row.flagged) << row.data << " " << row.metric;
    }
  }
  EXPECT_TRUE(r.regressed());
  EXPECT_EQ(r.flagged(), 2u);
  // A higher-is-better metric that grew is flagged but is no regression.
  const fs::path c = write_run("snr_base", {{"kvarn:k=4", base_snr}}, "key.end_to_end.snr_db");
  const fs::path d = write_run("snr_new", {{"kvarn:k=4", better_snr}}, "key.end_to_end.snr_db");
  PairedOptions only_snr;
  only_snr.metrics = {"key."};
  const PairedResult s = compare_paired_runs(load_run_units(c), load_run_units(d), only_snr);
  ASSERT_EQ(s.rows.size(), 1u);
  EXPECT_TRUE(s.rows[0].flagged);
  EXPECT_FALSE(s.regressed());
  EXPECT_EQ(s.to_json()["rows"][0]["difference"]["significant"], true);
  EXPECT_NE(format_paired_table(r).find("REGRESSED"), std::string::npos);
}

TEST_F(PairedRunTest, TwoMethodsOfOneRun) {
  const auto [kvarn, kivi] = planted(0.2, 11);
  const auto [kvarn2, rtn] = planted(0.0, 12);
  UnitMap rtn_same = kvarn;  // rtn_same - kvarn: planted null on kvarn's own units
  for (auto& [u, v] : rtn_same) v += rtn.at(u) - kvarn2.at(u);
  const fs::path run = write_run(
      "one", {{"kvarn:k=4", kvarn}, {"kivi:bits=2", kivi}, {"kvarn:k=4,rotation=none", rtn_same}},
      "attention.headline.kl.mean");
  const RunUnits units = load_run_units(run);
  const PairedResult d = compare_paired_methods(units, "name-kvarn:k=4", "kivi:bits=2", {});
  ASSERT_EQ(d.rows.size(), 2u);
  for (const PairedRow& row : d.rows) {
    EXPECT_TRUE(row.flagged) << row.metric;
    EXPECT_FALSE(row.regressed);  // within one run nothing is a regression
    EXPECT_NEAR(row.test->difference.estimate, row.mean_a - row.mean_b, 1e-12);
    EXPECT_LT(row.test->difference.hi, 0.0);
  }
  const PairedResult n = compare_paired_methods(units, "kvarn:k=4", "kvarn:k=4,rotation=none", {});
  ASSERT_EQ(n.rows.size(), 2u);
  for (const PairedRow& row : n.rows) EXPECT_FALSE(row.flagged) << row.metric;
  EXPECT_FALSE(d.to_json()["rows"][0].contains("regressed"));
  EXPECT_THROW(compare_paired_methods(units, "kvarn_k4v2_g128", "kivi:bits=2", {}), Error);
  EXPECT_THROW(load_run_units(dir_ / "nope"), Error);
}

TEST_F(PairedRunTest, CliExitStatus) {
  using testing_util::run_cli;
  const auto [base_kl, worse_kl] = planted(0.2, 21);
  const fs::path a =
      write_run("base", {{"kvarn:k=4", base_kl}, {"kivi:bits=2", worse_kl}}, "attention.kl.mean");
  const fs::path b = write_run("new", {{"kvarn:k=4", worse_kl}}, "attention.kl.mean");
  testing_util::CliOptions o;
  o.out = (dir_ / "out.txt").string();
  // Between runs: the planted rise is a regression (exit 1); within one run a report (exit 0).
  EXPECT_EQ(run_cli({"compare", a.string(), b.string(), "--paired"}, o), 1);
  EXPECT_NE(testing_util::slurp_file(dir_ / "out.txt").find("REGRESSED"), std::string::npos);
  EXPECT_EQ(run_cli({"compare", a.string(), "--paired", "--methods", "kvarn:k=4", "kivi:bits=2",
                     "--metric", "attention.", "--json"},
                    o),
            0);
  const json j = json::parse(testing_util::slurp_file(dir_ / "out.txt"));
  ASSERT_EQ(j["rows"].size(), 1u);
  EXPECT_EQ(j["rows"][0]["flagged"], true);
  EXPECT_EQ(j["bootstrap"]["seed"], 0);
  // Usage errors: --methods with two runs, two runs missing, --methods without --paired.
  EXPECT_EQ(run_cli({"compare", a.string(), b.string(), "--paired", "--methods", "x", "y"}, o), 2);
  EXPECT_EQ(run_cli({"compare", a.string(), "--paired"}, o), 2);
  EXPECT_EQ(run_cli({"compare", a.string(), "--methods", "x", "y"}, o), 2);
}

}  // namespace
}  // namespace kvarn
