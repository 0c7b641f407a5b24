// Rewrites tests/golden/input.json and tests/golden/<preset>.json from the current code (the
// cases of tests/core/golden_cases.hpp). Not a test: it checks nothing and is not run by ctest.
// Run it through scripts/update_goldens.sh when a numerical change is intended, then review and
// commit the diff of tests/golden/.
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/golden_cases.hpp"

namespace {

void write_file(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream os(tmp, std::ios::binary);
    os << text;
    if (!os.good()) throw std::runtime_error("cannot write " + tmp);
  }
  std::filesystem::rename(tmp, path);
}

}  // namespace

int main() {
  try {
    kvarn::Matrix k, v;
    kvarn::golden::make_inputs(&k, &v);
    std::filesystem::create_directories(
        std::filesystem::path(kvarn::golden::input_path()).parent_path());
    write_file(kvarn::golden::input_path(), kvarn::golden::inputs_json(k, v).dump() + "\n");
    int written = 0;
    for (const auto& preset : kvarn::Registry::instance().presets()) {
      // One key per line: reviewable diffs.
      write_file(kvarn::golden::golden_name(preset.name),
                 kvarn::golden::preset_json(preset.name, k, v).dump(1) + "\n");
      ++written;
    }
    std::printf("wrote %s and %d preset goldens; review `git diff tests/golden`\n",
                kvarn::golden::input_path().c_str(), written);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "update_golden: %s\n", e.what());
    return 1;
  }
}
