"""The hostcopy benchmark: one numpy ``copyto`` between two touched host buffers per sample.

A point is one size; a sample is one copy of ``nbytes``, timed on the host with
``time.perf_counter`` around the call (numpy's copy returns when the bytes are written). The
record's rate is nbytes / seconds, counted once (what a memcpy benchmark such as STREAM's Copy
reports as bandwidth counts read and write: twice this).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

from gpubench.core import benchmark as driver
from gpubench.core.benchmark import Benchmark, Context, Point
from gpubench.core.errors import UsageError
from gpubench.core.report import ProgressSink
from gpubench.core.result import Record, Result
from gpubench.core.timing import TimingPlan, sample_loop
from gpubench.core.units import format_size

MAX_BYTES = 2**40  # one copy of at most 1 TiB: beyond any host's memory


@dataclass(frozen=True)
class HostCopySpec:
    """Parsed options of ``gpubench hostcopy``.

    Attributes:
        sizes: bytes per copy, ascending, each in [1, MAX_BYTES].
        plan: warm-ups and the iteration rule (a sample is one copy).
    """

    sizes: tuple[int, ...]
    plan: TimingPlan = field(default_factory=lambda: TimingPlan(warmup=2))

    def __post_init__(self):
        if not self.sizes:
            raise UsageError("no sizes to measure")
        for n in self.sizes:
            if not 1 <= n <= MAX_BYTES:
                raise UsageError(f"size {format_size(n)} out of range", f"use 1 B to {format_size(MAX_BYTES)}")

    def to_dict(self) -> dict:
        return asdict(self)


class HostCopy(Benchmark):
    """A point per size; one timed copy per sample; records of metric "bandwidth"."""

    name = "hostcopy"
    needs_gpu = False

    def points(self, spec: HostCopySpec, devices: tuple[int, ...]) -> list[Point]:
        return [Point(f"hostcopy {format_size(n)}", n, host_bytes=2 * n) for n in spec.sizes]

    def too_big_hint(self, spec: HostCopySpec) -> str:
        return "lower -e/--max-bytes"

    def measure(self, ctx: Context, point: Point) -> list[Record]:
        import numpy as np

        n: int = point.key
        src = np.full(n, 0xA5, dtype=np.uint8)  # touched, and not zeros
        dst = np.zeros(n, dtype=np.uint8)
        dst.fill(1)

        def take() -> float:
            t0 = time.perf_counter()
            np.copyto(dst, src)
            return time.perf_counter() - t0

        samples = sample_loop(take, ctx.spec.plan)
        if dst[0] != 0xA5 or dst[-1] != 0xA5:
            raise UsageError(f"hostcopy {format_size(n)}: the copy did not arrive")
        return [Record(params={"nbytes": n}, metric="bandwidth", nbytes=n, samples_s=list(samples))]

    def environment(self, spec: HostCopySpec) -> dict:
        from gpubench.core import env

        return {"host": env.host_info(), "versions": env.versions()}

    def timing(self, ctx: Context) -> dict:
        return {"clock": "perf_counter", "method": "one numpy copyto per sample, timed on the host",
                **ctx.spec.plan.to_dict()}


def run(spec: HostCopySpec, progress: ProgressSink | None = None) -> Result:
    """Measure every size through gpubench's driver.

    Returns:
        A Result with one record per size: metric "bandwidth", nbytes, seconds per copy.
    """
    return driver.run(HostCopy(), spec, progress)
