"""``gpubench merge`` options and report (dask-cuda's local_cudf_merge options and output).
Nothing here imports Dask, dask-cuda, cuDF, RMM or UCXX."""

from __future__ import annotations

import math
import re

import click

from gpubench.kit import benchmark_command
from gpubench.core.errors import UsageError
from gpubench.core.options import parse_number
from gpubench.core.units import format_rate, parse_size

SEPARATOR_LEN = 80
KEY_LEN = 25

HELP = """Distributed cuDF (or pandas) merge on Dask(-CUDA) over tcp or ucx: dask-cuda's local_cudf_merge.

    Prints dask-cuda's report: per-run wall clock and throughput (data processed by the whole
    cluster / wall clock), their harmonic means, and per worker-pair bandwidth percentiles from
    the workers' incoming-transfer logs during the timed joins. Sizes and rates in that block are
    binary (GiB = 2^30 B), as dask-cuda prints them.
    """

# Declared once: each option's name is a MergeSpec field, except those build_spec converts.
OPTIONS = [
    click.option("-t", "--type", "merge_type", type=click.Choice(["gpu", "cpu"]), default="gpu", show_default=True,
                 help="gpu: cuDF partitions on a LocalCUDACluster; cpu: pandas partitions on a plain Dask "
                      "LocalCluster (one worker per -d entry), same join."),
    click.option("-d", "--devices", "--devs", "devices", default="0", show_default=True,
                 help="GPUs, one worker each, e.g. 0,1 (physical ids, as dask-cuda's -d)."),
    click.option("-p", "--protocol", type=click.Choice(["tcp", "ucx", "ucxx"]), default="tcp", show_default=True,
                 help="tcp, or ucx through distributed-ucxx (ucxx is the same)."),
    click.option("-c", "--chunk-size", type=int, default=1_000_000, show_default=True,
                 help="Rows per partition of each frame (underscores allowed: 50_000_000)."),
    click.option("--base-chunks", type=int, default=None, help="Partitions of the base frame [default: workers]."),
    click.option("--other-chunks", type=int, default=None, help="Partitions of the other frame [default: workers]."),
    click.option("--frac-match", type=float, default=0.3, show_default=True,
                 help="Fraction of the other frame's keys that match the base frame, in (0, 1]."),
    click.option("--broadcast-join", is_flag=True, help="Use a broadcast join when possible."),
    click.option("--shuffle-join", is_flag=True, help="Use a shuffle join (takes precedence over --broadcast-join)."),
    click.option("--shuffle-method", type=click.Choice(["tasks", "p2p", "disk"]), default="tasks", show_default=True,
                 help="Dask's shuffle; under p2p the transfer logs (the pair table) stay almost empty."),
    click.option("--no-shuffle", is_flag=True, help="Do not shuffle the base frame's keys (dask-cuda's --no-shuffle)."),
    click.option("-s", "--set-index", is_flag=True, help="set_index('key') on the joined frame."),
    click.option("--rmm-pool-size", default=None,
                 help="RMM pool per worker, read as dask-cuda reads it: a size (30GB and 30G = 30e9 B, 30GiB = "
                      "30 x 2^30 B) or a fraction of the GPU's memory "
                      "(0.5) [default: RMM's, half of the GPU's memory]."),
    click.option("--disable-rmm-pool", is_flag=True, help="RMM without a pool."),
    click.option("--rmm-async", "--enable-rmm-async", "rmm_async", is_flag=True,
                 help="RMM's CudaAsyncMemoryResource instead of a pool."),
    click.option("--enable-cudf-spill", is_flag=True, help="Enable cuDF's built-in spilling."),
    click.option("--enable-tcp-over-ucx/--disable-tcp-over-ucx", default=None,
                 help="UCX TCP transport [default: automatic]."),
    click.option("--enable-nvlink/--disable-nvlink", default=None,
                 help="UCX NVLink (cuda_ipc) transport [default: automatic]."),
    click.option("--enable-infiniband/--disable-infiniband", default=None,
                 help="UCX InfiniBand transport [default: automatic]."),
    click.option("--enable-rdmacm/--disable-rdmacm", default=None, help="UCX RDMACM [default: automatic]."),
    click.option("--interface", default=None, help="Network interface the workers and scheduler listen on, e.g. ib0."),
    click.option("--threads-per-worker", type=int, default=1, show_default=True, help="Dask threads per worker."),
    click.option("--runs", type=int, default=3, show_default=True, help="Timed runs."),
    click.option("--warmup-runs", type=int, default=1, show_default=True, help="Untimed runs before them."),
    click.option("--ignore-size", default="1MiB", show_default=True,
                 help="Leave transfers smaller than this out of the pair table (0 keeps all)."),
    click.option("--scheduler-address", default=None, help="Use an existing cluster, e.g. tcp://HOST:8786."),
    click.option("--scheduler-file", default=None, type=click.Path(dir_okay=False),
                 help="Use an existing cluster through its scheduler file."),
    click.option("--timeout", "timeout_s", default="600", show_default=True,
                 help="Seconds a cluster start, a data generation or one join may take (600, 1.5, 10s, 5m)."),
]


def _stopped_by(result) -> str:
    if result.failed_by:
        return f"stopped by a fault ({result.failed_by[:120]})"
    return f"interrupted by {result.interrupted_by}"


_FLOAT_RE = re.compile(r"^\s*\d*\.\d+\s*$|^\s*\d+(\.\d*)?[eE][-+]?\d+\s*$", re.ASCII)


def parse_pool_size(text: str | None) -> tuple[int | None, float | None]:
    """--rmm-pool-size as dask-cuda reads it: a size through ``dask.utils.parse_bytes`` ("30GB" =
    30e9 B, "30GiB" = 30 x 2^30 B) or a fraction of the GPU's total memory with a decimal point ("0.5"):
    (bytes, None), (None, fraction) or (None, None) when not given.

    Raises:
        UsageError: not a size, a size below 1 byte, a fraction outside (0, 1], or dask is missing.
    """
    if text is None:
        return None, None
    if not text.strip():
        raise UsageError(f"--rmm-pool-size {text!r} is empty", "e.g. 30GB, 30GiB or 0.5")
    if _FLOAT_RE.match(text):
        frac = float(text)
        if not (0.0 < frac <= 1.0):
            raise UsageError(f"--rmm-pool-size {text!r} is neither a size nor a fraction in (0, 1]",
                             "e.g. 30GB, 30GiB or 0.5")
        return None, frac
    try:
        from dask.utils import parse_bytes
    except ImportError:
        raise UsageError("--rmm-pool-size reads sizes as dask-cuda does (dask.utils.parse_bytes); dask is not "
                         "installed", "pip install 'gpubench-cuda[dask]'") from None
    try:  # gpubench's numbers are ASCII digits (docs/errors.md)
        nbytes = parse_bytes(text.strip()) if text.isascii() else None
    except (ValueError, TypeError, KeyError, OverflowError):  # "9" x 400 overflows a float
        nbytes = None
    if not isinstance(nbytes, int) or nbytes < 1:
        raise UsageError(f"--rmm-pool-size {text!r} is not a size",
                         "e.g. 30GB (30e9 B, as dask-cuda reads it), 30GiB (30 x 2^30 B) or 0.5 of the GPU's memory")
    return nbytes, None


# --timeout's units (the names dask.utils.parse_timedelta knows, in seconds), read case-blind
_TIMEOUT_UNITS = {**dict.fromkeys(("", "s", "sec", "second", "seconds"), 1.0),
                  **dict.fromkeys(("ms", "millisecond", "milliseconds"), 1e-3),
                  **dict.fromkeys(("us", "microsecond", "microseconds"), 1e-6),
                  **dict.fromkeys(("m", "min", "minute", "minutes"), 60.0),
                  **dict.fromkeys(("h", "hr", "hour", "hours"), 3600.0),
                  **dict.fromkeys(("d", "day", "days"), 86400.0),
                  **dict.fromkeys(("w", "wk", "week", "weeks"), 604800.0)}


def parse_timeout(text) -> float:
    """--timeout: seconds, read as every number option reads one, with an optional unit as Dask
    writes durations ("10s", "5m", "2 hours"). UsageError: the number's own error, or a unit that is
    not one of :data:`_TIMEOUT_UNITS`."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return text
    number, unit = re.fullmatch(r"(.*?)[ ]*([A-Za-z]*)[ ]*", str(text), re.DOTALL).groups()  # type: ignore[union-attr]
    if unit.lower() not in _TIMEOUT_UNITS or not number.strip():
        raise UsageError(f"--timeout {str(text)[:40]!r} is not a duration", "seconds, e.g. 600, 1.5, 10s or 5m")
    from gpubench.core.bounds import field_bound
    from gpubench.plugins.merge.bench import MergeSpec

    bound = field_bound(MergeSpec, "timeout_s")
    seconds = parse_number(number, "--timeout", float, bound.largest(), bound=lambda: bound) * _TIMEOUT_UNITS[unit.lower()]
    if not math.isfinite(seconds):
        raise bound.too_large(repr(str(text)[:40]))
    return seconds


def build_spec(**options):
    """Build a MergeSpec from the options, by name (MergeSpec checks each; UsageError names a bad value).
    No GPU or Dask needed."""
    from gpubench.plugins.merge.bench import MergeSpec
    from gpubench.core.options import parse_devices

    o = dict(options)
    devices = o.pop("devices")
    o["devices"] = parse_devices(devices)
    if o["devices"] is None:
        raise UsageError(f"-d/--devices {devices!r} names no device", "e.g. -d 0,1")
    o["rmm_pool_bytes"], o["rmm_pool_fraction"] = parse_pool_size(o.pop("rmm_pool_size"))
    size = o["ignore_size"]  # "0" or "0B" keeps every transfer
    o["ignore_size"] = 0 if str(size).strip() in ("0", "0B") else parse_size(size, what="--ignore-size")
    o["timeout_s"] = parse_timeout(o["timeout_s"])
    broadcast_join, shuffle_join = o.pop("broadcast_join"), o.pop("shuffle_join")
    o["broadcast"] = False if shuffle_join else (True if broadcast_join else None)
    o["protocol"] = "ucx" if o["protocol"] == "ucxx" else o["protocol"]
    return MergeSpec(**o)


# -- dask-cuda's text formatting (dask.utils.format_bytes / format_time, benchmarks/utils.py
# print_key_value / print_separator), copied so rendering needs no Dask.


def format_bytes(n: float) -> str:
    """dask.utils.format_bytes: binary prefixes, two decimals, from 0.9 of a unit: 1.07 GiB."""
    for prefix, k in (("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("ki", 2**10)):
        if n >= k * 0.9:
            return f"{n / k:.2f} {prefix}B"
    return f"{n} B"


def format_time(n: float) -> str:
    """dask.utils.format_time: 2.79 s, 187.39 ms, 12.00 us, 11m 3s ..."""
    if n > 24 * 60 * 60 * 2:
        d = int(n / 3600 / 24)
        h = int((n - d * 3600 * 24) / 3600)
        return f"{d}d {h}hr"
    if n > 60 * 60 * 2:
        h = int(n / 3600)
        m = int((n - h * 3600) / 60)
        return f"{h}hr {m}m"
    if n > 60 * 10:
        m = int(n / 60)
        s = int(n - m * 60)
        return f"{m}m {s}s"
    if n >= 1:
        return f"{n:.2f} s"
    if n >= 1e-3:
        return "%.2f ms" % (n * 1e3)
    return "%.2f us" % (n * 1e6)


def _kv(key, value) -> str:
    return f"{key!s: <{KEY_LEN}} | {value}"


def _sep(ch: str = "-") -> str:
    return ch * SEPARATOR_LEN


def _pool_text(spec: dict) -> str:
    """The "RMM pool size" row of -t gpu."""
    if spec.get("rmm_pool_bytes") is not None:
        return f"{format_bytes(spec['rmm_pool_bytes'])} ({spec['rmm_pool_bytes']:,} B)"
    if spec.get("rmm_pool_fraction") is not None:
        return f"{spec['rmm_pool_fraction']:g} of each GPU's memory"
    if spec.get("rmm_async"):
        return "async (CudaAsyncMemoryResource)"
    return "RMM default (half of each GPU's memory)" if not spec.get("disable_rmm_pool") else "none"


def _head(left: str, right: str) -> list[str]:
    """A table's heading between its separators."""
    return [_sep("="), _kv(left, right), _sep("-")]


def format_lines(result) -> list[str]:
    """dask-cuda's merge report of a merge Result as text lines."""
    spec = result.spec
    rec = result.records[0] if result.records else None
    ex = rec.extra if rec is not None else {}
    n_workers = len(ex.get("workers", [])) or (rec.params.get("n_workers") if rec else None)
    gpu = spec["merge_type"] == "gpu"
    broadcast = spec.get("broadcast")
    rows = [("Backend", "dask"), ("Merge type", spec["merge_type"]), ("Rows-per-chunk", spec["chunk_size"]),
            ("Base-chunks", rec.params.get("base_chunks") if rec else spec.get("base_chunks")),
            ("Other-chunks", rec.params.get("other_chunks") if rec else spec.get("other_chunks")),
            ("Broadcast", "default" if broadcast is None else broadcast), ("Protocol", spec["protocol"]),
            ("Device(s)", ",".join(map(str, spec["devices"]))),
            ("RMM Pool", (not spec.get("disable_rmm_pool") and not spec.get("rmm_async")) if gpu else "n/a (-t cpu)")]
    rows += [("RMM pool size", _pool_text(spec))] if gpu else []
    rows.append(("Frac-match", spec["frac_match"]))
    if spec["protocol"] == "ucx":
        sel = "automatic" if all(spec.get(k) is None for k in
                                 ("enable_tcp_over_ucx", "enable_infiniband", "enable_nvlink")) else "manual"
        rows.append(("UCX transport selection", sel))
        if sel == "manual":
            rows += [("TCP", spec.get("enable_tcp_over_ucx")), ("InfiniBand", spec.get("enable_infiniband")),
                     ("NVLink", spec.get("enable_nvlink"))]
    rows += [("Worker thread(s)", spec["threads_per_worker"]), ("Shuffle method", spec["shuffle_method"])]
    lines = ["Merge benchmark", _sep("-"), *(_kv(k, v) for k, v in rows)]
    if rec is None or not rec.samples_s:
        return lines + [_kv("Data processed", "-"), _kv("Number of workers", n_workers if n_workers is not None else "-"),
                        _sep("="), "no timed run finished" + (f": {rec.error}" if rec is not None and rec.error else "")]
    lines += [_kv("Data processed", format_bytes(rec.nbytes)), _kv("Number of workers", n_workers)]
    lines += _head("Wall clock", "Throughput")
    lines += [_kv(format_time(seconds), f"{format_bytes(tp)}/s") for seconds, tp in zip(rec.samples_s, ex["throughputs_Bps"])]
    lines += [_sep("="),
              _kv("Throughput", f"{format_bytes(ex['throughput_hmean_Bps'])}/s "
                                f"+/- {format_bytes(ex['throughput_hstd_Bps'])}/s"),
              _kv("Bandwidth", f"{format_bytes(ex['bandwidth_hmean_Bps'])}/s "
                               f"+/- {format_bytes(ex['bandwidth_hstd_Bps'])}/s"),
              _kv("Wall clock", f"{format_time(ex['wall_clock_mean_s'])} +/- {format_time(ex['wall_clock_std_s'])}")]
    lines += _head("(w1,w2)", "25% 50% 75% (total nbytes)")
    lines += [_kv(f"({p['w1']},{p['w2']})", f"{format_bytes(p['q25'])}/s {format_bytes(p['q50'])}/s "
                                            f"{format_bytes(p['q75'])}/s ({format_bytes(p['total_bytes'])})")
              for p in ex.get("pairs", []) if p["total_bytes"] > 0]
    lines += _head("Worker index", "Worker address")
    lines += [_kv(w["index"], w["address"]) for w in sorted(ex.get("workers", []), key=lambda w: w["index"])]
    return lines + [_sep("=")]


def format_notes(result, units: str = "GB") -> list[str]:
    """What the figures mean, in --units, and warnings (empty pair table, overflowed logs, partial)."""
    rec = result.records[0] if result.records else None
    notes: list[str] = []
    if rec is None or not rec.samples_s:
        if result.partial:
            notes.append(f"PARTIAL: {_stopped_by(result)} before a timed run finished.")
        return notes
    ex = rec.extra
    s = rec.rate_summary()
    notes.append(
        f"Throughput is for the whole cluster ({len(ex.get('workers', []))} workers): data processed (rows x bytes "
        f"per row of both frames) / wall clock; median {format_rate(s.median, units)} {units}/s over {s.n} run(s).")
    ignore = result.spec.get("ignore_size", 0)
    notes.append(
        f"Bandwidth and (w1,w2) are per worker pair (w1 received from w2), from the transfers of the timed joins "
        f"only (warm-up runs and data generation left out): {ex.get('transfers_counted', 0)} of "
        f"{ex.get('transfers_logged', 0)} transfers counted, those under {format_bytes(ignore)} left out. "
        f"Bandwidth = harmonic mean over pairs = {format_rate(ex['bandwidth_hmean_Bps'], units)} {units}/s "
        f"per pair, not a total.")
    if not ex.get("pairs"):
        why = ("under --shuffle-method p2p the data moves through the shuffle extension, not the logged "
               "transfers; use --shuffle-method tasks for the pair table"
               if result.spec.get("shuffle_method") == "p2p" else
               "no transfer reached --ignore-size; lower it (e.g. --ignore-size 0) or use a larger -c")
        notes.append(f"The pair table is empty ({why}); Bandwidth then reads 0 B/s as in dask-cuda.")
    if ex.get("transfer_log_overflowed"):
        notes.append("Some workers' transfer logs filled up during a join; the pair table lacks their "
                     "oldest transfers: " + ", ".join(ex["transfer_log_overflowed"]))
    jc = ex.get("join_check")
    if jc:
        notes.append(f"Joined rows (last run): {jc['rows']}.")
    if isinstance(ex.get("rmm"), str) and "already set up" in ex["rmm"]:
        notes.append("RMM " + ex["rmm"] + ".")
    if result.partial:
        notes.append(f"PARTIAL: {_stopped_by(result)}; {s.n} timed run(s) kept.")
    return notes


def format_report(result, units: str = "GB") -> list:
    """The report as rich renderables (Text, so nothing is read as markup)."""
    from rich.text import Text

    import textwrap

    notes = [w for n in format_notes(result, units) for w in textwrap.wrap(n, 100, subsequent_indent="  ")]
    return [Text(line) for line in format_lines(result)] + [Text(n) for n in notes]


command = benchmark_command("merge", OPTIONS, build_spec, format_report, help=HELP)
