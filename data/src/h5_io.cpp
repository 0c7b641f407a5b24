#include "kvarn/data/h5_io.hpp"

#include <algorithm>
#include <cstring>

namespace kvarn::h5 {

void silence_errors() {
  static const bool done = [] {
    H5::Exception::dontPrint();
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    return true;
  }();
  (void)done;
}

const H5::FloatType& f16_type() {
  static const H5::FloatType type = [] {
    H5::FloatType t(H5::PredType::IEEE_F32LE);
    // Order matters: shrink the fields while they still fit in 4 bytes, then the size.
    t.setFields(15, 10, 5, 0, 10);
    t.setSize(2);
    t.setEbias(15);
    return t;
  }();
  return type;
}

bool is_f16(const H5::DataType& t) {
  if (t.getClass() != H5T_FLOAT || t.getSize() != 2) return false;
  hid_t id = t.getId();
  size_t spos = 0, epos = 0, esize = 0, mpos = 0, msize = 0;
  if (H5Tget_fields(id, &spos, &epos, &esize, &mpos, &msize) < 0) return false;
  return spos == 15 && epos == 10 && esize == 5 && mpos == 0 && msize == 10 &&
         H5Tget_ebias(id) == 15 && H5Tget_order(id) == H5T_ORDER_LE;
}

std::uint16_t float_to_half(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  const std::uint32_t abs = u & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // Inf or NaN (keep NaN quiet and non-zero)
    return static_cast<std::uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  }
  if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds to Inf
  const int exp = static_cast<int>(abs >> 23) - 127;
  if (exp >= -14) {  // normal half
    std::uint32_t mant = abs & 0x7fffffu;
    std::uint32_t h = (static_cast<std::uint32_t>(exp + 15) << 10) | (mant >> 13);
    const std::uint32_t rest = mant & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // carry may bump the exponent
    return static_cast<std::uint16_t>(sign | h);
  }
  if (exp < -25) return static_cast<std::uint16_t>(sign);  // below half the smallest subnormal
  // Subnormal half: value = m * 2^-24 with m = mant_with_implicit >> shift.
  const std::uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
  const int shift = -exp - 1;  // value = mant * 2^(exp-23) = (mant >> shift) * 2^-24
  std::uint32_t h = mant >> shift;
  const std::uint32_t rest = mant & ((1u << shift) - 1u);
  const std::uint32_t halfway = 1u << (shift - 1);
  if (rest > halfway || (rest == halfway && (h & 1u))) ++h;
  return static_cast<std::uint16_t>(sign | h);
}

float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t mant = h & 0x3ffu;
  std::uint32_t u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    u = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {
    u = sign;
  } else {  // subnormal: normalize
    int e = -1;
    do {
      mant <<= 1;
      ++e;
    } while ((mant & 0x400u) == 0);
    u = sign | (static_cast<std::uint32_t>(112 - e) << 23) | ((mant & 0x3ffu) << 13);
  }
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
}

namespace {

// Ids kept for the life of the process: the scalar dataspace and the UTF-8 variable-length
// string type of the attributes below, made once instead of per attribute (files get many).
hid_t scalar_space() {
  static const hid_t id = H5Screate(H5S_SCALAR);
  return id;
}

hid_t utf8_string_type() {
  static const hid_t id = [] {
    const hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, H5T_VARIABLE);
    H5Tset_cset(t, H5T_CSET_UTF8);
    return t;
  }();
  return id;
}

void write_scalar_attr(const H5::H5Object& obj, const std::string& name, hid_t file_type,
                       hid_t mem_type, const void* value) {
  const hid_t a =
      H5Acreate2(obj.getId(), name.c_str(), file_type, scalar_space(), H5P_DEFAULT, H5P_DEFAULT);
  if (a < 0) throw H5::AttributeIException("write attribute", "H5Acreate2 failed for " + name);
  const herr_t written = H5Awrite(a, mem_type, value);
  H5Aclose(a);
  if (written < 0) throw H5::AttributeIException("write attribute", "H5Awrite failed for " + name);
}

}  // namespace

H5::H5File create_file(const std::string& path, hsize_t meta_block_bytes) {
  H5::FileCreatPropList fcpl;  // the root group's object header takes these settings
  H5Pset_obj_track_times(fcpl.getId(), false);
  // No sieve buffer: every dataset is written whole, once, so a contiguous one goes to the file
  // in one write instead of through a zeroed 64 KiB buffer copied and flushed when it closes.
  H5::FileAccPropList fapl;
  H5Pset_sieve_buf_size(fapl.getId(), 0);
  if (meta_block_bytes > 0) H5Pset_meta_block_size(fapl.getId(), meta_block_bytes);
  return H5::H5File(path, H5F_ACC_TRUNC, fcpl, fapl);
}

H5::Group create_group(const H5::Group& parent, const std::string& name) {
  // Made once per process: a property list costs about as much to make as the group itself.
  static const hid_t gcpl = [] {
    const hid_t p = H5Pcreate(H5P_GROUP_CREATE);
    H5Pset_obj_track_times(p, false);
    return p;
  }();
  const hid_t id = H5Gcreate2(parent.getId(), name.c_str(), H5P_DEFAULT, gcpl, H5P_DEFAULT);
  if (id < 0) throw H5::GroupIException("create_group", "H5Gcreate2 failed for " + name);
  H5::Group g(id);
  // Some HDF5 versions' Group(hid_t) takes a reference of its own: keep exactly one.
  if (H5Iget_ref(id) > 1) H5Idec_ref(id);
  return g;
}

void write_string_attr(H5::H5Object& obj, const std::string& name, const std::string& value) {
  const char* text = value.c_str();  // a variable-length string is written as its pointer
  write_scalar_attr(obj, name, utf8_string_type(), utf8_string_type(), &text);
}

void write_int_attr(H5::H5Object& obj, const std::string& name, long long value) {
  write_scalar_attr(obj, name, H5T_STD_I64LE, H5T_NATIVE_LLONG, &value);
}

void write_double_attr(H5::H5Object& obj, const std::string& name, double value) {
  write_scalar_attr(obj, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &value);
}

void write_ints_attr(H5::H5Object& obj, const std::string& name, const std::vector<int>& values) {
  const hsize_t n = values.size();
  H5::Attribute a = obj.createAttribute(name, H5::PredType::STD_I32LE, H5::DataSpace(1, &n));
  if (n > 0) a.write(H5::PredType::NATIVE_INT, values.data());
}

H5::DataSet write_dataset(H5::Group& g, const std::string& name, const H5::DataType& file_type,
                          const H5::DataType& mem_type, const std::vector<hsize_t>& dims,
                          const void* data, std::vector<hsize_t> chunk, Compression compression) {
  const int rank = static_cast<int>(dims.size());
  H5::DataSpace space(rank, dims.data());
  hsize_t total = 1;
  for (hsize_t d : dims) total *= d;
  H5::DSetCreatPropList plist;
  H5Pset_obj_track_times(plist.getId(), false);
  if (total > 0 && rank > 0) {
    if (chunk.empty()) chunk = dims;
    for (int i = 0; i < rank; ++i) chunk[i] = std::max<hsize_t>(1, std::min(chunk[i], dims[i]));
    plist.setChunk(rank, chunk.data());
    if (compression == Compression::kGzip) {
      plist.setShuffle();
      plist.setDeflate(4);
    }
  }
  H5::DataSet ds = g.createDataSet(name, file_type, space, plist);
  if (total > 0) ds.write(data, mem_type);
  return ds;
}

namespace {
herr_t collect_error(unsigned, const H5E_error2_t* err, void* data) {
  auto* out = static_cast<std::vector<std::string>*>(data);
  if (err && err->desc && *err->desc) out->emplace_back(err->desc);
  return 0;
}
}  // namespace

std::string describe(const H5::Exception& e) {
  std::vector<std::string> msgs;  // innermost first
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, collect_error, &msgs);
  std::string detail = e.getDetailMsg();
  if (!msgs.empty()) {
    if (detail.empty()) return msgs.front();
    return msgs.front() + " (" + detail + ")";
  }
  return detail.empty() ? std::string("HDF5 error") : detail;
}

}  // namespace kvarn::h5
