"""``gpubench pin``: what ``cudaHostAlloc``, ``cudaHostRegister`` (of a touched buffer) and
``cudaMalloc``, and their frees, cost over a size sweep (docs/pin.md): one call per phase per
sample, timed on the host with ``time.perf_counter``; two records per size (alloc or register,
free or unregister), seconds per call, ``extra.bytes_per_s`` = nbytes / median seconds.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import click

from gpubench.kit import benchmark_command, sweep_options, timing_options

from gpubench.core import benchmark as driver
from gpubench.core.benchmark import Benchmark, Context, Point
from gpubench.core.bounds import check_bounds, device_field
from gpubench.core.errors import UsageError
from gpubench.core import report
from gpubench.core.options import csv_list
from gpubench.core.report import ProgressSink
from gpubench.core.result import Record, Result
from gpubench.core.timing import TimingPlan, kept, sample_loop
from gpubench.core.units import format_rate, format_size, parse_size, size_sweep

# operation -> (first phase, second phase, what it is)
OPERATIONS: dict[str, tuple[str, str, str]] = {
    "host-alloc": ("alloc", "free", "cudaHostAlloc (portable) then cudaFreeHost"),
    "host-register": ("register", "unregister", "cudaHostRegister (portable) of a touched buffer, then unregister"),
    "malloc": ("alloc", "free", "cudaMalloc on the GPU then cudaFree"),
}


@dataclass(frozen=True)
class PinSpec:
    """Parsed options of ``gpubench pin``; a sample is one call of each phase, on ``device``'s context."""

    sizes: tuple[int, ...]  # bytes per call, ascending
    operations: tuple[str, ...] = tuple(OPERATIONS)
    device: int = device_field()
    plan: TimingPlan = field(default_factory=lambda: TimingPlan(warmup=1))

    def __post_init__(self):
        check_bounds(self)
        if not self.sizes:
            raise UsageError("no sizes to measure")
        for op in self.operations:
            if op not in OPERATIONS:
                raise UsageError(f"operation {op!r} not known", f"use {', '.join(OPERATIONS)}")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class _Group:
    operation: str
    nbytes: int


def _phases(op: str, nbytes: int) -> tuple[Callable[[], object], Callable[[object], None], Callable[[], None]]:
    """(first(), second(handle), cleanup()) of one operation; first returns what second releases."""
    import numpy as np
    from cupy.cuda import runtime

    from gpubench.core.gpu import HOST_ALLOC_PORTABLE, HOST_REGISTER_PORTABLE

    if op == "host-alloc":
        return (lambda: runtime.hostAlloc(nbytes, HOST_ALLOC_PORTABLE)), runtime.freeHost, lambda: None
    if op == "malloc":
        return (lambda: runtime.malloc(nbytes)), runtime.free, lambda: None
    buf = np.ones(nbytes, dtype=np.uint8)  # touched: registering measures the locking, not first touch
    ptr = buf.ctypes.data
    return (lambda: runtime.hostRegister(ptr, nbytes, HOST_REGISTER_PORTABLE)), \
        (lambda _h: runtime.hostUnregister(ptr)), (lambda: buf.fill(0))


class Pin(Benchmark):
    """The pin plug-in: a point is (operation, size); one timed call of each phase per sample."""

    name = "pin"

    def points(self, spec: PinSpec, devices: tuple[int, ...]) -> list[Point]:
        out = []
        for op in spec.operations:
            for n in spec.sizes:
                host = n if op != "malloc" else 0
                out.append(Point(f"{op} {format_size(n)}", _Group(op, n), device_bytes=n if op == "malloc" else 0,
                                 host_bytes=host, locked_bytes=host, devices=(spec.device,)))
        return out

    def too_big_hint(self, spec: PinSpec) -> str:
        return "lower -e/--max-bytes"

    def measure(self, ctx: Context, point: Point) -> list[Record]:
        import cupy

        spec: PinSpec = ctx.spec
        g: _Group = point.key
        first_name, second_name, _ = OPERATIONS[g.operation]
        with cupy.cuda.Device(spec.device):
            first, second, cleanup = _phases(g.operation, g.nbytes)
            seconds: list[float] = []

            def take() -> float:
                t0 = time.perf_counter()
                handle = first()
                t1 = time.perf_counter()
                second(handle)
                seconds.append(time.perf_counter() - t1)
                return t1 - t0

            firsts = sample_loop(take, spec.plan)
            cleanup()
        base = {"device": spec.device, "operation": g.operation, "nbytes": g.nbytes}
        return [Record(params={**base, "phase": phase}, metric="time", nbytes=g.nbytes, samples_s=list(samples))
                for phase, samples in ((first_name, firsts), (second_name, kept(seconds, len(firsts))))]

    def failed(self, ctx: Context, point: Point, message: str) -> list[Record]:
        g: _Group = point.key
        first_name, second_name, _ = OPERATIONS[g.operation]
        return [Record(params={"device": ctx.spec.device, "operation": g.operation, "nbytes": g.nbytes,
                               "phase": ph}, metric="time", nbytes=g.nbytes, error=message)
                for ph in (first_name, second_name)]

    def derive(self, ctx: Context, records: list[Record]) -> None:
        for r in records:
            if r.samples_s:
                r.extra["bytes_per_s"] = r.nbytes / r.time_summary().median

    def timing(self, ctx: Context) -> dict:
        return {"clock": "perf_counter",
                "method": "one CUDA runtime call per phase per sample, timed on the host around the call",
                **ctx.spec.plan.to_dict()}


BENCHMARK = Pin()


def run(spec: PinSpec, progress: ProgressSink | None = None) -> Result:
    """Measure every (operation, size) through :func:`gpubench.core.benchmark.run` (NoGPUError,
    UsageError, MachineError as it raises them): two records (the two phases) per (operation, size),
    metric "time", seconds per call; ``extra.bytes_per_s`` = nbytes / median seconds."""
    return driver.run(BENCHMARK, spec, progress)


# -- the command (the plug-in's command module is this one): options, spec from options, report

HELP = """Cost of page-locking host memory and of cudaMalloc, over a size sweep.

    cudaHostAlloc / cudaFreeHost, cudaHostRegister / cudaHostUnregister of a touched buffer, and
    cudaMalloc / cudaFree: microseconds per call (median, p25-p75) and the rate in GB/s. Compare
    with `gpubench copy` to see when pinning pays; see docs/pin.md.
    """


OPTIONS = [
    click.option("--op", "operations", default=",".join(OPERATIONS), show_default=True,
                 help="Comma list of host-alloc, host-register, malloc."),
    *sweep_options(min_bytes="4KiB", max_bytes="256MiB", what="allocation"),
    click.option("-d", "--device", type=int, default=0, show_default=True, help="CUDA device."),
    *timing_options(warmup=1, what="calls"),
]


def build_spec(operations, min_bytes, max_bytes, step_factor, device, warmup, iters, min_time) -> PinSpec:
    """Validate the options (no GPU needed) and build a PinSpec; raises UsageError: any bad value, named in the
    message."""
    ops = csv_list(operations, "--op", kind="operation")
    sizes = size_sweep(parse_size(min_bytes, what="-b/--min-bytes"), parse_size(max_bytes, what="-e/--max-bytes"),
                       step_factor)
    return PinSpec(sizes=tuple(sizes), operations=ops, device=device,
                   plan=TimingPlan(warmup=warmup, iters=iters, min_time=min_time))


def format_report(result: Result, units: str = "GB") -> list:
    """One table per operation: size rows, each phase's median us (p25-p75) and the alloc rate."""
    out: list = []
    for op in [o for o in OPERATIONS if any(r.params["operation"] == o for r in result.records)]:
        first_name, second_name, what = OPERATIONS[op]
        t = report.table(f"{op}: {what} - GPU {result.spec.get('device')}",
                         ["size", f"{first_name} us (p25-p75)", f"{first_name} {units}/s",
                          f"{second_name} us (p25-p75)"])
        recs = {(r.params["nbytes"], r.params["phase"]): r for r in result.records if r.params["operation"] == op}
        for n in sorted({k[0] for k in recs}):
            row = [format_size(n)]
            for phase in (first_name, second_name):
                r = recs.get((n, phase))
                if r is None or r.error:
                    cell = f"failed: {r.error[:40]}" if r is not None and r.error else ""
                    row += [cell, ""] if phase == first_name else [cell]
                    continue
                s = r.time_summary()
                row.append(f"{s.median * 1e6:,.1f} ({s.p25 * 1e6:,.1f}-{s.p75 * 1e6:,.1f})")
                if phase == first_name:
                    row.append(format_rate(r.extra.get("bytes_per_s", 0.0), units))
            t.add_row(*row)
        out.append(t)
    out.append(f"Host-timed (perf_counter) around each call; median over samples ({result.timing.get('warmup')} "
               f"warm-up(s)); {units}/s = nbytes / median seconds of the {'alloc'} phase.")
    if result.partial:
        out.append(report.partial_note(result))
    return out


command = benchmark_command("pin", OPTIONS, build_spec, format_report, help=HELP)
