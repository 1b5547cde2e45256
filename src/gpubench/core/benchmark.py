"""The benchmark contract and the one driver every measuring command runs through (docs/architecture.md).

The shape follows nvbandwidth's ``Testcase``, nccl-tests' ``testColl`` and dask-cuda's benchmark
``Config``: per test only what differs, one driver around them.
"""

from __future__ import annotations

import contextlib
import contextvars
import signal
from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterator, Sequence

from gpubench.core import timing
from gpubench.core.errors import MachineError, UsageError, first_line
from gpubench.core.report import ProgressSink
from gpubench.core.result import Record, Result
from gpubench.core.signals import Interrupted, last_signal, raise_if_signalled
from gpubench.core.units import format_size

DEVICE_MARGIN_BYTES = 512 * 2**20  # left free on a GPU for the CUDA context and the spin kernel


@dataclass(frozen=True)
class Conditions:
    """The conditions a run measures under, the same for every command (docs/conditions.md):
    ``--no-telemetry``, seconds between telemetry sample sets, ``--numa``, ``--require-idle``."""

    telemetry: bool = True
    telemetry_interval_s: float = 0.01
    numa: str | int = "auto"
    require_idle: bool = False


_CONDITIONS: contextvars.ContextVar[Conditions] = contextvars.ContextVar("gpubench_conditions", default=Conditions())


@contextlib.contextmanager
def conditions(c: Conditions) -> Iterator[Conditions]:
    """Run the block's :func:`run` calls under ``c`` (the command line's options)."""
    token = _CONDITIONS.set(c)
    try:
        yield c
    finally:
        _CONDITIONS.reset(token)


class BusyGPU(MachineError):
    """``--require-idle`` and the pre-flight idle check found a GPU busy; exit 3."""


@dataclass(frozen=True)
class Point:
    """One unit of the loop: its label, the plug-in's own ``key``, the bytes of device memory it
    allocates on each of ``devices``, of host memory it holds at once, and of page-locked memory
    among those."""

    label: str
    key: Any
    device_bytes: int = 0
    host_bytes: int = 0
    locked_bytes: int = 0
    devices: tuple[int, ...] = ()


@dataclass
class Context:
    """What lives across the points of one run; a plug-in's ``setup`` may subclass or fill ``data``."""

    spec: Any
    env: dict
    devices: tuple[int, ...] = ()
    data: dict = field(default_factory=dict)


class Benchmark:
    """The contract of a plug-in (docs/architecture.md). Subclass it, set the class attributes and
    override what differs."""

    name: ClassVar[str] = ""
    needs_gpu: ClassVar[bool] = True
    host_memory: ClassVar[bool] = False

    def devices(self, spec) -> tuple[int, ...]:
        """The CUDA ordinals the run uses, checked visible. Raises UsageError: a device that is not visible, or too
        few."""
        from gpubench.core import gpu

        if hasattr(spec, "device"):
            return gpu.resolve_devices((spec.device,))
        return gpu.resolve_devices(getattr(spec, "devices", None))

    def points(self, spec, devices: tuple[int, ...]) -> list[Point]:
        """Every point of the run, in order, with the bytes each needs."""
        raise NotImplementedError

    def preflight(self, spec, points: Sequence[Point], devices: tuple[int, ...]) -> None:
        """Refuse a run that cannot fit before anything is allocated (default: :func:`check_fits`). Raises UsageError: a
        point does not fit."""
        check_fits(points, getattr(spec, "max_pinned_bytes", None), self.too_big_hint(spec))

    def too_big_hint(self, spec) -> str:
        """What to change when a point does not fit (for the preflight's message)."""
        return "lower the largest size"

    def environment(self, spec) -> dict:
        """The machine the run is on, for the Result."""
        from gpubench.core import env as envmod

        return envmod.capture()

    @contextlib.contextmanager
    def setup(self, ctx: Context) -> Iterator[Context]:
        """Own what lives across points (buffers, communicators, clusters); default: nothing."""
        yield ctx

    def measure(self, ctx: Context, point: Point) -> list[Record]:
        """The one timed step: measure ``point`` and return its records (raw bytes and seconds)."""
        raise NotImplementedError

    def failed(self, ctx: Context, point: Point, message: str) -> list[Record]:
        """Records of a point whose allocation failed (``error`` = ``message``); default: one."""
        return [Record(params={"point": point.label}, error=message)]

    def derive(self, ctx: Context, records: list[Record]) -> None:
        """Add derived figures (speed-ups, busbw, % of peak) to ``records`` in place; default none."""

    def spec_dict(self, ctx: Context) -> dict:
        """The Result's ``spec``: the Spec as a JSON-able dict (a plug-in may add what it resolved)."""
        return ctx.spec.to_dict()

    def timing(self, ctx: Context) -> dict:
        """How the records were timed (clock, method, warm-ups, iteration rule), for the Result."""
        plan = getattr(ctx.spec, "plan", None)
        return plan.to_dict() if plan is not None else {}


def check_fits(points: Sequence[Point], max_pinned_bytes: int | None, hint: str) -> None:
    """Check the largest point against each GPU's free memory, the host's available memory and the page-locked cap
    (``max_pinned_bytes``, default half of MemTotal), before allocating anything. Raises UsageError: naming the point,
    what it needs and what there is."""
    from gpubench.core import env as envmod
    from gpubench.core import gpu

    if not points:
        return
    biggest_dev = max(points, key=lambda p: p.device_bytes)
    for d in sorted({d for p in points for d in p.devices}):
        need = max(p.device_bytes for p in points if d in p.devices)
        free, _total = gpu.device_free_bytes(d)
        if need + DEVICE_MARGIN_BYTES > free:
            raise UsageError(f"{biggest_dev.label} needs {format_size(need)} on GPU {d}, which has "
                             f"{format_size(free)} free", hint)
    total, avail = envmod.host_memory()
    host = max(points, key=lambda p: p.host_bytes)
    if avail is not None and host.host_bytes > avail:
        raise UsageError(f"{host.label} needs {format_size(host.host_bytes)} of host memory; "
                         f"{format_size(avail)} is available", hint)
    cap = max_pinned_bytes if max_pinned_bytes is not None else (total // 2 if total else None)
    locked = max(points, key=lambda p: p.locked_bytes)
    if cap is not None and locked.locked_bytes > cap:
        raise UsageError(f"{locked.label} would page-lock {format_size(locked.locked_bytes)}, over the cap of "
                         f"{format_size(cap)}", "pinning too much slows the whole host; " + hint +
                         " or raise --max-pinned")


def run(bench: Benchmark, spec, progress: ProgressSink | None = None, conditions: Conditions | None = None) -> Result:
    """Run ``bench`` over ``spec``: the one driver of every measuring command (docs/architecture.md).
    With ``--numa all`` setup and the points run once per NUMA node. The Result is ``partial`` with
    ``interrupted_by`` when a signal stopped the loop. Raises NoGPUError, UsageError: before anything is
    measured; BusyGPU: ``require_idle`` and a GPU is not idle (exit 3); MachineError: a CUDA, NCCL or
    library fault, its ``partial_result`` holding the finished points."""
    from gpubench.core import env as envmod
    from gpubench.core import gpu, health, limits, numa, telemetry

    cond = conditions or _CONDITIONS.get()
    progress = progress or ProgressSink()
    numa.check_applies(cond.numa, bench.name, host_memory=bench.host_memory, binds=bench.needs_gpu)
    devices: tuple[int, ...] = ()
    if bench.needs_gpu:
        cupy = gpu.require_gpu()  # a missing CuPy is a setup problem (exit 2), not a fault
        devices = bench.devices(spec)
    points = bench.points(spec, devices)
    bench.preflight(spec, points, devices)
    ctx = Context(spec=spec, env=bench.environment(spec), devices=devices)
    gpus = [g for g in ctx.env.get("gpus", []) if g.get("index") in devices]
    bindings: list = [numa.Binding(None, None, "no GPU: not bound")]
    if bench.needs_gpu:
        check = envmod.idle_check(gpus, devices)
        ctx.env["preflight"] = check
        for w in check["warnings"]:
            progress.warn(w)
        if cond.require_idle and check["warnings"]:
            raise BusyGPU(check["warnings"][0], "--require-idle: wait until the GPU is idle, or leave it out")
        if cond.require_idle and check["idle"] is None:
            raise BusyGPU(f"--require-idle: the idle check could not run ({check['error']})")
        first = envmod.gpu_by_index(ctx.env, devices[0]) if devices else None
        bindings = numa.plan(cond.numa, first, bench.host_memory) if bench.host_memory or cond.numa != "auto" \
            else [numa.Binding(None, None, "no host buffers: not bound")]
        ctx.env["numa"] = {"policy": str(cond.numa), "bindings": [b.to_dict() for b in bindings]}
    records: list[Record] = []
    interrupted: str | None = None
    fault: MachineError | None = None
    with health.watch(gpus, bench.needs_gpu) as hw, \
            telemetry.session(gpus, cond.telemetry and bench.needs_gpu, cond.telemetry_interval_s) as tel:
        if hw is not None:
            ctx.env["health"] = hw.block  # its "after" reads are filled in when the block ends
        ctx.env["telemetry"] = tel.status if tel is not None else {"enabled": False, "interval_s": None, "error": None}
        progress.start(len(points) * len(bindings), points[0].label if points else "")
        try:
            for b in bindings:
                with numa.bound(b), bench.setup(ctx) as ctx:
                    try:
                        for p in points:
                            raise_if_signalled()
                            progress.advance(p.label if b.tag is None else f"{p.label} (node {b.tag})")
                            try:
                                got = _measure_one(bench, ctx, p, tel, b)
                            except (KeyboardInterrupt, Interrupted, GeneratorExit):
                                raise
                            except MachineError as e:
                                records.extend(_tagged(e.point_records, b))  # measured before the fault
                                raise
                            except Exception as e:
                                if gpu.is_oom(e):
                                    got = bench.failed(ctx, p, f"allocation of {p.label} failed: {first_line(e)}")
                                elif bench.needs_gpu and isinstance(e, cupy.cuda.runtime.CUDARuntimeError):
                                    raise gpu.machine_error(f"{bench.name} ({p.label})", e) from None
                                else:
                                    raise
                            records.extend(_tagged(got, b))
                        raise_if_signalled()
                    except KeyboardInterrupt:
                        interrupted = "SIGINT"
                    except Interrupted as e:
                        interrupted = signal.Signals(e.signum).name
                    except MachineError as e:
                        noted = last_signal()
                        if noted is not None:  # a fault after a Ctrl-C is its consequence (workers stopping)
                            interrupted = signal.Signals(noted).name
                        else:
                            fault = e
                if interrupted is not None or fault is not None:
                    break
        finally:
            progress.done()
    if fault is not None and not records:
        raise fault  # nothing measured (a setup fault): nothing to derive or keep
    bench.derive(ctx, records)
    limits.finalize(records)
    result = Result(command=bench.name, spec=bench.spec_dict(ctx), timing=bench.timing(ctx), env=ctx.env,
                    records=records, partial=interrupted is not None or fault is not None,
                    interrupted_by=interrupted, failed_by=fault.one_line() if fault is not None else None)
    if fault is not None:
        if records:
            fault.partial_result = result
        raise fault
    return result


def _tagged(recs: list[Record], binding) -> list[Record]:
    if binding.tag is not None:
        for r in recs:
            r.params["numa_node"] = binding.tag
    return recs


def _measure_one(bench: Benchmark, ctx: Context, p: Point, tel, binding) -> list[Record]:
    """``bench.measure(ctx, p)`` with the point's telemetry and host-page placement attached to
    each of its records (``Record.telemetry``, ``extra.host_numa``)."""
    from gpubench.core import numa

    with numa.placement_log() as log, timing.collect_stops() as stops:
        with tel.point(p.devices or ctx.devices) if tel is not None else contextlib.nullcontext() as sampler:
            recs = bench.measure(ctx, p)
        block = sampler.block if sampler is not None else None
        placed = log.take()
    timing.annotate(recs, stops)  # noise reached and why sampling stopped, per record
    for r in recs:
        r.telemetry = block
        if placed is not None:
            r.extra["host_numa"] = {"bound_node": binding.node,
                                    "cpus": numa.format_cpulist(binding.cpus) if binding.cpus else None, **placed}
    return recs
