// `kvarn-eval capture`: a thin shell over kvarn::run_capture (eval/runner/capture.cpp). Adds the
// tool provenance (version, git commit, build, command line), the SHA-256 implementation and
// SIGINT/SIGTERM handling: an interrupted capture removes its temporary file and leaves no
// output (SIGKILL leaves only "<out>.tmp.<pid>", never a file named --out).
#include <csignal>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "commands.hpp"
#include "kvarn/runner/capture.hpp"
#include "kvarn/sweeps/provenance.hpp"

namespace kvarn {

namespace {

volatile std::sig_atomic_t g_interrupted = 0;

extern "C" void on_capture_signal(int) { g_interrupted = 1; }

struct CaptureCli {
  CaptureOptions o;
  std::string model_dir, prompts, out, ids;
  int threads = 0;
  bool no_pre_rope = false, no_q = false;
};

void run_capture_cli(CaptureCli& c) {
  CaptureOptions& o = c.o;
  o.model_dir = c.model_dir;
  o.prompts = c.prompts;
  o.out = c.out;
  o.num_threads = c.threads;
  o.pre_rope = !c.no_pre_rope;
  o.q = !c.no_q;
  o.ids.clear();
  if (!c.ids.empty()) {
    std::string cur;
    for (char ch : c.ids + ",") {
      if (ch == ',') {
        if (!cur.empty()) o.ids.push_back(cur);
        cur.clear();
      } else {
        cur += ch;
      }
    }
  }
  nlohmann::json build = collect_provenance({{"command", command_line()}});
  o.provenance = {{"tool", "kvarn-eval capture"},
                  {"version", kKvarnEvalVersion},
                  {"git_commit", build.value("git_commit", nlohmann::json("unknown"))},
                  {"git_dirty", build.value("git_dirty", nlohmann::json(nullptr))},
                  {"command", command_line()},
                  {"build", build}};
  o.sha256_file = [](const std::filesystem::path& p) { return sha256_file_hex(p); };
  o.log = [](const std::string& line) { std::cerr << "[capture] " << line << std::endl; };
  g_interrupted = 0;
  o.cancelled = [] { return g_interrupted != 0; };
  auto old_int = std::signal(SIGINT, on_capture_signal);
  auto old_term = std::signal(SIGTERM, on_capture_signal);
  struct Restore {
    decltype(old_int) i, t;
    ~Restore() {
      std::signal(SIGINT, i);
      std::signal(SIGTERM, t);
    }
  } restore{old_int, old_term};
  const CaptureResult r = run_capture(o);
  std::cout << r.out.string() << " (" << r.bytes << " bytes, " << r.sequences << " sequences)"
            << std::endl;
}

}  // namespace

void add_capture_command(CLI::App& app) {
  auto c = std::make_shared<CaptureCli>();
  CLI::App* cmd = app.add_subcommand(
      "capture",
      "Capture real KV tiles (token ids, post-RoPE q, pre/post-RoPE k, v) from an HF checkpoint "
      "into a kvarn-tiles HDF5 file");
  cmd->add_option("--model", c->model_dir, "HF checkpoint directory (config.json, safetensors)")
      ->required();
  cmd->add_option("--prompts", c->prompts, "JSONL: {id, text} or {id, token_ids} per line")
      ->required();
  cmd->add_option("--out", c->out, "Output tile file (.h5); refuses to overwrite without --force")
      ->required();
  cmd->add_option("--ids", c->ids,
                  "Comma-separated prompt ids to use, in this order (default all)");
  cmd->add_option("--layers", c->o.layers, "Model layers: all (default), 0,3,7 or 0-3");
  cmd->add_option("--kv-heads", c->o.kv_heads, "KV heads; schema v1 stores all (default all)");
  cmd->add_option("--query-heads", c->o.query_heads, "Query heads to store (default all)");
  cmd->add_option("--max-tokens", c->o.max_tokens, "Truncate each sequence to N tokens (0: none)");
  cmd->add_option("--generate", c->o.generate, "Greedy continuation tokens before the capture");
  cmd->add_flag("--ignore-eos", c->o.ignore_eos, "Keep generating past an EOS token");
  cmd->add_option("--device", c->o.device, "cpu (default), cuda or cuda:N");
  cmd->add_option("--threads", c->threads, "CPU threads for torch (0: torch's default)");
  cmd->add_flag("--chat", c->o.chat, "Wrap each text prompt in the model's (ChatML) chat template");
  cmd->add_flag("--concat", c->o.concat, "All prompts form one sequence (texts joined by \\n\\n)");
  cmd->add_flag("--no-pre-rope", c->no_pre_rope, "Do not store k_pre_rope");
  cmd->add_flag("--no-q", c->no_q, "Do not store queries");
  cmd->add_flag("--compress", c->o.compress,
                "Gzip (level 4, shuffled) the fp16 datasets: about 15 % smaller, but every "
                "reader then inflates them");
  cmd->add_option("--model-name", c->o.model_name, "Root attribute `model` (default: dir name)");
  cmd->add_option("--source", c->o.source, "Root attribute `source`");
  cmd->add_flag("--force", c->o.force, "Overwrite --out if it exists");
  cmd->callback([c] { run_capture_cli(*c); });
}

}  // namespace kvarn
