"""``gpubench nccl`` options and report (nccl-tests' columns: size, count, type, redop, root, then
time, algbw, busbw and #wrong per placement)."""

from __future__ import annotations

import click

from gpubench.plugins.nccl import collectives as C
from gpubench.kit import StrictFloat, benchmark_command
from gpubench.core import limits, report
from gpubench.core.errors import RegressionFound
from gpubench.core.units import STEP_FACTOR, format_rate, parse_size, size_sweep, to_rate


_ROOTED_NAMES = [c.name for c in C.COLLECTIVES.values() if c.rooted]
_ROOTED = ", ".join(_ROOTED_NAMES[:-1]) + " and " + _ROOTED_NAMES[-1]  # "a, b and c"
_COLLECTIVE_LINES = "\n".join(f"  {c.name:<15} {c.nccl_tests:<20} busbw = algbw x {c.factor_text}"
                              for c in C.COLLECTIVES.values())
_HELP = f"""NCCL collective bandwidth, measured as nccl-tests measures it.

\b
COLLECTIVE (default all-reduce; nccl-tests' spellings such as allreduce are accepted):
{_COLLECTIVE_LINES}

algbw = S/t; busbw = algbw x the collective's factor (nccl-tests doc/PERFORMANCE.md). NCCL reads
its own NCCL_* environment variables (e.g. NCCL_NVLS_ENABLE); gpubench sets none.
"""


OPTIONS = [
    click.argument("collective", required=False, default="all-reduce"),
    click.option("-d", "--devices", default=None,
                 help="CUDA devices, one rank each, e.g. 0,1 [default: every visible GPU]."),
    click.option("-b", "--min-bytes", default="1M", show_default=True, help="Smallest size (nccl-tests -b; 1M = 2^20 B)."),
    click.option("-e", "--max-bytes", default="1G", show_default=True, help="Largest size (nccl-tests -e)."),
    click.option("-f", "--step-factor", type=StrictFloat(bound=lambda: STEP_FACTOR), default=4.0, show_default=True,
                 help="Size multiplier per step (nccl-tests -f)."),
    click.option("-t", "--dtype", default="float", show_default=True,
                 help="Data type: int8, uint8, int32, uint32, int64, uint64, half, float, double, bfloat16."),
    click.option("-o", "--op", default="sum", show_default=True, help="Reduction: sum, prod, max, min, avg."),
    click.option("-r", "--root", type=int, default=0, show_default=True, help=f"Root rank of {_ROOTED}."),
    click.option("-w", "--warmup", type=int, default=1, show_default=True,
                 help="Untimed iterations per size (nccl-tests -w)."),
    click.option("-n", "--iters", type=int, default=20, show_default=True,
                 help="Iterations per timed sample (nccl-tests -n)."),
    click.option("--samples", type=int, default=5, show_default=True, help="Timed samples per point; the median is shown."),
    click.option("-c", "--check", type=int, default=1, show_default=True,
                 help="Data checks per point, counting wrong elements (nccl-tests -c; 0 = off)."),
    click.option("--placement", type=click.Choice(["both", "out-of-place", "in-place"]), default="both",
                 show_default=True, help="Separate send and receive buffers, the same buffer, or both."),
    click.option("-G", "--cuda-graph", type=int, default=0, show_default=True,
                 help="Capture the -n iterations of each size into one CUDA graph per GPU and launch it this many "
                      "times per sample (nccl-tests -G; 0 = no graph). Cuts launch overhead at small sizes."),
    click.option("-T", "--timeout", type=float, default=300.0, show_default=True,
                 help="Abort the communicators and exit 3 when one wait lasts longer than this many seconds "
                      "(0 = never; nccl-tests -T)."),
    click.option("--expect-busbw", type=float, default=None,
                 help="Exit 1 when the busbw (GB/s) at the largest size is below this (node validation)."),
    click.option("-g", "--gpus-per-proc", type=int, default=None,
                 help="GPUs per process (nccl-tests -g). Under a launcher each process takes its local rank's N "
                      "GPUs [default: 1]; without one, the first N visible GPUs."),
    click.option("-a", "--average", type=int, default=1, show_default=True,
                 help="Under a launcher, each sample's time over the processes: 0 rank 0's, 1 the mean, 2 the "
                      "minimum, 3 the maximum (nccl-tests -a). Every rank's times are in the JSON either way."),
    click.option("--rendezvous", default=None, metavar="HOST:PORT",
                 help="Under a launcher without MPI (srun, torchrun): rank 0's address for the rank group "
                      "[default: MASTER_ADDR:MASTER_PORT]."),
    click.option("--scheduler-address", default=None,
                 help="Run one rank per worker of this Dask scheduler (tcp://host:8786)."),
    click.option("--scheduler-file", default=None, help="Like --scheduler-address, from a Dask scheduler file."),
]


def build_spec(collective, devices, min_bytes, max_bytes, step_factor, dtype, op, root, warmup, iters, samples,
               check, placement, cuda_graph, timeout, scheduler_address=None, scheduler_file=None, expect_busbw=None,
               gpus_per_proc=None, average=1, rendezvous=None):
    """Parse the options (no GPU needed) into an NcclSpec, which checks every value.

    Raises:
        UsageError: any bad value, named in the message.
    """
    from gpubench.plugins.nccl.bench import PLACES, NcclSpec
    from gpubench.core.options import parse_devices

    devs = parse_devices(devices)
    lo = parse_size(min_bytes, what="-b/--min-bytes")
    hi = parse_size(max_bytes, what="-e/--max-bytes")
    sizes = size_sweep(lo, hi, step_factor)
    places = PLACES if placement == "both" else (placement,)
    return NcclSpec(collective=collective, sizes=tuple(sizes), dtype=dtype, op=op, root=root, devices=devs,
                    warmup=warmup, iters=iters, samples=samples, check=check, places=places, cuda_graph=cuda_graph,
                    timeout_s=float(timeout), scheduler_address=scheduler_address, scheduler_file=scheduler_file,
                    expect_busbw_gbps=expect_busbw, gpus_per_proc=gpus_per_proc, average=average,
                    rendezvous=rendezvous)


def select_run(spec):
    """The run of ``spec``: one rank per Dask worker with a scheduler; this process's rank under a
    launcher; else one process."""
    from gpubench.plugins.nccl import bench

    if spec.distributed:
        from gpubench.plugins.nccl import over_dask

        return over_dask.run_on_dask
    from gpubench.launch.ranks import discover

    if discover().under_launcher:
        from gpubench.plugins.nccl import ranks as nccl_ranks

        return nccl_ranks.run_ranks
    return bench.run


def _not_rank0() -> bool:
    from gpubench.launch.ranks import speaks_for_the_job

    return not speaks_for_the_job()


def after(result, spec, code: int) -> int:
    """Once the result is shown and saved: exit 1 (RegressionFound) on wrong data or a busbw below
    --expect-busbw; an interrupted run keeps its code."""
    if code:
        return code
    if _not_rank0():  # rank 0 has every rank's figures and gives the verdict
        return 0
    failure = verdict(result, spec.expect_busbw_gbps)
    if failure:
        raise RegressionFound(failure)
    return 0


def verdict(result, expect_busbw: float | None) -> str | None:
    """Why the run failed, or None: wrong elements (nccl-tests exits 1 on them), or the busbw at the
    largest size (out-of-place when measured) below --expect-busbw GB/s."""
    wrong = sum(r.extra.get("wrong") or 0 for r in result.records)
    if wrong:
        return f"data check found {wrong} wrong element(s)"
    if expect_busbw is None:
        return None
    measured = [r for r in result.records if r.samples_s]
    if not measured:
        return f"no point was measured, so busbw cannot be checked against --expect-busbw {expect_busbw:g}"
    top = max(r.params["nbytes"] for r in measured)
    at_top = [r for r in measured if r.params["nbytes"] == top]
    r = next((x for x in at_top if x.params["placement"] == "out-of-place"), at_top[0])
    bus = r.extra.get("busbw_bytes_per_s")
    if bus is None or bus / 1e9 < expect_busbw:
        return (f"busbw {(bus or 0) / 1e9:.1f} GB/s at {top} B ({r.params['placement']}) is below --expect-busbw "
                f"{expect_busbw:g} GB/s")
    return None


def format_report(result, units: str = "GB") -> list:
    """The nccl-tests table, a line with the average busbw, and notes. Returns rich renderables."""
    spec = result.spec
    places = [p for p in ("out-of-place", "in-place") if p in spec.get("places", [])]
    nranks = spec.get("nranks")
    cols = ["size (B)", "count", "type", "redop", "root"]
    for p in places:
        cols += [f"{p} time (us)", f"algbw {units}/s", f"busbw {units}/s", "#wrong"]
    rows: dict[int, dict] = {}
    for r in result.records:
        rows.setdefault(r.params["nbytes"], {})[r.params["placement"]] = r
    graphs = spec.get("cuda_graph") or 0
    per_sample = (f"{graphs} CUDA-graph launches of {spec.get('iters')} iterations" if graphs
                  else f"{spec.get('iters')} iterations")
    t = report.table(f"{spec.get('collective')} - {nranks} rank(s), {spec.get('dtype')}, median of "
                     f"{spec.get('samples')} samples of {per_sample}", cols)
    busbws = []
    for size in sorted(rows):
        by = rows[size]
        any_r = next(iter(by.values()))
        row = [str(size), str(any_r.extra.get("count", "")), any_r.params.get("dtype", ""),
               any_r.params.get("op", "none"), str(any_r.params.get("root", -1))]
        for p in places:
            r = by.get(p)
            if r is None:
                row += ["", "", "", ""]
            elif r.error or not r.samples_s:
                row += [f"failed: {(r.error or 'no samples')[:40]}", "", "", ""]
            else:
                alg = r.extra["algbw_bytes_per_s"]
                bus = r.extra["busbw_bytes_per_s"]
                busbws.append(bus)
                w = r.extra.get("wrong")
                mark = limits.flag_mark(r.extra)  # " (no-op)", " !!" (core/limits.py)
                row += [f"{r.extra['time_s'] * 1e6:.2f}", format_rate(alg, units) + mark, format_rate(bus, units) + mark,
                        "N/A" if w is None else str(w)]
        t.add_row(*row)
    out: list = [t]
    if busbws:
        out.append(f"Avg bus bandwidth: {to_rate(sum(busbws) / len(busbws), units):.3f} {units}/s "
                   "(mean over the points above, as nccl-tests prints it)")
    factor = next((r.extra.get("busbw_formula") for r in result.records if r.extra.get("busbw_formula")), None)
    out.append(f"algbw = S/t; busbw = {factor or 'algbw * factor'} with n = {nranks} (nccl-tests doc/PERFORMANCE.md); "
               f"{units}/s = {'1e9' if units == 'GB' else '2^30'} B/s; t = host time of {per_sample} "
               "(grouped) until every stream finished, per iteration (nccl-tests' method).")
    if graphs and result.timing.get("buffers") == "cudaMalloc":
        out.append("Buffers come from cudaMalloc (this NCCL has no ncclMemAlloc): NCCL cannot register them for "
                   "zero-copy under CUDA graphs, so -G figures can be lower than nccl-tests'.")
    workers = result.env.get("dask_workers") or []
    seen = {repr((w.get("nccl") or {}).get("version")) + " " + repr(sorted(((w.get("nccl") or {}).get("env") or {}).items()))
            for w in workers}
    if len(seen) > 1:
        out.append("WARNING: the Dask workers differ in NCCL version or NCCL_* variables (env.dask_workers[i].nccl "
                   "in the JSON); the figures mix them.")
    out += _launch_lines(result)
    nccl_block = result.env.get("nccl") or {}
    nccl_env = nccl_block.get("env") or {}
    if nccl_block.get("version") is not None or nccl_env:
        from gpubench.analysis.compare import nccl_version_text
        from gpubench.core.safe import term

        line = f"NCCL {term(nccl_version_text(nccl_block.get('version')), limit=40)} (ncclGetVersion)"
        if nccl_env:  # the NCCL_* variables this process saw, which NCCL read
            line += "; environment: " + term(" ".join(f"{k}={v}" for k, v in sorted(nccl_env.items())), limit=2000)
        out.append(line)
    if spec.get("expect_busbw_gbps") is not None:
        out.append(f"--expect-busbw {spec['expect_busbw_gbps']:g} GB/s: checked on the largest size.")
    if result.partial:
        out.append(report.partial_note(result, "rows"))
    return out


def _launch_lines(result) -> list[str]:
    """Under a launcher: who ran, the slowest rank at the largest size, and how NCCL moved the data."""
    from gpubench.core.safe import term

    launch = result.env.get("launch")
    if not launch:
        return []
    out = [f"Launched by {term(launch.get('launcher'))}: {launch.get('processes')} process(es) on {launch.get('nodes')} "
           f"node(s), {launch.get('gpus_per_proc')} GPU(s) each, {launch.get('nranks')} NCCL ranks; rank group over "
           f"{term(launch.get('transport'))}, NCCL bootstrap by {term(launch.get('bootstrap'))}; -a "
           f"{result.spec.get('average', 1)}: each sample's time is the "
           + {0: "rank 0's", 1: "mean over processes", 2: "minimum over processes", 3: "maximum over processes"}
           .get(result.spec.get("average", 1), "?") + " (every rank's times: extra.per_rank in the JSON)."]
    measured = [r for r in result.records if r.extra.get("per_rank") and r.samples_s]
    if measured:
        top = max(r.params["nbytes"] for r in measured)
        r = next(x for x in measured if x.params["nbytes"] == top)
        from gpubench.plugins.nccl.ranks import slowest

        s = slowest(r.extra["per_rank"])
        if s is not None:
            g = (s.get("gpus") or [{}])[0]
            out.append(f"Slowest rank at {top} B ({r.params['placement']}): rank {s['rank']} on {term(s['host'])} "
                       f"(GPU {g.get('device')}, {term(g.get('pci_bus_id'))}), {s['time_s'] * 1e6:.2f} us, "
                       f"{s['above_median'] * 100:+.1f}% against the median rank.")
    log = result.env.get("nccl_log")
    if log:
        out.append("NCCL transport: " + term(log.get("summary"), limit=400)
                   + ("" if log.get("captured") else f" ({term(log.get('reason'))})"))
    return out


command = benchmark_command("nccl", OPTIONS, build_spec, format_report, help=_HELP, run=select_run, after=after,
                            gathers_ranks=True)


def _rank0_shows(callback):
    """Under a launcher, ranks other than 0 print nothing and write no JSON."""
    import functools

    @functools.wraps(callback)
    def cb(*args, **kwargs):
        if _not_rank0():
            kwargs.update(quiet=True, json_path=None)
        return callback(*args, **kwargs)

    return cb


command.callback = _rank0_shows(command.callback)
