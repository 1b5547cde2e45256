#!/usr/bin/env bash
# One call on the GPU machine that checks what the CPU cannot: every gpu test, the driver-only
# install (issue 12), pin, nccl's new collectives, --json - on stdout. Writes logs under $OUT.
#   bash benchmarks/gpu_session.sh [WHEEL_DIR]
set -u
export NCCL_NVLS_ENABLE=0 PYTHONPATH=src PYTHONUNBUFFERED=1
O=${OUT:-/tmp/gpu-session}; mkdir -p "$O"
G="python3 -m gpubench"
timeout 300 python3 -m pytest -q -m gpu tests/gpu tests/unit/test_nccl_driver.py -p no:cacheprovider > "$O/pytest-gpu.txt" 2>&1
echo "pytest rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$O/pytest-gpu.txt" | tail -12
$G pin -e 1GiB --json /tmp/pin.json 2>&1 | tail -40
for c in gather scatter all-reduce broadcast; do $G nccl $c -b 1M -e 256M -q --json /tmp/nccl-$c.json; echo "nccl $c rc=$?"; done
$G nccl gather -b 1M -e 16M -G 10 | tail -8
$G env --json - 2>/dev/null | python3 -m json.tool > /dev/null && echo "env --json - | json.tool: ok"
$G copy --pinned -b 64MiB -e 64MiB --json - 2>/tmp/copy-report.txt | python3 -c "import json,sys; d=json.load(sys.stdin); print('copy --json - on stdout:', d['command'], len(d['records']), 'records')"; head -3 /tmp/copy-report.txt
timeout 200 bash benchmarks/driver_only_check.sh "${1:-.whl/ctk}" > "$O/driver-only.txt" 2>&1; echo "driver-only rc=$?"
grep -E "^====|exit|GB/s|NVRTC|include|leg|Leg" "$O/driver-only.txt" | tail -40
cp /tmp/pin.json /tmp/nccl-*.json "$O/" 2>/dev/null; true
