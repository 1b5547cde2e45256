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
the run-to-run spread of each point's median over the rounds ((max - min) / median, %). The
measured default and how to read the verdict: docs/timing.md, "The copy default, measured".

`--analyse DIR` re-prints the summary from a folder of saved runs (no GPU needed).

Without ``--today-src`` the baseline is this tree's own fixed rule, ``--max-noise 100 --min-time 0.1``
(a 100% goal is met at the 10th sample, so: at least 10 samples and 0.1 s), which isolates the rule
from every other difference between checkouts. To run another checkout itself, point
``--today-src`` at its ``src`` folder, e.g. ``git worktree add /tmp/old COMMIT`` then
``--today-src /tmp/old/src`` (any gpubench checkout whose ``copy`` takes ``--json`` and ``-q``).

The verdict per rule against the baseline (`verdict`): wall time per sweep, paired by round (the
rounds alternate, so round i of each rule ran next to each other), and the run-to-run spread of the
points' medians, as the ratio of the median spread over points (rule / baseline) with a 95%
percentile-bootstrap interval over points resampled in pairs (B. Efron and R. Tibshirani, *An
Introduction to the Bootstrap*, 1993, ch. 13; 10,000 resamples, seed 0, so the same saved runs give
the same interval). Both overall and per memory kind (pinned, pageable): pageable points spread
3-50% from run to run under every rule and would hide a change in the pinned ones. "not higher"
means the interval reaches 1 or below; "lower" that it lies below 1; "higher" that it lies above.
"""

from __future__ import annotations

import argparse
import json
import math
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


SPREAD_RESAMPLES = 10_000


def _median_ratio_ci(pairs: list[tuple[float, float]], resamples: int = SPREAD_RESAMPLES) -> tuple[float, float, float]:
    """median(rule spreads) / median(baseline spreads) over points, with its 95% percentile-bootstrap
    interval: the points are resampled with replacement, each keeping its (baseline, rule) pair.

    Args: pairs: (baseline spread %, rule spread %) per point, the same points for both.
    Returns: (ratio, low, high); inf where a baseline median is 0.
    """
    import numpy as np

    a = np.array([p[0] for p in pairs], dtype=float)
    b = np.array([p[1] for p in pairs], dtype=float)

    def ratio(x, y):
        mx = np.median(x, axis=-1)
        my = np.median(y, axis=-1)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(mx > 0, my / np.where(mx > 0, mx, 1), np.inf)

    whole = float(ratio(a, b))
    if math.isinf(whole):
        return whole, whole, whole
    idx = np.random.default_rng(0).integers(0, len(a), size=(resamples, len(a)))
    boots = np.sort(ratio(a[idx], b[idx]))
    return whole, float(np.quantile(boots, 0.025)), float(np.quantile(boots, 0.975))


def verdict(summary: dict, base: str) -> dict:
    """Each rule against ``base``: wall time (mean, and paired by round) and the run-to-run spread
    ratio with its interval, overall and per memory kind. Needs at least 2 rounds of each."""
    out = {}
    b = summary[base]
    for rule, s in summary.items():
        if rule == base:
            continue
        rounds = min(len(s["wall_s"]), len(b["wall_s"]))
        paired = [s["wall_s"][i] / b["wall_s"][i] for i in range(rounds)]
        v = {"rounds": rounds, "wall_s_mean": s["wall_s_mean"], "base_wall_s_mean": b["wall_s_mean"],
             "wall_ratio_mean": s["wall_s_mean"] / b["wall_s_mean"],
             "wall_ratio_by_round": paired, "faster_in_every_round": all(x < 1 for x in paired),
             "noise_pct_median": s["noise_pct_median"], "base_noise_pct_median": b["noise_pct_median"],
             "spread": {}}
        for kind in ("all", "pinned", "pageable"):
            pairs = [(b["per_point"][k]["run_to_run_spread_pct"], p["run_to_run_spread_pct"])
                     for k, p in s["per_point"].items()
                     if k in b["per_point"] and (kind == "all" or k.startswith(kind + "/"))
                     and p["run_to_run_spread_pct"] is not None
                     and b["per_point"][k]["run_to_run_spread_pct"] is not None]
            if len(pairs) < 2:
                continue
            r, lo, hi = _median_ratio_ci(pairs)
            word = "lower" if hi < 1 else "higher" if lo > 1 else "not higher"
            v["spread"][kind] = {"points": len(pairs), "base_median_pct": statistics.median(x for x, _ in pairs),
                                 "median_pct": statistics.median(y for _, y in pairs),
                                 "ratio": r, "ci95": [lo, hi], "verdict": word}
        out[rule] = v
    return out


def show_verdict(v: dict, base: str) -> None:
    for rule, x in v.items():
        walls = ", ".join(f"{r:.2f}" for r in x["wall_ratio_by_round"])
        print(f"\n{rule} against {base} ({x['rounds']} rounds): wall {x['wall_s_mean']:.2f} s vs "
              f"{x['base_wall_s_mean']:.2f} s per sweep, x{x['wall_ratio_mean']:.2f} (by round: {walls}; "
              f"{'faster in every round' if x['faster_in_every_round'] else 'not faster in every round'}); "
              f"noise reached, median over points {x['noise_pct_median']:.3f}% vs {x['base_noise_pct_median']:.3f}%")
        for kind, sp in x["spread"].items():
            print(f"  run-to-run spread, {kind:8} ({sp['points']:2} points): median {sp['median_pct']:.2f}% vs "
                  f"{sp['base_median_pct']:.2f}%, ratio {sp['ratio']:.2f} (95% CI {sp['ci95'][0]:.2f}-"
                  f"{sp['ci95'][1]:.2f}): {sp['verdict']}")


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
    ap.add_argument("--base", help="the rule the others are judged against (default: today, else fixed)")
    ap.add_argument("--no-fixed", action="store_true", help="leave out the fixed rule of this tree (needs --today-src)")
    a = ap.parse_args()
    if a.analyse:
        summary = analyse(a.analyse)
        show(summary)
        base = a.base or ("today" if "today" in summary else "fixed")
        if base in summary and min(len(s["wall_s"]) for s in summary.values()) >= 2:
            show_verdict(verdict(summary, base), base)
        return
    here = str(Path(__file__).resolve().parents[1] / "src")
    rules = {}
    if a.today_src:
        if not (Path(a.today_src) / "gpubench" / "__main__.py").is_file():
            raise SystemExit(f"--today-src {a.today_src}: no gpubench package there "
                             "(give the src folder of a checkout, e.g. of `git worktree add DIR COMMIT`)")
        rules["today"] = ("", a.today_src)
    if not (a.no_fixed and a.today_src):
        rules["fixed"] = ("--max-noise 100 --min-time 0.1", here)  # the old rule, in this tree
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
    base = a.base or ("today" if "today" in summary else "fixed")
    v = verdict(summary, base) if len(runs) >= 2 * len(rules) else {}
    (a.out / "summary.json").write_text(json.dumps({"rules": summary, "verdict": v, "base": base}, indent=1))
    show(summary)
    show_verdict(v, base)


if __name__ == "__main__":
    main()
