#!/bin/bash
# gpubench nccl under the three launch modes on one GPU, the same call, side by side (issue 13
# item 7): the plain run, mpirun -n 1 and torchrun --nproc-per-node 1; then the rank group itself
# under Open MPI + mpi4py and torchrun's agent store (3 CPU ranks), the NCCL INFO lines the parser
# reads, and a refused 2-ranks-on-1-GPU run (exit 3, no hang). Writes under $OUT (default /tmp/out).
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
echo "== rank group: mpirun -n 3 (Open MPI + mpi4py)"; mpirun -n 3 --allow-run-as-root --oversubscribe -x PYTHONPATH $PY tests/ranks/rank_probe.py --timeout 30 | cut -c1-300; echo "rc=${PIPESTATUS[0]}"
echo "== rank group: torchrun --nproc-per-node 3 (agent TCPStore)"; torchrun --nproc-per-node 3 tests/ranks/rank_probe.py --timeout 30 2>&1 | grep -v "c10d\|^W1\|OMP_NUM\|^\*" | cut -c1-300; echo "rc=${PIPESTATUS[0]}"
echo "== rank group hang under torchrun: rank 2 sleeps; 0 and 1 exit 3 at 5 s"; timeout 120 torchrun --nproc-per-node 3 tests/ranks/rank_probe.py --timeout 5 --victim 2 2>&1 | grep -E "FAULT|RESULT|exitcode|Failures" | head; echo "rc=${PIPESTATUS[0]}"
echo "== NCCL INFO lines (user-set NCCL_DEBUG: gpubench reads nothing)"; NCCL_DEBUG=INFO NCCL_DEBUG_FILE=$OUT/info.log mpirun -n 1 --allow-run-as-root -x PYTHONPATH -x NCCL_DEBUG -x NCCL_DEBUG_FILE -x NCCL_NVLS_ENABLE $PY -m gpubench nccl -b 1M -e 1M -q; echo "rc=$?"
grep -E "NCCL version|NET/|network|Channel|plugin|Plugin" "$OUT/info.log" | head -20
echo "== two ranks on one GPU (-d 0 each): NCCL refuses, exit 3, nothing left"; t0=$(date +%s); timeout 120 mpirun -n 2 --allow-run-as-root -x PYTHONPATH -x NCCL_NVLS_ENABLE $PY -m gpubench nccl -b 1M -e 1M -d 0 -T 20 2>&1 | tail -4; echo "rc=${PIPESTATUS[0]} took=$(( $(date +%s) - t0 ))s"; ps aux | grep "gpubench nccl" | grep -v grep | wc -l
