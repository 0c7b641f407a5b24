// `kvarn-eval quantize`: runs one method over (sequence, layer, KV head) slabs of a tile file and
// writes what the cache would hold (every stored field, concatenated per chunk) plus the
// reconstruction, in the "kvarn-quantized" v1 schema (docs/hdf5-schema.md). The stored bytes
// must equal Method::sequence_bytes; any mismatch is an error, not a warning.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kvarn/core/registry.hpp"
#include "kvarn/data/atomic_file.hpp"
#include "kvarn/data/error.hpp"
#include "kvarn/data/h5_io.hpp"
#include "kvarn/data/tile_file.hpp"
#include "kvarn/sweeps/commands.hpp"
#include "kvarn/sweeps/provenance.hpp"

namespace kvarn {

namespace {

namespace fs = std::filesystem;

inline constexpr const char* kQuantizedFormat = "kvarn-quantized";
inline constexpr int kQuantizedFormatVersion = 1;

struct QuantizeOptions {
  std::string method, in, out;
  std::vector<int> layers, heads, sequences;
  bool force = false;
};

std::string two_digits(const char* prefix, int i) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%s%02d", prefix, i);
  return buf;
}

std::string join(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : ", ") + std::to_string(x);
  return s;
}

// Resolves --layers (model layer indices, as in the file's `layers` dataset) to captured indices.
std::vector<int> select_layers(const TileReader& r, const std::vector<int>& wanted) {
  const std::vector<int>& captured = r.info().layers;
  std::vector<int> out;
  if (wanted.empty()) {
    for (int i = 0; i < r.info().num_captured_layers(); ++i) out.push_back(i);
    return out;
  }
  for (int l : wanted) {
    auto it = std::find(captured.begin(), captured.end(), l);
    KVARN_CHECK(it != captured.end(), r.path().string(), ": --layers: model layer ", l,
                " is not captured in this file (captured: ", join(captured), ")");
    out.push_back(static_cast<int>(it - captured.begin()));
  }
  return out;
}

std::vector<int> select_range(const std::vector<int>& wanted, int n, const std::string& what,
                              const std::string& file) {
  std::vector<int> out;
  if (wanted.empty()) {
    for (int i = 0; i < n; ++i) out.push_back(i);
    return out;
  }
  for (int x : wanted) {
    KVARN_CHECK(x >= 0 && x < n, file, ": --", what, ": index ", x, " out of range (the file has ",
                n, " ", what, ")");
    out.push_back(x);
  }
  return out;
}

double sum_sq(const Matrix& m) { return m.cast<double>().squaredNorm(); }
double sum_sq_err(const Matrix& a, const Matrix& b) {
  return (a.cast<double>() - b.cast<double>()).squaredNorm();
}

// Writes one stream's chunks: per field name a dataset [num_chunks, ...field.shape]; returns the
// payload bytes written (must equal the chunks' own byte count).
std::size_t write_stream(H5::Group& parent, const char* name, const std::vector<Chunk>& chunks,
                         const StreamCodec& codec, int num_kept, const std::string& where) {
  H5::Group g = h5::create_group(parent, name);
  const StreamPolicy p = codec.policy();
  h5::write_int_attr(g, "num_chunks", static_cast<long long>(chunks.size()));
  h5::write_int_attr(g, "chunk_tokens", p.chunk);
  h5::write_int_attr(g, "sink", p.sink);
  h5::write_int_attr(g, "keep_recent", p.keep_recent);
  h5::write_int_attr(g, "chunk_bytes", static_cast<long long>(codec.chunk_bytes()));
  h5::write_int_attr(g, "kept_tokens", num_kept);
  h5::write_int_attr(g, "kept_token_bytes", static_cast<long long>(codec.kept_token_bytes()));
  h5::write_double_attr(g, "code_bits", codec.code_bits());
  const hsize_t n = chunks.size();
  std::vector<std::int32_t> first(n);
  for (std::size_t i = 0; i < n; ++i) first[i] = chunks[i].first_token;
  h5::write_dataset(g, "first_token", H5::PredType::STD_I32LE, H5::PredType::NATIVE_INT32, {n},
                    first.data());
  if (chunks.empty()) return 0;
  std::size_t written = 0;
  for (const Field& f0 : chunks.front().fields) {
    const std::string w = where + "/" + name + "/" + f0.name;
    std::vector<std::uint8_t> bytes;
    bytes.reserve(f0.bytes.size() * n);
    for (std::size_t i = 0; i < n; ++i) {
      const Field* f = chunks[i].find(f0.name);
      KVARN_CHECK(
          f && f->dtype == f0.dtype && f->shape == f0.shape && f->bytes.size() == f0.bytes.size(),
          w, ": chunk ", i, " stores this field with a different dtype or shape");
      bytes.insert(bytes.end(), f->bytes.begin(), f->bytes.end());
    }
    std::vector<hsize_t> dims{n};
    std::size_t elems = 1;
    for (std::size_t s : f0.shape) {
      dims.push_back(s);
      elems *= s;
    }
    const H5::DataType* file_type = nullptr;
    const H5::DataType* mem_type = nullptr;
    std::size_t elem_size = 0;
    if (f0.dtype == "u8") {
      file_type = &H5::PredType::STD_U8LE;
      mem_type = &H5::PredType::NATIVE_UINT8;
      elem_size = 1;
    } else if (f0.dtype == "f16") {  // raw IEEE half bits, little endian (see the schema doc)
      file_type = &H5::PredType::STD_U16LE;
      mem_type = &H5::PredType::STD_U16LE;
      elem_size = 2;
    } else if (f0.dtype == "f32") {
      file_type = &H5::PredType::IEEE_F32LE;
      mem_type = &H5::PredType::IEEE_F32LE;
      elem_size = 4;
    } else {
      fail(w, ": unknown field dtype '", f0.dtype, "'");
    }
    KVARN_CHECK(elems * elem_size == f0.bytes.size(), w, ": field holds ", f0.bytes.size(),
                " bytes but its shape and dtype say ", elems * elem_size);
    // Chunk along the chunk axis so one cache chunk is one HDF5 chunk.
    std::vector<hsize_t> hchunk = dims;
    hchunk[0] = 1;
    if (elems * elem_size < 4096) hchunk[0] = std::max<hsize_t>(1, 4096 / (elems * elem_size));
    H5::DataSet ds =
        h5::write_dataset(g, f0.name, *file_type, *mem_type, dims, bytes.data(), hchunk);
    h5::write_string_attr(ds, "dtype", f0.dtype);
    written += bytes.size();
  }
  return written;
}

struct LayerSummary {
  double k_err = 0, k_ref = 0, v_err = 0, v_ref = 0;
  std::size_t stored = 0, fp16 = 0;
  int slabs = 0;
};

void run_quantize(const QuantizeOptions& o) {
  // Validate the cheap things first, so bad input fails before any work.
  auto method = make_method(o.method);
  const fs::path in(o.in), out(o.out);
  KVARN_CHECK(o.force || !fs::exists(out), out.string(),
              ": already exists (use --force to overwrite)");
  TileReader reader(in);
  {
    std::error_code ec;
    KVARN_CHECK(!fs::equivalent(in, out, ec), out.string(), ": --out is the input file");
  }
  const TileFileInfo& info = reader.info();
  const int D = info.head_dim;
  method->check_head_dim(D);
  const std::vector<int> layers = select_layers(reader, o.layers);
  const std::vector<int> heads = select_range(o.heads, info.num_kv_heads, "heads", in.string());
  const std::vector<int> seqs =
      select_range(o.sequences, reader.num_sequences(), "sequences", in.string());

  nlohmann::json prov = {
      {"tool", "kvarn-eval quantize"},
      {"version", kKvarnEvalVersion},
      {"git_commit", std::getenv("KVARN_GIT_COMMIT") ? std::getenv("KVARN_GIT_COMMIT") : "unknown"},
      {"created", utc_timestamp()},
      {"command", command_line()},
      {"method", method->name()},
      {"method_spec", method->spec()},
      {"selection", {{"layers", o.layers}, {"heads", heads}, {"sequences", seqs}}},
      {"input",
       {{"path", in.string()},
        {"model", info.model},
        {"source", info.source},
        {"provenance", nlohmann::json::parse(info.provenance, nullptr, false).is_discarded()
                           ? nlohmann::json(info.provenance)
                           : nlohmann::json::parse(info.provenance)}}}};

  std::map<int, LayerSummary> summary;  // by model layer
  write_atomically(
      out,
      [&](const fs::path& tmp) {
        try {
          H5::H5File file = h5::create_file(tmp.string());
          h5::write_string_attr(file, "format", kQuantizedFormat);
          h5::write_int_attr(file, "format_version", kQuantizedFormatVersion);
          h5::write_string_attr(file, "method", method->name());
          h5::write_string_attr(file, "method_spec", method->spec());
          h5::write_string_attr(file, "source_file", in.string());
          h5::write_string_attr(file, "model", info.model);
          h5::write_int_attr(file, "num_layers", info.num_layers);
          h5::write_int_attr(file, "head_dim", D);
          h5::write_string_attr(file, "provenance", prov.dump());
          H5::Group seq_root = h5::create_group(file, "sequences");
          for (int s : seqs) {
            const SequenceInfo& si = reader.sequence(s);
            H5::Group gs = h5::create_group(seq_root, si.name);
            h5::write_int_attr(gs, "num_tokens", si.num_tokens);
            h5::write_string_attr(gs, "prompt_id", si.prompt_id);
            for (int li : layers) {
              const int model_layer = info.layers[li];
              H5::Group gl = h5::create_group(gs, two_digits("layer_", model_layer));
              h5::write_int_attr(gl, "model_layer", model_layer);
              h5::write_int_attr(gl, "captured_index", li);
              const LayerContext ctx{model_layer, info.num_layers};
              for (int h : heads) {
                const std::string where = out.string() + ": /sequences/" + si.name + "/" +
                                          two_digits("layer_", model_layer) + "/" +
                                          two_digits("head_", h);
                const Matrix k = reader.read(s, "k", li, h);
                const Matrix v = reader.read(s, "v", li, h);
                const SequenceResult r = quantize_sequence(*method, k, v, ctx);
                const int T = si.num_tokens;
                H5::Group gh = h5::create_group(gl, two_digits("head_", h));
                const hsize_t t = T, d = D;
                const hsize_t rows = std::min<hsize_t>(t, 256);
                h5::write_dataset(gh, "k_hat", H5::PredType::IEEE_F32LE, H5::PredType::NATIVE_FLOAT,
                                  {t, d}, r.k_hat.data(), {rows, d});
                h5::write_dataset(gh, "v_hat", H5::PredType::IEEE_F32LE, H5::PredType::NATIVE_FLOAT,
                                  {t, d}, r.v_hat.data(), {rows, d});
                h5::write_dataset(gh, "k_quantized", H5::PredType::STD_U8LE,
                                  H5::PredType::NATIVE_UINT8, {t}, r.k_quantized.data());
                h5::write_dataset(gh, "v_quantized", H5::PredType::STD_U8LE,
                                  H5::PredType::NATIVE_UINT8, {t}, r.v_quantized.data());
                auto kc = method->make_codec(StreamKind::kKey, D, ctx);
                auto vc = method->make_codec(StreamKind::kValue, D, ctx);
                auto count_kept = [](const std::vector<std::uint8_t>& q) {
                  return static_cast<int>(std::count(q.begin(), q.end(), 0));
                };
                const int k_kept = count_kept(r.k_quantized), v_kept = count_kept(r.v_quantized);
                std::size_t payload = write_stream(gh, "k", r.k_chunks, *kc, k_kept, where);
                payload += write_stream(gh, "v", r.v_chunks, *vc, v_kept, where);
                const std::size_t stored =
                    payload + k_kept * kc->kept_token_bytes() + v_kept * vc->kept_token_bytes();
                const std::size_t accounted = method->sequence_bytes(T, D, ctx);
                KVARN_CHECK(stored == r.stored_bytes, where, ": wrote ", stored,
                            " bytes but the cache measured ", r.stored_bytes);
                KVARN_CHECK(stored == accounted, where, ": stored ", stored,
                            " bytes but Method::sequence_bytes accounts ", accounted, " (method ",
                            method->spec(), ", ", T, " tokens)");
                const double k_err = sum_sq_err(r.k_hat, k), k_ref = sum_sq(k);
                const double v_err = sum_sq_err(r.v_hat, v), v_ref = sum_sq(v);
                h5::write_int_attr(gh, "num_tokens", T);
                h5::write_int_attr(gh, "stored_bytes", static_cast<long long>(stored));
                h5::write_int_attr(gh, "accounted_bytes", static_cast<long long>(accounted));
                h5::write_int_attr(gh, "fp16_bytes", 4LL * T * D);
                h5::write_int_attr(gh, "layer_skipped", method->layer_skipped(ctx) ? 1 : 0);
                h5::write_double_attr(gh, "k_nmse", k_ref > 0 ? k_err / k_ref : 0.0);
                h5::write_double_attr(gh, "v_nmse", v_ref > 0 ? v_err / v_ref : 0.0);
                LayerSummary& ls = summary[model_layer];
                ls.k_err += k_err;
                ls.k_ref += k_ref;
                ls.v_err += v_err;
                ls.v_ref += v_ref;
                ls.stored += stored;
                ls.fp16 += 4ULL * T * D;
                ++ls.slabs;
              }
            }
          }
          file.close();
        } catch (const H5::Exception& e) {
          fail(tmp.string(), ": cannot write: ", h5::describe(e));
        }
      },
      o.force);

  std::printf("%s -> %s (method %s, %s)\n", in.string().c_str(), out.string().c_str(),
              method->name().c_str(), method->spec().c_str());
  std::printf("%6s %6s %10s %10s %12s %12s %8s\n", "layer", "slabs", "k NMSE", "v NMSE", "stored B",
              "fp16 B", "bits/el");
  for (const auto& [layer, s] : summary) {
    std::printf("%6d %6d %10.3e %10.3e %12zu %12zu %8.3f\n", layer, s.slabs,
                s.k_ref > 0 ? s.k_err / s.k_ref : 0.0, s.v_ref > 0 ? s.v_err / s.v_ref : 0.0,
                s.stored, s.fp16, 16.0 * static_cast<double>(s.stored) / s.fp16);
  }
}

}  // namespace

void add_quantize_command(CLI::App& app) {
  auto opts = std::make_shared<QuantizeOptions>();
  CLI::App* cmd = app.add_subcommand(
      "quantize", "Quantize the K/V slabs of a tile file with one method and store the result");
  cmd->add_option("--method", opts->method, "Method name or spec (see `kvarn-eval methods`)")
      ->required();
  cmd->add_option("--in", opts->in, "Input tile file (kvarn-tiles HDF5)")->required();
  cmd->add_option("--out", opts->out, "Output file (kvarn-quantized HDF5)")->required();
  cmd->add_option("--layers", opts->layers,
                  "Model layer indices to quantize, as listed in the file's `layers` dataset "
                  "(default all)")
      ->delimiter(',');
  cmd->add_option("--heads", opts->heads, "KV head indices (default all)")->delimiter(',');
  cmd->add_option("--sequences", opts->sequences, "Sequence indices (default all)")->delimiter(',');
  cmd->add_flag("--force", opts->force, "Overwrite --out if it exists");
  cmd->callback([opts] { run_quantize(*opts); });
}

}  // namespace kvarn
