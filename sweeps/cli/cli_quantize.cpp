// `kvarn-eval quantize`: the command-line shell over quantize_tile_file
// (kvarn/sweeps/quantize.hpp) which writes the "kvarn-quantized" schema
// (docs/hdf5-schema.md); prints the per-layer summary.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "commands.hpp"
#include "kvarn/sweeps/quantize.hpp"

namespace kvarn {

namespace {

struct QuantizeCliOptions {
  std::string method, in, out;
  std::vector<int> layers, heads, sequences;
  bool force = false, reconstruction = false, timings = false;
  int threads = 0;
};

void print_summary(const QuantizeFileOptions& o, const QuantizeReport& r) {
  std::printf("%s -> %s (method %s, %s)\n", o.in.string().c_str(), o.out.string().c_str(),
              r.method_name.c_str(), r.method_spec.c_str());
  std::printf("%6s %6s %10s %10s %12s %12s %8s\n", "layer", "slabs", "k NMSE", "v NMSE", "stored B",
              "fp16 B", "bits/el");
  for (const auto& [layer, s] : r.layers) {
    std::printf("%6d %6d %10.3e %10.3e %12zu %12zu %8.3f\n", layer, s.slabs,
                s.k_ref > 0 ? s.k_err / s.k_ref : 0.0, s.v_ref > 0 ? s.v_err / s.v_ref : 0.0,
                s.stored, s.fp16, 16.0 * static_cast<double>(s.stored) / s.fp16);
  }
}

void print_timings(const QuantizeReport& r) {
  const QuantizePhaseTimes& t = r.times;
  std::fprintf(stderr,
               "timings (s): total %.3f | pipeline %.3f | thread-seconds: read %.3f, decode "
               "%.3f, quantize %.3f, collect %.3f, metrics %.3f, write %.3f | CPU seconds: read "
               "%.3f, decode to metrics %.3f, write %.3f | %lld K + %lld V chunks\n",
               t.total, t.compute, t.read, t.decode, t.quantize, t.collect, t.metrics, t.write,
               t.read_cpu, t.compute_cpu, t.write_cpu, r.k_chunks, r.v_chunks);
}

}  // namespace

void add_quantize_command(CLI::App& app) {
  auto opts = std::make_shared<QuantizeCliOptions>();
  CLI::App* cmd = app.add_subcommand("quantize",
                                     "Quantize the K/V slabs of a tile file "
                                     "with one method and store the result");
  cmd->add_option("--method", opts->method, "Method name or spec (see `kvarn-eval methods`)")
      ->required();
  cmd->add_option("--in", opts->in, "Input tile file (kvarn-tiles HDF5)")->required();
  cmd->add_option("--out", opts->out, "Output file (kvarn-quantized HDF5)")->required();
  cmd->add_option("--layers", opts->layers,
                  "Model layer indices to quantize, as listed in the file's "
                  "`layers` dataset "
                  "(default all)")
      ->delimiter(',');
  cmd->add_option("--heads", opts->heads, "KV head indices (default all)")->delimiter(',');
  cmd->add_option("--sequences", opts->sequences, "Sequence indices (default all)")->delimiter(',');
  cmd->add_flag("--reconstruction", opts->reconstruction,
                "Also store the fp32 reconstructions k_hat / v_hat of every slab");
  cmd->add_option("--threads", opts->threads,
                  "Threads that read, quantize and write the slabs (default: "
                  "OMP_NUM_THREADS or all cores); the file is identical for any count");
  cmd->add_flag("--timings", opts->timings, "Print the time per phase to stderr");
  cmd->add_flag("--force", opts->force, "Overwrite --out if it exists");
  cmd->callback([opts] {
    QuantizeFileOptions o;
    o.method = opts->method;
    o.in = opts->in;
    o.out = opts->out;
    o.layers = opts->layers;
    o.heads = opts->heads;
    o.sequences = opts->sequences;
    o.force = opts->force;
    o.reconstruction = opts->reconstruction;
    o.threads = opts->threads;
    o.command = command_line();
    keep_freed_memory_for_reuse();
    const QuantizeReport r = quantize_tile_file(o);
    print_summary(o, r);
    if (opts->timings) print_timings(r);
  });
}

}  // namespace kvarn
