#!/usr/bin/env python3
"""Condense `ncu --csv --page raw` output into one block per profiled kernel launch.

Usage: ncu --csv --page raw --section ... <app> > raw.csv; python3 tools/ncu_summary.py raw.csv
Prints duration, the throughput percentages that bound a kernel (SM, memory, DRAM, L1, issue,
tensor pipes), occupancy, registers and shared memory, and the largest warp stall reasons (warps
stalled per issued instruction), so a device call's log stays short.
"""
import csv
import re
import sys


def num(x):
    try:
        return float(str(x).replace(",", ""))
    except ValueError:
        return None


def main(path):
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]  # ncu prints its own log lines first
    rows = list(csv.reader(lines))
    if len(rows) < 3:
        print("ncu_summary: no kernel rows in", path)
        return 1
    head, data = rows[0], rows[2:]  # row 1 holds the units
    col = {h: i for i, h in enumerate(head)}

    def get(r, name):
        i = col.get(name)
        return num(r[i]) if i is not None and i < len(r) else None

    stall = re.compile(r"smsp__average_warps_issue_stalled_(\w+)_per_issue_active\.ratio$")
    picks = [
        ("SM %", "sm__throughput.avg.pct_of_peak_sustained_elapsed"),
        ("mem %", "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"),
        ("DRAM %", "dram__throughput.avg.pct_of_peak_sustained_elapsed"),
        ("L1 %", "l1tex__throughput.avg.pct_of_peak_sustained_active"),
        ("L2 %", "lts__throughput.avg.pct_of_peak_sustained_elapsed"),
        ("issue %", "sm__inst_issued.avg.pct_of_peak_sustained_active"),
        ("occ %", "sm__warps_active.avg.pct_of_peak_sustained_active"),
        ("regs", "launch__registers_per_thread"),
        ("smem KB", "launch__shared_mem_per_block_dynamic"),
        ("blocks/SM", "launch__occupancy_limit_shared_mem"),
    ]
    for r in data:
        name = r[col["Kernel Name"]] if "Kernel Name" in col else "?"
        name = re.sub(r"\(.*", "", name)[:60]
        grid = r[col["Grid Size"]] if "Grid Size" in col else ""
        dur = get(r, "gpu__time_duration.sum")
        print(f"== {name} grid {grid} block {r[col['Block Size']] if 'Block Size' in col else ''}: "
              f"{dur / 1000 if dur else float('nan'):.1f} us")
        parts = []
        for label, key in picks:
            v = get(r, key)
            if v is not None:
                parts.append(f"{label} {v / 1024 if label == 'smem KB' else v:.1f}")
        for label, key in (("tensor %", "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active"),
                           ("hmma inst %", "sm__inst_executed_pipe_tensor_op_hmma.avg.pct_of_peak_sustained_active"),
                           ("gmma inst %", "sm__inst_executed_pipe_tensor_op_gmma.avg.pct_of_peak_sustained_active")):
            v = get(r, key)
            if v:
                parts.append(f"{label} {v:.1f}")
        print("   " + ", ".join(parts))
        stalls = []
        for h in head:
            m = stall.match(h)
            if m:
                v = get(r, h)
                if v:
                    stalls.append((v, m.group(1)))
        stalls.sort(reverse=True)
        print("   stalls/issue: " + ", ".join(f"{n} {v:.2f}" for v, n in stalls[:7]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
