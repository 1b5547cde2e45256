"""What ``gpubench suite`` and the fleet ask of copy: its step and its fleet figures."""

from __future__ import annotations

from gpubench.core.plugin import StepPlace, SuiteStep
from gpubench.validation.checks import largest, median_rate_gbps, row, size_text

SIZES = ("4KiB", "1GiB", 4.0)  # min, max, step factor of the suite's pinned copy sweep


def suite_steps(place: StepPlace) -> list[SuiteStep]:
    """The pinned H2D and D2H sweep over every visible GPU (on a fleet, each rank its own GPU;
    none on a fleet node without GPUs)."""
    from gpubench.kit import default_spec
    from gpubench.plugins.copy import command

    if place.fleet and not place.devices:
        return []
    devices = (place.gpu,) if place.fleet and place.gpu is not None else place.devices
    lo, hi, f = SIZES
    return [SuiteStep("copy pinned", lambda: default_spec(command.command, only="pinned", min_bytes=lo, max_bytes=hi,
                                                          step_factor=f, devices=",".join(map(str, devices)) or None),
                      order=10, min_gpus=0, each_rank=True)]


def fleet_checks(result) -> list[dict]:
    """Per GPU the pinned (or other memory) H2D and D2H copy at the largest size."""
    best = largest(result.records, lambda r: (r.params.get("device"), r.params.get("direction"), r.params.get("memory"))
                   if r.params.get("direction") in ("h2d", "d2h") else None)
    return [row(f"copy {d} {mem} {size_text(r.params['nbytes'])}", result.command, r, median_rate_gbps(r), gpu=dev)
            for (dev, d, mem), r in sorted(best.items(), key=lambda kv: str(kv[0]))]
