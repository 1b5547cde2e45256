"""Saved results as OpenMetrics text for Prometheus (node_exporter's textfile collector).

Every family is a gauge, named ``gpubench_<command>_...`` in base units (bytes per second, seconds)
as Prometheus' naming guide asks; no sample timestamps (the textfile collector refuses them).
docs/metrics.md lists the families and labels (a param's: :func:`label_name`). Label values pass
through :func:`gpubench.core.safe.term` (cut at MAX_LABEL characters); prometheus_client's writer
escapes them as the OpenMetrics ABNF requires.
"""

from __future__ import annotations

import datetime as _dt
import math
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from gpubench.core import registry, safe
from gpubench.core.result import Result
from gpubench.core.stats import Summary

_LABEL_OK = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
_NOT_NAME = re.compile(r"[^a-zA-Z0-9_]")
FIXED_LABELS = ("host", "gpu_uuid", "command", "stat")
UNITS = {"bandwidth": ("bandwidth", "bytes_per_second", "bytes per second (1e9 = 1 GB/s)"),
         "time": ("time", "seconds", "seconds per step")}
STATS = ("median", "p25", "p75")
MAX_LABEL = 1024  # characters of a label value kept (a 10 MB host name is cut, as a terminal cuts it)


def label_name(param: str) -> str:
    """A param's label name: itself when a valid label that is not one of the fixed labels and
    does not start with ``__`` (reserved), else ``param_`` + it with invalid characters as ``_``."""
    if _LABEL_OK.match(param) and param not in FIXED_LABELS and not param.startswith("__"):
        return param
    return "param_" + _NOT_NAME.sub("_", param)


def _label_value(v: Any) -> str:
    return ("true" if v else "false") if isinstance(v, bool) else str(v)


def _unix(created: str) -> float | None:
    try:
        t = _dt.datetime.fromisoformat(created)
    except (TypeError, ValueError):
        return None
    if t.tzinfo is None:
        t = t.replace(tzinfo=_dt.timezone.utc)
    return t.timestamp()


@dataclass
class Families:
    """The families being built: name -> (help, unit, {label tuple: value}); a later sample of the
    same series replaces the earlier one and is counted in ``replaced``."""

    fams: dict[str, tuple[str, str, dict[tuple, float]]] = field(default_factory=dict)
    replaced: int = 0

    def add(self, name: str, help_: str, labels: dict[str, str], value: float, unit: str = "") -> None:
        if not math.isfinite(value):
            return
        series = self.fams.setdefault(name, (help_, unit, {}))[2]
        key = tuple(sorted((k, safe.term(v, MAX_LABEL)) for k, v in labels.items()))
        if key in series:
            self.replaced += 1
        series[key] = float(value)

    def text(self) -> bytes:
        """The OpenMetrics text, families and series in sorted order, ending in ``# EOF``."""
        from types import SimpleNamespace

        from prometheus_client.core import GaugeMetricFamily
        from prometheus_client.openmetrics.exposition import generate_latest

        built = []
        for name in sorted(self.fams):
            help_, unit, series = self.fams[name]
            fam = GaugeMetricFamily(name, help_, unit=unit)
            for key in sorted(series):
                fam.add_sample(fam.name, dict(key), series[key])
            built.append(fam)
        return generate_latest(SimpleNamespace(collect=lambda: built))  # it reads only the collect() of a registry


def _host(env: dict) -> str:
    host = env.get("host") if isinstance(env.get("host"), dict) else {}
    name = host.get("hostname") if isinstance(host, dict) else None
    return name if isinstance(name, str) else ""


def _check_gauges(got: Any) -> None:
    """A plug-in's metrics hook answers [(name, help, {label: str}, number)] (core/plugin.py)."""
    for g in got:
        if not (isinstance(g, tuple) and len(g) == 4 and isinstance(g[0], str) and _LABEL_OK.match(g[0])
                and isinstance(g[1], str) and isinstance(g[2], dict) and all(isinstance(k, str) and _LABEL_OK.match(k)
                                                                              for k in g[2])
                and isinstance(g[3], (int, float)) and not isinstance(g[3], bool)):
            raise TypeError(f"a gauge is (name, help, {{label: value}}, number), not {g!r:.80}")


def add_result(f: Families, res: Result) -> None:
    """Add one result's figures, its run facts and its GPUs' counters to ``f``."""
    host = _host(res.env)
    uuids = {g["index"]: g["uuid"] for g in res.env.get("gpus") or []
             if isinstance(g, dict) and isinstance(g.get("index"), int) and isinstance(g.get("uuid"), str)}
    cmd = res.command
    part = _NOT_NAME.sub("_", cmd)  # the command as a part of a metric name
    nvml = res.env.get("nvml")
    driver = nvml.get("driver_version") if isinstance(nvml, dict) else None
    created = _unix(res.created)
    if created is not None:
        f.add("gpubench_result_created", "When the result was made (Unix time)",
              {"host": host, "command": cmd, "gpubench_version": _label_value(res.gpubench_version),
               "driver_version": _label_value(driver if driver is not None else "")}, created, "seconds")
    f.add("gpubench_result_partial", "1 when the run stopped before its end (a signal or a machine fault)",
          {"host": host, "command": cmd}, 1.0 if res.partial else 0.0)
    replays: dict[int, float] = {}
    nvl_errors: dict[int, float] = {}
    for r in res.records:
        gpu = next((v for k in ("device", "src") if isinstance(v := r.params.get(k), int) and not isinstance(v, bool)),
                   None)
        labels = {"host": host, "gpu_uuid": uuids.get(gpu, "") if gpu is not None else "", "command": cmd}
        labels.update({label_name(k): _label_value(v) for k, v in r.params.items()})
        s = None  # the figure in base units (B/s or s), where the point has one
        if r.samples_s and not r.error:
            try:
                s = Summary.of(r.rates() if r.metric == "bandwidth" else list(r.samples_s))
            except (ValueError, ZeroDivisionError, OverflowError):
                pass
        if s is None:
            f.add(f"gpubench_{part}_point_failed", f"1 for a {cmd} point measured with no samples (its error)",
                  labels, 1.0)
            continue
        kind, unit, what = UNITS.get(r.metric, UNITS["bandwidth"])
        for stat in STATS:
            f.add(f"gpubench_{part}_{kind}", f"{cmd} figure per point, {what}; stat median, p25, p75",
                  {**labels, "stat": stat}, getattr(s, stat), unit)
        f.add(f"gpubench_{part}_samples", f"Timed samples behind each {cmd} figure", labels, float(s.n))
        t = r.telemetry or {}
        for gpu_i in t.get("devices") or []:
            if not isinstance(gpu_i, int):
                continue
            for key, into in (("pcie_replay_delta", replays), ("nvlink_errors_delta", nvl_errors)):
                v = t.get(key)
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    into[gpu_i] = into.get(gpu_i, 0.0) + v
    plugin = registry.find(cmd)
    for name, help_, labels, value in (registry.call_hook(plugin, "metrics", res, check=_check_gauges, default=[])
                                       if plugin is not None else []):
        f.add(f"gpubench_{part}_{name}", help_, {"host": host, **{k: _label_value(v) for k, v in labels.items()}},
              float(value))
    for name, help_, counts in (
            ("gpubench_gpu_pcie_replays", "PCIe replays during the command's points (NVML replay counter)", replays),
            ("gpubench_gpu_nvlink_errors", "NVLink DL errors during the command's points (replay, recovery, CRC)",
             nvl_errors)):
        for gpu_i, v in counts.items():
            f.add(name, help_, {"host": host, "gpu_uuid": uuids.get(gpu_i, ""), "command": cmd}, v)


# env.health's counters exported from each GPU's last read (core/health.py): name -> path in COUNTERS
HEALTH_COUNTERS = {
    "pcie_replays": ("pcie_replays",),
    "nvlinks_up": ("nvlinks_up",),
    "ecc_volatile_corrected": ("ecc", "volatile", "corrected"),
    "ecc_volatile_uncorrected": ("ecc", "volatile", "uncorrected"),
    "ecc_aggregate_uncorrected": ("ecc", "aggregate", "uncorrected"),
    "remapped_rows_pending": ("remapped_rows", "pending"),
    "remapped_rows_failed": ("remapped_rows", "failed"),
    "retired_pages_double_bit": ("retired_pages", "double_bit"),
}


HEALTH_FLAGS = frozenset({"remapped_rows_pending", "remapped_rows_failed"})


def add_health(f: Families, res: Result) -> None:
    """Add each GPU's health counters from ``res.env["health"]`` (their read after the points; a
    counter the GPU lacks is left out) and the XID events during the run."""
    h = res.env.get("health")
    if not isinstance(h, dict):
        return
    host, cmd = _host(res.env), res.command
    xids = h.get("xid_events")
    for g in h.get("gpus") or []:
        if not isinstance(g, dict) or not isinstance(g.get("after"), dict):
            continue
        base = {"host": host, "gpu_uuid": _label_value(g.get("uuid") or "")}
        for name, path in HEALTH_COUNTERS.items():
            v: Any = g["after"]
            for k in path:
                v = v.get(k) if isinstance(v, dict) else None
            # a flag (remapped_rows_*) as 0/1; a count only as an integer, as the suite's [health] rules read it
            if isinstance(v, bool) if name in HEALTH_FLAGS else type(v) is int:
                f.add("gpubench_gpu_health_counter", "A GPU health counter read after the command's points "
                      "(docs/env.md); booleans as 0/1", {**base, "counter": name}, float(v))
        if isinstance(xids, list):
            n = sum(1 for x in xids if isinstance(x, dict) and x.get("index") == g.get("index"))
            f.add("gpubench_gpu_xid_events", "XID errors the driver reported during the command's points",
                  {**base, "command": cmd}, float(n))


def add_env(f: Families, env: dict) -> None:
    """Add each GPU's PCIe generation and width (current and max) and NVLinks up from ``env``."""
    host = _host(env)
    for g in env.get("gpus") or []:
        if not isinstance(g, dict):
            continue
        base = {"host": host, "gpu_uuid": _label_value(g.get("uuid") or "")}
        for key, name, state in (("pcie_gen", "gen", "current"), ("pcie_gen_max", "gen", "max"),
                                 ("pcie_width", "width", "current"), ("pcie_width_max", "width", "max")):
            v = g.get(key)
            if isinstance(v, int) and not isinstance(v, bool):
                f.add(f"gpubench_gpu_pcie_link_{name}", f"PCIe link {name} (state current or max)",
                      {**base, "state": state}, v)
        v = g.get("nvlink_links_up")
        if isinstance(v, int) and not isinstance(v, bool):
            f.add("gpubench_gpu_nvlinks_up", "NVLinks up", base, v)


def add_outcomes(f: Families, host: str, outcomes: Iterable, verdict: str | None) -> None:
    """Add a suite bundle's expectation outcomes and its verdict."""
    for o in outcomes:
        e = o.expectation
        labels = {"host": host, "command": e.command, "expectation": e.label()}
        f.add("gpubench_expectation_status", "1 for each expectation's outcome (pass, fail, missing, skipped)",
              {**labels, "status": o.status}, 1.0)
        if o.value is not None:
            f.add("gpubench_expectation_value", "The figure an expectation checked, in its unit (GB/s or us)",
                  {**labels, "unit": e.unit}, o.value)
    if verdict:
        f.add("gpubench_suite_verdict", "1 for the suite's verdict (passed, failed, nothing checked)",
              {"host": host, "verdict": verdict.lower()}, 1.0)


def build(results: Sequence[Result], bundles: Sequence[Any] = ()) -> Families:
    """The families of ``results`` (oldest first, so the newest wins a shared series) and of the
    suite ``bundles`` (their outcomes and verdicts; their steps' results come in ``results``)."""
    from gpubench.validation.suite import verdict_line

    f = Families()
    envs: dict[str, dict] = {}
    for res in sorted(results, key=lambda r: _unix(r.created) or 0.0):
        add_result(f, res)
        add_health(f, res)
        if res.env.get("gpus"):
            envs[_host(res.env)] = res.env
    for b in bundles:
        verdict = verdict_line(b).split(":", 1)[0] if b.expect_file is not None or b.outcomes else None
        add_outcomes(f, _host(b.env), b.outcomes, verdict)
        if b.env.get("gpus"):
            envs.setdefault(_host(b.env), b.env)
    for env in envs.values():
        add_env(f, env)
    return f
