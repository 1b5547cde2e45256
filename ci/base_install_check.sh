#!/usr/bin/env bash
# The wheel on a base install (no extras: click, rich, numpy, nvidia-ml-py) in a fresh venv, run
# outside the checkout: every command that needs no GPU works, every one that needs an extra that
# is missing fails with exit 2 and one line naming the extra, and no command prints a traceback.
#
#   ci/base_install_check.sh dist/gpubench_cuda-*.whl     (make check runs it after python -m build)
#
# PYTHON picks the interpreter of the venv (default python3). Needs network access to PyPI for the
# base dependencies, or a pip cache that holds them.
set -euo pipefail

wheel=${1:?usage: ci/base_install_check.sh WHEEL}
root=$(cd "$(dirname "$0")/.." && pwd)
wheel=$(cd "$(dirname "$wheel")" && pwd)/$(basename "$wheel")
data=$root/tests/data
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"${PYTHON:-python3}" -m venv "$work/venv"
"$work/venv/bin/python" -m pip install -q --disable-pip-version-check "$wheel"
gb=$work/venv/bin/gpubench
cd "$work"  # not the checkout: the installed wheel is what runs

failed=0
n=0

# run EXPECTED_RC WANTED -- COMMAND...: exit EXPECTED_RC, no traceback; with exit 2, stderr is one
# line holding WANTED (the extra's install hint); WANTED "" asks nothing of the output.
run() {
    local rc_want=$1 want=$2
    shift 3
    local rc=0
    "$@" >"$work/out" 2>"$work/err" </dev/null || rc=$?
    n=$((n + 1))
    local why=""
    if [ "$rc" != "$rc_want" ]; then
        why="exit $rc, expected $rc_want"
    elif grep -q "Traceback" "$work/out" "$work/err"; then
        why="a traceback"
    elif [ "$rc_want" = 2 ] && [ "$(grep -c . "$work/err")" != 1 ]; then
        why="$(grep -c . "$work/err") lines on stderr, expected one"
    elif [ -n "$want" ] && ! grep -qF -- "$want" "$work/err"; then
        why="stderr does not name $want"
    fi
    local shown=${*#"$work"/venv/bin/}
    shown=${shown//"$data"\//tests/data/}
    shown=${shown//"$work"\//}
    if [ -n "$why" ]; then
        failed=$((failed + 1))
        echo "FAIL  $shown: $why"
        sed 's/^/      | /' "$work/err" | tail -n 20
    else
        echo "ok    $shown (exit $rc)"
    fi
}

run 0 "" -- "$gb" --help
run 0 "" -- "$gb" --version
run 0 "" -- "$work/venv/bin/python" -m gpubench --help
# every command's help, the measuring ones' too: loading a command needs no extra
for c in $("$work/venv/bin/python" -c "from gpubench.core import registry; print(' '.join(sorted(registry.plugins())))"); do
    run 0 "" -- "$gb" "$c" --help
done
run 0 "" -- "$gb" env
run 0 "" -- "$gb" env --json "$work/env.json"
# the CUDA wheels are recorded, null on a base install; NVRTC's version is null without CuPy
"$work/venv/bin/python" - "$work/env.json" <<'EOF' || { failed=$((failed + 1)); echo "FAIL  env --json: the record"; }
import json, sys
d = json.load(open(sys.argv[1]))
v, c = d["env"]["versions"], d["env"]["cuda"]
wheels = {k: v.get(k, "absent") for k in ("cuda-toolkit", "nvidia-cuda-nvrtc", "nvidia-nccl", "cuda-bindings")}
assert set(wheels.values()) == {None}, wheels
assert c["nvrtc_version"] is None, c
from gpubench.core.result import Result
Result.from_dict(d, source=sys.argv[1])
print("ok    env --json: CUDA wheels and NVRTC recorded as null, the file loads")
EOF
run 0 "" -- "$gb" env --json -
run 0 "" -- "$gb" compare "$data/copy-pinned-h200.json" "$data/copy-all-h200.json"
run 0 "" -- "$gb" compare "$data/nccl-h200x2.json" "$data/nccl-h200x2.json" --format markdown
run 0 "" -- "$gb" net local -t 1 -i 0.5 -q
cat >"$work/expect.toml" <<'EOF'
[[expect]]
name = "H2D pinned 1 GiB, GPU 0"
command = "copy"
where = { device = 0, direction = "h2d", memory = "pinned", nbytes = 1073741824 }
min_gbps = 1
EOF
run 0 "" -- "$gb" suite --check "$data/copy-pinned-h200.json" --expect "$work/expect.toml"
run 0 "" -- "$gb" metrics "$data/copy-pinned-h200.json" -o "$work/out.prom"
run 0 "" -- "$gb" suite --check "$data/nccl-h200x2.json" --expect gcp-a3-high
# an extra that is missing: exit 2, one line naming it
run 2 "gpubench-cuda[plot]" -- "$gb" plot "$data/copy-pinned-h200.json" -o "$work/out.png"
run 2 "gpubench-cuda[plot]" -- "$gb" report "$data/copy-pinned-h200.json" -o "$work/out.html"
run 2 "gpubench-cuda[dask]" -- "$gb" merge -t cpu
run 2 "gpubench-cuda[dask]" -- "$gb" nccl --scheduler-address tcp://127.0.0.1:9
# a GPU command without CuPy: exit 2 naming the CUDA extras
run 2 "gpubench-cuda[cuda13]" -- "$gb" copy
run 2 "gpubench-cuda[cuda13]" -- "$gb" suite

if [ "$failed" != 0 ]; then
    echo "base install: $failed of $n checks failed"
    exit 1
fi
echo "base install: all $n checks passed"
