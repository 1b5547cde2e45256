"""The GPU's state while each point runs: NVML (nvidia-ml-py) sampled on a thread beside the timed work.

Every record of a point gets the block (:attr:`PointSampler.block`) as ``Record.telemetry`` (each
field's NVML source: docs/conditions.md)::

    {"n": 14, "interval_s": 0.01, "devices": [0],
     "sm_clock_mhz", "mem_clock_mhz", "power_w", "temp_c": {"min", "median", "max"} | null,
     "reasons": ["sw_power_cap", ...], "pcie": {"gen": 5, "width": 16} | null,
     "pcie_replay_delta", "nvlink_errors_delta", "other_processes": 0 | null}

A statistic is null when the driver does not answer that query; with several GPUs in a point the
statistics run over the samples of all of them (cost: docs/conditions.md).
"""

from __future__ import annotations

import contextlib
import functools
import operator
import os
import statistics
import threading
from typing import Any, Iterator, Sequence

from gpubench.core.env import nvml_call as _call
from gpubench.core.env import nvml_handles

DEFAULT_INTERVAL_S = 0.01

# nvmlClocksEventReasons (nvml.h), the events only (not idle, application or display clocks)
REASON_BITS = {0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x10: "sync_boost", 0x20: "sw_thermal", 0x40: "hw_thermal",
               0x80: "hw_power_brake"}
# the reasons that lower clocks because of power or heat: the report names a point that saw one
SLOWDOWN_REASONS = ("sw_power_cap", "hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake")
REASON_WORDS = {"sw_power_cap": "power-capped", "hw_slowdown": "in hardware slowdown",
                "sw_thermal": "thermally throttled (software)", "hw_thermal": "thermally throttled (hardware)",
                "hw_power_brake": "power-braked", "sync_boost": "sync-boosted"}
NVLINK_COUNTERS = 4  # NVML_NVLINK_ERROR_DL_REPLAY, _RECOVERY, _CRC_FLIT, _CRC_DATA


def summary3(values: Sequence[float]) -> dict[str, float] | None:
    """{"min", "median", "max"} of ``values``, or None when there are none."""
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    return {"min": min(vals), "median": statistics.median(vals), "max": max(vals)}


class _Device:
    """One GPU's NVML handle and what was found about it once (its NVLink links up)."""

    def __init__(self, nv, index: int, handle):
        self.nv = nv
        self.index = index
        self.h = handle
        self.links = [link for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18))
                      if _call(nv.nvmlDeviceGetNvLinkState, handle, link) == 1]

    def sample(self) -> tuple:
        nv, h = self.nv, self.h
        power = _call(nv.nvmlDeviceGetPowerUsage, h)
        return (_call(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM),
                _call(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM),
                power / 1000.0 if power is not None else None,
                _call(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU),
                _call(getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
                      or nv.nvmlDeviceGetCurrentClocksThrottleReasons, h))

    def counters(self) -> dict[str, Any]:
        """The slow reads, once at a point's start and end: link state, replay and NVLink errors,
        other processes."""
        nv, h = self.nv, self.h
        nvl = None
        if self.links:
            vals = [_call(nv.nvmlDeviceGetNvLinkErrorCounter, h, link, c)
                    for link in self.links for c in range(NVLINK_COUNTERS)]
            vals = [v for v in vals if v is not None]
            nvl = sum(vals) if vals else None
        procs = _call(nv.nvmlDeviceGetComputeRunningProcesses, h)
        return {"gen": _call(nv.nvmlDeviceGetCurrPcieLinkGeneration, h),
                "width": _call(nv.nvmlDeviceGetCurrPcieLinkWidth, h),
                "replay": _call(nv.nvmlDeviceGetPcieReplayCounter, h),
                "nvlink": nvl,
                "others": None if procs is None else sum(1 for p in procs if p.pid != os.getpid())}


class PointSampler:
    """Samples the GPUs of one point on a daemon thread; :attr:`block` holds the summary once stopped."""

    def __init__(self, devices: Sequence[_Device], interval_s: float):
        self.devices = list(devices)
        self.interval_s = interval_s
        self.samples: list[tuple] = []
        self.block: dict[str, Any] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="gpubench-telemetry", daemon=True)
        self._start: list[dict] = []

    def _take(self) -> None:
        for d in self.devices:
            self.samples.append(d.sample())

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._take()

    def start(self) -> None:
        self._start = [d.counters() for d in self.devices]
        self._take()
        self._thread.start()

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        self._thread.join()
        self._take()
        end = [d.counters() for d in self.devices]
        self.block = summarize(self.samples, self._start, end, self.interval_s,
                               [d.index for d in self.devices])
        return self.block


def _delta(start: list[dict], end: list[dict], key: str) -> int | None:
    ds = [e[key] - s[key] for s, e in zip(start, end) if s[key] is not None and e[key] is not None]
    return sum(ds) if ds else None


def summarize(samples: list[tuple], start: list[dict], end: list[dict], interval_s: float,
              devices: list[int]) -> dict[str, Any]:
    """The telemetry block (module docstring) from raw sample tuples (sm MHz, mem MHz, W, C,
    reasons mask) and the start and end counter reads of each device."""
    cols: list[tuple] = list(zip(*samples)) if samples else [(), (), (), (), ()]
    mask = functools.reduce(operator.or_, (int(m) for m in cols[4] if m is not None), 0)
    links = [(c["gen"], c["width"]) for c in start + end if c["gen"] is not None and c["width"] is not None]
    others = [c["others"] for c in start + end if c["others"] is not None]
    return {"n": len(samples) // max(1, len(devices)), "interval_s": interval_s, "devices": devices,
            "sm_clock_mhz": summary3(cols[0]), "mem_clock_mhz": summary3(cols[1]), "power_w": summary3(cols[2]),
            "temp_c": summary3(cols[3]),
            "reasons": [name for bit, name in REASON_BITS.items() if mask & bit],  # in REASON_BITS order
            "pcie": {"gen": min(g for g, _ in links), "width": min(w for _, w in links)} if links else None,
            "pcie_replay_delta": _delta(start, end, "replay"), "nvlink_errors_delta": _delta(start, end, "nvlink"),
            "other_processes": max(others) if others else None}


class Telemetry:
    """NVML opened once for a run over the env's ``gpus`` entries, sampled every ``interval_s``
    seconds; :meth:`point` samples the GPUs of one point. ``status`` is the Result's
    ``env["telemetry"]``."""

    def __init__(self, gpus: Sequence[dict], interval_s: float = DEFAULT_INTERVAL_S):
        self.interval_s = interval_s
        self.status: dict[str, Any] = {"enabled": True, "interval_s": interval_s, "error": None}
        self._devices: dict[int, _Device] = {}
        self._nv = None
        try:
            import pynvml as nv

            nv.nvmlInit()
            self._nv = nv
        except Exception as e:
            self.status["error"] = f"NVML not available ({type(e).__name__})"
            return
        self._devices = {g["index"]: _Device(nv, g["index"], h) for g, h in nvml_handles(nv, gpus)}
        if not self._devices:
            self.status["error"] = "NVML knows none of the GPUs used"

    @contextlib.contextmanager
    def point(self, devices: Sequence[int]) -> Iterator[PointSampler | None]:
        """Sample ``devices`` (CUDA ordinals) while the block runs; yields None when none can be."""
        devs = [self._devices[d] for d in devices if d in self._devices]
        if not devs:
            yield None
            return
        s = PointSampler(devs, self.interval_s)
        s.start()
        try:
            yield s
        finally:
            s.stop()

    def close(self) -> None:
        if self._nv is not None:
            _call(self._nv.nvmlShutdown)
            self._nv = None


@contextlib.contextmanager
def session(gpus: Sequence[dict], enabled: bool, interval_s: float = DEFAULT_INTERVAL_S) -> Iterator[Telemetry | None]:
    """A :class:`Telemetry` for the run, closed after; None when ``enabled`` is False."""
    if not enabled:
        yield None
        return
    with contextlib.closing(Telemetry(gpus, interval_s)) as t:
        yield t


def notes(records: Sequence[Any]) -> list[str]:
    """One line per group of GPUs where something happened during the points: a slowdown reason
    (with the SM clock range), other processes on the GPU, PCIe replays or NVLink errors."""
    by_dev: dict[tuple, list[dict]] = {}
    for r in records:
        t = getattr(r, "telemetry", None)
        if t:
            by_dev.setdefault(tuple(t.get("devices") or ()), []).append(t)
    out = []
    for devs, blocks in by_dev.items():
        uniq = list({repr(sorted(b.items())): b for b in blocks}.values())  # a point's records share one block
        name = ("GPU " + str(devs[0])) if len(devs) == 1 else ("GPUs " + ",".join(map(str, devs)))
        n = len(uniq)
        parts = []
        for reason in SLOWDOWN_REASONS:
            hit = [b for b in uniq if reason in (b.get("reasons") or ())]
            if hit:
                parts.append(f"{REASON_WORDS[reason]} during {len(hit)} of {n} points")
        others = [b for b in uniq if (b.get("other_processes") or 0) > 0]
        if others:
            most = max(b["other_processes"] for b in others)
            parts.append(f"shared with {most} other process{'es' if most > 1 else ''} during {len(others)} of {n} points")
        replay = sum(b.get("pcie_replay_delta") or 0 for b in uniq)
        if replay:
            parts.append(f"{replay} PCIe replay(s)")
        nvl = sum(b.get("nvlink_errors_delta") or 0 for b in uniq)
        if nvl:
            parts.append(f"{nvl} NVLink error count(s)")
        if parts:
            sm = [b["sm_clock_mhz"] for b in uniq if b.get("sm_clock_mhz")]
            pw = [b["power_w"] for b in uniq if b.get("power_w")]
            tail = ""
            if sm:
                lo, hi = min(s["min"] for s in sm), max(s["max"] for s in sm)
                tail += f"; SM clock {lo:.0f}-{hi:.0f} MHz" if lo != hi else f"; SM clock {lo:.0f} MHz"
            if pw:
                tail += f", power up to {max(p['max'] for p in pw):.0f} W"
            out.append(f"{name} {'; '.join(parts)}{tail} (telemetry in the JSON).")
    return out
