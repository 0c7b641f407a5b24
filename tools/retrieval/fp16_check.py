#!/usr/bin/env python3
"""fp16 check of the retrieval tasks with transformers (fp32 weights, greedy), independent of the
C++ runner: does SmolLM2-135M-Instruct solve the passkey prompt and copy the induction spans
that configs/quality.yaml uses, before any method is put in the loop? The prompts follow
docs/metrics.md, "Retrieval" (haystack of seeded filler sentences, needle at the sentence
boundary nearest the depth; spans repeated `occurrences` times, last copy scored teacher-forced),
with numpy's generator in place of the runner's, so the keys and spans differ from a sweep's.

  python3 tools/retrieval/fp16_check.py passkey 4096 --seed 1
  python3 tools/retrieval/fp16_check.py induction --seed 11
"""
import argparse

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

MODEL = "data/cache/smollm2-135m-instruct"
INTRO = "Read the text below and remember the pass key in it.\n\n"
NEEDLE = "\nThe pass key is {key}.\n"
QUESTION = "\n\nWhat is the pass key in the text above?"
ANSWER_PREFIX = "The pass key in the text is"


def passkey(model, tok, lengths, seed, filler):
    sentences = [ln.strip() for ln in open(filler) if ln.strip()]
    sent_ids = [tok(" " + s, add_special_tokens=False)["input_ids"] for s in sentences]
    turn = tok.apply_chat_template([{"role": "user", "content": "\x01"}], tokenize=False,
                                   add_generation_prompt=True)
    before, after = turn.split("\x01")
    head = tok(before + INTRO, add_special_tokens=False)["input_ids"]
    tail = tok(QUESTION + after + ANSWER_PREFIX, add_special_tokens=False)["input_ids"]
    rng = np.random.default_rng(seed)
    for length in lengths:
        for depth in (0.0, 0.5, 1.0):
            key = "".join(str(x) for x in rng.integers(0, 10, 5))
            needle = tok(NEEDLE.replace("{key}", key), add_special_tokens=False)["input_ids"]
            n_fill = length - len(head) - len(tail) - len(needle)
            hay, bounds = [], [0]
            while len(hay) < n_fill:
                hay += sent_ids[rng.integers(0, len(sent_ids))]
                bounds.append(len(hay))
            hay = hay[:n_fill]
            k = min([b for b in bounds if b <= n_fill], key=lambda b: abs(b - depth * n_fill))
            prompt = head + hay[:k] + needle + hay[k:] + tail
            with torch.no_grad():
                out = model.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False)
            answer = tok.decode(out[0, len(prompt):])
            print(length, depth, key, repr(answer), key in answer, flush=True)


def induction(model, seed):
    rng = np.random.default_rng(seed)

    def run(hi, span, dist, occ):
        s = list(rng.integers(3, hi, span))
        seq = list(rng.integers(3, hi, 16)) + s
        for _ in range(occ - 1):
            seq += list(rng.integers(3, hi, dist)) + s
        start = len(seq) - span
        with torch.no_grad():
            lg = model(torch.tensor([seq])).logits[0]
        return np.mean([(lg[start + i - 1].argmax() == seq[start + i]).item()
                        for i in range(1, span)])

    # (token_hi, span, distance, occurrences), 4 sequences each, in this order (one generator).
    for args in [(1000, 32, 64, 3), (1000, 32, 128, 4), (500, 32, 256, 3)]:
        r = [run(*args) for _ in range(4)]
        print("token_hi %d span %d distance %d occurrences %d:" % args,
              [round(float(x), 2) for x in r], "mean", round(float(np.mean(r)), 3), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("task", choices=["passkey", "induction"])
    ap.add_argument("lengths", nargs="*", type=int, default=[1024, 2048, 4096])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--filler", default="data/prompts/passkey_filler.txt")
    a = ap.parse_args()
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32).eval()
    if a.task == "passkey":
        passkey(model, AutoTokenizer.from_pretrained(MODEL), a.lengths, a.seed, a.filler)
    else:
        induction(model, a.seed)


if __name__ == "__main__":
    main()
