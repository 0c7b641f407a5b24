#!/usr/bin/env python3
"""Writes the committed seed inputs under fuzz/corpus/<target>/ (small valid or near-valid files).

    python3 fuzz/make_seeds.py      # from the repository root, after tests/corpus/make_corpus.py
"""
import json
import os
import shutil
import struct

C = "fuzz/corpus"


def put(target, name, data):
    os.makedirs(f"{C}/{target}", exist_ok=True)
    with open(f"{C}/{target}/{name}", "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def safetensors(header, data=b""):
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


def byte_level_tokenizer():
    """A tiny byte-level BPE tokenizer.json: GPT-2's byte alphabet plus four merges."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) +
          list(range(ord("®"), ord("ÿ") + 1)))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    vocab = {chr(c): i for i, c in enumerate(cs)}
    merges = [["H", "e"], ["l", "l"], ["He", "ll"], ["Ġ", "w"]]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    split = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+"
             "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                  "use_regex": False}
    return {
        "version": "1.0",
        "added_tokens": [{"id": len(vocab), "content": "<|im_start|>", "single_word": False,
                          "lstrip": False, "rstrip": False, "normalized": False,
                          "special": True}],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": split}, "behavior": "Isolated",
             "invert": False}, byte_level]},
        "post_processor": byte_level,
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": "", "end_of_word_suffix": "", "fuse_unk": False,
                  "byte_fallback": False, "vocab": vocab,
                  "merges": [" ".join(m) for m in merges]},
    }


def main():
    shutil.rmtree(C, ignore_errors=True)
    # Configs name the small tile file the config targets write next to them (small_tiles.hpp):
    # hashing and probing the repository's megabyte tile files would take most of each input.
    with open("configs/quickstart.yaml") as f:
        text = f.read()
    start = text.index("  tiles:\n")
    end = text.index("\n", text.index("smollm2_long.h5", start))
    put("config_yaml", "quickstart.yaml",
        text[:start] + "  tiles:\n    - small_tiles.h5" + text[end:])
    put("config_yaml", "small.yaml",
        "version: 1\nname: s\ndata:\n  tiles: small_tiles.h5\n  sequences: [0]\n"
        "  layers: [0, 1]\n  kv_heads: all\n  max_tokens: 64\nmethods:\n  - fp16\n"
        "  - 'kvarn:k=3,v=2,g=64'\nmetrics:\n  attention: false\n  outlier_fractions: [1]\n"
        "seed: 3\noutput: runs\nreport: false\n")
    put("config_yaml", "flow.yaml",
        "version: 1\nname: &n a\ndata: {tiles: [small_tiles.h5], sequences: all, "
        "max_tokens: 0}\nmethods: [fp16, fp8_e4m3]\noutput: *n\n")
    put("set", "basic.txt", "data.max_tokens=32\nmethods=[fp16,kivi_4bit]\nseed=7\n")
    put("set", "nested.txt", "metrics.attention=false\ndata.layers=[0]\nname=x\n")
    put("set", "null.txt", "throughput.results=null\naccumulation.enabled=false\n")
    for name in ("valid.h5", "nan_in_k.h5"):
        os.makedirs(f"{C}/tile_reader", exist_ok=True)
        shutil.copy(f"tests/corpus/h5/{name}", f"{C}/tile_reader/{name}")
    put("safetensors", "two.safetensors", safetensors(
        {"__metadata__": {"format": "pt"},
         "a": {"dtype": "F16", "shape": [2, 2], "data_offsets": [0, 8]},
         "b": {"dtype": "BF16", "shape": [3], "data_offsets": [8, 14]}}, bytes(range(14))))
    put("safetensors", "empty.safetensors", safetensors({}))
    put("safetensors", "scalar.safetensors",
        safetensors({"s": {"dtype": "F32", "shape": [], "data_offsets": [0, 4]}},
                    b"\0\0\x80\x3f"))
    with open("data/models/fixture-qwen3-h128/config.json") as f:
        put("model_config", "qwen3.json", f.read())
    small = {"vocab_size": 100, "hidden_size": 64, "intermediate_size": 128,
             "num_hidden_layers": 4, "num_attention_heads": 4}
    put("model_config", "llama3.json", json.dumps(dict(
        small, architectures=["LlamaForCausalLM"], num_key_value_heads=2, eos_token_id=[1, 2],
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})))
    put("model_config", "qwen2_sliding.json", json.dumps(dict(
        small, architectures=["Qwen2ForCausalLM"], use_sliding_window=True, sliding_window=16,
        max_window_layers=2)))
    tok = byte_level_tokenizer()
    put("tokenizer_json", "byte_level.json", json.dumps(tok))
    tok["model"]["merges"] = [m.split(" ") for m in tok["model"]["merges"]]
    put("tokenizer_json", "merge_pairs.json", json.dumps(tok))
    put("bpe_encode", "chat.txt",
        "<|im_start|>user\nWhat is 2+2? Answer in one word.<|im_end|>\n<|im_start|>assistant\n")
    put("bpe_encode", "unicode.txt",
        "Ünïcödé — 日本語のテキスト 🙂 \t\r\n  spaces   and 12345 digits")
    put("bpe_encode", "contractions.txt", "I'm sure they'll say it's fine, isn't it? DON'T")
    put("prompts", "text.jsonl",
        '{"id": "a", "text": "Hello"}\n{"id": "b", "text": "World", "system": "Be brief."}\n')
    put("prompts", "tokens.jsonl", '{"id": 1, "token_ids": [1, 2, 3]}\n\n{"id": "x", "token_ids": []}\n')
    run = "tests/corpus/runs/good"
    if os.path.isdir(run):
        with open(f"{run}/summary.jsonl") as f:
            put("run_dir", "summary.jsonl", b"\0" + f.read().encode())
        with open(f"{run}/resolved.json") as f:
            put("run_dir", "resolved.json", b"\1" + f.read().encode())
        case = sorted(os.listdir(f"{run}/cases"))[0]
        with open(f"{run}/cases/{case}") as f:
            rec = json.load(f)
        rec["case_id"], rec["spec"] = "c000-fp16", "fp16"
        rec["rows"] = rec["rows"][:3]
        put("run_dir", "case.json", b"\2" + json.dumps(rec).encode())


if __name__ == "__main__":
    main()
