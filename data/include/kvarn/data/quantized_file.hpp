// The quantized-tile file (HDF5, schema "kvarn-quantized" v2, docs/hdf5-schema.md): what a
// quantization method stores for each (sequence, layer, KV head) slab of a tile file, and
// optionally the fp32 reconstruction. QuantizedFileWriter writes one atomically (temp + rename),
// slab by slab in the caller's order; QuantizedFileReader opens one, checks its format and reads
// slabs back. Plain arrays only: this layer knows nothing of the methods that fill them.
#ifndef KVARN_DATA_QUANTIZED_FILE_HPP_
#define KVARN_DATA_QUANTIZED_FILE_HPP_

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace kvarn {

inline constexpr const char* kQuantizedFormat = "kvarn-quantized";
inline constexpr int kQuantizedFormatVersion = 2;

// Root attributes.
struct QuantizedFileInfo {
  std::string method, method_spec, source_file, model;
  int num_layers = 0;
  int head_dim = 0;
  bool reconstruction = false;    // k_hat / v_hat present in every head group
  std::string provenance = "{}";  // JSON text
};

// One stored field of one stream, all chunks concatenated: shape [num_chunks, ...field shape].
struct QuantizedField {
  std::string name;
  std::string dtype;  // "u8", "f16" (raw half bits, stored as uint16), "f32"
  std::vector<std::size_t> shape;
  std::vector<std::uint8_t> bytes;
};

struct QuantizedStream {
  int chunk_tokens = 1, sink = 0, keep_recent = 0;
  long long chunk_bytes = 0, kept_token_bytes = 0;
  int kept_tokens = 0;
  double code_bits = 0;
  std::vector<std::int32_t> first_token;  // [num_chunks]
  std::vector<QuantizedField> fields;
  int num_chunks() const { return static_cast<int>(first_token.size()); }
  std::size_t payload_bytes() const;  // sum of the fields' bytes
};

// One (sequence, layer, KV head) slab.
struct QuantizedSlab {
  int num_tokens = 0;
  long long stored_bytes = 0, accounted_bytes = 0, fp16_bytes = 0;
  bool layer_skipped = false;
  double k_nmse = 0, v_nmse = 0;
  std::vector<std::uint8_t> k_quantized, v_quantized;  // [T]: 1 = in a quantized chunk
  std::vector<float> k_hat, v_hat;                     // [T, D] when the file holds them
  QuantizedStream k, v;
};

// Where a slab sits: the groups /sequences/<sequence>/layer_LL/head_HH.
struct SlabKey {
  std::string sequence;  // "000001", as in the input tile file
  int num_tokens = 0;
  std::string prompt_id;
  int model_layer = 0, captured_index = 0;
  int head = 0;
};

class QuantizedFileWriter {
 public:
  // Writes to a temporary sibling of `path`; finish() moves it into place. Refuses to overwrite
  // an existing file unless `overwrite`.
  QuantizedFileWriter(const std::filesystem::path& path, QuantizedFileInfo info,
                      bool overwrite = false);
  // Without finish(), the temporary file is removed and `path` is left untouched.
  ~QuantizedFileWriter();
  QuantizedFileWriter(const QuantizedFileWriter&) = delete;
  QuantizedFileWriter& operator=(const QuantizedFileWriter&) = delete;

  // Slabs of one sequence and of one layer must be added together (the groups stay open).
  void add_slab(const SlabKey& key, const QuantizedSlab& slab);
  void finish();

 private:
  struct Impl;
  std::filesystem::path path_, tmp_;
  QuantizedFileInfo info_;
  bool overwrite_;
  std::unique_ptr<Impl> impl_;
};

class QuantizedFileReader {
 public:
  explicit QuantizedFileReader(const std::filesystem::path& path);
  ~QuantizedFileReader();
  QuantizedFileReader(const QuantizedFileReader&) = delete;
  QuantizedFileReader& operator=(const QuantizedFileReader&) = delete;

  const QuantizedFileInfo& info() const { return info_; }
  // Every slab in the file, in sequence / layer / head order.
  const std::vector<SlabKey>& slabs() const { return slabs_; }
  QuantizedSlab read(const SlabKey& key) const;

 private:
  struct Impl;
  std::filesystem::path path_;
  std::unique_ptr<Impl> impl_;
  QuantizedFileInfo info_;
  std::vector<SlabKey> slabs_;
};

// "layer_05", "head_00" (two digits at least).
std::string quantized_group_name(const char* prefix, int index);

}  // namespace kvarn

#endif  // KVARN_DATA_QUANTIZED_FILE_HPP_
