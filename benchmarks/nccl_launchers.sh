#!/bin/bash
# gpubench nccl under three launch modes on one GPU, the same call side by side: the plain run,
# mpirun -n 1 and torchrun --nproc-per-node 1, then the plain run again; prints the time per
# iteration (algbw) of every point in each mode, and each launcher's launch record and NCCL
# transport line (docs/nccl.md, "Launch modes"). Needs Open MPI's mpirun and torchrun on PATH.
# Writes the four results under $OUT (default /tmp/out).
# Run from a checkout: PYTHONPATH=src NCCL_NVLS_ENABLE=0 bash benchmarks/nccl_launchers.sh
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=${PYTHONPATH:-src} NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
ARGS="nccl -b 1M -e 1G -f 4"
PY=${PY:-python3}
echo "== uptime: $(uptime)"; nvidia-smi --query-gpu=name,uuid,pci.bus_id --format=csv,noheader
echo "== plain"; $PY -m gpubench $ARGS --json "$OUT/plain.json" -q; echo "rc=$?"
echo "== mpirun -n 1"; mpirun -n 1 --allow-run-as-root -x PYTHONPATH -x NCCL_NVLS_ENABLE $PY -m gpubench $ARGS --json "$OUT/mpirun.json"; echo "rc=$?"
echo "== torchrun"; torchrun --nproc-per-node 1 -m gpubench $ARGS --json "$OUT/torchrun.json" 2>&1 | grep -v "c10d\|^W1" | tail -6; echo "rc=${PIPESTATUS[0]}"
echo "== plain again"; $PY -m gpubench $ARGS --json "$OUT/plain2.json" -q; echo "rc=$?"
$PY - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
runs = {n: json.load(open(f"{out}/{n}.json")) for n in ("plain", "mpirun", "torchrun", "plain2")}
print("time per iteration, us (algbw GB/s); one rank, so busbw = algbw x 0 = 0 in every mode")
print(f"{'size':>12} {'place':<13}" + "".join(f"{n:>20}" for n in runs))
keys = [(r["params"]["nbytes"], r["params"]["placement"]) for r in runs["plain"]["records"]]
for k in keys:
    row = []
    for n, res in runs.items():
        r = next(x for x in res["records"] if (x["params"]["nbytes"], x["params"]["placement"]) == k)
        row.append(f"{r['extra']['time_s'] * 1e6:9.2f} ({r['extra']['algbw_bytes_per_s'] / 1e9:7.1f})")
    print(f"{k[0]:>12} {k[1]:<13}" + "".join(f"{v:>20}" for v in row))
for n in ("mpirun", "torchrun"):
    e = runs[n]["env"]
    print(n, "launch:", e.get("launch"), "| log:", (e.get("nccl_log") or {}).get("summary"))
    print(n, "rank 0:", {k: v for k, v in e["ranks"][0].items()})
PY
