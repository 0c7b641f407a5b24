// The sweep engine's part of model-level quality: runs kvarn/runner/quality.hpp for one case over
// every configured model and window, and turns it into summary rows and the case record's
// `quality` block (docs/results.md, docs/metrics.md "Model-level quality"). Internal to
// kvarn_sweeps; compiled only with the runner.
#ifndef KVARN_SWEEPS_SRC_QUALITY_CASE_HPP_
#define KVARN_SWEEPS_SRC_QUALITY_CASE_HPP_

#include <nlohmann/json.hpp>

#include "kvarn/sweeps/config.hpp"

namespace kvarn {

struct QualityCase {
  nlohmann::json record = nlohmann::json::object();  // cases/<id>.json's `quality`
  nlohmann::json rows = nlohmann::json::array();     // tidy summary rows
};

// Built only with the runner; the engine reaches it through RunnerSteps (runner_steps.hpp).
QualityCase run_quality_case(const SweepConfig& cfg, const CaseSpec& cs);

}  // namespace kvarn

#endif  // KVARN_SWEEPS_SRC_QUALITY_CASE_HPP_
