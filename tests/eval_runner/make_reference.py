#!/usr/bin/env python3
"""Reference outputs for the libtorch runner tests (tests/eval_runner), made with transformers.

Writes into OUT (created):
  models/<name>/          tiny random-initialized HF checkpoints (seeded), one per architecture
  models/<name>/reference.safetensors   logits [T, V] (fp32) of the fixed token sequence
  reference.json          per model: token sequence, prompt, 128 greedy tokens
  tokenizers/<name>/tokenizer.json + cases.json   trained tokenizers and encode/decode cases
  smollm2.json + smollm2_logits.safetensors       when --smollm2 DIR exists (skipped otherwise)
  fixture.json + fixture_logits.safetensors       when --fixture DIR exists (skipped otherwise)
Real models: fp32 logits of prompt + greedy continuation, GREEDY_STEPS greedy tokens and the top-2
logit margin of every greedy step (the C++ test requires each > 1e-3, so a genuine near-tie is
reported as such instead of as a runner bug).
Run by the C++ tests at test time (cached by the script's hash); also usable by hand:
  python3 tests/eval_runner/make_reference.py /tmp/ref [--smollm2 data/cache/smollm2-135m-instruct]
      [--fixture data/models/fixture-qwen3-h128]
"""
import argparse
import inspect
import json
import os
import random
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

GREEDY_STEPS = 128
SEQ_LEN = 40


def randomize(model, seed):
    """Non-trivial weights: HF init leaves biases at 0 and norms at 1, which would hide bugs."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.08 * torch.randn(p.shape, generator=g))


def model_specs():
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config
    common = dict(vocab_size=512, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    return [
        # Llama-3 RoPE scaling with an original context of 64: all three frequency bands occur.
        ("llama3", LlamaConfig(**common, rope_parameters={
            "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
            attention_bias=True, mlp_bias=True), "float32", None),
        # Qwen2: q/k/v bias, GQA 4:1, tied embeddings, three layers.
        ("qwen2", Qwen2Config(**{**common, "num_key_value_heads": 1, "num_hidden_layers": 3},
                              tie_word_embeddings=True, rope_parameters={
                                  "rope_type": "default", "rope_theta": 1e6}), "float32", None),
        # Qwen3: q/k RMSNorm, head_dim 32 != hidden / heads; stored as bf16.
        ("qwen3", Qwen3Config(**common, head_dim=32, rope_parameters={
            "rope_type": "default", "rope_theta": 1e6}), "bfloat16", None),
        # Mistral: sliding window 24 < sequence, stored as fp16 in 100 KB shards (index.json).
        ("mistral", MistralConfig(**common, sliding_window=24), "float16", "100KB"),
        # head_dim 64 for the quantized-cache test (kvarn_k4v2_g64).
        ("llama_hd64", LlamaConfig(**{**common, "hidden_size": 128, "num_attention_heads": 2,
                                      "num_key_value_heads": 1}, head_dim=64,
                                   tie_word_embeddings=True), "float32", None),
    ]


def make_models(out):
    from transformers import AutoModelForCausalLM
    refs = {}
    for i, (name, cfg, dtype, shard) in enumerate(model_specs()):
        torch.manual_seed(1000 + i)
        cfg.architectures = [{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                              "qwen3": "Qwen3ForCausalLM", "mistral": "MistralForCausalLM"}[
                                  cfg.model_type]]
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
        randomize(model, 2000 + i)
        d = os.path.join(out, "models", name)
        kwargs = {"max_shard_size": shard} if shard else {}
        model.to(getattr(torch, dtype)).save_pretrained(d, **kwargs)
        # The reference runs the stored weights in fp32, as the C++ runner does.
        model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
        g = torch.Generator().manual_seed(3000 + i)
        seq = torch.randint(0, cfg.vocab_size, (SEQ_LEN,), generator=g)
        with torch.no_grad():
            logits = model(seq[None]).logits[0].float().contiguous()
            prompt = seq[:8]
            gen = model.generate(prompt[None], max_new_tokens=GREEDY_STEPS, min_new_tokens=GREEDY_STEPS,
                                 do_sample=False, eos_token_id=None, pad_token_id=0)
        save_file({"logits": logits}, os.path.join(d, "reference.safetensors"))
        refs[name] = {"tokens": seq.tolist(), "prompt": prompt.tolist(),
                      "greedy": gen[0, len(prompt):].tolist(), "dtype": dtype,
                      "sharded": bool(shard)}
    return refs


def training_text():
    import collections, email, http.client, json as js, textwrap
    parts = []
    for mod in (collections, email, http.client, js, textwrap, argparse, random):
        parts.append(inspect.getsource(mod))
    parts.append("The year 2024 had 366 days; 3.14159 and 1,000,000 are numbers. " * 20)
    parts.append("Ünïcödé tëxt — «quotes» and “curly” ones. Привет, мир! Καλημέρα κόσμε. "
                 "你好，世界。こんにちは。 😀🚀 مرحبا بالعالم ") 
    return parts


def test_strings(n, specials, seed):
    rnd = random.Random(seed)
    words = ["the", "The", "hello", "world", "don't", "I'LL", "we're", "it's", "can't", "naïve",
             "café", "Straße", "東京", "привет", "Ελλάδα", "مرحبا", "नमस्ते", "😀", "👩‍💻", "🇩🇪",
             "👍🏽", "x", "foo_bar", "fooBar", "HTTPServer", "e\u0301", "ﬁ", "Ⅻ", "½", "²", "٣"]
    code = ["def f(x):\n    return x**2\n", "for (int i = 0; i < n; ++i) {", "a[i] += b[j];",
            "#include <vector>", "if x != None:", "printf(\"%d\\n\", x);", "{'a': 1, \"b\": [2, 3]}",
            "SELECT * FROM t WHERE id = 42;", "x => x * 2", "  // comment", "\t\tindent"]
    spaces = [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n ", "\u00a0", "\u3000", "\u2028",
              "\u0085", "\u2009", "    \n", "\n   ", " \t "]
    digits = ["0", "7", "42", "123", "2024", "3.14159", "1,000,000", "00012", "99999999",
              "١٢٣", "٣٤"]
    punct = [".", ",", "!", "?", "...", "—", "-", "'", "\"", "(", ")", "[", "]", "<", ">", "<|",
             "|>", "''", "`", "~", "@", "#", "$", "%", "^", "&", "*", "'s", "'t", "'re", "'ve"]
    out = ["", " ", "a", "hello world", "  leading", "trailing  ", "\n\n\n", "1234567890",
           "Hello, World!", "😀😀😀", "<|endoftext|>", " <|endoftext|> "]
    while len(out) < n:
        k = rnd.randint(1, 14)
        s = ""
        for _ in range(k):
            r = rnd.random()
            if r < 0.3:
                s += rnd.choice(words)
            elif r < 0.45:
                s += rnd.choice(spaces)
            elif r < 0.58:
                s += rnd.choice(digits)
            elif r < 0.72:
                s += rnd.choice(punct)
            elif r < 0.8:
                s += rnd.choice(code)
            elif r < 0.86 and specials:
                s += rnd.choice(specials)
            elif r < 0.93:
                s += "".join(chr(rnd.choice([rnd.randint(0x20, 0x7e), rnd.randint(0xa0, 0x24f),
                                             rnd.randint(0x370, 0x4ff), rnd.randint(0x4e00, 0x4fff),
                                             rnd.randint(0x1f600, 0x1f64f)]))
                             for _ in range(rnd.randint(1, 6)))
            else:
                s += " "
        out.append(s)
    return out[:n]


def write_cases(tok, d, specials, seed, n):
    strings = test_strings(n, specials, seed)
    cases = []
    for s in strings:
        ids = tok.encode(s, add_special_tokens=False).ids
        ids_sp = tok.encode(s, add_special_tokens=True).ids
        cases.append({"text": s, "ids": ids, "ids_special": ids_sp, "decoded": tok.decode(ids, skip_special_tokens=False)})
    with open(os.path.join(d, "cases.json"), "w") as f:
        json.dump(cases, f, ensure_ascii=True)


def make_tokenizers(out, smollm2, fixture, n):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    text = training_text()
    res = {}
    # (1) GPT-2 style: ByteLevel with its own regex.
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(text, trainers.BpeTrainer(
        vocab_size=1200, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    # (2) Llama-3 / Qwen2 style: Split regex + ByteLevel without regex + digits, BOS template.
    llama3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
              r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
    tok2 = Tokenizer(models.BPE(ignore_merges=True))
    tok2.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(llama3), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok2.decoder = decoders.ByteLevel()
    tok2.train_from_iterator(text, trainers.BpeTrainer(
        vocab_size=1500, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    bos = tok2.token_to_id("<|im_start|>")
    tok2.post_processor = processors.TemplateProcessing(
        single="<|im_start|> $A", special_tokens=[("<|im_start|>", bos)])
    # (3) SmolLM2 style: Digits(individual) + ByteLevel, lstrip/rstrip added token.
    tok3 = Tokenizer(models.BPE())
    tok3.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)])
    tok3.decoder = decoders.ByteLevel()
    tok3.train_from_iterator(text, trainers.BpeTrainer(
        vocab_size=900, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    from tokenizers import AddedToken
    tok3.add_special_tokens([AddedToken("<mask>", lstrip=True, rstrip=True)])
    tok3.add_tokens([AddedToken("hello world", single_word=True)])
    for i, (name, t) in enumerate([("trained_gpt2", tok), ("trained_llama3", tok2),
                                   ("trained_digits", tok3)]):
        d = os.path.join(out, "tokenizers", name)
        os.makedirs(d, exist_ok=True)
        t.save(os.path.join(d, "tokenizer.json"))
        write_cases(t, d, specials + (["<mask>", "hello world"] if i == 2 else []), 10 + i, n)
        res[name] = True
    for name, src, extra, seed in [("smollm2", smollm2, ["<repo_name>"], 20),
                                   ("fixture", fixture, [], 30)]:
        if src and os.path.exists(os.path.join(src, "tokenizer.json")):
            d = os.path.join(out, "tokenizers", name)
            os.makedirs(d, exist_ok=True)
            t = Tokenizer.from_file(os.path.join(src, "tokenizer.json"))
            write_cases(t, d, specials + extra, seed, n)
            res[name] = True
    return res


# Prompts of the real models, chosen so that no greedy step is a near-tie (top-2 margins >= 6e-3
# with transformers 5.23 / torch 2.15; see docs/runner.md).
SMOLLM2_PROMPT = ("<|im_start|>user\nWhat is the capital of France? Answer briefly.<|im_end|>\n"
                  "<|im_start|>assistant\n")
FIXTURE_PROMPT = "The meaning of the word is"


def make_real_model(out, name, model_dir, prompt):
    """fp32 reference of a real checkpoint: greedy (KV-cached), then logits of prompt + greedy."""
    if not model_dir or not os.path.exists(os.path.join(model_dir, "model.safetensors")):
        return False
    from transformers import AutoModelForCausalLM
    from tokenizers import Tokenizer
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    ids = tok.encode(prompt).ids
    with torch.no_grad():
        gen = model.generate(torch.tensor([ids]), max_new_tokens=GREEDY_STEPS,
                             min_new_tokens=GREEDY_STEPS, do_sample=False, eos_token_id=None,
                             pad_token_id=0, use_cache=True, output_logits=True,
                             return_dict_in_generate=True)
        greedy = gen.sequences[0, len(ids):].tolist()
        top2 = [torch.topk(step[0].float(), 2).values for step in gen.logits]
        margins = [float(v[0] - v[1]) for v in top2]
        # One prefill over prompt + continuation: the logits of every position.
        logits = model(torch.tensor([ids + greedy])).logits[0].float().contiguous()
    save_file({"logits": logits}, os.path.join(out, name + "_logits.safetensors"))
    with open(os.path.join(out, name + ".json"), "w") as f:
        json.dump({"prompt": prompt, "tokens": ids, "greedy": greedy, "margins": margins}, f)
    return True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--smollm2", default="")
    ap.add_argument("--fixture", default="")
    ap.add_argument("--cases", type=int, default=3000)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    # One thread: the work is mostly KV-cached decode steps of small matrices, which do not gain
    # from more; on 2 shared cores 2 threads took 3-4x the CPU time (spinning) and more wall time.
    torch.set_num_threads(1)
    refs = make_models(a.out)
    toks = make_tokenizers(a.out, a.smollm2, a.fixture, a.cases)
    smol = make_real_model(a.out, "smollm2", a.smollm2, SMOLLM2_PROMPT)
    fixture = make_real_model(a.out, "fixture", a.fixture, FIXTURE_PROMPT)
    import tokenizers, transformers
    with open(os.path.join(a.out, "reference.json"), "w") as f:
        json.dump({"models": refs, "tokenizers": toks, "smollm2": smol, "fixture": fixture,
                   "versions": {"torch": torch.__version__,
                                "transformers": transformers.__version__,
                                "tokenizers": tokenizers.__version__}}, f)
    print("make_reference: wrote", a.out, file=sys.stderr)


if __name__ == "__main__":
    main()
