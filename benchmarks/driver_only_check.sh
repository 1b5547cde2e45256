#!/usr/bin/env bash
# Does the README's main job run on a GPU machine that has only the NVIDIA driver?
#
#   sudo bash benchmarks/driver_only_check.sh [WHEEL_DIR]      # WHEEL_DIR defaults to .whl/ctk
#
# Needs root (a private mount namespace: unshare -m), a Python that imports CuPy and gpubench's
# dependencies (PYTHON, default python3), and in WHEEL_DIR the wheels that gpubench-cuda[cuda13]
# takes from the CUDA toolkit: nvidia-cuda-nvrtc (NVRTC) and nvidia-cuda-runtime (the headers),
# e.g. fetched with
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
#       -d .whl/ctk nvidia-cuda-nvrtc==13.2.86 nvidia-cuda-runtime==13.2.86 cuda-toolkit==13.2.2
# No network is used. In each leg the CUDA toolkit (/usr/local/cuda*) and every site-packages'
# nvidia/ folder (the CUDA component wheels) are hidden under empty tmpfs mounts, CUDA_PATH,
# CUDA_HOME, LD_LIBRARY_PATH and CONDA_PREFIX are unset; then cupy.show_config() and
# `gpubench copy --pinned -b 64MiB -e 1GiB` run:
#   A  nothing added: expected to fail (exit 3, CUDA headers / NVRTC not found), since CuPy
#      compiles gpubench's kernels with NVRTC and the driver brings neither;
#   B  the wheels unpacked with pip install --target DIR and DIR on PYTHONPATH: expected to fail
#      like A, because cuda-pathfinder (how CuPy 14 finds NVRTC and the headers) searches
#      site-packages folders (site.getsitepackages()), not PYTHONPATH;
#   C  the wheels in a virtual environment's site-packages, as `pip install gpubench-cuda[cuda13]`
#      lays them out (the venv reaches this Python's CuPy through a .pth line): expected to measure.
# Everything found is written to stdout; the exit status is 0 when leg C measured, else 1.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PY=${PYTHON:-python3}
WHEELS=$(realpath -m "${1:-.whl/ctk}")

say() { printf '%s\n' "$*"; }
rule() { say ""; say "==== $* ===="; }

[ "$(id -u)" = 0 ] || { say "needs root (mount namespaces); run with sudo"; exit 2; }
command -v unshare >/dev/null || { say "needs unshare (util-linux)"; exit 2; }
ls "$WHEELS"/*.whl >/dev/null 2>&1 || { say "no wheels in $WHEELS"; exit 2; }

WORK=$(mktemp -d /tmp/gpubench-driver-only.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

rule "machine"
say "date: $(date -u +%FT%TZ)  host: $(hostname)  kernel: $(uname -r)"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
say "python: $(command -v "$PY") -> $("$PY" -c 'import sys; print(sys.executable, sys.version.split()[0])')"
PURELIB=$("$PY" -c 'import cupy, os; print(os.path.dirname(os.path.dirname(cupy.__file__)))') \
    || { say "this Python cannot import cupy"; exit 2; }
PYVER=$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
"$PY" -c 'import cupy; from importlib import metadata as m
print("cupy", cupy.__version__, "at", cupy.__file__)
for d in ("cuda-pathfinder", "cuda-bindings", "numpy", "click", "rich", "nvidia-ml-py"):
    try: print(d, m.version(d))
    except m.PackageNotFoundError: print(d, "not installed")'
say "environment: CUDA_PATH=${CUDA_PATH:-} CUDA_HOME=${CUDA_HOME:-} LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-} CONDA_PREFIX=${CONDA_PREFIX:-}"
say "wheels in $WHEELS:"
ls -l "$WHEELS"/*.whl | awk '{print "  " $5 " B  " $NF}'

# what to hide: the toolkit's folders (symlinks resolved) and every site-packages' nvidia/
HIDE=()
for d in /usr/local/cuda*; do [ -e "$d" ] && HIDE+=("$(realpath "$d")"); done
while IFS= read -r d; do HIDE+=("$d"); done < <("$PY" - <<'EOF'
import os, site, sys
dirs = list(site.getsitepackages()) + [site.getusersitepackages()] + sys.path
for d in dict.fromkeys(os.path.realpath(p) for p in dirs if p):
    if os.path.isdir(os.path.join(d, "nvidia")):
        print(os.path.join(d, "nvidia"))
EOF
)
mapfile -t HIDE < <(printf '%s\n' "${HIDE[@]}" | sort -u)
say "hidden in every leg (empty tmpfs over each):"
printf '  %s\n' "${HIDE[@]}"

# leg B's folder and leg C's virtual environment, made before anything is hidden (no network)
install_wheels() {  # install_wheels TARGET: pip install --no-index --no-deps --target, else unzip
    if "$PY" -m pip --version >/dev/null 2>&1; then
        "$PY" -m pip install -q --no-index --no-deps --disable-pip-version-check --target "$1" "$WHEELS"/*.whl
    else
        say "  (this Python has no pip: the wheels are unzipped into $1 instead)"
        for w in "$WHEELS"/*.whl; do "$PY" -m zipfile -e "$w" "$1"; done
    fi
}
rule "setup"
install_wheels "$WORK/site" && say "B: wheels installed in $WORK/site"
"$PY" -m venv --without-pip "$WORK/venv" || { say "cannot create a venv"; exit 2; }
VSITE=$("$WORK/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
install_wheels "$VSITE" && say "C: wheels installed in $VSITE"
printf '%s\n' "$PURELIB" > "$VSITE/zz-gpubench-check-base.pth"  # CuPy and gpubench's dependencies
say "C: $WORK/venv/bin/python (Python $PYVER) reaches $PURELIB through a .pth line"

cat > "$WORK/probe.py" <<'EOF'
import site, sys
print("site-packages searched by cuda-pathfinder:", site.getsitepackages())
try:
    from cuda import pathfinder
    try:
        lib = pathfinder.load_nvidia_dynamic_lib("nvrtc")
        print("nvrtc:", lib.abs_path, "found via", lib.found_via)
    except Exception as e:
        print("nvrtc: not found:", type(e).__name__, str(e).splitlines()[0][:200])
    try:
        print("cudart headers:", pathfinder.find_nvidia_header_directory("cudart"))
    except Exception as e:
        print("cudart headers: error:", type(e).__name__, str(e)[:200])
except Exception as e:
    print("cuda.pathfinder not importable:", type(e).__name__, e)
import cupy
print("---- cupy.show_config() ----", flush=True)
cupy.show_config()
EOF

leg() {  # leg NAME PYTHON EXTRA_PYTHONPATH
    local name=$1 py=$2 extra=$3
    rule "leg $name"
    unshare --mount --propagation private env -u CUDA_PATH -u CUDA_HOME -u LD_LIBRARY_PATH -u CONDA_PREFIX \
        LEG_PY="$py" LEG_PATH="$ROOT/src${extra:+:$extra}" LEG_OUT="$WORK/leg-$name" bash -s -- "${HIDE[@]}" <<'EOF'
for d in "$@"; do mount -t tmpfs -o size=1m,mode=755 gpubench-hide "$d" || echo "could not hide $d"; done
echo "hidden now: $(for d in "$@"; do printf '%s(%s entries) ' "$d" "$(ls -A "$d" | wc -l)"; done)"
echo "ld.so cache entries for nvrtc/cudart (their files are hidden when under the folders above):"
ldconfig -p 2>/dev/null | grep -E 'libnvrtc|libcudart' | sed 's/^/  /' | head -6
echo "libnvrtc / cuda_runtime.h still visible under /usr /opt /lib /lib64 /root (outside this check's folders):"
timeout 120 find /usr /opt /lib /lib64 /root -xdev \( -name 'libnvrtc.so*' -o -name 'cuda_runtime.h' \) 2>/dev/null \
    | grep -v '/tmp/gpubench-driver-only' | sed 's/^/  /' | head -10
echo "---- probe (python: $LEG_PY) ----"
PYTHONPATH="$LEG_PATH" "$LEG_PY" "$(dirname "$LEG_OUT")/probe.py" 2>&1
echo "probe exit: $?"
echo "---- gpubench copy --pinned -b 64MiB -e 1GiB ----"
start=$(date +%s)
PYTHONPATH="$LEG_PATH" "$LEG_PY" -m gpubench copy --pinned -b 64MiB -e 1GiB --json "$LEG_OUT.json" 2>&1
rc=$?
echo "gpubench exit: $rc after $(( $(date +%s) - start )) s"
echo "$rc" > "$LEG_OUT.rc"
EOF
}

leg A "$PY" ""
leg B "$PY" "$WORK/site"
leg C "$WORK/venv/bin/python" ""

rule "summary"
for n in A B C; do
    rc=$(cat "$WORK/leg-$n.rc" 2>/dev/null || echo "?")
    extra=""
    if [ -s "$WORK/leg-$n.json" ]; then
        extra=$("$PY" - "$WORK/leg-$n.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
pts = [r for r in d["records"] if r["samples_s"]]
best = {}
for r in pts:
    s = sorted(r["samples_s"]); med = s[len(s) // 2]
    k = r["params"]["direction"]
    best[k] = max(best.get(k, 0), r["nbytes"] / med / 1e9)
print(f"{len(pts)} points measured; best median GB/s: " + ", ".join(f"{k} {v:.2f}" for k, v in sorted(best.items()))
      + f"; runtime {d['env'].get('cuda', {}).get('runtime_version')} driver {d['env'].get('nvml', {}).get('driver_version')}")
EOF
)
    fi
    say "leg $n: gpubench exit $rc${extra:+; $extra}"
done
say "expected: A and B exit 3 (CUDA headers or NVRTC not found), C exit 0 with figures"
[ "$(cat "$WORK/leg-C.rc" 2>/dev/null)" = 0 ]
