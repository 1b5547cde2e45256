"""`gpubench compare`'s statistics on one figure as its samples grow: wall seconds, beside scipy.

Shows that compare is linear (or n log n) in the samples of a figure on every path of its
statistics (gpubench.analysis.compare): the exact Mann-Whitney p when one side has at most 8
samples and no ties (:func:`_u_at_most`, a truncated Gaussian binomial series), the normal
approximation (ties or both sides over 8), and the Hodges-Lehmann change with its Moses interval,
selected among the m n pairwise log ratios without listing them (:func:`_kth_differences`).
Before, 8 samples against 5,000 took over 200 s (the whole null distribution of U, O(m^2 n^2)).
Run on any machine, no GPU:

    PYTHONPATH=src python3 benchmarks/compare_scaling.py [--sizes 1000,10000,100000,500000]
        [--small 8] [--scipy-budget 20] [--cli]

For each size N, four figures: ``--small`` samples against N and N against N, each with
distinct values (seconds log-normal around 20 ms, cv 1%, the new side 3% / sqrt(min(m, n)) slower) and with
ties (the same rounded to 1 us: about 1,000 distinct values). For each it prints the wall
seconds of ``judge`` (what compare computes per figure: the medians, the Hodges-Lehmann change
and its 99% interval, the U test) and of ``mann_whitney_u`` alone (caches cleared before each),
the path taken and p; then, where scipy is installed, the wall seconds of
``scipy.stats.mannwhitneyu(new, base, method="auto")`` and the relative difference of the two
p (scipy's exact p is itself quadratic in N: it is skipped, "skip", once its time extrapolated
from the size before is over ``--scipy-budget`` seconds). It prints, it does not assert.
``--cli`` adds ``python -m gpubench compare A B`` in a fresh process on two files of the
distinct samples (loading and printing included).

Measured on the 2-core CPU machine shared with other work (numpy 2.4.6, scipy 1.17.1), wall s:

           N case          judge s U test s path                 p |  scipy s p rel diff
    ------------------------------------------------------------------------------------
       1,000 8 vs N          0.003    0.001 exact         4.46e-02 |    0.017    7.3e-14
       1,000 8 vs N ties     0.002    0.001 asymptotic    6.67e-01 |    0.002    1.7e-16
       1,000 N vs N          0.011    0.001 asymptotic    2.79e-05 |    0.002    3.5e-15
       1,000 N vs N ties     0.007    0.001 asymptotic    1.00e-03 |    0.002    2.2e-16
      10,000 8 vs N          0.016    0.003 exact         3.25e-03 |    0.679    6.7e-14
      10,000 8 vs N ties     0.021    0.006 asymptotic    3.58e-02 |    0.003    9.7e-16
      10,000 N vs N          0.068    0.006 asymptotic    4.05e-01 |    0.004    0.0e+00
      10,000 N vs N ties     0.029    0.004 asymptotic    2.65e-01 |    0.004    4.2e-16
     100,000 8 vs N          0.123    0.047 exact         5.36e-03 | skip ~68          -
     100,000 8 vs N ties     0.100    0.027 asymptotic    2.71e-03 |    0.021    1.9e-15
     100,000 N vs N          0.330    0.059 asymptotic    2.09e-03 |    0.038    1.2e-15
     100,000 N vs N ties     0.234    0.029 asymptotic    3.76e-02 |    0.026    1.1e-15
     500,000 8 vs N          0.537    0.205 exact         1.36e-01 | skip ~1698          -
     500,000 8 vs N ties     0.304    0.081 asymptotic    1.59e-01 |    0.062    1.0e-15
     500,000 N vs N          1.537    0.297 asymptotic    4.66e-03 |    0.231    1.9e-15
     500,000 N vs N ties     1.176    0.180 asymptotic    9.15e-03 |    0.193    9.5e-16

scipy's exact p took 0.14 s to 13 s at 8 vs 10,000 over runs, and 30 s at 8 vs 100,000.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = ROOT / "tests" / "data" / "copy-pinned-h200.json"
sys.path.insert(0, str(ROOT / "src"))

import numpy as np  # noqa: E402

from gpubench.analysis import compare as cmp  # noqa: E402

try:
    from scipy.stats import mannwhitneyu
except ImportError:  # prints "-" in scipy's columns
    mannwhitneyu = None


def seconds(rng: np.random.Generator, n: int, slower: float, ties: bool) -> list[float]:
    """``n`` per-sample seconds, log-normal around 20 ms x ``slower`` (cv 1%); rounded to 1 us with ``ties``."""
    s = 0.02 * slower * np.exp(rng.normal(0.0, 0.01, n))
    return (np.round(s, 6) if ties else s).tolist()


def figure(n_base: int, n_new: int, ties: bool, seed: int) -> tuple[list[float], list[float]]:
    """(base, new) seconds, new slower by 3% / sqrt(the smaller size) (p neither 1 nor 0 at any
    size, so that the p of scipy and gpubench compare); without ``ties`` every pooled value distinct
    (drawn again until so)."""
    rng = np.random.default_rng(seed)
    slower = 1.0 + 0.03 / min(n_base, n_new) ** 0.5  # a shift the U test puts near z = 2 at any size
    while True:
        base, new = seconds(rng, n_base, 1.0, ties), seconds(rng, n_new, slower, ties)
        if ties or len(set(base) | set(new)) == n_base + n_new:
            return base, new


def clear_caches() -> None:
    for f in (cmp._u_at_most, cmp._tie_deviations):  # the cached null distributions of U
        f.cache_clear()


def timed(f, *args, **kw):
    t0 = time.perf_counter()
    got = f(*args, **kw)
    return time.perf_counter() - t0, got


def cli_seconds(base: list[float], new: list[float]) -> str:
    """Wall seconds of ``python -m gpubench compare A B`` on two one-figure copy results of these samples."""
    doc = json.loads(TEMPLATE.read_text())
    rec = doc["records"][0]
    rec.update(params={**rec["params"], "nbytes": 1 << 30}, nbytes=1 << 30, reps=1, extra={})
    with tempfile.TemporaryDirectory() as d:
        paths = []
        for name, s in (("base", base), ("new", new)):
            doc["records"] = [{**rec, "samples_s": s}]
            paths.append(Path(d) / f"{name}.json")
            paths[-1].write_text(json.dumps(doc))
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-m", "gpubench", "compare", *map(str, paths)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
        wall = time.perf_counter() - t0
    return f"{wall:.2f}" if p.returncode in (0, 1) else f"exit {p.returncode}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,10000,100000,500000", help="samples N of the large side(s), comma-separated")
    ap.add_argument("--small", type=int, default=8, help="samples of the small side (<= 8: the exact test)")
    ap.add_argument("--scipy-budget", type=float, default=20.0, help="seconds scipy may take per figure (extrapolated)")
    ap.add_argument("--cli", action="store_true", help="also time the whole command on files (distinct samples)")
    a = ap.parse_args()
    sizes = [int(float(s)) for s in a.sizes.split(",")]
    print(f"compare's statistics on one figure, wall seconds (scipy {'missing' if mannwhitneyu is None else 'installed'})")
    head = (f"{'N':>8} {'case':<12} {'judge s':>8} {'U test s':>8} {'path':<12} {'p':>9} | "
            f"{'scipy s':>10} {'p rel diff':>10}" + (f" | {'cli s':>6}" if a.cli else ""))
    print(head)
    print("-" * len(head))
    last_scipy: dict[str, tuple[int, float]] = {}
    cmp.judge(*figure(9, 300, False, seed=0), "time", threshold_pct=1.0)  # imports and first calls, untimed
    for n in sizes:
        for label, m, ties in ((f"{a.small} vs N", a.small, False), (f"{a.small} vs N ties", a.small, True),
                               ("N vs N", n, False), ("N vs N ties", n, True)):
            base, new = figure(m, n, ties, seed=n + m + ties)
            clear_caches()
            t_judge, j = timed(cmp.judge, base, new, "time", threshold_pct=1.0)
            clear_caches()
            t_u, u = timed(cmp.mann_whitney_u, new, base)
            assert u.p == j.test.p
            sc, diff = "-", "-"
            if mannwhitneyu is not None:
                prev = last_scipy.get(label)
                # scipy's exact count grows as N^2 (asymptotic: N log N, far under the budget)
                est = prev[1] * (n / prev[0]) ** 2 if prev and u.method == "exact" else 0.0
                if est > a.scipy_budget:
                    sc, diff = f"skip ~{est:.0f}", "-"
                else:
                    t_s, s = timed(mannwhitneyu, new, base, method="auto")
                    last_scipy[label] = (n, t_s)
                    sc = f"{t_s:.3f}"
                    diff = f"{abs(u.p - s.pvalue) / s.pvalue:.1e}" if s.pvalue > 0 else "p 0"
            row = (f"{n:>8,} {label:<12} {t_judge:>8.3f} {t_u:>8.3f} {u.method:<12} {u.p:>9.2e} | "
                   f"{sc:>10} {diff:>10}")
            if a.cli:
                row += f" | {cli_seconds(base, new) if not ties else '-':>6}"
            print(row, flush=True)
    print("judge: medians, Hodges-Lehmann change and its Moses 99% interval, and the U test; "
          "U test: gpubench's mann_whitney_u alone; p rel diff: |p - scipy's p| / scipy's p.")
    if mannwhitneyu is None:
        print("scipy is not installed here: its columns are '-' (pip install scipy to fill them).")


if __name__ == "__main__":
    main()
