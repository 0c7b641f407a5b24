#include "kvarn/data/quantized_file.hpp"

#include <algorithm>
#include <cstdio>

#ifdef __linux__
#include <fcntl.h>
#endif

#include "kvarn/data/atomic_file.hpp"
#include "kvarn/data/error.hpp"
#include "kvarn/data/h5_io.hpp"

namespace kvarn {

namespace fs = std::filesystem;

std::string quantized_group_name(const char* prefix, int index) {
  char buf[48];
  std::snprintf(buf, sizeof(buf), "%s_%02d", prefix, index);
  return buf;
}

std::size_t QuantizedStream::payload_bytes() const {
  std::size_t b = 0;
  for (const QuantizedField& f : fields) b += f.bytes.size();
  return b;
}

namespace {

// Every slab adds 3 groups, a dozen datasets and 31 attributes: their headers come from 1 MiB
// blocks instead of the default 2 KiB ones (fewer file-space allocations).
constexpr hsize_t kMetaBlockBytes = hsize_t{1} << 20;

struct FieldType {
  const H5::PredType* type;  // file and memory type: the bytes are little endian already
  std::size_t size;
};

FieldType field_type(const std::string& dtype, const std::string& where) {
  if (dtype == "u8") return {&H5::PredType::STD_U8LE, 1};
  if (dtype == "f16") return {&H5::PredType::STD_U16LE, 2};  // raw IEEE half bits
  if (dtype == "f32") return {&H5::PredType::IEEE_F32LE, 4};
  fail(where, ": unknown field dtype '", dtype, "' (valid: u8, f16, f32)");
}

// Contiguous and unfiltered: the payload is quantized codes and scales that do
// not compress, and a reader wants whole datasets.
H5::DataSet write_plain(H5::Group& g, const std::string& name, const H5::DataType& type,
                        const std::vector<hsize_t>& dims, const void* data) {
  H5::DataSpace space(static_cast<int>(dims.size()), dims.data());
  H5::DataSet ds = g.createDataSet(name, type, space);
  hsize_t total = 1;
  for (hsize_t d : dims) total *= d;
  if (total > 0) ds.write(data, type);
  return ds;
}

void write_stream(H5::Group& parent, const char* name, const QuantizedStream& s,
                  const std::string& where) {
  H5::Group g = h5::create_group(parent, name);
  h5::write_int_attr(g, "num_chunks", s.num_chunks());
  h5::write_int_attr(g, "chunk_tokens", s.chunk_tokens);
  h5::write_int_attr(g, "sink", s.sink);
  h5::write_int_attr(g, "keep_recent", s.keep_recent);
  h5::write_int_attr(g, "chunk_bytes", s.chunk_bytes);
  h5::write_int_attr(g, "kept_tokens", s.kept_tokens);
  h5::write_int_attr(g, "kept_token_bytes", s.kept_token_bytes);
  h5::write_double_attr(g, "code_bits", s.code_bits);
  const hsize_t n = s.first_token.size();
  write_plain(g, "first_token", H5::PredType::STD_I32LE, {n}, s.first_token.data());
  for (const QuantizedField& f : s.fields) {
    const std::string w = where + "/" + name + "/" + f.name;
    const FieldType ft = field_type(f.dtype, w);
    std::vector<hsize_t> dims{n};
    std::size_t elems = n;
    for (std::size_t d : f.shape) {
      dims.push_back(d);
      elems *= d;
    }
    KVARN_CHECK(elems * ft.size == f.bytes.size(), w, ": field holds ", f.bytes.size(),
                " bytes but its shape and dtype say ", elems * ft.size);
    H5::DataSet ds = write_plain(g, f.name, *ft.type, dims, f.bytes.data());
    h5::write_string_attr(ds, "dtype", f.dtype);
  }
}

void write_head(H5::Group& gl, int head, const QuantizedSlab& s, bool reconstruction, int d,
                const std::string& where) {
  const hsize_t t = s.num_tokens;
  KVARN_CHECK(s.k_quantized.size() == t && s.v_quantized.size() == t, where,
              ": quantized-token masks must have ", t, " entries");
  H5::Group gh = h5::create_group(gl, quantized_group_name("head", head));
  if (reconstruction) {
    const std::size_t n = static_cast<std::size_t>(t) * d;
    KVARN_CHECK(s.k_hat.size() == n && s.v_hat.size() == n, where,
                ": reconstructions must have T*D = ", n, " values");
    write_plain(gh, "k_hat", H5::PredType::IEEE_F32LE, {t, static_cast<hsize_t>(d)},
                s.k_hat.data());
    write_plain(gh, "v_hat", H5::PredType::IEEE_F32LE, {t, static_cast<hsize_t>(d)},
                s.v_hat.data());
  }
  write_plain(gh, "k_quantized", H5::PredType::STD_U8LE, {t}, s.k_quantized.data());
  write_plain(gh, "v_quantized", H5::PredType::STD_U8LE, {t}, s.v_quantized.data());
  write_stream(gh, "k", s.k, where);
  write_stream(gh, "v", s.v, where);
  h5::write_int_attr(gh, "num_tokens", s.num_tokens);
  h5::write_int_attr(gh, "stored_bytes", s.stored_bytes);
  h5::write_int_attr(gh, "accounted_bytes", s.accounted_bytes);
  h5::write_int_attr(gh, "fp16_bytes", s.fp16_bytes);
  h5::write_int_attr(gh, "layer_skipped", s.layer_skipped ? 1 : 0);
  h5::write_double_attr(gh, "k_nmse", s.k_nmse);
  h5::write_double_attr(gh, "v_nmse", s.v_nmse);
}

}  // namespace

struct QuantizedFileWriter::Impl {
  H5::H5File file;
  H5::Group sequences, sequence, layer;
  std::string sequence_name;
  int layer_index = -1;
  int fd = -1;  // the file's descriptor under HDF5's default (sec2) driver, else -1
  int slabs_since_writeback = 0;
};

namespace {

// Slabs between two requests to start writing the file's dirty pages back.
constexpr int kWritebackSlabs = 16;

int file_descriptor(const H5::H5File& file) {
  if (H5Pget_driver(file.getAccessPlist().getId()) != H5FD_SEC2) return -1;
  void* handle = nullptr;
  if (H5Fget_vfd_handle(file.getId(), H5P_DEFAULT, &handle) < 0 || !handle) return -1;
  return *static_cast<int*>(handle);
}

// Starts the kernel's writeback of what was written so far without waiting for it, so that the
// fsync when the file is committed has little left to wait for (it runs after the last slab,
// with nothing to overlap it).
void start_writeback(int fd) {
#ifdef __linux__
  if (fd >= 0) ::sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE);
#else
  (void)fd;
#endif
}

}  // namespace

QuantizedFileWriter::QuantizedFileWriter(const fs::path& path, QuantizedFileInfo info,
                                         bool overwrite)
    : path_(path), tmp_(temp_path_for(path)), info_(std::move(info)), overwrite_(overwrite) {
  h5::silence_errors();
  const std::string f = path.string();
  KVARN_CHECK(overwrite || !fs::exists(path), f, ": already exists (use --force to overwrite)");
  KVARN_CHECK(info_.head_dim > 0 && info_.num_layers > 0, f,
              ": QuantizedFileInfo needs positive head_dim and num_layers");
  impl_ = std::make_unique<Impl>();
  try {
    impl_->file = h5::create_file(tmp_.string(), kMetaBlockBytes);
    H5::H5File& file = impl_->file;
    h5::write_string_attr(file, "format", kQuantizedFormat);
    h5::write_int_attr(file, "format_version", kQuantizedFormatVersion);
    h5::write_string_attr(file, "method", info_.method);
    h5::write_string_attr(file, "method_spec", info_.method_spec);
    h5::write_string_attr(file, "source_file", info_.source_file);
    h5::write_string_attr(file, "model", info_.model);
    h5::write_int_attr(file, "num_layers", info_.num_layers);
    h5::write_int_attr(file, "head_dim", info_.head_dim);
    h5::write_int_attr(file, "reconstruction", info_.reconstruction ? 1 : 0);
    h5::write_string_attr(file, "provenance", info_.provenance);
    impl_->sequences = h5::create_group(file, "sequences");
    impl_->fd = file_descriptor(file);
  } catch (const H5::Exception& e) {
    impl_.reset();
    std::error_code ec;
    fs::remove(tmp_, ec);
    fail(tmp_.string(), ": cannot create: ", h5::describe(e));
  }
}

QuantizedFileWriter::~QuantizedFileWriter() {
  if (!impl_) return;
  try {
    impl_.reset();
  } catch (...) {  // a destructor must not throw; the file is discarded anyway
  }
  std::error_code ec;
  fs::remove(tmp_, ec);
}

void QuantizedFileWriter::add_slab(const SlabKey& key, const QuantizedSlab& slab) {
  KVARN_CHECK(impl_, path_.string(), ": add_slab after finish");
  const std::string layer = quantized_group_name("layer", key.model_layer);
  const std::string where = path_.string() + ": /sequences/" + key.sequence + "/" + layer + "/" +
                            quantized_group_name("head", key.head);
  KVARN_CHECK(slab.num_tokens == key.num_tokens, where, ": slab has ", slab.num_tokens,
              " tokens, its sequence ", key.num_tokens);
  Impl& m = *impl_;
  try {
    if (key.sequence != m.sequence_name) {
      m.sequence = h5::create_group(m.sequences, key.sequence);
      h5::write_int_attr(m.sequence, "num_tokens", key.num_tokens);
      h5::write_string_attr(m.sequence, "prompt_id", key.prompt_id);
      m.sequence_name = key.sequence;
      m.layer_index = -1;
    }
    if (key.model_layer != m.layer_index) {
      m.layer = h5::create_group(m.sequence, layer);
      h5::write_int_attr(m.layer, "model_layer", key.model_layer);
      h5::write_int_attr(m.layer, "captured_index", key.captured_index);
      m.layer_index = key.model_layer;
    }
    write_head(m.layer, key.head, slab, info_.reconstruction, info_.head_dim, where);
    if (++m.slabs_since_writeback == kWritebackSlabs) {
      start_writeback(m.fd);
      m.slabs_since_writeback = 0;
    }
  } catch (const H5::Exception& e) {
    fail(where, ": cannot write: ", h5::describe(e));
  }
}

void QuantizedFileWriter::finish() {
  KVARN_CHECK(impl_, path_.string(), ": finish called twice");
  try {
    impl_->layer.close();
    impl_->sequence.close();
    impl_->sequences.close();
    impl_->file.close();
  } catch (const H5::Exception& e) {
    fail(tmp_.string(), ": cannot close: ", h5::describe(e));
  }
  impl_.reset();
  commit_temp_file(tmp_, path_, overwrite_);
}

// ---------------------------------------------------------------------------------------------
namespace {

std::string read_string(const H5::H5Object& o, const char* name, const std::string& where) {
  KVARN_CHECK(o.attrExists(name), where, ": missing attribute '", name, "'");
  H5::Attribute a = o.openAttribute(name);
  KVARN_CHECK(a.getDataType().getClass() == H5T_STRING, where, ": attribute '", name,
              "' must be a string");
  std::string s;
  a.read(a.getStrType(), s);
  return s;
}

long long read_int(const H5::H5Object& o, const char* name, const std::string& where) {
  KVARN_CHECK(o.attrExists(name), where, ": missing attribute '", name, "'");
  H5::Attribute a = o.openAttribute(name);
  KVARN_CHECK(
      a.getDataType().getClass() == H5T_INTEGER && a.getSpace().getSimpleExtentNpoints() == 1,
      where, ": attribute '", name, "' must be a scalar integer");
  long long v = 0;
  a.read(H5::PredType::NATIVE_LLONG, &v);
  return v;
}

double read_double(const H5::H5Object& o, const char* name, const std::string& where) {
  KVARN_CHECK(o.attrExists(name), where, ": missing attribute '", name, "'");
  H5::Attribute a = o.openAttribute(name);
  KVARN_CHECK(a.getDataType().getClass() == H5T_FLOAT && a.getSpace().getSimpleExtentNpoints() == 1,
              where, ": attribute '", name, "' must be a scalar float");
  double v = 0;
  a.read(H5::PredType::NATIVE_DOUBLE, &v);
  return v;
}

// Reads a whole dataset of `elem_size`-byte elements as raw little-endian
// bytes; returns dims.
std::vector<hsize_t> read_raw(const H5::Group& g, const std::string& name, const H5::PredType& type,
                              std::size_t elem_size, std::vector<std::uint8_t>* out,
                              const std::string& where) {
  KVARN_CHECK(g.nameExists(name), where, ": missing dataset '", name, "'");
  H5::DataSet ds = g.openDataSet(name);
  H5::DataType ft = ds.getDataType();
  KVARN_CHECK(ft.getSize() == elem_size, where, "/", name, ": element size ", ft.getSize(),
              ", expected ", elem_size);
  H5::DataSpace space = ds.getSpace();
  const int rank = space.getSimpleExtentNdims();
  std::vector<hsize_t> dims(rank);
  if (rank > 0) space.getSimpleExtentDims(dims.data());
  out->resize(static_cast<std::size_t>(space.getSimpleExtentNpoints()) * elem_size);
  if (!out->empty()) ds.read(out->data(), type);
  return dims;
}

template <typename T>
std::vector<T> read_vector(const H5::Group& g, const std::string& name, const H5::PredType& type,
                           const std::string& where) {
  std::vector<std::uint8_t> raw;
  read_raw(g, name, type, sizeof(T), &raw, where);
  std::vector<T> v(raw.size() / sizeof(T));
  if (!v.empty()) std::copy(raw.begin(), raw.end(), reinterpret_cast<std::uint8_t*>(v.data()));
  return v;
}

QuantizedStream read_stream(const H5::Group& parent, const char* name, const std::string& where) {
  const std::string w = where + "/" + name;
  KVARN_CHECK(parent.nameExists(name), where, ": missing stream group '", name, "'");
  H5::Group g = parent.openGroup(name);
  QuantizedStream s;
  s.chunk_tokens = static_cast<int>(read_int(g, "chunk_tokens", w));
  s.sink = static_cast<int>(read_int(g, "sink", w));
  s.keep_recent = static_cast<int>(read_int(g, "keep_recent", w));
  s.chunk_bytes = read_int(g, "chunk_bytes", w);
  s.kept_tokens = static_cast<int>(read_int(g, "kept_tokens", w));
  s.kept_token_bytes = read_int(g, "kept_token_bytes", w);
  s.code_bits = read_double(g, "code_bits", w);
  s.first_token = read_vector<std::int32_t>(g, "first_token", H5::PredType::STD_I32LE, w);
  KVARN_CHECK(read_int(g, "num_chunks", w) == s.num_chunks(), w,
              ": num_chunks disagrees with first_token");
  for (hsize_t i = 0; i < g.getNumObjs(); ++i) {
    const std::string fname = g.getObjnameByIdx(i);
    if (fname == "first_token") continue;
    H5::DataSet ds = g.openDataSet(fname);
    QuantizedField f;
    f.name = fname;
    f.dtype = read_string(ds, "dtype", w + "/" + fname);
    const FieldType ft = field_type(f.dtype, w + "/" + fname);
    const std::vector<hsize_t> dims = read_raw(g, fname, *ft.type, ft.size, &f.bytes, w);
    KVARN_CHECK(!dims.empty() && dims[0] == s.first_token.size(), w, "/", fname,
                ": first axis must be num_chunks = ", s.num_chunks());
    f.shape.assign(dims.begin() + 1, dims.end());
    s.fields.push_back(std::move(f));
  }
  return s;
}

}  // namespace

struct QuantizedFileReader::Impl {
  H5::H5File file;
};

QuantizedFileReader::QuantizedFileReader(const fs::path& path) : path_(path) {
  h5::silence_errors();
  const std::string f = path.string();
  KVARN_CHECK(fs::exists(path), f, ": no such file");
  impl_ = std::make_unique<Impl>();
  try {
    impl_->file = H5::H5File(f, H5F_ACC_RDONLY);
    const H5::H5File& file = impl_->file;
    const std::string fmt = read_string(file, "format", f);
    KVARN_CHECK(fmt == kQuantizedFormat, f, ": format is '", fmt, "', expected '", kQuantizedFormat,
                "'");
    const long long version = read_int(file, "format_version", f);
    KVARN_CHECK(version == kQuantizedFormatVersion, f, ": format_version ", version,
                " is not supported (this reader reads ", kQuantizedFormatVersion, ")");
    info_.method = read_string(file, "method", f);
    info_.method_spec = read_string(file, "method_spec", f);
    info_.source_file = read_string(file, "source_file", f);
    info_.model = read_string(file, "model", f);
    info_.num_layers = static_cast<int>(read_int(file, "num_layers", f));
    info_.head_dim = static_cast<int>(read_int(file, "head_dim", f));
    info_.reconstruction = read_int(file, "reconstruction", f) != 0;
    info_.provenance = read_string(file, "provenance", f);
    H5::Group seqs = file.openGroup("sequences");
    for (hsize_t i = 0; i < seqs.getNumObjs(); ++i) {
      SlabKey key;
      key.sequence = seqs.getObjnameByIdx(i);
      H5::Group gs = seqs.openGroup(key.sequence);
      const std::string ws = f + ": /sequences/" + key.sequence;
      key.num_tokens = static_cast<int>(read_int(gs, "num_tokens", ws));
      key.prompt_id = read_string(gs, "prompt_id", ws);
      for (hsize_t j = 0; j < gs.getNumObjs(); ++j) {
        H5::Group gl = gs.openGroup(gs.getObjnameByIdx(j));
        const std::string wl = ws + "/" + gs.getObjnameByIdx(j);
        key.model_layer = static_cast<int>(read_int(gl, "model_layer", wl));
        key.captured_index = static_cast<int>(read_int(gl, "captured_index", wl));
        for (hsize_t h = 0; h < gl.getNumObjs(); ++h) {
          const std::string hn = gl.getObjnameByIdx(h);
          KVARN_CHECK(hn.rfind("head_", 0) == 0, wl, ": unexpected object '", hn, "'");
          key.head = std::stoi(hn.substr(5));
          slabs_.push_back(key);
        }
      }
    }
  } catch (const H5::Exception& e) {
    fail(f, ": cannot read (truncated or corrupt file?): ", h5::describe(e));
  } catch (const std::logic_error& e) {
    fail(f, ": malformed group name: ", e.what());
  }
}

QuantizedFileReader::~QuantizedFileReader() = default;

QuantizedSlab QuantizedFileReader::read(const SlabKey& key) const {
  const std::string obj = "/sequences/" + key.sequence + "/" +
                          quantized_group_name("layer", key.model_layer) + "/" +
                          quantized_group_name("head", key.head);
  const std::string where = path_.string() + ": " + obj;
  QuantizedSlab s;
  try {
    KVARN_CHECK(impl_->file.nameExists(obj), where, ": no such slab");
    H5::Group g = impl_->file.openGroup(obj);
    s.num_tokens = static_cast<int>(read_int(g, "num_tokens", where));
    s.stored_bytes = read_int(g, "stored_bytes", where);
    s.accounted_bytes = read_int(g, "accounted_bytes", where);
    s.fp16_bytes = read_int(g, "fp16_bytes", where);
    s.layer_skipped = read_int(g, "layer_skipped", where) != 0;
    s.k_nmse = read_double(g, "k_nmse", where);
    s.v_nmse = read_double(g, "v_nmse", where);
    s.k_quantized = read_vector<std::uint8_t>(g, "k_quantized", H5::PredType::STD_U8LE, where);
    s.v_quantized = read_vector<std::uint8_t>(g, "v_quantized", H5::PredType::STD_U8LE, where);
    if (info_.reconstruction) {
      s.k_hat = read_vector<float>(g, "k_hat", H5::PredType::IEEE_F32LE, where);
      s.v_hat = read_vector<float>(g, "v_hat", H5::PredType::IEEE_F32LE, where);
    }
    s.k = read_stream(g, "k", where);
    s.v = read_stream(g, "v", where);
  } catch (const H5::Exception& e) {
    fail(where, ": cannot read (truncated or corrupt file?): ", h5::describe(e));
  }
  return s;
}

}  // namespace kvarn
