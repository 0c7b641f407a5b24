#include "tile_slab.hpp"

#ifdef KVARN_HAVE_LIBDEFLATE
#include <libdeflate.h>
#else
#include <zlib.h>
#endif

#include <algorithm>
#include <array>
#include <bit>
#include <climits>
#include <cstring>
#include <new>
#include <string>

#include "kvarn/data/error.hpp"
#include "kvarn/data/h5_io.hpp"

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#define KVARN_F16C_PATH 1
#endif

namespace kvarn {

static_assert(std::endian::native == std::endian::little,
              "the tile reader decodes little-endian fp16 in place");

namespace {

// The dataset's filter pipeline when decode_slab can undo it: shuffle of the fp16 values and/or
// deflate after it (each at most once), or none.
bool supported_filters(hid_t dcpl, std::vector<StoredSlab::Filter>* out) {
  const int n = H5Pget_nfilters(dcpl);
  if (n < 0 || n > 2) return false;
  for (int i = 0; i < n; ++i) {
    unsigned flags = 0, config = 0;
    unsigned cd[4] = {};
    std::size_t cd_n = 4;
    char name[64];
    const H5Z_filter_t id = H5Pget_filter2(dcpl, static_cast<unsigned>(i), &flags, &cd_n, cd,
                                           sizeof(name), name, &config);
    if (id == H5Z_FILTER_DEFLATE) {
      out->push_back(StoredSlab::Filter::kDeflate);
    } else if (id == H5Z_FILTER_SHUFFLE && (cd_n == 0 || cd[0] == 2)) {
      out->push_back(StoredSlab::Filter::kShuffle);
    } else {
      return false;
    }
  }
  return out->size() < 2 ||
         (out->at(0) == StoredSlab::Filter::kShuffle && out->at(1) == StoredSlab::Filter::kDeflate);
}

// The dataset's chunk tokens c when its chunks are [1, 1, c, D] and every chunk, the partial
// edge chunk included, goes through the filters; 0 otherwise.
int chunk_tokens(hid_t dcpl, int head_dim) {
  if (H5Pget_layout(dcpl) != H5D_CHUNKED) return 0;
  hsize_t chunk[4] = {};
  if (H5Pget_chunk(dcpl, 4, chunk) != 4) return 0;
  unsigned opts = 0;
  if (H5Pget_chunk_opts(dcpl, &opts) < 0 || (opts & H5D_CHUNK_DONT_FILTER_PARTIAL_CHUNKS)) return 0;
  if (chunk[0] != 1 || chunk[1] != 1 || chunk[3] != static_cast<hsize_t>(head_dim)) return 0;
  if (chunk[2] < 1 || chunk[2] > (1u << 30)) return 0;
  return static_cast<int>(chunk[2]);
}

struct PlistCloser {
  hid_t id;
  ~PlistCloser() { H5Pclose(id); }
};

}  // namespace

bool read_direct_chunks(const H5::DataSet& ds, std::uintmax_t file_size, StoredSlab* slab) {
  const hid_t dcpl = H5Dget_create_plist(ds.getId());
  if (dcpl < 0) return false;
  const PlistCloser closer{dcpl};
  const int c = chunk_tokens(dcpl, slab->head_dim);
  std::vector<StoredSlab::Filter> filters;
  if (c == 0 || !supported_filters(dcpl, &filters)) return false;
  slab->chunk_tokens = c;
  slab->filters = std::move(filters);
  const int num_chunks = (slab->num_tokens + c - 1) / c;
  auto offset = [&](int i) -> std::array<hsize_t, 4> {
    return {static_cast<hsize_t>(slab->layer_index), static_cast<hsize_t>(slab->head),
            static_cast<hsize_t>(i) * c, 0};
  };
  auto at = [&](int i) {
    return "stored chunk at token " + std::to_string(static_cast<long long>(i) * c);
  };
  // Sizes first, so that the slab's bytes are allocated once and each chunk is read in place.
  std::uintmax_t total = 0;
  for (int i = 0; i < num_chunks; ++i) {
    hsize_t bytes = 0;
    if (H5Dget_chunk_storage_size(ds.getId(), offset(i).data(), &bytes) < 0) {
      throw H5::DataSetIException("read_direct_chunks", "cannot locate the " + at(i));
    }
    total += bytes;
    KVARN_CHECK(bytes > 0 && total <= file_size, slab->where, ": [layer ", slab->layer_index,
                ", head ", slab->head, "]: the ", at(i), " claims ", bytes, " bytes (", total,
                " for the slab so far) in a file of ", file_size, " bytes (corrupt file?)");
    slab->chunk_end.push_back(static_cast<std::size_t>(total));
  }
  slab->bytes.resize(static_cast<std::size_t>(total));
  for (int i = 0; i < num_chunks; ++i) {
    std::uint32_t mask = 0;
    const std::size_t begin = i == 0 ? 0 : slab->chunk_end[i - 1];
    if (H5Dread_chunk(ds.getId(), H5P_DEFAULT, offset(i).data(), &mask,
                      slab->bytes.data() + begin) < 0) {
      throw H5::DataSetIException("read_direct_chunks", "cannot read the " + at(i));
    }
    slab->filter_mask.push_back(mask);
  }
  return true;
}

namespace {

// fp16 bits (little endian) to floats, exactly (h5::half_to_float without branches, so that it
// vectorizes); returns false if any value is Inf or NaN.
__attribute__((target_clones("avx2", "default"))) bool halfs_to_floats(const std::uint8_t* in,
                                                                       std::size_t n, float* out) {
  std::uint32_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t h = in[2 * i] | static_cast<std::uint32_t>(in[2 * i + 1]) << 8;
    const std::uint32_t em = h & 0x7fffu;
    bad |= (em + 0x400u) >> 15;  // exponent all ones: Inf or NaN
    // Subnormals (and zero): em * 2^-24, exact in float; normals: rebias the exponent by 112.
    const auto sub =
        std::bit_cast<std::uint32_t>(static_cast<float>(static_cast<int>(em)) * 0x1p-24f);
    const std::uint32_t norm = (em << 13) + 0x38000000u;
    const std::uint32_t is_norm = 0u - static_cast<std::uint32_t>(em >= 0x400u);
    out[i] = std::bit_cast<float>((norm & is_norm) | (sub & ~is_norm) | (h & 0x8000u) << 16);
  }
  return bad == 0;
}

// A chunk's fp16 values as bytes: interleaved (little endian, `hi` null) or as the shuffle
// filter leaves them, all low bytes, then all high bytes from `hi` on.
struct HalfBytes {
  const std::uint8_t* lo;
  const std::uint8_t* hi = nullptr;
  std::uint16_t at(std::size_t i) const {
    return hi ? static_cast<std::uint16_t>(lo[i] | hi[i] << 8)
              : static_cast<std::uint16_t>(lo[2 * i] | lo[2 * i + 1] << 8);
  }
};

#ifdef KVARN_F16C_PATH
// halfs_to_floats with F16C's fp16 -> float instruction (exact, like the bit formula), 8 values
// at a time, reading the shuffle filter's byte planes directly when given them.
__attribute__((target("avx2,f16c"))) bool halfs_to_floats_f16c(HalfBytes in, std::size_t n,
                                                               float* out) {
  const __m128i exponent = _mm_set1_epi16(0x7c00);
  __m128i bad = _mm_setzero_si128();
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h =
        in.hi ? _mm_unpacklo_epi8(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(in.lo + i)),
                                  _mm_loadl_epi64(reinterpret_cast<const __m128i*>(in.hi + i)))
              : _mm_loadu_si128(reinterpret_cast<const __m128i*>(in.lo + 2 * i));
    bad = _mm_or_si128(bad, _mm_cmpeq_epi16(_mm_and_si128(h, exponent), exponent));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
  }
  bool ok = _mm_testz_si128(bad, bad) != 0;
  for (; i < n; ++i) {
    ok = ok && h5::half_is_finite(in.at(i));
    out[i] = h5::half_to_float(in.at(i));
  }
  return ok;
}

// F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports does not know "f16c".
bool cpu_has_f16c() {
  static const bool yes = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __builtin_cpu_supports("avx2") && __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 &&
           (ecx & bit_F16C) != 0;
  }();
  return yes;
}
#else
bool cpu_has_f16c() { return false; }
bool halfs_to_floats_f16c(HalfBytes, std::size_t, float*) { return false; }
#endif

// Converts `n` halfs starting at slab element `first`; names the first non-finite one. Byte
// planes only come with F16C (unfilter_chunk undoes the shuffle otherwise).
void convert_checked(const StoredSlab& s, HalfBytes in, std::size_t n, std::size_t first,
                     float* out) {
  if (cpu_has_f16c() ? halfs_to_floats_f16c(in, n, out) : halfs_to_floats(in.lo, n, out)) return;
  const std::size_t D = s.head_dim;
  for (std::size_t j = 0; j < n; ++j) {
    const std::uint16_t h = in.at(j);
    if (h5::half_is_finite(h)) continue;
    const std::size_t i = first + j;
    fail(s.where, ": non-finite value (", h5::half_to_float(h), ") at [layer ", s.layer_index,
         ", head ", s.head, ", token ", i / D, ", channel ", i % D, "]");
  }
}

// A zlib stream (HDF5's deflate filter) inflated whole; the adler32 check included either way.
#ifdef KVARN_HAVE_LIBDEFLATE
class Inflater {
 public:
  Inflater() : d_(libdeflate_alloc_decompressor()) {
    if (!d_) throw std::bad_alloc();
  }
  ~Inflater() { libdeflate_free_decompressor(d_); }
  Inflater(const Inflater&) = delete;
  Inflater& operator=(const Inflater&) = delete;

  // True when `in` is one complete zlib stream of exactly `out_len` bytes.
  bool inflate_exact(const std::uint8_t* in, std::size_t len, std::uint8_t* out,
                     std::size_t out_len) {
    std::size_t got = 0;
    return libdeflate_zlib_decompress(d_, in, len, out, out_len, &got) == LIBDEFLATE_SUCCESS &&
           got == out_len;
  }

 private:
  libdeflate_decompressor* d_;
};
#else
class Inflater {
 public:
  Inflater() {
    if (inflateInit(&z_) != Z_OK) throw std::bad_alloc();
  }
  ~Inflater() { inflateEnd(&z_); }
  Inflater(const Inflater&) = delete;
  Inflater& operator=(const Inflater&) = delete;

  // True when `in` is one complete zlib stream of exactly `out_len` bytes.
  bool inflate_exact(const std::uint8_t* in, std::size_t len, std::uint8_t* out,
                     std::size_t out_len) {
    if (len > UINT_MAX || out_len > UINT_MAX || inflateReset(&z_) != Z_OK) return false;
    z_.next_in = const_cast<Bytef*>(in);
    z_.avail_in = static_cast<uInt>(len);
    z_.next_out = out;
    z_.avail_out = static_cast<uInt>(out_len);
    return ::inflate(&z_, Z_FINISH) == Z_STREAM_END && z_.avail_out == 0;
  }

 private:
  z_stream z_{};
};
#endif

// HDF5's shuffle of 2-byte elements: all first bytes, then all second bytes.
void unshuffle2(const std::uint8_t* in, std::size_t n, std::uint8_t* out) {
  for (std::size_t i = 0; i < n; ++i) {
    out[2 * i] = in[i];
    out[2 * i + 1] = in[n + i];
  }
}

// Undoes chunk i's filters (the last one first, those its mask skipped left out); returns its
// [c, D] halfs as bytes, in `buf` or in the slab itself. With `planes`, a shuffle undone last is
// left for the conversion, which reads the byte planes directly.
HalfBytes unfilter_chunk(const StoredSlab& s, std::size_t i, Inflater* z,
                         UninitVector<std::uint8_t> (&buf)[2], bool planes) {
  const std::size_t n = static_cast<std::size_t>(s.chunk_tokens) * s.head_dim, size = 2 * n;
  const std::size_t begin = i == 0 ? 0 : s.chunk_end[i - 1];
  const std::uint8_t* in = s.bytes.data() + begin;
  std::size_t len = s.chunk_end[i] - begin;
  const std::string at = "stored chunk at token " + std::to_string(i * s.chunk_tokens);
  int next = 0;
  for (std::size_t f = s.filters.size(); f-- > 0;) {
    if ((s.filter_mask[i] >> f) & 1u) continue;
    std::uint8_t* out = buf[next].data();
    next ^= 1;
    if (s.filters[f] == StoredSlab::Filter::kDeflate) {
      KVARN_CHECK(z->inflate_exact(in, len, out, size), s.where, ": [layer ", s.layer_index,
                  ", head ", s.head, "]: the ", at, " (", len, " bytes) does not inflate to its ",
                  size, " bytes (corrupt file?)");
    } else {
      KVARN_CHECK(len == size, s.where, ": [layer ", s.layer_index, ", head ", s.head, "]: the ",
                  at, " holds ", len, " bytes, expected ", size, " (corrupt file?)");
      if (planes && f == 0) return {in, in + n};
      unshuffle2(in, n, out);
    }
    in = out;
    len = size;
  }
  KVARN_CHECK(len == size, s.where, ": [layer ", s.layer_index, ", head ", s.head, "]: the ", at,
              " holds ", len, " bytes, expected ", size, " (corrupt file?)");
  return {in};
}

}  // namespace

TileMatrix decode_slab(const StoredSlab& s) {
  const std::size_t T = s.num_tokens, D = s.head_dim;
  TileMatrix m(s.num_tokens, s.head_dim);
  if (s.chunk_tokens == 0) {
    KVARN_CHECK(s.halfs.size() == T * D, s.where, ": slab holds ", s.halfs.size(),
                " values, expected ", T * D);
    convert_checked(s, {reinterpret_cast<const std::uint8_t*>(s.halfs.data())}, T * D, 0, m.data());
    return m;
  }
  const std::size_t c = s.chunk_tokens, num_chunks = (T + c - 1) / c;
  KVARN_CHECK(s.chunk_end.size() == num_chunks && s.filter_mask.size() == num_chunks, s.where,
              ": slab holds ", s.chunk_end.size(), " chunks, expected ", num_chunks);
  KVARN_CHECK(std::is_sorted(s.chunk_end.begin(), s.chunk_end.end()) &&
                  s.chunk_end.back() == s.bytes.size(),
              s.where, ": inconsistent chunk offsets");
  // Kept per thread: quantize decodes hundreds of slabs on each.
  thread_local UninitVector<std::uint8_t> buf[2];
  for (auto& b : buf) b.resize(2 * c * D);
  thread_local Inflater z;
  for (std::size_t i = 0; i < num_chunks; ++i) {
    const HalfBytes halfs = unfilter_chunk(s, i, &z, buf, cpu_has_f16c());
    const std::size_t first = i * c * D, n = std::min(c, T - i * c) * D;
    convert_checked(s, halfs, n, first, m.data() + first);
  }
  return m;
}

}  // namespace kvarn
