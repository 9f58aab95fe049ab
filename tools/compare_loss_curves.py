#!/usr/bin/env python3
"""Compares two training runs' metrics.jsonl (a reference and a candidate, e.g. bf16 and fp8).

Prints one JSON line: the relative gap of the candidate's loss to the reference's, both smoothed by
a trailing 20-step mean (max |gap| from step 20 on, and the mean gap over the last 100 steps: the
fp8_loss_gap key), the first and last smoothed losses, the gradient norms' means over the last 100
steps, and whether the candidate diverged (a non-finite loss, or a smoothed loss above its first).

  compare_loss_curves.py [--name NAME] REF/metrics.jsonl CANDIDATE/metrics.jsonl
"""
import argparse
import json
import math
import sys


def read(path):
    loss, norm = {}, {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"{path}:{n}: not JSON ({e})")
            if "loss" in rec and "step" in rec:
                loss[rec["step"]] = rec["loss"]
                norm[rec["step"]] = rec.get("grad_norm", float("nan"))
    if not loss:
        sys.exit(f"{path}: no step records with a loss")
    return loss, norm


def smooth(values, window):
    out = []
    for i in range(len(values)):
        part = values[max(0, i - window + 1): i + 1]
        out.append(sum(part) / len(part))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", default="run")
    ap.add_argument("--window", type=int, default=20)
    ap.add_argument("--tail", type=int, default=100)
    ap.add_argument("ref")
    ap.add_argument("cand")
    a = ap.parse_args()
    rl, rn = read(a.ref)
    cl, cn = read(a.cand)
    steps = sorted(set(rl) & set(cl))
    if len(steps) < a.window:
        sys.exit(f"only {len(steps)} common steps in {a.ref} and {a.cand}")
    r = smooth([rl[s] for s in steps], a.window)
    c = smooth([cl[s] for s in steps], a.window)
    gap = [(y - x) / x for x, y in zip(r, c)]
    tail = gap[-a.tail:]
    finite = all(math.isfinite(cl[s]) for s in steps)
    mean = lambda v: sum(v) / len(v)
    out = {
        "name": a.name, "steps": len(steps),
        f"fp8_loss_gap_{a.name}": mean(tail),
        "max_abs_gap_smoothed": max(abs(g) for g in gap[a.window - 1:]),
        "ref_loss_first_last": [r[a.window - 1], r[-1]], "cand_loss_first_last": [c[a.window - 1], c[-1]],
        "ref_grad_norm_tail": mean([rn[s] for s in steps[-a.tail:]]),
        "cand_grad_norm_tail": mean([cn[s] for s in steps[-a.tail:]]),
        "diverged": (not finite) or c[-1] > c[a.window - 1],
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
