// docs/config-schema.md documents exactly the keys of the config key table (config_keys()): every
// table row of the "## Keys" part names one key, and every key of the table has a row.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>

#include "kvarn/sweeps/config_keys.hpp"

namespace kvarn {
namespace {

// Documented key -> its type cell, from the tables under "## Keys": a row's first cell is
// `key` (a full dotted key, or a name within the section of the last "### `section`" heading).
std::map<std::string, std::string> documented_keys(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  std::map<std::string, std::string> keys;
  const std::regex heading(R"(^### `([a-z_.]+)`)"), row(R"(^\| `([a-z_.]+)` \| ([^|]*)\|)");
  bool in_keys = false;
  std::string section, line;
  while (std::getline(in, line)) {
    if (line.rfind("## ", 0) == 0) in_keys = line == "## Keys";
    if (!in_keys) continue;
    std::smatch m;
    if (std::regex_search(line, m, heading)) section = m[1];
    if (std::regex_search(line, m, row)) {
      std::string key = m[1];
      if (key.find('.') == std::string::npos && !section.empty()) key = section + "." + key;
      EXPECT_TRUE(keys.emplace(key, m[2]).second) << key << " is documented twice";
    }
  }
  return keys;
}

TEST(ConfigSchemaDoc, ListsExactlyTheKeyTable) {
  const auto documented = documented_keys(std::string(KVARN_SOURCE_DIR) + "/docs/config-schema.md");
  std::set<std::string> table;
  for (const ConfigKey& k : config_keys()) {
    EXPECT_TRUE(table.insert(k.path()).second) << k.path() << " is in the table twice";
    const auto it = documented.find(k.path());
    if (it == documented.end()) {
      ADD_FAILURE() << "docs/config-schema.md has no row for key '" << k.path() << "'";
      continue;
    }
    // Integer keys say so, with their upper bound when it is not just "fits an int".
    if (k.type == KeyType::kInt) {
      EXPECT_NE(it->second.find("int"), std::string::npos) << k.path() << ": " << it->second;
    }
    EXPECT_FALSE(k.doc.empty()) << k.path();
  }
  for (const auto& [key, type] : documented) {
    EXPECT_TRUE(table.count(key)) << "docs/config-schema.md documents '" << key
                                  << "', which the config key table (sweeps/src/config_keys.cpp) "
                                     "does not have";
  }
  EXPECT_GT(documented.size(), 40u);  // the parse found the tables at all
}

}  // namespace
}  // namespace kvarn
