// The KV tile file (HDF5, schema "kvarn-tiles" v1, docs/hdf5-schema.md): captured post-RoPE
// keys, values (and optionally pre-RoPE keys and queries) of a few sequences, per captured layer
// and KV head. TileWriter writes one atomically; TileReader validates one on open (attributes,
// dataset presence, shapes, dtypes) and then streams one (sequence, layer, head) slab at a time,
// rejecting non-finite values with the exact index; a slab can also be read undecoded and decoded
// on another thread (StoredSlab).
#ifndef KVARN_DATA_TILE_FILE_HPP_
#define KVARN_DATA_TILE_FILE_HPP_

#include <Eigen/Core>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kvarn/data/uninit_vector.hpp"

namespace kvarn {

inline constexpr const char* kTileFormat = "kvarn-tiles";
inline constexpr int kTileFormatVersion = 1;

using TileMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// Root attributes plus the `layers` dataset.
struct TileFileInfo {
  std::string model;
  int num_layers = 0;    // of the model
  int num_kv_heads = 0;  // every KV head is captured
  int num_q_heads = 0;
  int head_dim = 0;
  std::optional<double> rope_theta;
  std::string source;             // e.g. "synthetic (data/make_sample_tiles.py)"
  std::string provenance = "{}";  // JSON text
  std::vector<int> layers;        // model layer index of each captured layer
  int num_captured_layers() const { return static_cast<int>(layers.size()); }
};

struct SequenceInfo {
  std::string name;  // "000001"
  int num_tokens = 0;
  std::string prompt_id;
  bool has_k_pre_rope = false;
  bool has_q = false;
  std::vector<int> q_heads;  // model query-head index of each captured q head
};

// One sequence to write. Arrays are C order [L_captured, H, T, D] (q: [L_captured, Hq, T, D]);
// values are rounded to fp16 on write. Empty k_pre_rope / q = absent.
struct SequenceData {
  std::string prompt_id;
  std::vector<std::int32_t> token_ids;  // [T]
  std::vector<float> k, v, k_pre_rope, q;
  std::vector<int> q_heads;
  // Extra attributes of the sequence group (e.g. capture's num_prompt_tokens, checks).
  std::vector<std::pair<std::string, long long>> int_attrs;
  std::vector<std::pair<std::string, std::string>> string_attrs;
};

// One (sequence, dataset, layer, head) slab as the file stores it, not yet decoded. Reading one
// (TileReader::read_stored) uses HDF5, which is not thread-safe; decoding one (decode_slab) does
// not, so many slabs can be decoded at once while the next ones are read. For the tile writer's
// storage (chunks of whole tokens x head_dim with shuffle and/or deflate, or unfiltered) the
// chunks are read as stored (HDF5's direct chunk read) and inflated by decode_slab; any other
// storage is read through HDF5 and the slab holds its fp16 values. Both decode to the same floats.
struct StoredSlab {
  enum class Filter : std::uint8_t { kShuffle, kDeflate };
  std::string where;  // "<file>: /sequences/000000/k", for messages
  int layer_index = 0, head = 0, num_tokens = 0, head_dim = 0;
  int chunk_tokens = 0;                    // tokens per stored chunk; 0: `halfs` holds the slab
  std::vector<Filter> filters;             // the dataset's filter pipeline, in HDF5's order
  UninitVector<std::uint8_t> bytes;        // the stored chunks, back to back
  std::vector<std::size_t> chunk_end;      // end of chunk i in `bytes`
  std::vector<std::uint32_t> filter_mask;  // per chunk: bit i set = filter i was skipped
  std::vector<std::uint16_t> halfs;        // [T, D] fp16 bits, when read through HDF5
};

// How read_stored reads a slab: direct chunk reads where the storage allows (kAuto), or always
// through HDF5 (kHdf5; the reference the direct path is tested against).
enum class SlabRead { kAuto, kHdf5 };

// The [T, D] values of a stored slab; rejects non-finite values with their exact index and
// damaged chunks with their position. Safe to call from any thread.
TileMatrix decode_slab(const StoredSlab& slab);

class TileReader {
 public:
  // Opens `path`. The file's structure is walked in a child process only (h5_probe.hpp), which
  // sends it back: a libhdf5 crash or hang on corrupt metadata becomes one kvarn::Error naming
  // the file, and this process never decodes an attribute. A file's walk is remembered (path,
  // inode, size, mtime) and not repeated.
  explicit TileReader(const std::filesystem::path& path);
  // Reads an in-memory copy of a tile file (`size` bytes at `image`, copied), probed the same
  // way every time; `label` names it in errors.
  TileReader(const std::filesystem::path& label, const void* image, std::size_t size);
  ~TileReader();
  TileReader(const TileReader&) = delete;
  TileReader& operator=(const TileReader&) = delete;

  const std::filesystem::path& path() const { return path_; }
  const TileFileInfo& info() const { return info_; }
  int num_sequences() const { return static_cast<int>(sequences_.size()); }
  const SequenceInfo& sequence(int seq) const;
  std::vector<std::int32_t> token_ids(int seq) const;
  // One [T, D] slab of dataset "k", "v", "k_pre_rope" or "q"; `layer_index` indexes the captured
  // layers (0..L_captured-1), `head` the KV heads (for "q": the captured q heads).
  TileMatrix read(int seq, const std::string& dataset, int layer_index, int head) const;
  // The same slab undecoded (decode_slab(read_stored(...)) == read(...)), so that decoding can run
  // on other threads.
  StoredSlab read_stored(int seq, const std::string& dataset, int layer_index, int head,
                         SlabRead how = SlabRead::kAuto) const;
  // Reads every slab once (bounded memory), so non-finite values anywhere are reported.
  void validate_values() const;

  // How many string attributes libhdf5 has read, and how many structure walks (every attribute,
  // dataset dtype, shape and chunk index) have run, in this process for tile readers: 0 while
  // every reader is probed (only the probe child walks the structure, see tile_file.cpp).
  static long long string_attribute_reads_in_process();
  static long long structure_walks_in_process();

 private:
  struct Impl;
  struct Image {
    const void* data = nullptr;
    std::size_t size = 0;
  };
  // `image` null: read the file at `path`. `record` null: walk the structure in a probe child
  // and take it (or its error) from the child; else this is that child's walk, which writes its
  // outcome to *record.
  TileReader(const std::filesystem::path& path, std::optional<Image> image, std::string* record);
  void open_file(const std::string& f, std::optional<Image> image);
  std::filesystem::path path_;
  std::unique_ptr<Impl> impl_;
  TileFileInfo info_;
  std::vector<SequenceInfo> sequences_;
};

// How TileWriter stores the fp16 datasets (k, v, k_pre_rope, q): in chunks of [1, 1, 256, D]
// either way. Gzip (level 4 after shuffle) saves about 15 % on real captures (their low mantissa
// bytes do not compress), but every reader then pays the inflate, which costs `quantize` about
// as much as a sixth of its time: off unless asked for. Readers accept both.
enum class TileCompression { kNone, kGzip };

class TileWriter {
 public:
  // Writes to a temporary sibling of `path`; finish() moves it into place. Refuses to overwrite
  // an existing file unless `overwrite`.
  TileWriter(const std::filesystem::path& path, TileFileInfo info, bool overwrite = false,
             TileCompression compression = TileCompression::kNone);
  // Without finish(), the temporary file is removed and `path` is left untouched.
  ~TileWriter();
  TileWriter(const TileWriter&) = delete;
  TileWriter& operator=(const TileWriter&) = delete;

  void add_sequence(const SequenceData& seq);
  // Replaces the root `provenance` attribute (e.g. with results known only at the end).
  void set_provenance(const std::string& json);
  void finish();

 private:
  struct Impl;
  std::filesystem::path path_, tmp_;
  TileFileInfo info_;
  bool overwrite_;
  TileCompression compression_;
  int num_sequences_ = 0;
  std::unique_ptr<Impl> impl_;
};

// "000042"
std::string sequence_name(int index);

}  // namespace kvarn

#endif  // KVARN_DATA_TILE_FILE_HPP_
