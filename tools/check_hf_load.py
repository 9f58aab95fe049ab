#!/usr/bin/env python3
"""Loads qwentune-written model directories with transformers and reports missing/unexpected keys.

    python3 tools/check_hf_load.py DIR [DIR ...] [--logits QWENTUNE_LOGITS.json]

With --logits (written by `qwentune logits`), also compares transformers' fp32 logits with
qwentune's for the same token ids and prints the max abs / relative difference.
"""
import argparse
import json

import torch
from transformers import Qwen3_5ForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--logits", default=None)
    args = ap.parse_args()
    for d in args.dirs:
        model, info = Qwen3_5ForCausalLM.from_pretrained(d, output_loading_info=True, dtype=torch.float32,
                                                         attn_implementation="eager")
        n = sum(p.numel() for p in model.parameters())
        out = {"dir": d, "parameters": n, "missing_keys": sorted(info["missing_keys"]),
               "unexpected_keys": sorted(info["unexpected_keys"]),
               "mismatched_keys": sorted(str(k) for k in info.get("mismatched_keys", [])),
               "error_msgs": [str(e) for e in info.get("error_msgs", [])]}
        if args.logits:
            ref = json.load(open(args.logits))
            ids = torch.tensor([ref["input_ids"]])
            with torch.no_grad():
                logits = model(input_ids=ids).logits[0].float()
            ours = torch.tensor(ref["logits"], dtype=torch.float32).view_as(logits)
            diff = (logits - ours).abs()
            out["logits_max_abs_diff"] = float(diff.max())
            out["logits_rel_diff"] = float((logits - ours).norm() / logits.norm())
        print(json.dumps(out))


if __name__ == "__main__":
    main()
