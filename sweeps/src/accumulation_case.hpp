// The sweep engine's part of error accumulation: runs eval's accumulation protocols for one case
// over every configured model and prompt, and turns them into summary rows and HDF5 arrays
// (docs/results.md, "Accumulation"). Internal to kvarn_sweeps; compiled only with the runner.
#ifndef KVARN_SWEEPS_SRC_ACCUMULATION_CASE_HPP_
#define KVARN_SWEEPS_SRC_ACCUMULATION_CASE_HPP_

#include <H5Cpp.h>

#include <memory>
#include <nlohmann/json.hpp>

#include "kvarn/sweeps/config.hpp"

namespace kvarn {

struct AccumulationCaseData;  // per model: the per-prompt results (opaque)

struct AccumulationCase {
  nlohmann::json record = nlohmann::json::object();  // for cases/<id>.json
  nlohmann::json rows = nlohmann::json::array();     // tidy summary rows
  std::shared_ptr<AccumulationCaseData> data;
};

// Built only with the runner; the engine reaches it through RunnerSteps (runner_steps.hpp).
AccumulationCase run_accumulation_case(const SweepConfig& cfg, const CaseSpec& cs);

// accumulation/* and decode/* of the first model at the root (what the report plots), every
// model under accumulation_models/<name>/.
void write_accumulation_arrays(H5::Group& root, const AccumulationCase& acc);

}  // namespace kvarn

#endif  // KVARN_SWEEPS_SRC_ACCUMULATION_CASE_HPP_
