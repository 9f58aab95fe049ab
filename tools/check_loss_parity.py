#!/usr/bin/env python3
"""transformers' loss and gradient norm for a model directory and a pre-tokenized JSONL, to compare
with `qwentune loss --backend cuda|cpu --grads g.safetensors` (which prints loss and grad_norm).

    python3 tools/check_loss_parity.py --model DIR --data FILE.jsonl [--dtype float32|bfloat16]

Each sample runs alone (no packing), fp32 unless --dtype; the loss is the mean cross-entropy over
all trained tokens of the file (labels shifted as transformers does), gradients of that mean.
Prints one JSON line: loss, trained_tokens, grad_norm.
"""
import argparse
import json

import torch
from transformers import Qwen3_5ForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    model = Qwen3_5ForCausalLM.from_pretrained(args.model, dtype=dtype, attn_implementation="eager").to(dev)
    samples = [json.loads(l) for l in open(args.data) if l.strip()]
    sums, counts = [], 0
    for s in samples:
        ids = torch.tensor([s["input_ids"]], device=dev)
        labels = s.get("labels") or s["input_ids"]
        logits = model(input_ids=ids).logits.float()[0]
        target = torch.tensor(labels[1:] + [-100], device=dev)
        sums.append(torch.nn.functional.cross_entropy(logits, target, ignore_index=-100, reduction="sum"))
        counts += int((target != -100).sum())
    loss = torch.stack(sums).sum() / counts
    loss.backward()
    sq = sum(float(p.grad.float().pow(2).sum()) for p in model.parameters() if p.grad is not None)
    print(json.dumps({"engine": "transformers", "dtype": args.dtype, "loss": float(loss), "trained_tokens": counts,
                      "grad_norm": sq ** 0.5}))


if __name__ == "__main__":
    main()
