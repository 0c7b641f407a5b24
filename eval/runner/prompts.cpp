// The capture prompts file (capture.hpp's load_capture_prompts): torch-free, so the fuzz and
// sanitizer builds, which leave libtorch out, compile and test it too.
#include <algorithm>
#include <fstream>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "kvarn/data/error.hpp"
#include "kvarn/data/read_file.hpp"
#include "kvarn/runner/capture.hpp"

namespace kvarn {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::vector<CapturePrompt> load_capture_prompts(const fs::path& path,
                                                const std::vector<std::string>& ids) {
  const std::string f = path.string();
  KVARN_CHECK(fs::is_regular_file(path), f, ": prompts file not found");
  std::ifstream in(path, std::ios::binary);
  KVARN_CHECK(in.good(), f, ": cannot open the prompts file");
  std::vector<CapturePrompt> prompts;
  std::map<std::string, int> first_line;
  std::string line;
  int ln = 0;
  while (std::getline(in, line)) {
    ++ln;
    if (line.find_first_not_of(" \t\r\n") == std::string::npos) continue;
    const std::string at = f + ":" + std::to_string(ln);
    json obj;
    try {
      obj = json::parse(line);
    } catch (const json::exception& e) {  // parse errors and numbers beyond double's range
      fail(at, ": invalid JSON (", without_tag(e.what()), ")");
    }
    KVARN_CHECK(obj.is_object(), at, ": each line must be a JSON object {\"id\", \"text\"} or ",
                "{\"id\", \"token_ids\"}");
    CapturePrompt p;
    p.line = ln;
    KVARN_CHECK(obj.contains("id"), at, ": missing \"id\"");
    const json& id = obj["id"];
    if (id.is_string()) {
      p.id = id.get<std::string>();
    } else if (id.is_number_integer()) {
      p.id = std::to_string(id.get<long long>());
    } else {
      fail(at, ": \"id\" must be a string or an integer");
    }
    KVARN_CHECK(!p.id.empty(), at, ": \"id\" is empty");
    const bool has_text = obj.contains("text"), has_ids = obj.contains("token_ids");
    KVARN_CHECK(has_text != has_ids, at, ": prompt '", p.id, "' needs exactly one of \"text\" ",
                "and \"token_ids\"");
    if (has_text) {
      KVARN_CHECK(obj["text"].is_string(), at, ": \"text\" must be a string");
      p.text = obj["text"].get<std::string>();
    } else {
      const json& t = obj["token_ids"];
      KVARN_CHECK(t.is_array() && !t.empty(), at, ": \"token_ids\" must be a non-empty array");
      for (std::size_t i = 0; i < t.size(); ++i) {
        KVARN_CHECK(t[i].is_number_integer() && t[i].get<long long>() >= 0 &&
                        t[i].get<long long>() <= std::numeric_limits<std::int32_t>::max(),
                    at, ": token_ids[", i, "] is not a non-negative 32-bit integer");
        p.token_ids.push_back(static_cast<std::int32_t>(t[i].get<long long>()));
      }
      p.has_token_ids = true;
    }
    const auto [it, inserted] = first_line.emplace(p.id, ln);
    KVARN_CHECK(inserted, at, ": duplicate prompt id '", p.id, "' (first on line ", it->second,
                ")");
    prompts.push_back(std::move(p));
  }
  KVARN_CHECK(!in.bad(), f, ": read error");
  KVARN_CHECK(!prompts.empty(), f, ": no prompts");
  if (ids.empty()) return prompts;
  std::vector<CapturePrompt> selected;
  std::string missing;
  for (const std::string& id : ids) {
    auto it = std::find_if(prompts.begin(), prompts.end(),
                           [&](const CapturePrompt& p) { return p.id == id; });
    if (it == prompts.end()) {
      missing += (missing.empty() ? "'" : ", '") + id + "'";
    } else {
      selected.push_back(*it);
    }
  }
  KVARN_CHECK(missing.empty(), f, ": unknown prompt id(s) ", missing, " (the file has ",
              prompts.size(), " prompts)");
  return selected;
}

}  // namespace kvarn
