// RunnerSteps of a build without the libtorch model runner: config validation asks available()
// and skips or refuses the blocks that need it; a step called anyway is a clear error.
#include "kvarn/data/error.hpp"
#include "runner_steps.hpp"

namespace kvarn {

namespace {

[[noreturn]] void no_runner(const std::string& what) {
  fail(what,
       ": this kvarn-eval was built without the libtorch model runner (scripts/install_deps.sh "
       "installs torch; rebuild)");
}

class NoRunnerSteps final : public RunnerSteps {
 public:
  bool available() const override { return false; }
  void resolve_capture(const config_detail::Ctx&, const YAML::Node&, const std::string& key,
                       const std::filesystem::path&, CaptureSpec&) const override {
    no_runner(key);
  }
  CheckpointShape checkpoint_shape(const std::filesystem::path& config_json) const override {
    no_runner(config_json.string());
  }
  void capture(const SweepConfig&, const CaptureSpec& cap, const std::filesystem::path&, bool,
               const std::string&, std::FILE*) const override {
    no_runner(cap.key);
  }
  AccumulationCase accumulation_case(const SweepConfig&, const CaseSpec&) const override {
    no_runner("accumulation");
  }
  void write_accumulation_arrays(H5::Group&, const AccumulationCase&) const override {
    no_runner("accumulation");
  }
  QualityCase quality_case(const SweepConfig&, const CaseSpec&) const override {
    no_runner("quality");
  }
  RetrievalCase retrieval_case(const SweepConfig&, const CaseSpec&) const override {
    no_runner("retrieval");
  }
};

}  // namespace

const RunnerSteps& runner_steps() {
  static const NoRunnerSteps steps;
  return steps;
}

}  // namespace kvarn
