// The `data` block of a sweep config (and `data.fallback`): tile files, selections, captures.
#include <algorithm>

#include "config_parse.hpp"
#include "kvarn/data/error.hpp"
#include "kvarn/data/tile_file.hpp"
#include "kvarn/sweeps/provenance.hpp"
#include "runner_steps.hpp"

namespace kvarn::config_detail {

namespace {

namespace fs = std::filesystem;

constexpr const char* kSection = "data";

// The tile files of a data block, each opened (header validated) and named after its stem.
std::vector<TilesSource> parse_tiles(const Ctx& c, const YAML::Node& n, const std::string& path,
                                     const fs::path& config_path,
                                     const std::vector<CaptureSpec>& captures) {
  const std::string tkey = join_key(path, "tiles");
  const YAML::Node tiles = n["tiles"];
  const bool no_tiles = !present(tiles);
  if (no_tiles && captures.empty())
    c.fail_at(n, tkey, "missing (an HDF5 tile file, or a capture block)");
  std::vector<std::pair<YAML::Node, std::string>> entries;
  if (no_tiles) {
  } else if (tiles.IsSequence()) {
    if (tiles.size() == 0) c.fail_at(tiles, tkey, "empty list of tile files");
    for (std::size_t i = 0; i < tiles.size(); ++i) {
      entries.emplace_back(tiles[i], tkey + "." + std::to_string(i));
    }
  } else {
    entries.emplace_back(tiles, tkey);
  }
  std::set<std::string> names;
  for (const CaptureSpec& cap : captures) names.insert(cap.name);
  std::vector<TilesSource> out;
  for (const auto& [node, key] : entries) {
    TilesSource t;
    t.path = get_string(c, node, key);
    t.resolved = resolve_input_path(t.path, config_path);
    if (t.resolved.empty()) {
      c.fail_at(node, key,
                "file not found: " + t.path +
                    " (looked in the current directory, the config's "
                    "directory and its parent)");
    }
    try {
      TileReader r(t.resolved);
      t.head_dim = r.info().head_dim;
      t.num_sequences = r.num_sequences();
      t.num_captured_layers = r.info().num_captured_layers();
      t.num_kv_heads = r.info().num_kv_heads;
      for (int s = 0; s < r.num_sequences(); ++s)
        t.has_queries = t.has_queries || r.sequence(s).has_q;
    } catch (const Error& e) {
      c.fail_at(node, key, e.what());
    }
    t.fingerprint = file_fingerprint(t.resolved);
    t.name = fs::path(t.path).stem().string();
    for (int i = 2; names.count(t.name); ++i)
      t.name = fs::path(t.path).stem().string() + "_" + std::to_string(i);
    names.insert(t.name);
    out.push_back(t);
  }
  return out;
}

// Parses tiles/sequences/layers/kv_heads/max_tokens of `data` or `data.fallback`. The tiles may
// be absent when captures are given; the selection then applies to every captured file too.
DataSelection parse_selection(const Ctx& c, const YAML::Node& n, const std::string& path,
                              const fs::path& config_path,
                              const std::vector<CaptureSpec>& captures) {
  DataSelection d;
  d.captures = captures;
  d.tiles = parse_tiles(c, n, path, config_path, captures);
  for (auto [k, out] :
       {std::pair<const char*, std::optional<std::vector<int>>*>{"sequences", &d.sequences},
        {"layers", &d.layers},
        {"kv_heads", &d.kv_heads}}) {
    *out = get_selection(c, n[k], join_key(path, k), config_key(kSection, k));
  }
  read_int(c, n, path, config_key(kSection, "max_tokens"), d.max_tokens);
  auto check_all = [&](const std::string& file, int sequences, int layers, int kv_heads) {
    check_selection(c, n["sequences"], join_key(path, "sequences"), d.sequences, sequences, file,
                    "sequences");
    check_selection(c, n["layers"], join_key(path, "layers"), d.layers, layers, file,
                    "captured layers");
    check_selection(c, n["kv_heads"], join_key(path, "kv_heads"), d.kv_heads, kv_heads, file,
                    "KV heads");
  };
  for (const CaptureSpec& cap : captures) {
    check_all("the capture of " + cap.key, static_cast<int>(cap.sequence_tokens.size()),
              cap.captured_layers, cap.num_kv_heads);
  }
  for (const TilesSource& t : d.tiles) {
    check_all(t.path, t.num_sequences, t.num_captured_layers, t.num_kv_heads);
  }
  return d;
}

// The capture blocks of `capture:` (one mapping, or a list of them), each with its key.
std::vector<std::pair<YAML::Node, std::string>> capture_blocks(const Ctx& c, const YAML::Node& cn,
                                                               const std::string& key) {
  std::vector<std::pair<YAML::Node, std::string>> blocks;
  if (!cn.IsSequence()) {
    blocks.emplace_back(cn, key);
    return blocks;
  }
  if (cn.size() == 0) c.fail_at(cn, key, "empty list of capture blocks");
  for (std::size_t i = 0; i < cn.size(); ++i)
    blocks.emplace_back(cn[i], key + "." + std::to_string(i));
  return blocks;
}

// A second capture of the same checkpoint directory name gets "_2", "_3", ... (the `data` label
// of its results must be unique).
void make_capture_names_unique(std::vector<CaptureSpec>& captures) {
  std::set<std::string> names;
  for (CaptureSpec& cap : captures) {
    const std::string base = cap.name;
    for (int i = 2; names.count(cap.name); ++i) cap.name = base + "_" + std::to_string(i);
    names.insert(cap.name);
  }
}

// One data block (`data` or `data.fallback`) into cfg.data. Returns false, with *remote set to the
// model, when one of its captures names a model that is not on disk (a hub id).
bool parse_data_block(const Ctx& c, const YAML::Node& n, const std::string& path,
                      const fs::path& config_path, SweepConfig& cfg, std::string* remote) {
  const YAML::Node cn = n["capture"];
  const bool has_tiles = n["tiles"].IsDefined() && !n["tiles"].IsNull();
  std::vector<CaptureSpec> captures;
  if (cn.IsDefined() && !cn.IsNull()) {
    for (const auto& [block, key] : capture_blocks(c, cn, join_key(path, "capture"))) {
      CaptureSpec cap;
      if (!parse_capture(c, block, key, config_path, cap)) {
        // data.fallback replaces a single capture; a list names only checkpoints on disk.
        if (cn.IsSequence()) {
          c.fail_at(block["model"], key + ".model",
                    "'" + cap.model +
                        "' is not a local checkpoint directory (no config.json found); every "
                        "block of a list of captures must name one");
        }
        *remote = cap.model;
        return false;
      }
      if (runner_steps().available()) {
        captures.push_back(std::move(cap));
      } else if (path != "data" && has_tiles) {
        // A fallback with tiles still runs (as accumulation does); anything else would measure
        // something other than what the config asks for.
        cfg.notices.push_back(cfg.name + ": " + key +
                              " skipped: this kvarn-eval was built without the libtorch model "
                              "runner; running on " +
                              join_key(path, "tiles") + " only");
      } else {
        c.fail_at(block, key,
                  "capturing from " + cap.model +
                      " needs the libtorch model runner, and this kvarn-eval was built without "
                      "it (scripts/install_deps.sh installs torch; rebuild), or capture elsewhere "
                      "and point " +
                      join_key(path, "tiles") + " at the file");
      }
    }
    make_capture_names_unique(captures);
  } else if (!has_tiles) {
    c.fail_at(n, join_key(path, "tiles"), "missing (an HDF5 tile file, or a capture block)");
  }
  cfg.data = parse_selection(c, n, path, config_path, captures);
  return true;
}

// What a fallback run measures instead of the configured workload, for the notice.
std::string fallback_notice(const SweepConfig& cfg, const std::string& remote) {
  std::string what;
  for (const CaptureSpec& cap : cfg.data.captures) {
    what += (what.empty() ? "" : " + ") + std::string("a capture from ") + cap.model + " (" +
            std::to_string(cap.sequence_tokens.size()) + " prompt(s) of " + cap.prompts + ", " +
            std::to_string(cap.generate) + " generated tokens)";
  }
  for (const TilesSource& t : cfg.data.tiles) what += (what.empty() ? "" : " + ") + t.path;
  return cfg.name + ": data.capture.model '" + remote +
         "' is not a local checkpoint, so data.fallback runs instead, at REDUCED SIZE (not the "
         "configured workload): " +
         what +
         ". To run the configured workload, supply the model: --set "
         "data.capture.model=/path/to/checkpoint";
}

}  // namespace

// data: tiles and/or a capture spec; a capture whose model is not on disk (a hub id) selects
// data.fallback, with a notice saying so.
void parse_data(const Ctx& c, const YAML::Node& root, const fs::path& config_path,
                SweepConfig& cfg) {
  const YAML::Node data = root["data"];
  if (!data.IsDefined()) c.fail_at(root, "data", "missing");
  require_map(c, data, "data");
  check_keys(c, data, "data", config_section_keys(kSection));
  const YAML::Node fallback = data["fallback"];
  const bool has_fallback = present(fallback);
  if (has_fallback) {
    require_map(c, fallback, "data.fallback");
    std::vector<std::string> keys = config_section_keys(kSection);
    keys.erase(std::find(keys.begin(), keys.end(), "fallback"));
    check_keys(c, fallback, "data.fallback", keys);
  }
  std::string remote;
  if (parse_data_block(c, data, "data", config_path, cfg, &remote)) {
    cfg.data.source = cfg.data.captures.empty() ? "tiles" : "capture";
    return;
  }
  if (!has_fallback) {
    c.fail_at(data["capture"]["model"], "data.capture.model",
              "'" + remote +
                  "' is not a local checkpoint directory (no config.json found) and there is "
                  "no data.fallback: download the model and pass its directory, e.g. --set "
                  "data.capture.model=/path/to/checkpoint");
  }
  std::string fb_remote;
  if (!parse_data_block(c, fallback, "data.fallback", config_path, cfg, &fb_remote)) {
    c.fail_at(fallback["capture"]["model"], "data.fallback.capture.model",
              "'" + fb_remote +
                  "' is not a local checkpoint directory: a fallback must run on local data");
  }
  cfg.data.source = "fallback";
  cfg.notices.push_back(fallback_notice(cfg, remote));
}

}  // namespace kvarn::config_detail
