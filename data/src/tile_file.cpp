#include "kvarn/data/tile_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <utility>

#include "kvarn/data/atomic_file.hpp"
#include "kvarn/data/error.hpp"
#include "kvarn/data/h5_io.hpp"
#include "kvarn/data/h5_probe.hpp"
#include "tile_slab.hpp"

namespace kvarn {

namespace fs = std::filesystem;

std::string sequence_name(int index) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%06d", index);
  return buf;
}

namespace {

const std::array<const char*, 4> kSlabDatasets = {"k", "v", "k_pre_rope", "q"};

std::string dims_text(const std::vector<hsize_t>& dims) {
  std::ostringstream os;
  os << "[";
  for (std::size_t i = 0; i < dims.size(); ++i) os << (i ? ", " : "") << dims[i];
  os << "]";
  return os.str();
}

std::string type_text(const H5::DataType& t) {
  std::ostringstream os;
  switch (t.getClass()) {
    case H5T_INTEGER:
      os << 8 * t.getSize() << "-bit integer";
      break;
    case H5T_FLOAT:
      os << 8 * t.getSize() << "-bit float" << (t.getSize() == 2 ? " (not IEEE half LE)" : "");
      break;
    case H5T_STRING:
      os << "string";
      break;
    default:
      os << "HDF5 type class " << static_cast<int>(t.getClass());
  }
  return os.str();
}

// Error context: "<file>: <object>".
struct Where {
  std::string file, object;
  std::string str() const { return file + ": " + object; }
};

H5::Attribute open_attr(const H5::H5Object& obj, const std::string& name, const Where& w) {
  KVARN_CHECK(obj.attrExists(name), w.str(), ": missing attribute '", name, "'");
  return obj.openAttribute(name);
}

void check_scalar(const H5::Attribute& a, const std::string& name, const Where& w) {
  H5::DataSpace s = a.getSpace();
  KVARN_CHECK(s.getSimpleExtentNpoints() == 1, w.str(), ": attribute '", name,
              "' must be a scalar, has ", s.getSimpleExtentNpoints(), " elements");
}

// Calls of read_string_attr in this process (TileReader::string_attribute_reads_in_process).
std::atomic<long long> string_attr_reads{0};

std::string read_string_attr(const H5::H5Object& obj, const std::string& name, const Where& w) {
  ++string_attr_reads;
  H5::Attribute a = open_attr(obj, name, w);
  H5::DataType t = a.getDataType();
  KVARN_CHECK(t.getClass() == H5T_STRING, w.str(), ": attribute '", name, "' must be a string, is ",
              type_text(t));
  check_scalar(a, name, w);
  std::string out;
  a.read(a.getStrType(), out);
  // Fixed-length strings may carry NUL padding.
  out.erase(std::find(out.begin(), out.end(), '\0'), out.end());
  return out;
}

// Little-endian length-prefixed strings, for the probe's result.
void put_text(std::string& out, const std::string& text) {
  const std::uint32_t n = static_cast<std::uint32_t>(text.size());
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  out += text;
}

bool take_text(const std::string& in, std::size_t& pos, std::string& text) {
  if (in.size() - pos < 4) return false;
  std::uint32_t n = 0;
  for (int i = 0; i < 4; ++i)
    n |= static_cast<std::uint32_t>(static_cast<unsigned char>(in[pos + i])) << (8 * i);
  pos += 4;
  if (in.size() - pos < n) return false;
  text = in.substr(pos, n);
  pos += n;
  return true;
}

}  // namespace

namespace {

long long read_int_attr(const H5::H5Object& obj, const std::string& name, const Where& w) {
  H5::Attribute a = open_attr(obj, name, w);
  H5::DataType t = a.getDataType();
  KVARN_CHECK(t.getClass() == H5T_INTEGER, w.str(), ": attribute '", name,
              "' must be an integer, is ", type_text(t));
  check_scalar(a, name, w);
  long long v = 0;
  a.read(H5::PredType::NATIVE_LLONG, &v);
  return v;
}

int read_positive_int_attr(const H5::H5Object& obj, const std::string& name, const Where& w) {
  long long v = read_int_attr(obj, name, w);
  KVARN_CHECK(v > 0 && v < (1 << 30), w.str(), ": attribute '", name, "' = ", v,
              " must be positive");
  return static_cast<int>(v);
}

std::vector<hsize_t> extent(const H5::DataSet& ds) {
  H5::DataSpace s = ds.getSpace();
  std::vector<hsize_t> dims(s.getSimpleExtentNdims());
  if (!dims.empty()) s.getSimpleExtentDims(dims.data());
  return dims;
}

// Deflate cannot expand data more than 1032:1; a claimed size beyond that of what is stored is
// not data but a damaged or hostile header.
constexpr long double kMaxCompressionRatio = 1100.0L;

// A dataset's claimed size must be backed by the file before anything is allocated for it:
// every chunk stored, the stored bytes within the file, the claimed bytes within what they can
// decompress to. Messages give the numbers.
void check_backed(const H5::DataSet& ds, const std::vector<hsize_t>& dims, std::size_t elem_size,
                  std::uintmax_t file_size, const Where& w) {
  long double claimed = static_cast<long double>(elem_size);
  for (hsize_t d : dims) claimed *= static_cast<long double>(d);
  if (claimed == 0) return;
  const auto bytes = [](long double n) {
    std::ostringstream os;
    if (n < 1.8e19L) {
      os << static_cast<unsigned long long>(n);
    } else {
      os << static_cast<double>(n);
    }
    return os.str();
  };
  const hsize_t stored = ds.getStorageSize();
  const hid_t dcpl = H5Dget_create_plist(ds.getId());
  const H5D_layout_t layout = H5Pget_layout(dcpl);
  std::vector<hsize_t> chunk(dims.size(), 0);
  if (layout == H5D_CHUNKED) H5Pget_chunk(dcpl, static_cast<int>(chunk.size()), chunk.data());
  H5Pclose(dcpl);
  if (layout == H5D_CHUNKED) {
    // Every chunk of the claimed extent must be stored; unwritten chunks would read as fill.
    long double expected = 1;
    for (std::size_t i = 0; i < dims.size(); ++i) {
      expected *= std::ceil(static_cast<long double>(dims[i]) / std::max<hsize_t>(1, chunk[i]));
    }
    hsize_t present = 0;
    const H5::DataSpace space = ds.getSpace();
    KVARN_CHECK(H5Dget_num_chunks(ds.getId(), space.getId(), &present) >= 0 &&
                    static_cast<long double>(present) == expected,
                w.str(), ": shape ", dims_text(dims), " claims ", bytes(claimed), " bytes in ",
                bytes(expected), " chunks but the file stores ", present, " chunks (", stored,
                " bytes)");
  } else if (layout == H5D_CONTIGUOUS) {
    KVARN_CHECK(static_cast<long double>(stored) == claimed, w.str(), ": shape ", dims_text(dims),
                " claims ", bytes(claimed), " bytes but the file stores ", stored);
  }
  KVARN_CHECK(stored <= file_size, w.str(), ": claims ", stored,
              " bytes of storage, more than the whole file (", file_size, " bytes)");
  KVARN_CHECK(claimed <= kMaxCompressionRatio * static_cast<long double>(stored), w.str(),
              ": shape ", dims_text(dims), " claims ", bytes(claimed), " bytes, more than its ",
              stored, " stored bytes can hold");
}

std::vector<int> read_int_vector(const H5::DataSet& ds, std::uintmax_t file_size, const Where& w) {
  H5::DataType t = ds.getDataType();
  KVARN_CHECK(t.getClass() == H5T_INTEGER, w.str(), ": dtype is ", type_text(t),
              ", expected int32");
  std::vector<hsize_t> dims = extent(ds);
  KVARN_CHECK(dims.size() == 1, w.str(), ": expected a 1-D dataset, shape is ", dims_text(dims));
  check_backed(ds, dims, t.getSize(), file_size, w);
  std::vector<int> v(dims[0]);
  if (!v.empty()) ds.read(v.data(), H5::PredType::NATIVE_INT);
  return v;
}

void check_slab_dataset(const H5::DataSet& ds, const std::vector<hsize_t>& expect,
                        const std::string& expect_text, std::uintmax_t file_size, const Where& w) {
  H5::DataType t = ds.getDataType();
  KVARN_CHECK(h5::is_f16(t), w.str(), ": dtype is ", type_text(t),
              ", expected float16 (IEEE half, little endian)");
  std::vector<hsize_t> dims = extent(ds);
  KVARN_CHECK(dims == expect, w.str(), ": shape is ", dims_text(dims), ", expected ",
              dims_text(expect), " ", expect_text);
  check_backed(ds, dims, 2, file_size, w);
}

void check_post_rope(const H5::DataSet& ds, int expect, const Where& w) {
  long long v = read_int_attr(ds, "post_rope", w);
  KVARN_CHECK(v == expect, w.str(), ": attribute 'post_rope' = ", v, ", expected ", expect);
}

// Our files (and h5py's) put the superblock at offset 0; checking the signature first gives a
// clearer message than HDF5's for text files and the like.
void check_signature(const std::string& f, const char* head, std::size_t n) {
  static const char kSig[8] = {'\211', 'H', 'D', 'F', '\r', '\n', '\032', '\n'};
  KVARN_CHECK(n >= 8 && std::equal(head, head + 8, kSig), f,
              ": not an HDF5 file (no HDF5 signature at offset 0)");
}

// Existence, size and signature of a tile file on disk; returns its size.
std::uintmax_t check_file_start(const fs::path& path) {
  const std::string f = path.string();
  std::error_code ec;
  KVARN_CHECK(fs::exists(path, ec), f, ": no such file");
  KVARN_CHECK(fs::is_regular_file(path, ec), f, ": not a regular file");
  const auto size = fs::file_size(path, ec);
  KVARN_CHECK(!ec, f, ": cannot stat: ", ec.message());
  KVARN_CHECK(size > 0, f, ": empty file (0 bytes), expected an HDF5 kvarn-tiles file");
  char head[8] = {};
  std::ifstream is(path, std::ios::binary);
  KVARN_CHECK(is.good(), f, ": cannot open for reading");
  is.read(head, 8);
  check_signature(f, head, static_cast<std::size_t>(is.gcount()));
  return size;
}

std::uintmax_t check_image_start(const std::string& f, const void* data, std::size_t size) {
  KVARN_CHECK(size > 0, f, ": empty file (0 bytes), expected an HDF5 kvarn-tiles file");
  check_signature(f, static_cast<const char*>(data), size);
  return size;
}

// An in-memory file image through the core driver (no backing store). The name HDF5 gets cannot
// exist on disk (the core driver refuses to open an image under the name of an existing file)
// and is new each time (HDF5 would hand back a file still open under the same name).
H5::H5File open_image(const void* data, std::size_t size) {
  static std::atomic<unsigned long long> count{0};
  H5::FileAccPropList fapl;
  KVARN_CHECK(H5Pset_fapl_core(fapl.getId(), 64 * 1024, false) >= 0 &&
                  H5Pset_file_image(fapl.getId(), const_cast<void*>(data), size) >= 0,
              "cannot set up an in-memory HDF5 file image");
  return H5::H5File("/dev/null/kvarn-tile-image-" + std::to_string(count++), H5F_ACC_RDONLY,
                    H5::FileCreatPropList::DEFAULT, fapl);
}

// Calls of the structure walk in this process (TileReader::structure_walks_in_process).
std::atomic<long long> structure_walks{0};

// The root attributes and /layers.
TileFileInfo walk_root(const H5::H5File& file, const std::string& f, std::uintmax_t size) {
  TileFileInfo info;
  const Where root{f, "/"};
  const std::string format = read_string_attr(file, "format", root);
  KVARN_CHECK(format == kTileFormat, f, ": attribute 'format' is '", format, "', expected '",
              kTileFormat, "' (not a tile file)");
  const long long version = read_int_attr(file, "format_version", root);
  KVARN_CHECK(version == kTileFormatVersion, f, ": unsupported format_version ", version,
              " (this build reads version ", kTileFormatVersion, ")");
  info.model = read_string_attr(file, "model", root);
  info.num_layers = read_positive_int_attr(file, "num_layers", root);
  info.num_kv_heads = read_positive_int_attr(file, "num_kv_heads", root);
  info.num_q_heads = read_positive_int_attr(file, "num_q_heads", root);
  info.head_dim = read_positive_int_attr(file, "head_dim", root);
  KVARN_CHECK(info.num_q_heads % info.num_kv_heads == 0, f, ": num_q_heads ", info.num_q_heads,
              " is not a multiple of num_kv_heads ", info.num_kv_heads);
  if (file.attrExists("rope_theta")) {
    H5::Attribute a = file.openAttribute("rope_theta");
    H5::DataType t = a.getDataType();
    KVARN_CHECK(t.getClass() == H5T_FLOAT || t.getClass() == H5T_INTEGER, f,
                ": attribute 'rope_theta' must be a number, is ", type_text(t));
    check_scalar(a, "rope_theta", root);
    double theta = 0;
    a.read(H5::PredType::NATIVE_DOUBLE, &theta);
    KVARN_CHECK(std::isfinite(theta) && theta > 0, f, ": attribute 'rope_theta' = ", theta,
                " must be positive");
    info.rope_theta = theta;
  }
  info.source = read_string_attr(file, "source", root);
  info.provenance = read_string_attr(file, "provenance", root);

  KVARN_CHECK(file.nameExists("layers"), f, ": /layers: missing dataset");
  const Where wl{f, "/layers"};
  info.layers = read_int_vector(file.openDataSet("layers"), size, wl);
  KVARN_CHECK(!info.layers.empty(), wl.str(), ": no captured layers");
  std::set<int> seen;
  for (std::size_t i = 0; i < info.layers.size(); ++i) {
    const int l = info.layers[i];
    KVARN_CHECK(l >= 0 && l < info.num_layers, wl.str(), ": layer ", l, " at index ", i,
                " is outside the model's ", info.num_layers, " layers");
    KVARN_CHECK(seen.insert(l).second, wl.str(), ": layer ", l, " listed twice");
  }
  return info;
}

// The captured query heads of /sequences/<name>/q (its `heads` attribute) and its slab checks.
std::vector<int> walk_q(const H5::DataSet& ds, const TileFileInfo& info, hsize_t T,
                        std::uintmax_t size, const Where& w) {
  KVARN_CHECK(ds.attrExists("heads"), w.str(), ": missing attribute 'heads'");
  H5::Attribute a = ds.openAttribute("heads");
  H5::DataType t = a.getDataType();
  KVARN_CHECK(t.getClass() == H5T_INTEGER, w.str(), ": attribute 'heads' must be int32, is ",
              type_text(t));
  const hssize_t n = a.getSpace().getSimpleExtentNpoints();
  KVARN_CHECK(n <= info.num_q_heads, w.str(), ": attribute 'heads' has ", n,
              " entries, more than the model's ", info.num_q_heads, " query heads");
  std::vector<int> heads(n);
  if (n > 0) a.read(H5::PredType::NATIVE_INT, heads.data());
  KVARN_CHECK(n > 0, w.str(), ": attribute 'heads' is empty");
  for (std::size_t j = 0; j < heads.size(); ++j) {
    KVARN_CHECK(heads[j] >= 0 && heads[j] < info.num_q_heads, w.str(), ": heads[", j,
                "] = ", heads[j], " is outside the model's ", info.num_q_heads, " query heads");
  }
  const hsize_t L = info.layers.size(), D = info.head_dim;
  check_slab_dataset(ds, {L, static_cast<hsize_t>(n), T, D},
                     "[captured layers, len(heads), num_tokens, head_dim]", size, w);
  check_post_rope(ds, 1, w);
  return heads;
}

// One sequence group: its attributes and its datasets' dtypes, shapes and storage.
SequenceInfo walk_sequence(const H5::Group& seqs, const std::string& name, const TileFileInfo& info,
                           const std::string& f, std::uintmax_t size) {
  const std::string gpath = "/sequences/" + name;
  const Where wg{f, gpath};
  KVARN_CHECK(seqs.childObjType(name) == H5O_TYPE_GROUP, wg.str(), ": not a group");
  H5::Group g = seqs.openGroup(name);
  SequenceInfo si;
  si.name = name;
  si.num_tokens = read_positive_int_attr(g, "num_tokens", wg);
  si.prompt_id = read_string_attr(g, "prompt_id", wg);
  const hsize_t T = si.num_tokens;
  const hsize_t L = info.layers.size(), H = info.num_kv_heads, D = info.head_dim;
  for (const char* req : {"token_ids", "k", "v"}) {
    KVARN_CHECK(g.nameExists(req), f, ": ", gpath, "/", req, ": missing dataset");
  }
  {
    const Where w{f, gpath + "/token_ids"};
    H5::DataSet ds = g.openDataSet("token_ids");
    H5::DataType t = ds.getDataType();
    KVARN_CHECK(t.getClass() == H5T_INTEGER, w.str(), ": dtype is ", type_text(t),
                ", expected int32");
    std::vector<hsize_t> dims = extent(ds);
    KVARN_CHECK(dims == std::vector<hsize_t>{T}, w.str(), ": shape is ", dims_text(dims),
                ", expected [", T, "] (num_tokens)");
    check_backed(ds, dims, t.getSize(), size, w);
  }
  const std::string kv_text = "[captured layers, num_kv_heads, num_tokens, head_dim]";
  for (const char* slab : {"k", "v", "k_pre_rope"}) {
    if (!g.nameExists(slab)) continue;
    const Where w{f, gpath + "/" + slab};
    H5::DataSet ds = g.openDataSet(slab);
    check_slab_dataset(ds, {L, H, T, D}, kv_text, size, w);
    if (std::string(slab) != "v") check_post_rope(ds, std::string(slab) == "k" ? 1 : 0, w);
  }
  si.has_k_pre_rope = g.nameExists("k_pre_rope");
  if (g.nameExists("q")) {
    si.q_heads = walk_q(g.openDataSet("q"), info, T, size, Where{f, gpath + "/q"});
    si.has_q = true;
  }
  return si;
}

// The whole structure walk of an open file: every attribute, dataset dtype, shape and chunk
// index the reader relies on. Runs only in the probe child (TileReader's constructor).
void walk_file(const H5::H5File& file, const std::string& f, std::uintmax_t size,
               TileFileInfo* info, std::vector<SequenceInfo>* sequences) {
  ++structure_walks;
  try {
    *info = walk_root(file, f, size);
    KVARN_CHECK(file.nameExists("sequences"), f, ": /sequences: missing group");
    H5::Group seqs = file.openGroup("sequences");
    std::vector<std::string> names;
    for (hsize_t i = 0; i < seqs.getNumObjs(); ++i) names.push_back(seqs.getObjnameByIdx(i));
    std::sort(names.begin(), names.end());
    KVARN_CHECK(!names.empty(), f, ": /sequences: no sequences");
    for (std::size_t i = 0; i < names.size(); ++i) {
      const std::string expect = sequence_name(static_cast<int>(i));
      KVARN_CHECK(names[i] == expect, f, ": /sequences/", names[i],
                  ": unexpected name (sequences must be named 000000, 000001, ... without gaps; "
                  "expected ",
                  expect, ")");
      sequences->push_back(walk_sequence(seqs, names[i], *info, f, size));
    }
  } catch (const H5::Exception& e) {
    fail(f, ": HDF5 error while reading the file structure: ", h5::describe(e));
  }
}

// What the probe child sends back: "ok" and the file's structure, or "error" and the error
// message without the file's name (the child of in-memory images does not know their label).
void put_int(std::string& out, long long v) { put_text(out, std::to_string(v)); }

bool take_int(const std::string& in, std::size_t& pos, long long& v) {
  std::string text;
  if (!take_text(in, pos, text)) return false;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  return ec == std::errc() && end == text.data() + text.size();
}

template <typename Int>
bool take_int_as(const std::string& in, std::size_t& pos, Int& v) {
  long long x = 0;
  if (!take_int(in, pos, x) || !std::in_range<Int>(x)) return false;
  v = static_cast<Int>(x);
  return true;
}

bool take_ints(const std::string& in, std::size_t& pos, std::vector<int>& v) {
  std::size_t n = 0;
  if (!take_int_as(in, pos, n) || n > in.size() - pos) return false;
  v.resize(n);
  for (int& x : v) {
    if (!take_int_as(in, pos, x)) return false;
  }
  return true;
}

void put_ints(std::string& out, const std::vector<int>& v) {
  put_int(out, static_cast<long long>(v.size()));
  for (int x : v) put_int(out, x);
}

std::string encode_structure(const TileFileInfo& info, const std::vector<SequenceInfo>& seqs) {
  std::string out;
  put_text(out, "ok");
  put_text(out, info.model);
  for (int v : {info.num_layers, info.num_kv_heads, info.num_q_heads, info.head_dim}) {
    put_int(out, v);
  }
  std::uint64_t theta_bits = 0;
  if (info.rope_theta) std::memcpy(&theta_bits, &*info.rope_theta, sizeof(theta_bits));
  put_int(out, info.rope_theta ? 1 : 0);
  put_text(out, std::to_string(theta_bits));
  put_text(out, info.source);
  put_text(out, info.provenance);
  put_ints(out, info.layers);
  put_int(out, static_cast<long long>(seqs.size()));
  for (const SequenceInfo& si : seqs) {
    put_text(out, si.name);
    put_int(out, si.num_tokens);
    put_text(out, si.prompt_id);
    put_int(out, (si.has_k_pre_rope ? 1 : 0) | (si.has_q ? 2 : 0));
    put_ints(out, si.q_heads);
  }
  return out;
}

std::string encode_error(const std::string& f, const std::string& what) {
  std::string out;
  put_text(out, "error");
  const std::string prefix = f + ": ";
  put_text(out, what.rfind(prefix, 0) == 0 ? what.substr(prefix.size()) : what);
  return out;
}

bool take_theta(const std::string& in, std::size_t& pos, std::optional<double>& theta) {
  long long has = 0;
  std::string bits_text;
  if (!take_int(in, pos, has) || !take_text(in, pos, bits_text)) return false;
  std::uint64_t bits = 0;
  const auto [end, ec] =
      std::from_chars(bits_text.data(), bits_text.data() + bits_text.size(), bits);
  if (ec != std::errc() || end != bits_text.data() + bits_text.size()) return false;
  if (has) {
    double v = 0;
    std::memcpy(&v, &bits, sizeof(v));
    theta = v;
  }
  return true;
}

bool take_sequence(const std::string& in, std::size_t& pos, SequenceInfo& si) {
  int flags = 0;
  if (!take_text(in, pos, si.name) || !take_int_as(in, pos, si.num_tokens) ||
      !take_text(in, pos, si.prompt_id) || !take_int_as(in, pos, flags) ||
      !take_ints(in, pos, si.q_heads)) {
    return false;
  }
  si.has_k_pre_rope = (flags & 1) != 0;
  si.has_q = (flags & 2) != 0;
  return true;
}

// Fills *info and *seqs from the probe child's record; throws the child's error (naming `f`).
void decode_structure(const std::string& f, const std::string& in, TileFileInfo* info,
                      std::vector<SequenceInfo>* seqs) {
  std::size_t pos = 0;
  std::string kind, text;
  bool ok = take_text(in, pos, kind);
  if (ok && kind == "error" && take_text(in, pos, text)) fail(f, ": ", text);
  ok = ok && kind == "ok" && take_text(in, pos, info->model);
  for (int* v : {&info->num_layers, &info->num_kv_heads, &info->num_q_heads, &info->head_dim}) {
    ok = ok && take_int_as(in, pos, *v);
  }
  ok = ok && take_theta(in, pos, info->rope_theta) && take_text(in, pos, info->source) &&
       take_text(in, pos, info->provenance) && take_ints(in, pos, info->layers);
  std::size_t n = 0;
  ok = ok && take_int_as(in, pos, n) && n <= in.size() - pos;
  for (std::size_t i = 0; ok && i < n; ++i) {
    ok = take_sequence(in, pos, seqs->emplace_back());
  }
  KVARN_CHECK(ok && pos == in.size(), f,
              ": the probe process sent back a damaged description of the file structure");
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Reader

struct TileReader::Impl {
  H5::H5File file;
  std::uintmax_t file_size = 0;
};

TileReader::TileReader(const fs::path& path) : TileReader(path, std::nullopt, nullptr) {}

TileReader::TileReader(const fs::path& label, const void* image, std::size_t size)
    : TileReader(label, Image{image, size}, nullptr) {}

long long TileReader::string_attribute_reads_in_process() { return string_attr_reads; }

long long TileReader::structure_walks_in_process() { return structure_walks; }

// libhdf5 1.10.8 decodes corrupt object-header messages past the end of their buffer, and what
// it meets there is whatever the process's heap holds next to it: a file the probe child walked
// safely crashed this process (fuzz/crashes/tile_reader/hdf5_attr_decode_overread_*.h5). So the
// walk runs only in the child, which sends back the structure (or the error); this process only
// opens the file and, later, the datasets it reads.
TileReader::TileReader(const fs::path& path, std::optional<Image> image, std::string* record)
    : path_(path) {
  h5::silence_errors();
  const std::string f = path.string();
  const std::uintmax_t size =
      image ? check_image_start(f, image->data, image->size) : check_file_start(path);
  impl_ = std::make_unique<Impl>();
  impl_->file_size = size;
  if (record) {
    // The probe child: the walk, its outcome appended to *record either way.
    try {
      open_file(f, image);
      walk_file(impl_->file, f, size, &info_, &sequences_);
    } catch (const std::exception& e) {
      *record = encode_error(f, e.what());
      throw;
    }
    *record = encode_structure(info_, sequences_);
    return;
  }
  std::string probed;
  if (image) {
    // One long-lived child for every image (the fuzz target opens millions).
    static std::mutex mu;
    static h5::ProbeWorker worker([](const std::string& bytes, std::string& result) {
      const TileReader walked("image", Image{bytes.data(), bytes.size()}, &result);
    });
    const std::lock_guard<std::mutex> lock(mu);
    probed = worker.run(f, "the file structure", image->data, image->size, h5::probe_seconds());
  } else {
    probed = h5::probe_file_once(f, "the file structure", [&](std::string& result) {
      const TileReader walked(path, std::nullopt, &result);
    });
  }
  decode_structure(f, probed, &info_, &sequences_);
  open_file(f, image);
}

void TileReader::open_file(const std::string& f, std::optional<Image> image) {
  try {
    impl_->file = image ? open_image(image->data, image->size) : H5::H5File(f, H5F_ACC_RDONLY);
  } catch (const H5::Exception& e) {
    fail(f, ": cannot open as HDF5 (truncated or corrupt file?): ", h5::describe(e));
  }
}

TileReader::~TileReader() = default;

const SequenceInfo& TileReader::sequence(int seq) const {
  KVARN_CHECK(seq >= 0 && seq < num_sequences(), path_.string(), ": sequence index ", seq,
              " out of range (", num_sequences(), " sequences)");
  return sequences_[seq];
}

std::vector<std::int32_t> TileReader::token_ids(int seq) const {
  const SequenceInfo& si = sequence(seq);
  const std::string obj = "/sequences/" + si.name + "/token_ids";
  try {
    H5::DataSet ds = impl_->file.openDataSet(obj);
    std::vector<std::int32_t> ids(si.num_tokens);
    ds.read(ids.data(), H5::PredType::NATIVE_INT32);
    return ids;
  } catch (const H5::Exception& e) {
    fail(path_.string(), ": ", obj, ": cannot read: ", h5::describe(e));
  }
}

TileMatrix TileReader::read(int seq, const std::string& dataset, int layer_index, int head) const {
  return decode_slab(read_stored(seq, dataset, layer_index, head));
}

StoredSlab TileReader::read_stored(int seq, const std::string& dataset, int layer_index, int head,
                                   SlabRead how) const {
  const SequenceInfo& si = sequence(seq);
  const std::string gpath = "/sequences/" + si.name;
  const std::string f = path_.string();
  if (std::find_if(kSlabDatasets.begin(), kSlabDatasets.end(),
                   [&](const char* n) { return dataset == n; }) == kSlabDatasets.end()) {
    fail(f, ": ", gpath, ": unknown dataset '", dataset, "' (valid: k, v, k_pre_rope, q)");
  }
  const std::string obj = gpath + "/" + dataset;
  KVARN_CHECK(dataset != "k_pre_rope" || si.has_k_pre_rope, f, ": ", obj,
              ": not present in this file (optional dataset)");
  KVARN_CHECK(dataset != "q" || si.has_q, f, ": ", obj,
              ": not present in this file (optional dataset)");
  const int num_layers = info_.num_captured_layers();
  KVARN_CHECK(layer_index >= 0 && layer_index < num_layers, f, ": ", obj, ": layer index ",
              layer_index, " out of range (", num_layers, " captured layers)");
  const int num_heads = dataset == "q" ? static_cast<int>(si.q_heads.size()) : info_.num_kv_heads;
  KVARN_CHECK(head >= 0 && head < num_heads, f, ": ", obj, ": head ", head, " out of range (",
              num_heads, " heads)");
  StoredSlab slab;
  slab.where = f + ": " + obj;
  slab.layer_index = layer_index;
  slab.head = head;
  slab.num_tokens = si.num_tokens;
  slab.head_dim = info_.head_dim;
  const int T = si.num_tokens, D = info_.head_dim;
  try {
    H5::DataSet ds = impl_->file.openDataSet(obj);
    if (how == SlabRead::kAuto && read_direct_chunks(ds, impl_->file_size, &slab)) return slab;
    slab.halfs.resize(static_cast<std::size_t>(T) * D);
    H5::DataSpace fspace = ds.getSpace();
    const hsize_t start[4] = {static_cast<hsize_t>(layer_index), static_cast<hsize_t>(head), 0, 0};
    const hsize_t count[4] = {1, 1, static_cast<hsize_t>(T), static_cast<hsize_t>(D)};
    fspace.selectHyperslab(H5S_SELECT_SET, count, start);
    const hsize_t mdims[2] = {static_cast<hsize_t>(T), static_cast<hsize_t>(D)};
    H5::DataSpace mspace(2, mdims);
    // Read with the file's own half type: no HDF5 conversion, we decode the bits ourselves.
    ds.read(slab.halfs.data(), h5::f16_type(), mspace, fspace);
  } catch (const H5::Exception& e) {
    fail(f, ": ", obj, ": cannot read [layer ", layer_index, ", head ", head,
         "] (truncated or corrupt file?): ", h5::describe(e));
  }
  return slab;
}

void TileReader::validate_values() const {
  for (int s = 0; s < num_sequences(); ++s) {
    const SequenceInfo& si = sequences_[s];
    for (const char* name : kSlabDatasets) {
      const std::string n = name;
      if ((n == "k_pre_rope" && !si.has_k_pre_rope) || (n == "q" && !si.has_q)) continue;
      const int heads = n == "q" ? static_cast<int>(si.q_heads.size()) : info_.num_kv_heads;
      for (int l = 0; l < info_.num_captured_layers(); ++l) {
        for (int h = 0; h < heads; ++h) read(s, n, l, h);
      }
    }
    token_ids(s);
  }
}

// ---------------------------------------------------------------------------------------------
// Writer

struct TileWriter::Impl {
  H5::H5File file;
  H5::Group sequences;
};

TileWriter::TileWriter(const fs::path& path, TileFileInfo info, bool overwrite,
                       TileCompression compression)
    : path_(path),
      tmp_(temp_path_for(path)),
      info_(std::move(info)),
      overwrite_(overwrite),
      compression_(compression) {
  h5::silence_errors();
  const std::string f = path.string();
  KVARN_CHECK(overwrite || !fs::exists(path), f, ": refusing to overwrite an existing file");
  KVARN_CHECK(
      info_.num_layers > 0 && info_.num_kv_heads > 0 && info_.num_q_heads > 0 && info_.head_dim > 0,
      f, ": TileFileInfo needs positive num_layers, num_kv_heads, num_q_heads, head_dim");
  KVARN_CHECK(!info_.layers.empty(), f, ": TileFileInfo.layers is empty");
  for (int l : info_.layers) {
    KVARN_CHECK(l >= 0 && l < info_.num_layers, f, ": captured layer ", l,
                " is outside the model's ", info_.num_layers, " layers");
  }
  if (!path.parent_path().empty()) fs::create_directories(path.parent_path());
  impl_ = std::make_unique<Impl>();
  try {
    impl_->file = h5::create_file(tmp_.string());
    H5::H5File& file = impl_->file;
    h5::write_string_attr(file, "format", kTileFormat);
    h5::write_int_attr(file, "format_version", kTileFormatVersion);
    h5::write_string_attr(file, "model", info_.model);
    h5::write_int_attr(file, "num_layers", info_.num_layers);
    h5::write_int_attr(file, "num_kv_heads", info_.num_kv_heads);
    h5::write_int_attr(file, "num_q_heads", info_.num_q_heads);
    h5::write_int_attr(file, "head_dim", info_.head_dim);
    if (info_.rope_theta) h5::write_double_attr(file, "rope_theta", *info_.rope_theta);
    h5::write_string_attr(file, "source", info_.source);
    h5::write_string_attr(file, "provenance", info_.provenance);
    const hsize_t n = info_.layers.size();
    std::vector<std::int32_t> layers(info_.layers.begin(), info_.layers.end());
    h5::write_dataset(file, "layers", H5::PredType::STD_I32LE, H5::PredType::NATIVE_INT32, {n},
                      layers.data());
    impl_->sequences = h5::create_group(file, "sequences");
  } catch (const H5::Exception& e) {
    impl_.reset();
    std::error_code ec;
    fs::remove(tmp_, ec);
    fail(tmp_.string(), ": cannot create: ", h5::describe(e));
  }
}

TileWriter::~TileWriter() {
  if (!impl_) return;
  try {
    impl_.reset();
  } catch (...) {  // a destructor must not throw; the file is discarded anyway
  }
  std::error_code ec;
  fs::remove(tmp_, ec);
}

void TileWriter::add_sequence(const SequenceData& seq) {
  KVARN_CHECK(impl_, path_.string(), ": add_sequence after finish");
  const std::string name = sequence_name(num_sequences_);
  const std::string where = path_.string() + ": /sequences/" + name;
  const std::size_t T = seq.token_ids.size();
  const std::size_t L = info_.layers.size(), H = info_.num_kv_heads, D = info_.head_dim;
  KVARN_CHECK(T > 0, where, ": no tokens");
  const std::size_t kv = L * H * T * D;
  KVARN_CHECK(seq.k.size() == kv && seq.v.size() == kv, where, ": k/v have ", seq.k.size(), "/",
              seq.v.size(), " values, expected L*H*T*D = ", kv);
  KVARN_CHECK(seq.k_pre_rope.empty() || seq.k_pre_rope.size() == kv, where, ": k_pre_rope has ",
              seq.k_pre_rope.size(), " values, expected ", kv);
  const std::size_t hq = seq.q_heads.size();
  KVARN_CHECK(seq.q.size() == L * hq * T * D, where, ": q has ", seq.q.size(),
              " values, expected L*len(q_heads)*T*D = ", L * hq * T * D);
  for (int h : seq.q_heads) {
    KVARN_CHECK(h >= 0 && h < info_.num_q_heads, where, ": q head ", h, " out of range");
  }
  try {
    H5::Group g = h5::create_group(impl_->sequences, name);
    h5::write_int_attr(g, "num_tokens", static_cast<long long>(T));
    h5::write_string_attr(g, "prompt_id", seq.prompt_id);
    for (const auto& [key, value] : seq.int_attrs) h5::write_int_attr(g, key, value);
    for (const auto& [key, value] : seq.string_attrs) h5::write_string_attr(g, key, value);
    h5::write_dataset(g, "token_ids", H5::PredType::STD_I32LE, H5::PredType::NATIVE_INT32, {T},
                      seq.token_ids.data());
    auto write_slab = [&](const char* ds_name, const std::vector<float>& x, hsize_t heads,
                          int post_rope) {
      std::vector<std::uint16_t> half(x.size());
      for (std::size_t i = 0; i < x.size(); ++i) {
        half[i] = h5::float_to_half(x[i]);
        if (!h5::half_is_finite(half[i])) {
          const std::size_t per_head = T * D, per_layer = heads * per_head;
          fail(where, "/", ds_name, ": non-finite value (", x[i],
               ", or beyond fp16 range) at [layer ", i / per_layer, ", head ",
               (i % per_layer) / per_head, ", token ", (i % per_head) / D, ", channel ", i % D,
               "]");
        }
      }
      H5::DataSet ds = h5::write_dataset(
          g, ds_name, h5::f16_type(), h5::f16_type(), {L, heads, T, D}, half.data(),
          {1, 1, std::min<hsize_t>(T, 256), D},
          compression_ == TileCompression::kGzip ? h5::Compression::kGzip : h5::Compression::kNone);
      if (post_rope >= 0) h5::write_int_attr(ds, "post_rope", post_rope);
      return ds;
    };
    write_slab("k", seq.k, H, 1);
    write_slab("v", seq.v, H, -1);
    if (!seq.k_pre_rope.empty()) write_slab("k_pre_rope", seq.k_pre_rope, H, 0);
    if (hq > 0) {
      H5::DataSet q = write_slab("q", seq.q, hq, 1);
      h5::write_ints_attr(q, "heads", seq.q_heads);
    }
  } catch (const H5::Exception& e) {
    fail(where, ": cannot write: ", h5::describe(e));
  }
  ++num_sequences_;
}

void TileWriter::set_provenance(const std::string& json) {
  KVARN_CHECK(impl_, path_.string(), ": set_provenance after finish");
  try {
    if (impl_->file.attrExists("provenance")) impl_->file.removeAttr("provenance");
    h5::write_string_attr(impl_->file, "provenance", json);
  } catch (const H5::Exception& e) {
    fail(path_.string(), ": cannot write the provenance attribute: ", h5::describe(e));
  }
  info_.provenance = json;
}

void TileWriter::finish() {
  KVARN_CHECK(impl_, path_.string(), ": finish called twice");
  const std::string f = path_.string();
  KVARN_CHECK(num_sequences_ > 0, f, ": a tile file needs at least one sequence");
  try {
    impl_->sequences.close();
    impl_->file.close();
  } catch (const H5::Exception& e) {
    fail(tmp_.string(), ": cannot close: ", h5::describe(e));
  }
  impl_.reset();
  std::error_code ec;
  if (!overwrite_ && fs::exists(path_)) {
    fs::remove(tmp_, ec);
    fail(f, ": refusing to overwrite an existing file");
  }
  int fd = ::open(tmp_.c_str(), O_RDONLY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
  fs::rename(tmp_, path_, ec);
  if (ec) {
    fs::remove(tmp_, ec);
    fail(f, ": cannot move the finished file into place: ", ec.message());
  }
}

}  // namespace kvarn
