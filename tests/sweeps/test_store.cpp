// Result store: tidy summaries (JSONL, CSV quoting), case validation, temporaries, the run lock.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "kvarn/data/error.hpp"
#include "kvarn/sweeps/store.hpp"
#include "sweep_test_util.hpp"

namespace kvarn {
namespace {

using nlohmann::json;
using testing_util::slurp_file;
using testing_util::TempDirTest;
namespace fs = std::filesystem;
using testing_util::write_file;

json record(const std::string& id, const std::string& spec) {
  json row = {{"case_id", id},          {"method", "m"},
              {"spec", spec},           {"family", "kvarn"},
              {"data", "sample"},       {"bits_per_element", 3.375},
              {"effective_bits", 5.25}, {"metric", "key.end_to_end.nmse"},
              {"scope", "key"},         {"layer", "all"},
              {"head", "all"},          {"value", 0.25}};
  return {{"format", kCaseFormat},
          {"format_version", kCaseFormatVersion},
          {"case_id", id},
          {"spec", spec},
          {"rows", json::array({row})}};
}

class StoreTest : public TempDirTest {};

TEST_F(StoreTest, SummaryColumnsOrderAndCsvQuoting) {
  const std::vector<json> recs = {record("c000-aa", "kvarn:k=4,v=2,g=128")};
  const std::string jl = summary_jsonl(recs);
  EXPECT_EQ(jl,
            "{\"case_id\":\"c000-aa\",\"method\":\"m\",\"spec\":\"kvarn:k=4,v=2,g=128\","
            "\"family\":\"kvarn\",\"data\":\"sample\",\"bits_per_element\":3.375,"
            "\"effective_bits\":5.25,\"metric\":\"key.end_to_end.nmse\",\"scope\":\"key\","
            "\"layer\":\"all\",\"head\":\"all\",\"value\":0.25,\"ci_lo\":null,\"ci_hi\":null,"
            "\"ci_units\":null}\n");
  EXPECT_EQ(
      summary_csv(recs),
      "case_id,method,spec,family,data,bits_per_element,effective_bits,metric,scope,layer,head,"
      "value,ci_lo,ci_hi,ci_units\n"
      "c000-aa,m,\"kvarn:k=4,v=2,g=128\",kvarn,sample,3.375,5.25,key.end_to_end.nmse,key,all,"
      "all,0.25,null,null,null\n");
}

// A row with a bootstrap CI fills the three CI columns.
TEST_F(StoreTest, RowWithCiFillsTheCiColumns) {
  json rec = record("c000-aa", "fp8");
  rec["rows"][0]["ci_lo"] = 0.125;
  rec["rows"][0]["ci_hi"] = 0.5;
  rec["rows"][0]["ci_units"] = 16;
  EXPECT_NE(
      summary_jsonl({rec}).find("\"value\":0.25,\"ci_lo\":0.125,\"ci_hi\":0.5,\"ci_units\":16}"),
      std::string::npos);
  EXPECT_NE(summary_csv({rec}).find(",all,0.25,0.125,0.5,16\n"), std::string::npos);
}

// A record written before rows carried effective bits still summarizes, with the cell null.
TEST_F(StoreTest, RowWithoutEffectiveBitsGivesNull) {
  json rec = record("c000-aa", "fp8");
  rec["rows"][0].erase("effective_bits");
  EXPECT_NE(summary_jsonl({rec}).find("\"bits_per_element\":3.375,\"effective_bits\":null,"),
            std::string::npos);
  EXPECT_NE(summary_csv({rec}).find(",sample,3.375,null,key.end_to_end.nmse,"), std::string::npos);
}

TEST_F(StoreTest, CaseDoneValidatesAndSummariesFollowCaseOrder) {
  const RunStore store(dir_ / "run");
  const json resolved = {{"cases", json::array({{{"id", "c000-aa"}, {"spec", "fp16"}},
                                                {{"id", "c001-bb"}, {"spec", "fp8"}}})},
                         {"metrics", {{"arrays", false}}}};
  store.init(resolved, "version: 1\n");
  EXPECT_FALSE(store.case_done("c000-aa", "fp16", false));
  store.write_case(record("c001-bb", "fp8"));
  EXPECT_TRUE(store.case_done("c001-bb", "fp8", false));
  EXPECT_FALSE(store.case_done("c001-bb", "fp16", false));  // spec mismatch
  EXPECT_FALSE(store.case_done("c001-bb", "fp8", true));    // arrays missing
  // A truncated record (impossible with atomic writes, but hand-edited) is not finished.
  const std::string full = slurp_file(store.case_path("c001-bb"));
  write_file(store.case_path("c000-aa"), full.substr(0, full.size() / 2));
  EXPECT_FALSE(store.case_done("c000-aa", "fp16", false));
  store.write_case(record("c000-aa", "fp16"));
  EXPECT_EQ(store.write_summaries(), 2);
  const std::string jl = slurp_file(dir_ / "run" / "summary.jsonl");
  EXPECT_LT(jl.find("c000-aa"), jl.find("c001-bb"));
  // Re-initialising with another resolved config is refused.
  EXPECT_THROW(store.init({{"cases", json::array()}}, ""), Error);
}

TEST_F(StoreTest, StaleTemporariesAreRemoved) {
  const RunStore store(dir_ / "run");
  store.init({{"cases", json::array()}, {"metrics", {{"arrays", true}}}}, "");
  write_file(dir_ / "run" / "cases" / "c000-aa.json.tmp.12345", "{\"trunc");
  write_file(dir_ / "run" / "arrays" / "c000-aa.h5.tmp.12345", "x");
  EXPECT_EQ(store.remove_stale_temporaries(), 2);
  EXPECT_FALSE(fs::exists(dir_ / "run" / "cases" / "c000-aa.json.tmp.12345"));
}

TEST_F(StoreTest, RunLockIsExclusive) {
  fs::create_directories(dir_ / "run");
  {
    RunLock a(dir_ / "run");
    EXPECT_THROW(RunLock b(dir_ / "run"), Error);
  }
  RunLock c(dir_ / "run");  // released with a
}

}  // namespace
}  // namespace kvarn
