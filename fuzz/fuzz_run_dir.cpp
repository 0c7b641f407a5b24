// Run-directory readers: the first byte picks summary.jsonl, resolved.json or a case record; the
// rest is the file's text.
#include "fuzz_util.hpp"
#include "kvarn/sweeps/compare.hpp"
#include "kvarn/sweeps/store.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string text = kvarn::fuzz::as_string(data + 1, size - 1);
  kvarn::fuzz::expect_clean([&] {
    switch (data[0] % 3) {
      case 0:
        kvarn::parse_summary_jsonl(text, "summary.jsonl");
        break;
      case 1: {
        const auto j = kvarn::parse_json_text(text, "resolved.json");
        kvarn::resolved_cases(j, "resolved.json");
        kvarn::resolved_arrays(j, "resolved.json");
        break;
      }
      default: {
        const auto j = kvarn::parse_json_text(text, "case.json");
        const std::string problem = kvarn::case_record_problem(j, "c000-fp16", "fp16");
        if (problem.empty())
          kvarn::summary_jsonl(std::vector<nlohmann::json>{j});  // a valid record must summarize
      }
    }
  });
  return 0;
}
