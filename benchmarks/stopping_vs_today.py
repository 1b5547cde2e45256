"""The noise-based stopping rule against the fixed rule it replaces, on the default `copy` sweep.

Runs on a GPU machine, in one call, alternating the rules round by round so drift hits all alike:

    PYTHONPATH=src python3 benchmarks/stopping_vs_today.py --today-src /path/to/main/src \
        --rounds 3 --out $OUT/stop --rule "goal1:--max-noise 1 --min-time 0.01" ...

"today" is `gpubench copy` from ``--today-src`` (the checkout before the rule existed: at least 10
samples and 0.1 s of measured copies per point); every ``--rule`` is `gpubench copy` from this tree
with those options. Each run is a fresh process (`python3 -m gpubench copy --json ... -q`) timed
by its wall clock. Per rule it prints: wall seconds per sweep, samples taken, the noise each point
reached (the half-width of the median's 95% distribution-free confidence interval, % of the median,
recomputed from the saved samples with `gpubench.core.stats.median_noise` for every rule alike), and
the run-to-run spread of each point's median over the rounds ((max - min) / median, %).

`--analyse DIR` re-prints the summary from a folder of saved runs (no GPU needed).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path


def run_once(src: str, opts: list[str], out: Path) -> float:
    env = dict(os.environ, PYTHONPATH=src, NCCL_NVLS_ENABLE="0")
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "gpubench", "copy", "--json", str(out), "-q", *opts], env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"copy {' '.join(opts)} from {src} failed ({p.returncode}): {p.stderr[-2000:]}")
    return wall


def point_stats(path: Path) -> dict:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from gpubench.core.stats import Summary, median_noise

    doc = json.loads(path.read_text())
    out = {}
    for r in doc["records"]:
        s = r["samples_s"]
        if not s:
            continue
        key = f"{r['params']['memory']}/{r['params']['direction']}/{r['params']['nbytes']}"
        rates = [r["nbytes"] / t for t in s]
        noise = median_noise(sorted(s))
        out[key] = {"n": len(s), "median_gbps": Summary.of(rates).median / 1e9,
                    "noise_pct": None if noise is None else 100 * noise,
                    "measured_s": sum(s) * r["reps"], "stopped_by": r["extra"].get("stopped_by")}
    return out


def analyse(folder: Path) -> dict:
    meta = json.loads((folder / "runs.json").read_text())
    by_rule: dict[str, list] = {}
    for run in meta["runs"]:
        by_rule.setdefault(run["rule"], []).append((run["wall_s"], point_stats(folder / run["file"])))
    summary = {}
    for rule, runs in by_rule.items():
        walls = [w for w, _ in runs]
        keys = list(runs[0][1])
        noises = [p[k]["noise_pct"] for _, p in runs for k in keys if p[k]["noise_pct"] is not None]
        nsum = [sum(p[k]["n"] for k in keys) for _, p in runs]
        spread = {}
        for k in keys:
            meds = [p[k]["median_gbps"] for _, p in runs if k in p]
            spread[k] = 100 * (max(meds) - min(meds)) / statistics.median(meds) if len(meds) > 1 else None
        sp = [v for v in spread.values() if v is not None]
        capped = sum(1 for _, p in runs for k in keys if p[k]["stopped_by"] in ("max_time", "max_iters"))
        summary[rule] = {
            "opts": meta["rules"][rule], "runs": len(runs), "wall_s": walls, "wall_s_mean": statistics.mean(walls),
            "samples_per_sweep": statistics.mean(nsum),
            "noise_pct_median": statistics.median(noises), "noise_pct_max": max(noises),
            "points_noise_over_1pct": sum(1 for x in noises if x > 1) / len(runs),
            "run_to_run_spread_pct_median": statistics.median(sp) if sp else None,
            "run_to_run_spread_pct_max": max(sp) if sp else None,
            "capped_points_per_sweep": capped / len(runs),
            "per_point": {k: {"n": [p[k]["n"] for _, p in runs], "noise_pct": [p[k]["noise_pct"] for _, p in runs],
                              "median_gbps": [p[k]["median_gbps"] for _, p in runs],
                              "stopped_by": [p[k]["stopped_by"] for _, p in runs],
                              "run_to_run_spread_pct": spread[k]} for k in keys},
        }
    return summary


def show(summary: dict) -> None:
    print(f"{'rule':10} {'opts':44} {'wall s (each)':>26} {'samples':>8} {'noise% med/max':>15} "
          f"{'>1%':>4} {'r2r% med/max':>13} {'capped':>6}")
    for rule, s in summary.items():
        walls = "/".join(f"{w:.1f}" for w in s["wall_s"])
        print(f"{rule:10} {s['opts'][:44]:44} {s['wall_s_mean']:6.2f} ({walls:>17}) {s['samples_per_sweep']:8.0f} "
              f"{s['noise_pct_median']:6.3f}/{s['noise_pct_max']:6.3f}  {s['points_noise_over_1pct']:4.1f} "
              f"{s['run_to_run_spread_pct_median']:5.2f}/{s['run_to_run_spread_pct_max']:5.2f} "
              f"{s['capped_points_per_sweep']:6.1f}")
    rules = list(summary)
    print("\nper point: n / noise% (mean over rounds) / run-to-run spread %")
    print(f"{'point':28}" + "".join(f"{r:>26}" for r in rules))
    for k in summary[rules[0]]["per_point"]:
        cells = []
        for r in rules:
            p = summary[r]["per_point"].get(k)
            if p is None:
                cells.append(f"{'-':>26}")
                continue
            nz = [x for x in p["noise_pct"] if x is not None]
            r2r = p["run_to_run_spread_pct"]
            cells.append(f"{statistics.mean(p['n']):7.0f} {statistics.mean(nz) if nz else float('nan'):7.3f} "
                         f"{r2r if r2r is not None else float('nan'):7.3f}   ")
        print(f"{k:28}" + "".join(cells))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--today-src", help="src folder of the checkout with the old fixed rule")
    ap.add_argument("--rule", action="append", default=[], help="name:copy options (from this tree)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--budget-s", type=float, default=1e9, help="start no new round after this many seconds")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--analyse", type=Path, help="print the summary of a folder of saved runs")
    a = ap.parse_args()
    if a.analyse:
        show(analyse(a.analyse))
        return
    here = str(Path(__file__).resolve().parents[1] / "src")
    rules = {"today": ("", a.today_src)}
    for spec in a.rule:
        name, _, opts = spec.partition(":")
        rules[name] = (opts, here)
    a.out.mkdir(parents=True, exist_ok=True)
    runs = []
    t0 = time.perf_counter()
    for rnd in range(a.rounds):
        if rnd and time.perf_counter() - t0 > a.budget_s:
            print(f"budget reached after {rnd} round(s)")
            break
        order = list(rules) if rnd % 2 == 0 else list(rules)[::-1]  # alternate the order too
        for name in order:
            opts, src = rules[name]
            f = f"{name}-{rnd}.json"
            wall = run_once(src, shlex.split(opts), a.out / f)
            runs.append({"rule": name, "round": rnd, "file": f, "wall_s": wall})
            print(f"round {rnd} {name:10} {wall:6.2f} s", flush=True)
    (a.out / "runs.json").write_text(json.dumps({"rules": {k: v[0] for k, v in rules.items()}, "runs": runs}))
    summary = analyse(a.out)
    (a.out / "summary.json").write_text(json.dumps(summary, indent=1))
    show(summary)


if __name__ == "__main__":
    main()
