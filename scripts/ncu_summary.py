#!/usr/bin/env python3
"""One line per kernel launch from `ncu --csv --page details` output (gpu_run.sh's profile step):
duration, DRAM and memory throughput, achieved occupancy, registers, shared memory, and the
launch's grid, so a decode step's kernels can be compared at a glance.

    python scripts/ncu_summary.py ncu.csv [--json out.json]
"""

from __future__ import annotations

import argparse
import csv
import json
import sys

WANT = {  # metric name -> short column
    "Duration": "us",
    "DRAM Throughput": "dram%",
    "Memory Throughput": "mem",
    "Achieved Occupancy": "occ%",
    "Registers Per Thread": "regs",
    "Dynamic Shared Memory Per Block": "dsmem",
    "Warp Cycles Per Issued Instruction": "cyc/issue",
}


def parse(lines) -> list[dict]:
    rows = [ln for ln in lines if ln.startswith('"')]
    launches: dict[str, dict] = {}
    for rec in csv.DictReader(rows):
        lid = rec.get("ID")
        if lid is None:
            continue
        d = launches.setdefault(lid, {"id": int(lid), "kernel": rec["Kernel Name"].split("(")[0],
                                      "grid": rec.get("Grid Size"), "block": rec.get("Block Size")})
        name, unit, value = rec["Metric Name"], rec.get("Metric Unit", ""), rec["Metric Value"]
        if name in WANT:
            try:
                v = float(value.replace(",", ""))
            except ValueError:
                continue
            if name == "Duration":
                v = v / 1000 if unit == "ns" else v * 1000 if unit == "ms" else v
            if name == "Memory Throughput" and unit != "%":
                v = v * {"byte/s": 1e-9, "Kbyte/s": 1e-6, "Mbyte/s": 1e-3, "Gbyte/s": 1, "Tbyte/s": 1000}.get(unit, 1)
                d["mem_gb_s"] = round(v, 1)
                continue
            d[WANT[name]] = round(v, 2)
        elif "issue_stalled_" in name:  # --metrics regex:smsp__average_warps_issue_stalled_...: cycles per issue
            try:
                d.setdefault("stalls", {})[name.split("issue_stalled_")[1].split("_per_")[0]] = float(value.replace(",", ""))
            except ValueError:
                pass
        elif name in ("smsp__inst_executed.sum", "sm__inst_executed.max"):
            d[name.split("__")[0] + "_inst"] = int(float(value.replace(",", "")))
    return sorted(launches.values(), key=lambda d: d["id"])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("csv")
    p.add_argument("--json")
    args = p.parse_args(argv)
    with open(args.csv, errors="replace") as f:
        rows = parse(f.read().splitlines())
    for r in rows:
        print(f"{r['id']:>4} {r['kernel'][:34]:<34} grid {str(r['grid']):<14} {r.get('us', 0):>8.2f} us  "
              f"dram {r.get('dram%', 0):>5.1f}%  {r.get('mem_gb_s', 0):>7.0f} GB/s  occ {r.get('occ%', 0):>5.1f}%  "
              f"regs {r.get('regs', 0):>4.0f}  smem {r.get('dsmem', 0):>6.0f}  cyc/issue {r.get('cyc/issue', 0):>5.1f}"
              + (f"  inst/SM {r['sm_inst']}" if "sm_inst" in r else "")
              + "".join(f"  {k} {v:.1f}" for k, v in sorted(r.get("stalls", {}).items(), key=lambda kv: -kv[1])[:4]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
