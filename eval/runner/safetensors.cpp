#include "kvarn/runner/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "kvarn/data/error.hpp"
#include "kvarn/data/read_file.hpp"

namespace kvarn {
namespace {

// The reference implementation refuses headers above 100 MB; so do we (no giant allocations).
constexpr std::uint64_t kMaxHeaderBytes = 100ull * 1000 * 1000;

struct DtypeEntry {
  const char* name;
  StDtype dtype;
  std::size_t size;
};
constexpr DtypeEntry kDtypes[] = {
    {"BOOL", StDtype::kBool, 1},      {"U8", StDtype::kU8, 1},          {"I8", StDtype::kI8, 1},
    {"F8_E4M3", StDtype::kF8E4M3, 1}, {"F8_E5M2", StDtype::kF8E5M2, 1}, {"I16", StDtype::kI16, 2},
    {"U16", StDtype::kU16, 2},        {"F16", StDtype::kF16, 2},        {"BF16", StDtype::kBF16, 2},
    {"I32", StDtype::kI32, 4},        {"U32", StDtype::kU32, 4},        {"F32", StDtype::kF32, 4},
    {"F64", StDtype::kF64, 8},        {"I64", StDtype::kI64, 8},        {"U64", StDtype::kU64, 8},
};

// Reads a non-negative JSON integer that fits in u64; `what` names it in the error.
std::uint64_t as_u64(const nlohmann::json& j, const std::string& where, const char* what) {
  if (j.is_number_unsigned()) return j.get<std::uint64_t>();
  if (j.is_number_integer() && j.get<std::int64_t>() >= 0) return j.get<std::uint64_t>();
  fail(where, ": ", what, " must be a non-negative integer below 2^64, got ", j.dump());
}

}  // namespace

std::size_t st_dtype_size(StDtype dtype) {
  for (const auto& e : kDtypes) {
    if (e.dtype == dtype) return e.size;
  }
  return 0;
}

const char* st_dtype_name(StDtype dtype) {
  for (const auto& e : kDtypes) {
    if (e.dtype == dtype) return e.name;
  }
  return "?";
}

std::uint64_t StTensorInfo::numel() const {
  std::uint64_t n = 1;
  for (auto d : shape) n *= static_cast<std::uint64_t>(d);
  return n;
}

SafetensorsFile::SafetensorsFile(const std::filesystem::path& path) : path_(path) {
  const std::string file = path.string();
  int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  KVARN_CHECK(fd >= 0, file, ": cannot open safetensors file: ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(file, ": not a regular file");
  }
  const std::uint64_t size = static_cast<std::uint64_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    fail(file, ": truncated safetensors file (", size,
         " bytes; the 8-byte header length is missing)");
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  KVARN_CHECK(map != MAP_FAILED, file, ": mmap failed: ", std::strerror(errno));
  map_ = map;
  map_size_ = size;
  try {
    const auto* bytes = static_cast<const std::uint8_t*>(map_);
    std::uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[i];
    KVARN_CHECK(n <= size - 8, file, ": header length ", n, " exceeds the file (", size,
                " bytes): truncated or not a safetensors file");
    KVARN_CHECK(n <= kMaxHeaderBytes, file, ": header length ", n, " exceeds the limit of ",
                kMaxHeaderBytes, " bytes");
    KVARN_CHECK(n >= 2, file, ": header length ", n, " is too small for a JSON object");
    data_start_ = 8 + n;
    const std::uint64_t data_size = size - data_start_;
    const std::string text(reinterpret_cast<const char*>(bytes + 8), n);

    // Duplicate tensor names would silently shadow each other in a JSON object: reject them.
    std::set<std::string> seen;
    std::string duplicate;
    nlohmann::json header;
    try {
      header = nlohmann::json::parse(
          text, [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
            if (depth == 1 && event == nlohmann::json::parse_event_t::key) {
              const auto key = parsed.get<std::string>();
              if (!seen.insert(key).second && duplicate.empty()) duplicate = key;
            }
            return true;
          });
    } catch (const nlohmann::json::exception& e) {
      fail(file, ": corrupt safetensors header (invalid JSON): ", without_tag(e.what()));
    }
    KVARN_CHECK(duplicate.empty(), file, ": tensor '", duplicate, "' appears twice in the header");
    KVARN_CHECK(header.is_object(), file, ": safetensors header is not a JSON object");

    for (auto it = header.begin(); it != header.end(); ++it) {
      const std::string& name = it.key();
      const std::string where = file + ": tensor '" + name + "'";
      if (name == "__metadata__") {
        KVARN_CHECK(it->is_object(), file, ": __metadata__ is not an object");
        for (auto m = it->begin(); m != it->end(); ++m) {
          KVARN_CHECK(m->is_string(), file, ": __metadata__ value of '", m.key(),
                      "' is not a string");
          metadata_[m.key()] = m->get<std::string>();
        }
        continue;
      }
      const auto& t = *it;
      KVARN_CHECK(t.is_object(), where, ": entry is not an object");
      for (const char* key : {"dtype", "shape", "data_offsets"}) {
        KVARN_CHECK(t.contains(key), where, ": missing '", key, "'");
      }
      StTensorInfo info;
      info.name = name;
      KVARN_CHECK(t["dtype"].is_string(), where, ": dtype is not a string");
      const auto dtype = t["dtype"].get<std::string>();
      std::size_t esize = 0;
      for (const auto& e : kDtypes) {
        if (dtype == e.name) {
          info.dtype = e.dtype;
          esize = e.size;
        }
      }
      KVARN_CHECK(esize != 0, where, ": unknown dtype '", dtype, "'");
      KVARN_CHECK(t["shape"].is_array(), where, ": shape is not an array");
      std::uint64_t numel = 1;
      for (const auto& d : t["shape"]) {
        const std::uint64_t dim = as_u64(d, where, "shape entry");
        KVARN_CHECK(dim <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()),
                    where, ": shape entry ", dim, " too large");
        KVARN_CHECK(dim == 0 || numel <= std::numeric_limits<std::uint64_t>::max() / dim, where,
                    ": element count of shape ", t["shape"].dump(), " overflows");
        numel *= dim;
        info.shape.push_back(static_cast<std::int64_t>(dim));
      }
      KVARN_CHECK(numel <= std::numeric_limits<std::uint64_t>::max() / esize, where,
                  ": byte size of shape ", t["shape"].dump(), " overflows");
      const auto& off = t["data_offsets"];
      KVARN_CHECK(off.is_array() && off.size() == 2, where, ": data_offsets must be [begin, end]");
      info.begin = as_u64(off[0], where, "data_offsets[0]");
      info.end = as_u64(off[1], where, "data_offsets[1]");
      KVARN_CHECK(info.begin <= info.end, where, ": data_offsets [", info.begin, ", ", info.end,
                  "] are reversed");
      KVARN_CHECK(info.end <= data_size, where, ": data_offsets end ", info.end,
                  " lies beyond the data section (", data_size, " bytes): truncated file?");
      KVARN_CHECK(info.end - info.begin == numel * esize, where, ": data_offsets span ",
                  info.end - info.begin, " bytes but shape ", t["shape"].dump(), " of ", dtype,
                  " needs ", numel * esize);
      tensors_.push_back(std::move(info));
    }
    std::sort(tensors_.begin(), tensors_.end(), [](const StTensorInfo& a, const StTensorInfo& b) {
      return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
    for (std::size_t i = 0; i < tensors_.size(); ++i) {
      if (i > 0) {
        const auto& p = tensors_[i - 1];
        const auto& c = tensors_[i];
        KVARN_CHECK(c.begin >= p.end, file, ": tensors '", p.name, "' [", p.begin, ", ", p.end,
                    ") and '", c.name, "' [", c.begin, ", ", c.end, ") overlap");
      }
      index_[tensors_[i].name] = i;
    }
  } catch (...) {
    ::munmap(map_, map_size_);
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(map_, map_size_);
}

const StTensorInfo& SafetensorsFile::info(const std::string& name) const {
  auto it = index_.find(name);
  KVARN_CHECK(it != index_.end(), path_.string(), ": no tensor '", name, "'");
  return tensors_[it->second];
}

const std::uint8_t* SafetensorsFile::data(const StTensorInfo& info) const {
  return static_cast<const std::uint8_t*>(map_) + data_start_ + info.begin;
}

SafetensorsCheckpoint::SafetensorsCheckpoint(const std::filesystem::path& dir) : dir_(dir) {
  const auto single = dir / "model.safetensors";
  const auto index = dir / "model.safetensors.index.json";
  std::vector<std::filesystem::path> shards;
  nlohmann::json weight_map;
  if (std::filesystem::exists(index)) {
    const std::string text = read_regular_file(index, "safetensors index", kMaxHeaderBytes);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      fail(index.string(), ": invalid JSON: ", without_tag(e.what()));
    }
    KVARN_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(),
                index.string(), ": missing object 'weight_map'");
    weight_map = j["weight_map"];
    std::set<std::string> names;
    for (auto it = weight_map.begin(); it != weight_map.end(); ++it) {
      KVARN_CHECK(it->is_string(), index.string(), ": weight_map['", it.key(),
                  "'] is not a file name");
      const auto shard = it->get<std::string>();
      KVARN_CHECK(shard.find('/') == std::string::npos && shard != ".." && !shard.empty(),
                  index.string(), ": weight_map['", it.key(), "'] = '", shard,
                  "' is not a file in the checkpoint directory");
      if (names.insert(shard).second) shards.push_back(dir / shard);
    }
    KVARN_CHECK(!shards.empty(), index.string(), ": weight_map is empty");
  } else {
    KVARN_CHECK(std::filesystem::exists(single), dir.string(),
                ": no model.safetensors or model.safetensors.index.json (only safetensors "
                "checkpoints are supported)");
    shards.push_back(single);
  }
  for (const auto& shard : shards) {
    KVARN_CHECK(std::filesystem::exists(shard), index.string(), ": shard ", shard.string(),
                " is missing");
    files_.push_back(std::make_unique<SafetensorsFile>(shard));
    const std::size_t fi = files_.size() - 1;
    for (const auto& t : files_.back()->tensors()) {
      auto [it, inserted] = where_.emplace(t.name, fi);
      KVARN_CHECK(inserted, dir.string(), ": tensor '", t.name, "' is in both ",
                  files_[it->second]->path().filename().string(), " and ",
                  shard.filename().string());
    }
  }
  for (auto it = weight_map.begin(); it != weight_map.end(); ++it) {
    auto w = where_.find(it.key());
    KVARN_CHECK(w != where_.end() &&
                    files_[w->second]->path().filename().string() == it->get<std::string>(),
                index.string(), ": tensor '", it.key(), "' is listed in ", it->get<std::string>(),
                " but not stored there");
  }
}

const SafetensorsFile& SafetensorsCheckpoint::file_of(const std::string& name) const {
  auto it = where_.find(name);
  KVARN_CHECK(it != where_.end(), dir_.string(), ": checkpoint has no tensor '", name, "'");
  return *files_[it->second];
}

std::vector<std::string> SafetensorsCheckpoint::names() const {
  std::vector<std::string> out;
  for (const auto& [name, _] : where_) out.push_back(name);
  return out;
}

}  // namespace kvarn
