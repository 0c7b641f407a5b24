// A defensive reader of the safetensors format (https://github.com/huggingface/safetensors):
//
//   [u64 little-endian N][N bytes of JSON header][data section]
//   header: {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
//            "__metadata__": {"key": "value"}}   (offsets relative to the data section)
//
// Everything is checked against the file before any byte of data is used: header length within
// the file, JSON well formed, known dtypes, non-negative shapes whose element count does not
// overflow, end - begin == numel * dtype size, offsets within the data section, sorted and
// non-overlapping, no duplicate names. Every error names the file and, where one exists, the
// tensor. The data is memory-mapped read-only.
#ifndef KVARN_RUNNER_SAFETENSORS_HPP_
#define KVARN_RUNNER_SAFETENSORS_HPP_

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace kvarn {

// Every dtype of the format; the runner loads only F32, F16 and BF16 weights.
enum class StDtype {
  kBool,
  kU8,
  kI8,
  kF8E4M3,
  kF8E5M2,
  kI16,
  kU16,
  kF16,
  kBF16,
  kI32,
  kU32,
  kF32,
  kF64,
  kI64,
  kU64
};

std::size_t st_dtype_size(StDtype dtype);
const char* st_dtype_name(StDtype dtype);

struct StTensorInfo {
  std::string name;
  StDtype dtype = StDtype::kF32;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0, end = 0;  // within the data section
  std::uint64_t numel() const;
};

// One .safetensors file, validated on open, mapped read-only until destruction.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::filesystem::path& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::filesystem::path& path() const { return path_; }
  const std::vector<StTensorInfo>& tensors() const { return tensors_; }  // file order by offset
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  // Throws naming the file when absent.
  const StTensorInfo& info(const std::string& name) const;
  // The raw little-endian bytes of a tensor (end - begin of them), inside the mapping.
  const std::uint8_t* data(const StTensorInfo& info) const;

 private:
  std::filesystem::path path_;
  std::vector<StTensorInfo> tensors_;
  std::map<std::string, std::size_t> index_;
  std::map<std::string, std::string> metadata_;
  void* map_ = nullptr;
  std::size_t map_size_ = 0;
  std::uint64_t data_start_ = 0;
};

// The safetensors of an HF checkpoint directory: model.safetensors, or the shards listed by
// model.safetensors.index.json (every listed tensor must be present in its shard).
class SafetensorsCheckpoint {
 public:
  explicit SafetensorsCheckpoint(const std::filesystem::path& dir);
  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  const SafetensorsFile& file_of(const std::string& name) const;  // throws naming dir and name
  std::vector<std::string> names() const;
  const std::filesystem::path& dir() const { return dir_; }

 private:
  std::filesystem::path dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, std::size_t> where_;
};

}  // namespace kvarn

#endif  // KVARN_RUNNER_SAFETENSORS_HPP_
