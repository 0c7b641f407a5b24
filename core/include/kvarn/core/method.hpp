// The quantizer interface every method implements, and the KV cache built on it.
//
// A method quantizes the cache of one (layer, KV head) as two streams, keys and values, each
// with a policy that says which tokens stay fp16 and when the rest is quantized:
//
//   tokens:  [ sink (fp16 forever) | quantized chunks ... | pending (fp16) ]
//   flush:   while pending - keep_recent >= chunk: quantize the oldest `chunk` pending tokens
//
//   KVarN      sink = S (default G), chunk = G, keep_recent = 0   (tail of 0..G-1 fp16 tokens)
//   KIVI keys  sink = 0, chunk = R, keep_recent = 0               (flushed R at a time)
//   KIVI vals  sink = 0, chunk = 1, keep_recent = R               (sliding window of R)
//   FP8, TurboQuant, QuaRot: chunk = 1 (every token quantized on arrival)
//
// A StreamCodec turns one chunk of rows [chunk, D] into stored Fields (the exact bytes a cache
// would hold) and into its reconstruction (what attention reads, original frame, fp32).
#ifndef KVARN_CORE_METHOD_HPP_
#define KVARN_CORE_METHOD_HPP_

#include <Eigen/Core>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvarn/data/uninit_vector.hpp"

namespace kvarn {

using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatrixMap = Eigen::Map<const Matrix>;

// One stored array, exactly as it would sit in memory.
struct Field {
  std::string name;                 // e.g. "k_codes", "k_s_col", "v_zero"
  std::string dtype;                // "u8" (packed codes, fp8 bytes), "f16", "f32"
  std::vector<std::size_t> shape;   // logical shape of `bytes` in units of dtype
  std::vector<std::uint8_t> bytes;
};

// What a codec stores for one flushed chunk.
struct Chunk {
  int first_token = 0;
  int tokens = 0;
  std::vector<Field> fields;
  std::size_t bytes() const;
  const Field* find(const std::string& name) const;
};

struct StreamPolicy {
  int sink = 0;         // first tokens kept fp16 forever
  int chunk = 1;        // tokens quantized together
  int keep_recent = 0;  // newest tokens never flushed
};

// Where in the model a cache lives (TurboQuant keeps boundary layers unquantized).
struct LayerContext {
  int layer = 0;
  int num_layers = 1;
};

enum class StreamKind { kKey, kValue };

class StreamCodec {
 public:
  virtual ~StreamCodec() = default;
  virtual StreamPolicy policy() const = 0;
  // Bytes one quantized chunk occupies, metadata included; equals the encode() fields' sum.
  virtual std::size_t chunk_bytes() const = 0;
  // Bytes one fp16-kept token occupies (2 * D for every method here).
  virtual std::size_t kept_token_bytes() const;
  // Code bits per element as stored (packing waste included; 16 for fp16).
  virtual double code_bits() const = 0;
  // Quantizes n == policy().chunk rows [n, D]; fills chunk->fields; writes recon [n, D].
  virtual void encode(const float* rows, int n, Chunk* chunk, float* recon) = 0;
  // Reconstruction of rows kept in the fp16 region (identity unless stored rotated).
  virtual void keep(const float* rows, int n, float* recon);
  // Called once with the first rows ever appended (FP8 scale calibration); default nothing.
  virtual void calibrate(const float* rows, int n);
  int head_dim() const { return head_dim_; }

 protected:
  explicit StreamCodec(int head_dim) : head_dim_(head_dim) {}
  int head_dim_;
};

// Per-token storage of a method at head_dim D (quantized region, metadata included).
struct Accounting {
  int head_dim = 0;
  double key_code_bits = 0, value_code_bits = 0;            // per element, as stored
  double key_bytes_per_token = 0, value_bytes_per_token = 0;  // quantized region, per KV head
  StreamPolicy key_policy, value_policy;
  double bytes_per_token() const { return key_bytes_per_token + value_bytes_per_token; }
  double bits_per_element() const { return bytes_per_token() * 8.0 / (2.0 * head_dim); }
  double capacity_vs_fp16() const { return 4.0 * head_dim / bytes_per_token(); }
};

class KvCache;

class Method {
 public:
  virtual ~Method() = default;
  virtual std::string name() const = 0;    // canonical name (vLLM-style where one exists)
  virtual std::string spec() const = 0;    // full parameterized spec; make_method(spec()) rebuilds it
  virtual std::string family() const = 0;  // "fp16", "fp8", "kvarn", "kivi", "quarot", ...
  virtual std::string description() const = 0;
  // Throws kvarn::Error naming the method when head_dim is unsupported.
  virtual void check_head_dim(int head_dim) const;
  virtual std::unique_ptr<StreamCodec> make_codec(StreamKind kind, int head_dim,
                                                  const LayerContext& layer) const = 0;
  // Layers kept at fp16 by the method itself (TurboQuant boundary layers); default none.
  virtual bool layer_skipped(const LayerContext& layer) const;

  // Steady-state storage of a quantized layer.
  Accounting accounting(int head_dim) const;
  // Exact bytes a cache of `tokens` tokens holds (fp16 sink/tail/windows included), from the
  // policies and chunk sizes alone (the test compares it with what encode() really stores).
  std::size_t sequence_bytes(int tokens, int head_dim, const LayerContext& layer = {}) const;
  std::unique_ptr<KvCache> make_cache(int head_dim, const LayerContext& layer = {}) const;
};

// The cache of one (layer, KV head) with the method in the loop: append fp16 K/V rows, read the
// reconstruction attention sees. Appending n rows at once equals appending them one by one.
// Whether append checks its rows for NaN and Inf (kCheck), or the caller already did (kKnown:
// e.g. decode_slab's output, which rejects non-finite values with their index).
enum class FiniteRows { kCheck, kKnown };

class KvCache {
 public:
  KvCache(int head_dim, std::unique_ptr<StreamCodec> key, std::unique_ptr<StreamCodec> value);
  // [n, D] rows each, finite (a non-finite value is an error naming it, unless kKnown).
  void append(const float* k, const float* v, int n, FiniteRows finite = FiniteRows::kCheck);
  int size() const { return size_; }
  int head_dim() const { return head_dim_; }
  MatrixMap keys() const;    // [size, D] reconstruction, original frame
  MatrixMap values() const;
  bool quantized(StreamKind kind, int token) const;
  const std::vector<Chunk>& chunks(StreamKind kind) const;
  // Moves the stored chunks out (no copy); chunks() is empty afterwards, stored_bytes() unchanged.
  std::vector<Chunk> release_chunks(StreamKind kind);
  std::size_t stored_bytes() const;  // measured: stored chunk bytes + kept fp16 tokens
  const StreamCodec& codec(StreamKind kind) const;

 private:
  struct Stream {
    std::unique_ptr<StreamCodec> codec;
    StreamPolicy policy;
    UninitVector<float> recon;      // [capacity, D]; every row written by encode or keep
    std::vector<float> pending;     // raw rows not yet quantized (after the sink)
    int pending_first = 0;          // token index of pending row 0
    std::vector<std::uint8_t> is_quantized;
    std::vector<Chunk> chunks;
    std::size_t chunk_bytes = 0;  // of every chunk (checked on each flush)
    int flushed = 0;              // chunks flushed so far (release_chunks leaves this)
    void append(const float* rows, int n, int first_token, int d);
    void flush(const float* rows, int n, int first_token, int d);
  };
  Stream& stream(StreamKind kind) { return kind == StreamKind::kKey ? k_ : v_; }
  const Stream& stream(StreamKind kind) const { return kind == StreamKind::kKey ? k_ : v_; }
  int head_dim_;
  int size_ = 0;
  Stream k_, v_;
};

// Result of quantizing a whole sequence (one layer, one KV head) in a single append.
struct SequenceResult {
  Matrix k_hat, v_hat;                        // [T, D]
  std::vector<std::uint8_t> k_quantized, v_quantized;  // per token
  std::vector<Chunk> k_chunks, v_chunks;
  std::size_t stored_bytes = 0;
};
SequenceResult quantize_sequence(const Method& method, const Matrix& k, const Matrix& v,
                                 const LayerContext& layer = {});

// The method's cache after appending the whole sequence in one call: what quantize_sequence
// reads its result from, for callers that read the cache in place instead of copying it. A
// K/V shape mismatch is an error prefixed with `what`.
std::unique_ptr<KvCache> sequence_cache(const Method& method, const Matrix& k, const Matrix& v,
                                        const LayerContext& layer, const std::string& what,
                                        FiniteRows finite = FiniteRows::kCheck);

// Per token of `cache`, 1 where the `kind` row is in a quantized chunk, else 0.
std::vector<std::uint8_t> quantized_flags(const KvCache& cache, StreamKind kind);

// Throws kvarn::Error naming `what` and the first (row, column) that is NaN or Inf.
void check_finite(const float* x, int rows, int cols, const std::string& what);

}  // namespace kvarn

#endif  // KVARN_CORE_METHOD_HPP_
