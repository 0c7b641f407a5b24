// `kvarn-eval quantize` as a library call: runs one method over (sequence, layer, KV head) slabs
// of a tile file and writes the quantized-tile file (kvarn/data/quantized_file.hpp). The slabs
// flow through `threads` threads: each takes, in turn, the next HDF5 step (read a slab's stored
// chunks, or write the oldest quantized slab; one thread at a time) or decodes and quantizes a
// slab that was read. Slabs are written in sequence / layer / head order, so the file is
// identical whatever the thread count.
#ifndef KVARN_SWEEPS_QUANTIZE_HPP_
#define KVARN_SWEEPS_QUANTIZE_HPP_

#include <cstddef>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace kvarn {

struct QuantizeFileOptions {
  std::string method;
  std::filesystem::path in, out;
  std::vector<int> layers;     // model layer indices (the file's `layers` dataset); empty = all
  std::vector<int> heads;      // KV heads; empty = all
  std::vector<int> sequences;  // sequence indices; empty = all
  bool force = false;
  bool reconstruction = false;  // also write the fp32 reconstructions k_hat / v_hat
  int threads = 0;              // 0 = OpenMP's default (OMP_NUM_THREADS)
  std::string command;          // command line recorded in the provenance
};

struct QuantizeLayerSummary {
  double k_err = 0, k_ref = 0, v_err = 0, v_ref = 0;
  std::size_t stored = 0, fp16 = 0;
  int slabs = 0;
};

// Seconds per phase. `compute` and `total` are wall time; the others are summed over the
// threads that ran them (thread-seconds), wall time and, in the *_cpu fields, CPU time of those
// threads (which, unlike wall time, does not grow when other jobs share the cores).
struct QuantizePhaseTimes {
  double read = 0;      // HDF5 read of the input slabs' stored chunks
  double compute = 0;   // wall time of the pipeline: reads, the four below and writes
  double decode = 0;    // the input chunks inflated and converted from fp16
  double quantize = 0;  // the method's cache: encode, decode, reconstruction
  double collect = 0;   // stored fields concatenated per stream, byte accounting checks
  double metrics = 0;   // NMSE sums
  double write = 0;     // HDF5 write, close, fsync, rename
  double total = 0;
  double read_cpu = 0, compute_cpu = 0, write_cpu = 0;  // compute_cpu: decode to metrics

  // Field by field, to sum several runs (benchmarks).
  QuantizePhaseTimes& operator+=(const QuantizePhaseTimes& o) {
    read += o.read;
    compute += o.compute;
    decode += o.decode;
    quantize += o.quantize;
    collect += o.collect;
    metrics += o.metrics;
    write += o.write;
    total += o.total;
    read_cpu += o.read_cpu;
    compute_cpu += o.compute_cpu;
    write_cpu += o.write_cpu;
    return *this;
  }
};

struct QuantizeReport {
  std::string method_name, method_spec;
  std::map<int, QuantizeLayerSummary> layers;  // by model layer
  int slabs = 0;
  long long k_chunks = 0, v_chunks = 0;  // flushed chunks over all slabs (KVarN: tile pairs)
  QuantizePhaseTimes times;
};

QuantizeReport quantize_tile_file(const QuantizeFileOptions& o);

// Makes the C library's malloc keep freed memory for reuse instead of returning it to the kernel:
// quantize_tile_file allocates and frees megabytes per slab, and with glibc's defaults every slab
// faulted its buffers in again, zeroed page by page. Process-wide and lasting; `kvarn-eval
// quantize` calls it before quantize_tile_file. A no-op without glibc.
void keep_freed_memory_for_reuse();

}  // namespace kvarn

#endif  // KVARN_SWEEPS_QUANTIZE_HPP_
