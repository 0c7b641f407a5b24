// The sweep steps that need the libtorch model runner, behind one interface: runner_steps.cpp
// implements them when kvarn_runner is built, runner_steps_none.cpp otherwise (available() is
// false and every step throws a kvarn::Error saying the build has no runner). CMake picks the
// file, so no other sweeps source branches on the build. Internal to kvarn_sweeps.
#ifndef KVARN_SWEEPS_SRC_RUNNER_STEPS_HPP_
#define KVARN_SWEEPS_SRC_RUNNER_STEPS_HPP_

#include <H5Cpp.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "accumulation_case.hpp"
#include "config_parse.hpp"
#include "kvarn/sweeps/config.hpp"
#include "quality_case.hpp"
#include "retrieval_case.hpp"

namespace kvarn {

// What the sweep needs from a checkpoint's config.json (the runner's load_model_config).
struct CheckpointShape {
  int head_dim = 0, num_layers = 0, vocab_size = 0, max_position_embeddings = 0;
};

class RunnerSteps {
 public:
  virtual ~RunnerSteps() = default;

  // False in a build without the runner.
  virtual bool available() const = 0;

  // Config time: checks a `data.capture` block against its checkpoint and prompts (prompt ids,
  // layer / head index lists, every sequence within the context) and fills the rest of `cap`
  // (shape, token counts, canonical spec and hash). Errors name the block's keys through `c`.
  virtual void resolve_capture(const config_detail::Ctx& c, const YAML::Node& n,
                               const std::string& key, const std::filesystem::path& config_path,
                               CaptureSpec& cap) const = 0;

  // The shape of a checkpoint; throws kvarn::Error (an unsupported or malformed config.json).
  virtual CheckpointShape checkpoint_shape(const std::filesystem::path& config_json) const = 0;

  // Captures `cap` (one of cfg.data.captures) into `file` (temporary + rename; capture_step.cpp
  // decides when).
  virtual void capture(const SweepConfig& cfg, const CaptureSpec& cap,
                       const std::filesystem::path& file, bool overwrite,
                       const std::string& command, std::FILE* log) const = 0;

  // The accumulation protocols of one case (accumulation_case.hpp) and their arrays.
  virtual AccumulationCase accumulation_case(const SweepConfig& cfg, const CaseSpec& cs) const = 0;
  virtual void write_accumulation_arrays(H5::Group& root, const AccumulationCase& acc) const = 0;

  // Model-level quality of one case (quality_case.hpp).
  virtual QualityCase quality_case(const SweepConfig& cfg, const CaseSpec& cs) const = 0;
  // Passkey and induction copy of one case (retrieval_case.hpp).
  virtual RetrievalCase retrieval_case(const SweepConfig& cfg, const CaseSpec& cs) const = 0;
};

// This build's implementation.
const RunnerSteps& runner_steps();

}  // namespace kvarn

#endif  // KVARN_SWEEPS_SRC_RUNNER_STEPS_HPP_
