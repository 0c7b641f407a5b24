#include "kvarn/core/method.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "kvarn/core/half_array.hpp"
#include "kvarn/core/portable_math.hpp"
#include "kvarn/data/error.hpp"

namespace kvarn {

std::size_t Chunk::bytes() const {
  std::size_t b = 0;
  for (const auto& f : fields) b += f.bytes.size();
  return b;
}

const Field* Chunk::find(const std::string& name) const {
  for (const auto& f : fields)
    if (f.name == name) return &f;
  return nullptr;
}

std::size_t StreamCodec::kept_token_bytes() const { return 2 * static_cast<std::size_t>(head_dim_); }

void StreamCodec::keep(const float* rows, int n, float* recon) {
  const std::size_t total = static_cast<std::size_t>(n) * head_dim_;
  std::copy(rows, rows + total, recon);
  round_to_half_inplace(recon, total);  // == round_to_half per element, vectorized
}

void StreamCodec::calibrate(const float*, int) {}

void Method::check_head_dim(int head_dim) const {
  KVARN_CHECK(head_dim > 0 && head_dim % 8 == 0, "method ", name(), ": head_dim ", head_dim,
              " is not supported (must be a positive multiple of 8)");
}

bool Method::layer_skipped(const LayerContext&) const { return false; }

Accounting Method::accounting(int head_dim) const {
  check_head_dim(head_dim);
  LayerContext mid;  // a layer no method skips
  mid.num_layers = 1 << 20;
  mid.layer = mid.num_layers / 2;
  auto k = make_codec(StreamKind::kKey, head_dim, mid);
  auto v = make_codec(StreamKind::kValue, head_dim, mid);
  Accounting a;
  a.head_dim = head_dim;
  a.key_code_bits = k->code_bits();
  a.value_code_bits = v->code_bits();
  a.key_policy = k->policy();
  a.value_policy = v->policy();
  a.key_bytes_per_token = static_cast<double>(k->chunk_bytes()) / k->policy().chunk;
  a.value_bytes_per_token = static_cast<double>(v->chunk_bytes()) / v->policy().chunk;
  return a;
}

namespace {
std::size_t stream_bytes(const StreamCodec& c, int tokens) {
  const StreamPolicy p = c.policy();
  const int sink = std::min(tokens, p.sink);
  const int rest = tokens - sink;
  const int flushable = std::max(0, rest - p.keep_recent);
  const int chunks = flushable / p.chunk;
  const int kept = tokens - chunks * p.chunk;
  return static_cast<std::size_t>(chunks) * c.chunk_bytes() +
         static_cast<std::size_t>(kept) * c.kept_token_bytes();
}
}  // namespace

std::size_t Method::sequence_bytes(int tokens, int head_dim, const LayerContext& layer) const {
  check_head_dim(head_dim);
  auto k = make_codec(StreamKind::kKey, head_dim, layer);
  auto v = make_codec(StreamKind::kValue, head_dim, layer);
  return stream_bytes(*k, tokens) + stream_bytes(*v, tokens);
}

std::unique_ptr<KvCache> Method::make_cache(int head_dim, const LayerContext& layer) const {
  check_head_dim(head_dim);
  return std::make_unique<KvCache>(head_dim, make_codec(StreamKind::kKey, head_dim, layer),
                                   make_codec(StreamKind::kValue, head_dim, layer));
}

KvCache::KvCache(int head_dim, std::unique_ptr<StreamCodec> key,
                 std::unique_ptr<StreamCodec> value)
    : head_dim_(head_dim) {
  k_.codec = std::move(key);
  v_.codec = std::move(value);
  for (Stream* s : {&k_, &v_}) {
    s->policy = s->codec->policy();
    s->chunk_bytes = s->codec->chunk_bytes();
    KVARN_CHECK(s->policy.chunk >= 1 && s->policy.sink >= 0 && s->policy.keep_recent >= 0,
                "invalid stream policy (chunk ", s->policy.chunk, ", sink ", s->policy.sink,
                ", keep_recent ", s->policy.keep_recent, ")");
  }
}

// Queues the rows after the sink, then flushes every full chunk (encode writes its rows'
// reconstruction); pending / pending_first keep the rows not flushed yet. With nothing queued,
// full chunks are encoded straight from `rows` and only the rest is copied into pending.
void KvCache::Stream::flush(const float* rows, int n, int first_token, int d) {
  const std::size_t row = static_cast<std::size_t>(d);
  const int sink_rows = std::clamp(policy.sink - first_token, 0, std::max(n, 0));
  rows += sink_rows * row;
  n -= sink_rows;
  first_token += sink_rows;
  if (n <= 0) return;
  const bool direct = pending.empty();
  if (direct) {
    pending_first = first_token;
  } else {
    pending.insert(pending.end(), rows, rows + n * row);
  }
  const float* base = direct ? rows : pending.data();
  const int available = direct ? n : static_cast<int>(pending.size() / row);
  int consumed = 0;
  while (available - consumed - policy.keep_recent >= policy.chunk) {
    Chunk c;
    c.first_token = pending_first + consumed;
    c.tokens = policy.chunk;
    codec->encode(base + consumed * row, policy.chunk, &c, recon.data() + c.first_token * row);
    KVARN_CHECK(c.bytes() == chunk_bytes, "codec stored ", c.bytes(),
                " bytes for a chunk but accounts ", chunk_bytes);
    for (int t = 0; t < policy.chunk; ++t) is_quantized[c.first_token + t] = 1;
    chunks.push_back(std::move(c));
    ++flushed;
    consumed += policy.chunk;
  }
  if (direct) {
    pending.assign(rows + consumed * row, rows + n * row);
  } else if (consumed > 0) {
    pending.erase(pending.begin(), pending.begin() + consumed * row);
  }
  pending_first += consumed;
}

void KvCache::Stream::append(const float* rows, int n, int first_token, int d) {
  const std::size_t row = static_cast<std::size_t>(d);
  if (first_token == 0 && n > 0) codec->calibrate(rows, n);
  const std::size_t need = (static_cast<std::size_t>(first_token) + n) * row;
  if (recon.capacity() < need) recon.reserve(std::max(need, 2 * recon.capacity()));
  recon.resize(need);
  is_quantized.resize(first_token + n, 0);
  flush(rows, n, first_token, d);
  // The new rows still kept in fp16 (sink, tail, window) get their reconstruction; codecs keep
  // row by row, so runs of rows give the same values as one call over all rows. Rows queued
  // earlier and flushed now were overwritten by encode.
  int i = 0;
  while (i < n) {
    if (is_quantized[first_token + i]) {
      ++i;
      continue;
    }
    int j = i;
    while (j < n && !is_quantized[first_token + j]) ++j;
    codec->keep(rows + i * row, j - i, recon.data() + (first_token + i) * row);
    i = j;
  }
}

void KvCache::append(const float* k, const float* v, int n, FiniteRows finite) {
  KVARN_CHECK(n >= 0, "KvCache::append: negative row count ", n);
  if (finite == FiniteRows::kCheck) {
    check_finite(k, n, head_dim_, "keys appended at token " + std::to_string(size_));
    check_finite(v, n, head_dim_, "values appended at token " + std::to_string(size_));
  }
  k_.append(k, n, size_, head_dim_);
  v_.append(v, n, size_, head_dim_);
  size_ += n;
}

MatrixMap KvCache::keys() const { return MatrixMap(k_.recon.data(), size_, head_dim_); }
MatrixMap KvCache::values() const { return MatrixMap(v_.recon.data(), size_, head_dim_); }

bool KvCache::quantized(StreamKind kind, int token) const {
  return stream(kind).is_quantized.at(token) != 0;
}

const std::vector<Chunk>& KvCache::chunks(StreamKind kind) const { return stream(kind).chunks; }

std::vector<Chunk> KvCache::release_chunks(StreamKind kind) {
  return std::exchange(stream(kind).chunks, {});
}

const StreamCodec& KvCache::codec(StreamKind kind) const { return *stream(kind).codec; }

std::size_t KvCache::stored_bytes() const {
  std::size_t b = 0;
  for (const Stream* s : {&k_, &v_}) {
    const int quantized_tokens = s->flushed * s->policy.chunk;
    b += static_cast<std::size_t>(s->flushed) * s->chunk_bytes;
    b += static_cast<std::size_t>(size_ - quantized_tokens) * s->codec->kept_token_bytes();
  }
  return b;
}

std::unique_ptr<KvCache> sequence_cache(const Method& method, const Matrix& k, const Matrix& v,
                                        const LayerContext& layer, const std::string& what,
                                        FiniteRows finite) {
  KVARN_CHECK(k.rows() == v.rows() && k.cols() == v.cols(), what, ": K is ", k.rows(), "x",
              k.cols(), " but V is ", v.rows(), "x", v.cols());
  auto cache = method.make_cache(static_cast<int>(k.cols()), layer);
  cache->append(k.data(), v.data(), static_cast<int>(k.rows()), finite);
  return cache;
}

std::vector<std::uint8_t> quantized_flags(const KvCache& cache, StreamKind kind) {
  std::vector<std::uint8_t> flags(static_cast<std::size_t>(cache.size()));
  for (int i = 0; i < cache.size(); ++i) flags[i] = cache.quantized(kind, i);
  return flags;
}

SequenceResult quantize_sequence(const Method& method, const Matrix& k, const Matrix& v,
                                 const LayerContext& layer) {
  const auto cache = sequence_cache(method, k, v, layer, "quantize_sequence");
  SequenceResult r;
  r.k_hat = cache->keys();
  r.v_hat = cache->values();
  r.k_quantized = quantized_flags(*cache, StreamKind::kKey);
  r.v_quantized = quantized_flags(*cache, StreamKind::kValue);
  r.stored_bytes = cache->stored_bytes();
  r.k_chunks = cache->release_chunks(StreamKind::kKey);
  r.v_chunks = cache->release_chunks(StreamKind::kValue);
  return r;
}

void check_finite(const float* x, int rows, int cols, const std::string& what) {
  // Fast vectorizable scan; the indexed loop below only runs to name the first bad value.
  const std::size_t n = static_cast<std::size_t>(rows) * cols;
  std::uint32_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    std::uint32_t u;
    std::memcpy(&u, x + i, 4);
    bad |= (u & 0x7f800000u) == 0x7f800000u ? 1u : 0u;
  }
  if (!bad) return;
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) {
      float val = x[static_cast<std::size_t>(r) * cols + c];
      if (!std::isfinite(val)) {
        fail(what, ": non-finite value ", val, " at row ", r, ", column ", c);
      }
    }
  }
}

}  // namespace kvarn
