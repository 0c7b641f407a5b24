// Small helpers over the HDF5 C++ API shared by the tile format and the CLI's output files:
// an IEEE fp16 type that h5py reads as float16, attribute/dataset writers (chunked + gzip), and
// conversion of HDF5 exceptions into kvarn::Error with the file name.
#ifndef KVARN_DATA_H5_IO_HPP_
#define KVARN_DATA_H5_IO_HPP_

#include <H5Cpp.h>

#include <cstdint>
#include <string>
#include <vector>

namespace kvarn::h5 {

// Turns off HDF5's automatic error printing (we report errors ourselves); idempotent.
void silence_errors();

// IEEE binary16, little endian: HDF5 1.10 has no predefined half type, so it is derived from
// H5T_IEEE_F32LE (sign 15, exponent 10..14 bias 15, mantissa 0..9); h5py maps it to float16.
const H5::FloatType& f16_type();
// True when `t` is exactly that layout (any name or byte order other than LE is rejected).
bool is_f16(const H5::DataType& t);

// Round to nearest even, like numpy's astype(float16) and __float2half_rn.
std::uint16_t float_to_half(float x);
float half_to_float(std::uint16_t h);
inline bool half_is_finite(std::uint16_t h) { return (h & 0x7c00u) != 0x7c00u; }

// Every file and object the project writes is created without modification/creation times, so
// the same content written twice gives the same bytes (a byte comparison of result files works).
// create_file: a new file at `path` (truncated); create_group: a new group `name` in `parent`
// (a file or a group). meta_block_bytes > 0: object headers and other metadata are allocated
// from blocks of that size (HDF5's default is 2 KiB), which makes files of many small objects
// cheaper to write; the unused end of the last block is freed when the file closes.
H5::H5File create_file(const std::string& path, hsize_t meta_block_bytes = 0);
H5::Group create_group(const H5::Group& parent, const std::string& name);

void write_string_attr(H5::H5Object& obj, const std::string& name, const std::string& value);
void write_int_attr(H5::H5Object& obj, const std::string& name, long long value);
void write_double_attr(H5::H5Object& obj, const std::string& name, double value);
void write_ints_attr(H5::H5Object& obj, const std::string& name, const std::vector<int>& values);

// Whether write_dataset filters a dataset's chunks through shuffle + gzip level 4.
enum class Compression { kGzip, kNone };

// Creates dataset `name` in `g` with shape `dims` and writes `data` (memory layout C order,
// mem_type). Chunked with `chunk` (default: the whole shape, clamped), gzip level 4 plus shuffle
// unless `compression` is kNone; empty datasets are contiguous.
H5::DataSet write_dataset(H5::Group& g, const std::string& name, const H5::DataType& file_type,
                          const H5::DataType& mem_type, const std::vector<hsize_t>& dims,
                          const void* data, std::vector<hsize_t> chunk = {},
                          Compression compression = Compression::kGzip);

// Innermost message of the current HDF5 error stack (the useful one, e.g. "truncated file"),
// or the exception's own text.
std::string describe(const H5::Exception& e);

}  // namespace kvarn::h5

#endif  // KVARN_DATA_H5_IO_HPP_
