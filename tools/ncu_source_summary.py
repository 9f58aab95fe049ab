#!/usr/bin/env python3
"""Where a kernel's warps stall, per SASS instruction, from Nsight Compute's source page.

Usage (on the GPU machine, a build with -lineinfo, which qwentune_lib has):
  ncu --set full --import-source no -k regex:KERNEL -c 1 -o prof BINARY ARGS
  ncu -i prof.ncu-rep --page source --csv --print-source sass | gzip > KERNEL.csv.gz
  python3 tools/ncu_source_summary.py KERNEL.csv.gz [TOP]
Prints the warp-stall samples per opcode (share, instruction count, executions, shared-memory
wavefronts and the excess over ideal, the top three stall reasons), the TOP single instructions
with their two largest stall reasons, and the instructions with the most excess shared-memory
wavefronts (bank conflicts) and excess global sectors (uncoalesced or partial-sector accesses). A consumer stalled on long_sb waits for a global load, short_sb
for shared memory or MUFU, wait for a fixed-latency result, barrier for __syncthreads.
"""
import collections
import csv
import gzip
import re
import sys


def read_source_page(path):
    """The source page's column index by header name, and its instruction rows (also used by
    tools/ncu_phase_summary.py)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", newline="") as f:
        rows = list(csv.reader(f))
    hdr_at = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    return {h: i for i, h in enumerate(rows[hdr_at])}, rows[hdr_at + 1:]


def main(path, top):
    ix, data = read_source_page(path)

    def val(r, key):
        i = ix.get(key)
        try:
            return float(r[i].replace(",", "")) if i is not None else 0.0
        except (ValueError, IndexError):
            return 0.0

    samples_key = "Warp Stall Sampling (All Samples)"
    stalls = [h for h in ix if h.startswith("stall_") and "(" not in h]
    total = sum(val(r, samples_key) for r in data) or 1.0
    per_op = collections.defaultdict(lambda: collections.Counter())
    for r in data:
        op = re.sub(r"^@!?U?P\w+\s+", "", r[ix["Source"]].strip()).split(" ")[0]
        c = per_op[op]
        c["samples"] += val(r, samples_key)
        c["n"] += 1
        c["executed"] += val(r, "Instructions Executed")
        c["wf"] += val(r, "L1 Wavefronts Shared")
        c["wf_excess"] += val(r, "L1 Wavefronts Shared Excessive")
        for h in stalls:
            c[h] += val(r, h)
    print(f"{len(data)} instructions, {total:.0f} stall samples")
    print(f"{'opcode':24s} {'samp %':>7s} {'n':>5s} {'executed':>11s} {'smem wf':>11s} {'excess':>10s}  top stalls")
    for op, c in sorted(per_op.items(), key=lambda kv: -kv[1]["samples"])[:top]:
        reasons = sorted(((c[h], h[6:]) for h in stalls), reverse=True)[:3]
        why = ", ".join(f"{n} {100 * v / max(c['samples'], 1):.0f}%" for v, n in reasons)
        print(f"{op:24s} {100 * c['samples'] / total:6.1f}% {c['n']:5.0f} {c['executed']:11.0f} {c['wf']:11.0f} "
              f"{c['wf_excess']:10.0f}  {why}")
    print(f"\ntop {top} instructions (index in the listing, share, SASS, two largest stall reasons)")
    order = sorted(range(len(data)), key=lambda i: -val(data[i], samples_key))[:top]
    for i in order:
        r = data[i]
        reasons = sorted(((val(r, h), h[6:]) for h in stalls), reverse=True)[:2]
        print(f"{i:6d} {100 * val(r, samples_key) / total:5.2f}% {r[ix['Source']].strip()[:58]:58s} "
              + " ".join(f"{n}:{v:.0f}" for v, n in reasons))
    for name, key, ideal_key in (("shared-memory wavefronts", "L1 Wavefronts Shared Excessive", "L1 Wavefronts Shared"),
                                 ("global sectors", "L2 Theoretical Sectors Global Excessive",
                                  "L2 Theoretical Sectors Global Ideal")):
        excess = sum(val(r, key) for r in data)
        if excess <= 0:
            continue
        base = sum(val(r, ideal_key) for r in data)
        label = "of" if key.startswith("L1") else "over an ideal"
        print(f"\nexcess {name}: {excess:.0f} {label} {base:.0f}; the top {min(top, 12)} instructions (excess, "
              f"{'all' if key.startswith('L1') else 'ideal'}, SASS)")
        for i in sorted(range(len(data)), key=lambda i: -val(data[i], key))[:min(top, 12)]:
            if val(data[i], key) <= 0:
                break
            print(f"{i:6d} {val(data[i], key):11.0f} {val(data[i], ideal_key):11.0f}  {data[i][ix['Source']].strip()[:60]}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    try:
        sys.exit(main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 25))
    except BrokenPipeError:  # piped into head
        sys.stderr.close()
        sys.exit(0)
