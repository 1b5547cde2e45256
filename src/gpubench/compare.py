"""Compare saved results: pair figures, test the change against the noise, and say what differs.

Works on saved results only (:func:`gpubench.core.result.load`); no GPU is needed.

Pairing: two records are the same figure when their ``params`` are equal (:meth:`Record.key`).
Figures present on one side only are listed, not dropped.

Value of a figure: for metric "bandwidth" each sample's rate nbytes / seconds in B/s (higher is
better); for metric "time" each sample's seconds (lower is better). The change is
``100 * (median_new - median_base) / median_base`` of those values.

Verdict, from the raw samples: a two-sided Mann-Whitney U test (:func:`mann_whitney_u`) at level
``alpha`` (default 0.01). A figure is "worse" (or "better") only when the test finds a difference
(p < alpha) AND the medians differ by more than ``threshold_pct`` in the worse (better) direction;
otherwise it is "same" (within noise or within the threshold). ``--fail-on-regression`` fails on any
"worse" figure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

from gpubench.core.errors import UsageError
from gpubench.core.result import Record, Result

DEFAULT_ALPHA = 0.01
DEFAULT_THRESHOLD_PCT = 1.0
HIGHER_IS_BETTER = {"bandwidth": True, "time": False}


@dataclass(frozen=True)
class MWU:
    """Outcome of a Mann-Whitney U test.

    Attributes:
        u: U statistic of the first sample (number of pairs (x, y) with x > y, ties counting 1/2).
        z: normal score of u with tie and continuity corrections (0 when the variance is 0).
        p: two-sided p-value, in [0, 1]: exact when there are no ties and the smaller sample has
            at most EXACT_MAX values, else from the normal approximation.
        method: "exact", "exact (ties)" or "asymptotic".
        p_min: the smallest p these sample sizes can give (complete separation, no ties): when it
            is not below alpha the test cannot find any difference, however large.
    """

    u: float
    z: float
    p: float
    method: str = "asymptotic"
    p_min: float = 0.0


EXACT_MAX = 8  # scipy.stats.mannwhitneyu(method="auto"): exact when a sample has <= 8 values and no ties


def _u_counts(n1: int, n2: int) -> list[int]:
    """Number of orderings of n1 + n2 distinct values giving each U = 0 .. n1*n2 (the exact null
    distribution of U), by the recurrence f(u; m, n) = f(u - n; m - 1, n) + f(u; m, n - 1)
    (Mann and Whitney 1947, eq. 2)."""
    # f[m][n] as lists indexed by u, built up over m for every n
    prev = [[1] for _ in range(n2 + 1)]  # m = 0: only U = 0
    for m in range(1, n1 + 1):
        cur = [[1]]  # n = 0: only U = 0
        for n in range(1, n2 + 1):
            size = m * n + 1
            row = [0] * size
            a = prev[n]  # f(.; m - 1, n): shifted by n
            for u, c in enumerate(a):
                row[u + n] += c
            b = cur[n - 1]  # f(.; m, n - 1)
            for u, c in enumerate(b):
                row[u] += c
            cur.append(row)
        prev = cur
    return prev[n2]


def _exact_p(u1: float, n1: int, n2: int) -> float:
    """Two-sided exact p: 2 * P(U <= min(u1, n1 n2 - u1)), capped at 1."""
    counts = _u_counts(n1, n2)
    total = sum(counts)
    k = int(math.floor(min(u1, n1 * n2 - u1) + 1e-9))
    return min(1.0, 2.0 * sum(counts[: k + 1]) / total)


EXACT_TIES_MAX_SPLITS = 50_000  # with ties: the exact permutation distribution while C(n1+n2, n1) <= this


def _exact_p_ties(ranks: "Any", n1: int, u1: float) -> float:
    """Two-sided exact p with ties: every way of choosing which n1 of the pooled (mid)ranks belong
    to the first sample is equally likely under the null; p is the share of them whose U is at least
    as far from n1 n2 / 2 as the observed one (the permutation test of U, conditional on the ties).
    """
    import itertools

    n = len(ranks)
    n2 = n - n1
    mu = n1 * n2 / 2.0
    base = n1 * (n1 + 1) / 2.0
    far = abs(u1 - mu) - 1e-9
    hits = total = 0
    for idx in itertools.combinations(range(n), n1):
        u = sum(ranks[i] for i in idx) - base
        total += 1
        if abs(u - mu) >= far:
            hits += 1
    return min(1.0, hits / total)


def min_p(n1: int, n2: int) -> float:
    """The smallest two-sided p of the test for these sizes (every new value beyond every base value):
    exact 2 / C(n1 + n2, n1) when the exact test applies, else the normal approximation's."""
    if n1 == 0 or n2 == 0:
        return 1.0
    if min(n1, n2) <= EXACT_MAX:
        return min(1.0, 2.0 / math.comb(n1 + n2, n1))
    n = n1 + n2
    sigma = math.sqrt(n1 * n2 / 12.0 * (n + 1))
    return min(1.0, math.erfc(max(n1 * n2 / 2.0 - 0.5, 0.0) / sigma / math.sqrt(2.0)))


def mann_whitney_u(x: Sequence[float], y: Sequence[float]) -> MWU:
    """Two-sided Mann-Whitney U test: exact for small samples without ties, else the normal
    approximation with tie and continuity corrections.

    Exact (no ties and a sample of at most EXACT_MAX values, as scipy's method="auto"): p = 2 *
    P(U <= min(U1, n1 n2 - U1)) under the null distribution of U (every ordering equally likely),
    counted by Mann and Whitney's recurrence. With ties and at most EXACT_TIES_MAX_SPLITS ways to
    split the pooled values: the exact permutation distribution of U given the tied ranks (scipy
    would use the normal approximation, whose p cannot go under ~0.012 at 5 vs 5). Otherwise:

    With the n = n1 + n2 values ranked together (ties get their average rank) and R1 the sum of the
    ranks of ``x``::

        U1      = R1 - n1 (n1 + 1) / 2
        mu      = n1 n2 / 2
        sigma^2 = n1 n2 / 12 * ((n + 1) - sum_k (t_k^3 - t_k) / (n (n - 1)))   # t_k: size of tie group k
        z       = (|U1 - mu| - 1/2) / sigma        (continuity correction; 0 if that goes negative)
        p       = erfc(|z| / sqrt(2))              (two-sided)

    Sources: H. B. Mann and D. R. Whitney, "On a test of whether one of two random variables is
    stochastically larger than the other", Ann. Math. Statist. 18 (1947) 50-60; the tie-corrected
    variance from E. L. Lehmann, "Nonparametrics: Statistical Methods Based on Ranks" (1975), eq.
    (1.35); the same computation as ``scipy.stats.mannwhitneyu(method="asymptotic")``, and the exact
    branch as ``method="exact"``.

    Args:
        x, y: samples (any unit, finite), each with at least one value.

    Returns:
        MWU(u, z, p, method, p_min). When every value is tied (sigma = 0) the samples cannot be told
        apart: z = 0, p = 1.

    Raises:
        ValueError: an empty sample.
    """
    import numpy as np

    n1, n2 = len(x), len(y)
    if n1 == 0 or n2 == 0:
        raise ValueError("Mann-Whitney U needs two non-empty samples")
    allv = np.concatenate([np.asarray(x, dtype=float), np.asarray(y, dtype=float)])
    n = n1 + n2
    # average ranks (1-based) of tied groups
    uniq, inverse, counts = np.unique(allv, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)  # rank of each group's last member
    avg_rank = ends - (counts - 1) / 2.0
    ranks = avg_rank[inverse]
    r1 = float(ranks[:n1].sum())
    u1 = r1 - n1 * (n1 + 1) / 2.0
    mu = n1 * n2 / 2.0
    tie_term = float(((counts.astype(float) ** 3) - counts).sum())
    var = n1 * n2 / 12.0 * ((n + 1) - (tie_term / (n * (n - 1)) if n > 1 else 0.0))
    pmin = min_p(n1, n2)
    if var <= 0:
        return MWU(u1, 0.0, 1.0, "asymptotic", pmin)
    z = max(abs(u1 - mu) - 0.5, 0.0) / math.sqrt(var)
    z = math.copysign(z, u1 - mu)
    if len(uniq) == n and min(n1, n2) <= EXACT_MAX:
        return MWU(u1, z, _exact_p(u1, n1, n2), "exact", pmin)
    if len(uniq) < n and math.comb(n, n1) <= EXACT_TIES_MAX_SPLITS:
        # the normal approximation cannot go below ~0.012 at 5 vs 5, so a tie would hide any change
        return MWU(u1, z, _exact_p_ties([float(r) for r in ranks], n1, u1), "exact (ties)", pmin)
    p = min(1.0, math.erfc(abs(z) / math.sqrt(2.0)))
    return MWU(u1, z, p, "asymptotic", pmin)


def figure_values(record: Record, source: str = "result") -> list[float]:
    """The values a figure is judged on: rates nbytes / s in B/s for "bandwidth", seconds for "time".

    Raises:
        UsageError: an unknown metric, a bandwidth record that moves no bytes, or a sample that is
            not a finite positive number of seconds.
    """
    if record.metric not in HIGHER_IS_BETTER:
        raise UsageError(
            f"{source}: record {record.params} has metric {record.metric!r}", "known metrics: bandwidth, time"
        )
    for t in record.samples_s:
        if not (math.isfinite(t) and t > 0):
            raise UsageError(f"{source}: record {record.params} has a sample of {t!r} seconds",
                             "samples must be finite and > 0")
    if record.metric == "time":
        return list(record.samples_s)
    if record.nbytes <= 0:
        raise UsageError(f"{source}: bandwidth record {record.params} moves {record.nbytes} bytes")
    return record.rates()


def _median(xs: Sequence[float]) -> float:
    from gpubench.core.stats import Summary

    return Summary.of(xs).median


@dataclass
class Row:
    """One figure of a comparison.

    Attributes:
        params: the figure's params.
        metric: "bandwidth" (values in B/s) or "time" (values in seconds).
        status: "paired", "only-base", "only-new" or "no-data" (a side has an error or no samples).
        base_median, new_median: median value of each side (B/s or s), None where absent.
        change_pct: 100 * (new - base) / base, None unless paired.
        p: Mann-Whitney two-sided p-value, None unless paired.
        verdict: "better", "worse", "same", or "" when not paired.
        note: why a figure has no verdict (an error text), else "".
    """

    params: dict[str, Any]
    metric: str
    status: str
    base_median: float | None = None
    new_median: float | None = None
    n_base: int = 0
    n_new: int = 0
    change_pct: float | None = None
    p: float | None = None
    verdict: str = ""
    note: str = ""

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def judge(base: Sequence[float], new: Sequence[float], metric: str, *, threshold_pct: float,
          alpha: float = DEFAULT_ALPHA) -> tuple[float, float, str, float, float]:
    """Verdict on one figure from its two samples of values.

    Args:
        base, new: values (B/s for bandwidth, seconds for time).
        metric: "bandwidth" (higher is better) or "time" (lower is better).
        threshold_pct: a change smaller than this (in %) is "same" whatever the test says.
        alpha: significance level of the two-sided Mann-Whitney U test.

    Returns:
        (change_pct, p, verdict, base_median, new_median). verdict is "better", "worse", "same",
        or, when these sample sizes cannot reach p < alpha at all (3 runs against 3: p >= 0.1),
        "worse (untested)" / "better (untested)" for a change over the threshold and "same" below it.
    """
    mb, mn = _median(base), _median(new)
    change = 100.0 * (mn - mb) / mb if mb else 0.0
    t = mann_whitney_u(new, base)
    gain = change if HIGHER_IS_BETTER[metric] else -change
    if abs(change) <= threshold_pct:
        verdict = "same"
    elif t.p_min >= alpha:
        verdict = ("better" if gain > 0 else "worse") + " (untested)"
    elif t.p < alpha:
        verdict = "better" if gain > 0 else "worse"
    else:
        verdict = "same"
    return change, t.p, verdict, mb, mn


@dataclass
class Comparison:
    """``new`` against ``base``: the env differences and one Row per figure (base order, then new-only)."""

    base_name: str
    new_name: str
    command: str
    env_diff: list[tuple[str, str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        c = {"better": 0, "worse": 0, "same": 0, "better (untested)": 0, "worse (untested)": 0,
             "only-base": 0, "only-new": 0, "no-data": 0}
        for r in self.rows:
            c[r.verdict if r.status == "paired" else r.status] += 1
        return c

    def regressions(self) -> list[Row]:
        """Figures worse beyond the noise (p < alpha) and the threshold."""
        return [r for r in self.rows if r.verdict == "worse"]

    def untested_worse(self) -> list[Row]:
        """Figures worse by more than the threshold whose sample sizes cannot reach p < alpha: not
        regressions (noise alone moves 3 merge runs by several %), but said out loud."""
        return [r for r in self.rows if r.verdict == "worse (untested)"]

    def missing(self) -> list[Row]:
        """Figures the base has data for and the new result lacks (absent, or an error row)."""
        return [r for r in self.rows if r.status == "only-base" and r.base_median is not None
                or r.status == "no-data" and r.base_median is not None and r.new_median is None]

    def to_dict(self) -> dict:
        return {
            "base": self.base_name,
            "new": self.new_name,
            "command": self.command,
            "env_diff": [{"what": w, "base": b, "new": n} for w, b, n in self.env_diff],
            "notes": self.notes,
            "counts": self.counts(),
            "rows": [r.to_dict() for r in self.rows],
        }


def _gpu_field(env: dict, key: str) -> str:
    gpus = env.get("gpus") or []
    vals = [g.get(key) for g in gpus]
    if not vals:
        return "-"
    return ", ".join(str(v) for v in vals)


def _pcie(env: dict) -> str:
    gpus = env.get("gpus") or []
    if not gpus:
        return "-"
    return ", ".join(f"Gen{g.get('pcie_gen') or '?'} x{g.get('pcie_width') or '?'}" for g in gpus)


def env_facts(env: dict) -> dict[str, str]:
    """The machine facts a comparison header shows, as text: GPUs, driver, CUDA, PCIe link, versions, host."""
    host = env.get("host") or {}
    cuda = env.get("cuda") or {}
    nvml = env.get("nvml") or {}
    facts = {
        "hostname": str(host.get("hostname", "-")),
        "GPUs": _gpu_field(env, "name"),
        "GPU count": str(cuda.get("device_count", len(env.get("gpus") or [])) or "-"),
        "PCIe link (now)": _pcie(env),
        "NVIDIA driver": str(nvml.get("driver_version") or "-"),
        "CUDA driver": str(cuda.get("driver_version") or "-"),
        "CUDA runtime": str(cuda.get("runtime_version") or "-"),
        "CPU": str(host.get("cpu_model", "-")),
        "OS": str(host.get("os", "-")),
        "python": str(host.get("python", "-")),
    }
    for k, v in sorted((env.get("versions") or {}).items()):
        facts[k] = str(v)
    nccl = env.get("nccl")
    if isinstance(nccl, dict):  # nccl results: the library and the NCCL_* variables it read
        facts["NCCL"] = str(nccl.get("version") or "-")
        facts["NCCL_* variables"] = " ".join(f"{k}={v}" for k, v in sorted((nccl.get("env") or {}).items())) or "-"
    return facts


def env_diff(base: Result, new: Result) -> list[tuple[str, str, str]]:
    """(what, base value, new value) for each machine fact, gpubench version or option that differs."""
    a, b = env_facts(base.env), env_facts(new.env)
    out = [(k, a.get(k, "-"), b.get(k, "-")) for k in list(a) + [k for k in b if k not in a] if a.get(k) != b.get(k)]
    if base.gpubench_version != new.gpubench_version:
        out.append(("gpubench (result)", base.gpubench_version, new.gpubench_version))
    for k in sorted(set(base.spec) | set(new.spec)):
        va, vb = base.spec.get(k), new.spec.get(k)
        if (k not in base.spec or k not in new.spec) and (va if k in base.spec else vb) == \
                ADDED_OPTIONS.get((new.command, k), _NO_DEFAULT):
            continue  # an option an older gpubench did not have, at the value that means "off"
        if va != vb:
            out.append((f"option {k}", _short(va), _short(vb)))
    for k in TIMING_FACTS:  # how the figures were taken, where a command records it
        va, vb = base.timing.get(k), new.timing.get(k)
        if va != vb:
            out.append((f"timing {k}", _short(va), _short(vb)))
    return out


# options added to a command after results of it were saved, with the value that behaves as the
# results before them did: a result without the key equals one with this value
ADDED_OPTIONS: dict[tuple[str, str], Any] = {("nccl", "cuda_graph"): 0}
_NO_DEFAULT = object()

# timing keys that change what a figure means (nccl: the buffers' allocator, which NCCL's
# zero-copy registration under -G depends on)
TIMING_FACTS = ("buffers",)


def _short(v: Any, width: int = 60) -> str:
    import json

    s = json.dumps(v, sort_keys=True) if not isinstance(v, str) else v
    return s if len(s) <= width else s[: width - 3] + "..."


def check_same_command(results: Sequence[tuple[str, Result]]) -> str:
    """The command all results share.

    Raises:
        UsageError: results of different commands.
    """
    base_name, base = results[0]
    for name, r in results[1:]:
        if r.command != base.command:
            raise UsageError(
                f"{name} is a {r.command!r} result and {base_name} a {base.command!r} result",
                "compare results of the same command",
            )
    return base.command


def compare(base: Result, new: Result, *, base_name: str = "base", new_name: str = "new",
            threshold_pct: float = DEFAULT_THRESHOLD_PCT, alpha: float = DEFAULT_ALPHA) -> Comparison:
    """Compare ``new`` against ``base``, figure by figure.

    Args:
        base, new: results of the same command.
        threshold_pct: changes at or under this many percent are "same" (>= 0).
        alpha: significance level of the Mann-Whitney U test, in (0, 1).

    Raises:
        UsageError: different commands; a record with an unknown metric or impossible samples.
    """
    check_same_command([(base_name, base), (new_name, new)])
    cmp = Comparison(base_name, new_name, base.command, env_diff(base, new))
    for name, r in ((base_name, base), (new_name, new)):
        if r.partial:
            why = f"stopped by a fault: {r.failed_by[:100]}" if r.failed_by else \
                f"interrupted by {r.interrupted_by or 'a signal'}"
            cmp.notes.append(f"{name} is partial ({why})")
    if base.command == "nccl":
        formula = next((r.extra.get("busbw_formula") for r in new.records if r.extra.get("busbw_formula")),
                       "algbw * factor")
        cmp.notes.append(f"nccl rates are algbw = S/t; busbw = {formula} is the same figure scaled, so its change "
                         "and verdict are the same")
    new_by_key: dict[tuple, Record] = {}
    for r in new.records:
        new_by_key.setdefault(r.key(), r)
    seen: set[tuple] = set()
    for rb in base.records:
        k = rb.key()
        if k in seen:
            continue
        seen.add(k)
        rn = new_by_key.get(k)
        if rn is None:
            cmp.rows.append(_one_side(rb, "only-base", base_name))
            continue
        if rb.metric != rn.metric:
            raise UsageError(f"figure {rb.params}: metric {rb.metric!r} in {base_name} but {rn.metric!r} in {new_name}")
        if rb.error or rn.error or not rb.samples_s or not rn.samples_s:
            why = rb.error or rn.error or "no samples"
            row = Row(dict(rb.params), rb.metric, "no-data", note=why)
            if rb.samples_s and not rb.error:
                row.base_median = _median(figure_values(rb, base_name))
            if rn.samples_s and not rn.error:
                row.new_median = _median(figure_values(rn, new_name))
            cmp.rows.append(row)
            continue
        vb, vn = figure_values(rb, base_name), figure_values(rn, new_name)
        change, p, verdict, mb, mn = judge(vb, vn, rb.metric, threshold_pct=threshold_pct, alpha=alpha)
        cmp.rows.append(Row(dict(rb.params), rb.metric, "paired", mb, mn, len(vb), len(vn), change, p, verdict))
    for rn in new.records:
        if rn.key() not in seen:
            seen.add(rn.key())
            cmp.rows.append(_one_side(rn, "only-new", new_name))
    return cmp


def _one_side(r: Record, status: str, source: str) -> Row:
    row = Row(dict(r.params), r.metric, status, note=r.error or "")
    if r.samples_s and not r.error:
        m = _median(figure_values(r, source))
        if status == "only-base":
            row.base_median, row.n_base = m, len(r.samples_s)
        else:
            row.new_median, row.n_new = m, len(r.samples_s)
    return row


# ---- formatting: format_* return data (rich renderables or lines); the command displays them ----

def varying_params(rows: Sequence[Row]) -> list[str]:
    """Param names whose value differs between rows, in first-seen order (all names if one row)."""
    keys: list[str] = []
    for r in rows:
        for k in r.params:
            if k not in keys:
                keys.append(k)
    if len(rows) <= 1:
        return keys
    out = []
    for k in keys:
        vals = {repr(r.params.get(k)) for r in rows}
        if len(vals) > 1:
            out.append(k)
    return out or keys[:1]


def _param_cell(key: str, value: Any) -> str:
    from gpubench.core.units import format_size

    if value is None:
        return "-"
    if key in ("nbytes", "size", "piece", "piece_bytes") and isinstance(value, int) and not isinstance(value, bool):
        return format_size(value)
    return str(value)


def _value_cell(v: float | None, metric: str, units: str) -> str:
    from gpubench.core.units import format_rate

    if v is None:
        return "-"
    if metric == "time":
        us = v * 1e6
        return f"{us:.3g}" if us < 100 else f"{us:.0f}"
    return format_rate(v, units)


def _p_cell(p: float | None) -> str:
    if p is None:
        return "-"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def _change_cell(c: float | None) -> str:
    return "-" if c is None else f"{c:+.2f}%"


def table_rows(cmp: Comparison, units: str = "GB") -> tuple[list[str], list[list[str]]]:
    """Column names and text cells of a comparison table (shared by the rich and markdown forms)."""
    keys = varying_params(cmp.rows)
    metrics = {r.metric for r in cmp.rows}
    unit_label = f"{units}/s" if metrics == {"bandwidth"} else "us" if metrics == {"time"} else f"{units}/s or us"
    cols = keys + [f"base {unit_label}", f"new {unit_label}", "change", "p", "verdict"]
    body = []
    for r in cmp.rows:
        cells = [_param_cell(k, r.params.get(k)) for k in keys]
        cells += [_value_cell(r.base_median, r.metric, units), _value_cell(r.new_median, r.metric, units)]
        if r.status == "paired":
            cells += [_change_cell(r.change_pct), _p_cell(r.p), r.verdict]
        else:
            label = {"only-base": "only in base", "only-new": "only in new", "no-data": "no data"}[r.status]
            cells += ["-", "-", label + (f": {r.note[:40]}" if r.note else "")]
        body.append(cells)
    return cols, body


def summary_line(cmp: Comparison) -> str:
    c = cmp.counts()
    paired = c["better"] + c["worse"] + c["same"] + c["better (untested)"] + c["worse (untested)"]
    s = f"{paired} figure(s) paired: {c['better']} better, {c['worse']} worse, {c['same']} same"
    extra = []
    untested = c["better (untested)"] + c["worse (untested)"]
    if untested:
        extra.append(f"{untested} changed beyond the threshold with too few samples to test "
                     f"({c['worse (untested)']} worse)")
    if c["only-base"]:
        extra.append(f"{c['only-base']} only in base")
    if c["only-new"]:
        extra.append(f"{c['only-new']} only in new")
    if c["no-data"]:
        extra.append(f"{c['no-data']} without data")
    return s + ("; " + ", ".join(extra) if extra else "") + "."


def method_line(threshold_pct: float, alpha: float, units: str) -> str:
    return (f"verdict: two-sided Mann-Whitney U test on the raw samples at p < {alpha:g} and a change over "
            f"{threshold_pct:g}%; bandwidth higher is better ({units}/s = "
            f"{'1e9' if units == 'GB' else '2^30'} B/s), time lower is better (us); medians shown.")


def format_table(cmps: Sequence[Comparison], *, threshold_pct: float, alpha: float, units: str = "GB") -> list:
    """Rich renderables: per comparison, the env differences and the figure table."""
    from gpubench.core import report

    out: list = []
    for cmp in cmps:
        title = f"{cmp.command}: {cmp.new_name} vs base {cmp.base_name}"
        if cmp.env_diff:
            t = report.table(f"What differs - {title}", ["", "base", "new"])
            for w, b, n in cmp.env_diff:
                t.add_row(w, b, n)
            out.append(t)
        else:
            out.append(f"Same machine and options: {title}")
        out.extend(f"note: {n}" for n in cmp.notes)
        cols, body = table_rows(cmp, units)
        t = report.table(title, cols)
        for cells in body:
            style = {"worse": "red", "better": "green", "worse (untested)": "yellow",
                     "better (untested)": "yellow"}.get(cells[-1])
            t.add_row(*cells, style=style)
        out.append(t)
        out.append(summary_line(cmp))
    out.append(method_line(threshold_pct, alpha, units))
    return out


def _md_escape(s: str) -> str:
    return s.replace("|", "\\|")


def format_markdown(cmps: Sequence[Comparison], *, threshold_pct: float, alpha: float, units: str = "GB") -> list[str]:
    """Lines of GitHub markdown (for a pull-request comment)."""
    lines: list[str] = []
    for cmp in cmps:
        c = cmp.counts()
        lines.append(f"### gpubench {cmp.command}: `{cmp.new_name}` vs base `{cmp.base_name}`")
        lines.append("")
        if c["worse"] or c["worse (untested)"]:
            head = f"**{c['worse']} figure(s) worse.** " if c["worse"] else ""
            if c["worse (untested)"]:
                head += f"**{c['worse (untested)']} worse by more than the threshold but untested (too few samples).** "
            lines.append(head + summary_line(cmp))
        else:
            lines.append(summary_line(cmp))
        lines.append("")
        if cmp.env_diff:
            lines += ["| what differs | base | new |", "| --- | --- | --- |"]
            lines += [f"| {_md_escape(w)} | {_md_escape(b)} | {_md_escape(n)} |" for w, b, n in cmp.env_diff]
        else:
            lines.append("Same machine and options.")
        lines.append("")
        for n in cmp.notes:
            lines += [f"> note: {n}", ""]
        cols, body = table_rows(cmp, units)
        lines.append("| " + " | ".join(cols) + " |")
        lines.append("| " + " | ".join(["---"] + ["---:"] * (len(cols) - 2) + ["---"]) + " |")
        for cells in body:
            if cells[-1] in ("worse", "better", "worse (untested)", "better (untested)"):
                cells = cells[:-1] + [f"**{cells[-1]}**"]
            lines.append("| " + " | ".join(_md_escape(x) for x in cells) + " |")
        lines.append("")
    lines.append(f"<sub>{method_line(threshold_pct, alpha, units)}</sub>")
    return lines


def format_json(cmps: Sequence[Comparison], *, threshold_pct: float, alpha: float) -> dict:
    """A JSON-able dict: method, then each comparison with its rows (medians in B/s or seconds)."""
    return {
        "schema": "gpubench.compare",
        "schema_version": 1,
        "method": {"test": "mann-whitney-u two-sided: exact for small samples (with ties: the exact "
                           "permutation distribution), else the normal approximation with tie and "
                           "continuity corrections",
                   "alpha": alpha, "threshold_pct": threshold_pct,
                   "values": {"bandwidth": "B/s per sample, higher is better", "time": "seconds, lower is better"}},
        "comparisons": [c.to_dict() for c in cmps],
        "regressions": sum(len(c.regressions()) for c in cmps),
        "untested_worse": sum(len(c.untested_worse()) for c in cmps),
    }
