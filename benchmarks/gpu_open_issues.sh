#!/usr/bin/env bash
# What issues 13 and 19 still need from the one-GPU machine, in two device calls of under 10 min.
#   part 13: every gpu test (the launcher tests in tests/gpu/test_nccl_launch_gpu.py first), then
#            benchmarks/nccl_launchers.sh (plain / mpirun -n 1 / torchrun, nccl -b 1M -e 1G -f 4).
#   part 19: benchmarks/stopping_vs_today.py: today's checkout (if .stage/today-src was carried:
#            bash benchmarks/stage_today_src.sh first), the fixed rule in this tree and the default,
#            6 alternated rounds (an even count, so each rule's rounds are as often adjacent).
# Run from the checkout root: bash benchmarks/gpu_open_issues.sh 13   (or 19). Writes under $OUT.
set -u
export NCCL_NVLS_ENABLE=0 PYTHONPATH=src PYTHONUNBUFFERED=1
O=${OUT:-/tmp/gpu-open}; mkdir -p "$O"
echo "== $(date -u +%H:%M:%S) part ${1:?13 or 19}; uptime: $(uptime)"
nvidia-smi --query-gpu=name,uuid,pci.bus_id,clocks.sm,temperature.gpu,utilization.gpu --format=csv,noheader
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader
case "$1" in
13)
  timeout 120 python3 -m pytest -q -m gpu tests/gpu/test_nccl_launch_gpu.py -p no:cacheprovider > "$O/pytest-launch.txt" 2>&1
  echo "launcher gpu tests rc=$?"; tail -3 "$O/pytest-launch.txt"
  timeout 300 python3 -m pytest -q -m gpu tests/gpu tests/unit/test_nccl_driver.py -p no:cacheprovider \
      --ignore=tests/gpu/test_nccl_launch_gpu.py > "$O/pytest-gpu.txt" 2>&1
  echo "all other gpu tests rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$O/pytest-gpu.txt" | tail -12
  OUT="$O/launch" timeout 150 bash benchmarks/nccl_launchers.sh > "$O/launchers.txt" 2>&1
  echo "nccl_launchers rc=$?"; cat "$O/launchers.txt" | cut -c1-400 | tail -60
  echo "== the nccl footer (NCCL version as 2.28.x)"; timeout 60 python3 -m gpubench nccl -b 1M -e 16M -f 4 | tail -5
  echo "== under mpirun -n 1, output to a file: no colour codes"; timeout 60 mpirun -n 1 --allow-run-as-root \
      -x PYTHONPATH -x NCCL_NVLS_ENABLE python3 -m gpubench nccl -b 1M -e 1M > "$O/mpirun-log.txt" 2>&1
  echo "rc=$? escape bytes in the log: $(grep -c $'\x1b' "$O/mpirun-log.txt")"
  ;;
19)
  # RULES="name:copy options;name:..." tries other rules beside the default; NO_FIXED=1 leaves out
  # this tree's fixed rule (with today's src staged)
  T=(); [ -f .stage/today-src/gpubench/__main__.py ] && T=(--today-src .stage/today-src)
  [ "${NO_FIXED:-0}" = 1 ] && T+=(--no-fixed)
  R=(); IFS=';' read -ra SPECS <<< "${RULES:-default:}"; for r in "${SPECS[@]}"; do R+=(--rule "$r"); done
  timeout ${STOP_TIMEOUT:-480} python3 benchmarks/stopping_vs_today.py "${T[@]}" --rounds ${ROUNDS:-6} \
      --budget-s ${BUDGET:-330} --out "$O/stop" "${R[@]}" 2>&1 | tee "$O/stopping.txt" | grep -v "^round" | head -12
  echo "stopping rc=${PIPESTATUS[0]}"; sed -n '/against/,$p' "$O/stopping.txt"
  tar czf "$O/stop.tgz" -C "$O" stop && rm -rf "$O/stop"  # 8 files at most come back
  ;;
*) echo "part must be 13 or 19"; exit 2 ;;
esac
echo "== $(date -u +%H:%M:%S) done"
