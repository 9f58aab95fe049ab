#!/usr/bin/env python3
"""Where a straight-line kernel's time goes, phase by phase, from Nsight Compute's source page.

Usage (the same source CSV as tools/ncu_source_summary.py):
  ncu --set full --import-source no -k regex:KERNEL -c 1 -o prof BINARY ARGS
  ncu -i prof.ncu-rep --page source --csv --print-source sass | gzip > KERNEL.csv.gz
  python3 tools/ncu_phase_summary.py KERNEL.csv.gz [TOP]
Splits the SASS listing at every block barrier (BAR.SYNC) and wgmma wait (WARPGROUP.DEPBAR), the
points where a phase of a kernel like GDN's bwd_chunk ends, and prints per segment its share of the
warp-stall samples (about its share of the time), its instruction count, the wgmma shapes it issues
and its counts of the memory, shuffle and math opcodes that make up an epilogue. The stall
samples land on the instruction that waits, so a segment that ends in a barrier also carries the
time its warps spent waiting for the others (or for cp.async data) there. With TOP, each segment
with at least 2 % of the samples also lists its TOP instructions by samples (index, share, SASS, the
two largest stall reasons): where the sixteenth round found an epilogue's expf at 16 % of a scan.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ncu_source_summary import read_source_page  # noqa: E402

OPS = ("LDGSTS", "LDG", "STG", "LDSM", "LDS", "STS", "STL", "LDL", "SHFL", "MUFU", "F2FP", "FADD", "FMUL", "FFMA")


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def main(path, top=0):
    ix, data = read_source_page(path)
    samples, source = ix["Warp Stall Sampling (All Samples)"], ix["Source"]
    stalls = [h for h in ix if h.startswith("stall_") and "(" not in h]
    total = sum(number(r[samples]) for r in data) or 1.0
    segments, cur = [], {"start": 0, "samples": 0.0, "n": 0, "wgmma": {}, "ops": {}}
    for i, r in enumerate(data):
        tokens = r[source].split()
        if not tokens:
            continue
        op = tokens[1] if tokens[0].startswith("@") and len(tokens) > 1 else tokens[0]
        cur["samples"] += number(r[samples])
        cur["n"] += 1
        if op.startswith("HGMMA"):
            shape = op.split(".")[1]
            cur["wgmma"][shape] = cur["wgmma"].get(shape, 0) + 1
        for key in OPS:
            if op.startswith(key):
                cur["ops"][key] = cur["ops"].get(key, 0) + 1
                break
        if op.startswith("BAR.SYNC") or op.startswith("WARPGROUP.DEPBAR"):
            cur["end"], cur["end_op"] = i, "barrier" if op.startswith("BAR") else "wgmma wait"
            segments.append(cur)
            cur = {"start": i + 1, "samples": 0.0, "n": 0, "wgmma": {}, "ops": {}}
    cur["end"], cur["end_op"] = len(data), "end"
    segments.append(cur)
    print(f"{len(data)} instructions, {total:.0f} stall samples")
    print("instructions   share   n    ends at     wgmma / opcodes")
    for s in segments:
        wg = " ".join(f"{k}x{v}" for k, v in s["wgmma"].items())
        ops = " ".join(f"{k}={v}" for k, v in s["ops"].items())
        print(f"{s['start']:5d}-{s['end']:5d} {100 * s['samples'] / total:5.1f}% {s['n']:4d}  {s['end_op']:10s}  "
              f"{wg + ' | ' if wg else ''}{ops}")
        if top > 0 and s["samples"] >= 0.02 * total:
            rows = sorted(range(s["start"], min(s["end"] + 1, len(data))), key=lambda i: -number(data[i][samples]))
            for i in rows[:top]:
                r = data[i]
                reasons = sorted(((number(r[ix[h]]), h[6:]) for h in stalls), reverse=True)[:2]
                print(f"      {i:5d} {100 * number(r[samples]) / total:5.2f}% {r[source].strip()[:56]:56s} "
                      + " ".join(f"{n}:{v:.0f}" for v, n in reasons))


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    try:
        main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) == 3 else 0)
    except BrokenPipeError:  # piped into head
        sys.stderr.close()
