// Typed reads and error placement shared by the sweep config's section parsers.
#include "config_parse.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <sstream>

#include "kvarn/core/registry.hpp"
#include "kvarn/data/error.hpp"

namespace kvarn::config_detail {

void Ctx::fail_at(const YAML::Node& node, const std::string& key, const std::string& msg) const {
  fail_mark(node.IsDefined() ? node.Mark() : YAML::Mark::null_mark(), key, msg);
}

void Ctx::fail_mark(const YAML::Mark& mark, const std::string& key, const std::string& msg) const {
  std::ostringstream os;
  if (from_set(key)) {
    os << file_ << ": key '" << key << "' (from --set): " << msg;
  } else if (!mark.is_null()) {
    os << file_ << ":" << mark.line + 1 << ":" << mark.column + 1 << ": key '" << key
       << "': " << msg;
  } else {
    os << file_ << ": key '" << key << "': " << msg;
  }
  throw Error(os.str());
}

bool Ctx::from_set(const std::string& key) const {
  for (const std::string& p : overridden_) {
    if (key == p || key.rfind(p + ".", 0) == 0) return true;
  }
  return false;
}

std::string join_key(const std::string& parent, const std::string& child) {
  return parent.empty() ? child : parent + "." + child;
}

std::string type_name(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Null:
      return "null";
    case YAML::NodeType::Scalar:
      return "scalar '" + n.Scalar() + "'";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a mapping";
    default:
      return "nothing";
  }
}

bool present(const YAML::Node& n) { return n.IsDefined() && !n.IsNull(); }

void require_map(const Ctx& c, const YAML::Node& n, const std::string& key) {
  if (!n.IsMap()) c.fail_at(n, key, "expected a mapping, got " + type_name(n));
}

std::string key_text(const Ctx& c, const YAML::Node& key, const std::string& path) {
  if (!key.IsScalar()) {
    c.fail_mark(key.Mark(), path.empty() ? "(top level)" : path,
                "a key must be a name, got " + type_name(key) + " as a key");
  }
  return key.Scalar();
}

void check_keys(const Ctx& c, const YAML::Node& map, const std::string& path,
                const std::vector<std::string>& allowed) {
  for (auto it = map.begin(); it != map.end(); ++it) {
    const std::string k = key_text(c, it->first, path);
    if (std::find(allowed.begin(), allowed.end(), k) == allowed.end()) {
      c.fail_mark(it->first.Mark(), join_key(path, k),
                  "unknown key (nearest: " + nearest(k, allowed, 1) + ")");
    }
  }
}

std::string get_string(const Ctx& c, const YAML::Node& n, const std::string& key) {
  if (!n.IsScalar()) c.fail_at(n, key, "expected a string, got " + type_name(n));
  return n.Scalar();
}

namespace {

// Decimal digits with an optional sign: an integer, even when it does not fit 64 bits.
bool integer_text(const std::string& s) {
  std::size_t i = (!s.empty() && (s[0] == '-' || s[0] == '+')) ? 1 : 0;
  return i < s.size() &&
         std::all_of(s.begin() + static_cast<std::ptrdiff_t>(i), s.end(),
                     [](char ch) { return std::isdigit(static_cast<unsigned char>(ch)); });
}

std::string range_text(std::int64_t lo, std::int64_t hi) {
  std::ostringstream os;
  os << '[' << lo << ", " << hi << ']';
  return os.str();
}

}  // namespace

std::int64_t get_int(const Ctx& c, const YAML::Node& n, const std::string& key, std::int64_t lo,
                     std::int64_t hi) {
  if (!n.IsScalar()) c.fail_at(n, key, "expected an integer, got " + type_name(n));
  long long v = 0;
  try {
    v = n.as<long long>();
  } catch (const YAML::BadConversion&) {
    if (integer_text(n.Scalar())) {
      c.fail_at(n, key, "must be in " + range_text(lo, hi) + ", got " + n.Scalar());
    }
    c.fail_at(n, key, "expected an integer, got " + type_name(n));
  }
  if (v < lo || v > hi) {
    c.fail_at(n, key, "must be in " + range_text(lo, hi) + ", got " + std::to_string(v));
  }
  return v;
}

double get_double(const Ctx& c, const YAML::Node& n, const std::string& key) {
  if (n.IsScalar()) {
    try {
      const double x = n.as<double>();
      if (std::isfinite(x)) return x;
    } catch (const YAML::BadConversion&) {
    }
  }
  c.fail_at(n, key, "expected a finite number, got " + type_name(n));
}

bool get_bool(const Ctx& c, const YAML::Node& n, const std::string& key) {
  if (n.IsScalar()) {
    try {
      return n.as<bool>();
    } catch (const YAML::BadConversion&) {
    }
  }
  c.fail_at(n, key, "expected true or false, got " + type_name(n));
}

std::optional<std::vector<int>> get_selection(const Ctx& c, const YAML::Node& n,
                                              const std::string& key, const ConfigKey& spec) {
  if (!present(n)) return std::nullopt;
  if (n.IsScalar() && n.Scalar() == "all") return std::nullopt;
  if (n.IsScalar()) {  // a single index is accepted as a one-element list
    return std::vector<int>{static_cast<int>(get_int(c, n, key, spec.min, spec.max))};
  }
  if (!n.IsSequence())
    c.fail_at(n, key, "expected 'all' or a list of indices, got " + type_name(n));
  if (n.size() == 0) c.fail_at(n, key, "empty selection (use 'all' or list indices)");
  std::vector<int> out;
  for (std::size_t i = 0; i < n.size(); ++i) {
    const std::string k = key + "." + std::to_string(i);
    const int x = static_cast<int>(get_int(c, n[i], k, spec.min, spec.max));
    if (std::find(out.begin(), out.end(), x) != out.end()) {
      c.fail_at(n[i], k, "duplicate index " + std::to_string(x));
    }
    out.push_back(x);
  }
  return out;
}

void check_selection(const Ctx& c, const YAML::Node& n, const std::string& key,
                     const std::optional<std::vector<int>>& sel, int count, const std::string& file,
                     const std::string& what) {
  if (!sel) return;
  for (std::size_t i = 0; i < sel->size(); ++i) {
    if ((*sel)[i] >= count) {
      c.fail_at(n.IsSequence() ? n[i] : n, key,
                "index " + std::to_string((*sel)[i]) + " out of range: " + file + " has " +
                    std::to_string(count) + " " + what);
    }
  }
}

std::string read_bounded(const std::filesystem::path& path, std::int64_t limit,
                         const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  KVARN_CHECK(in.good(), path.string(), ": cannot open ", what);
  std::string text;
  char buf[1 << 16];
  while (in) {
    in.read(buf, sizeof(buf));
    text.append(buf, static_cast<std::size_t>(in.gcount()));
    KVARN_CHECK(static_cast<std::int64_t>(text.size()) <= limit, path.string(), ": ", what,
                " is larger than the limit of ", limit, " bytes (or an endless stream)");
  }
  KVARN_CHECK(in.eof(), path.string(), ": cannot read ", what);
  return text;
}

}  // namespace kvarn::config_detail
