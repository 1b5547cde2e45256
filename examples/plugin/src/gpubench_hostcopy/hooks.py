"""What ``gpubench suite`` and the fleet ask of hostcopy: a short sweep, and its largest figure."""

from __future__ import annotations

from gpubench.core.plugin import StepPlace, SuiteStep


def suite_steps(place: StepPlace) -> list[SuiteStep]:
    """A 64 KiB .. 16 MiB sweep on every node (no GPU needed)."""
    from gpubench.kit import default_spec
    from gpubench_hostcopy import command

    return [SuiteStep("hostcopy", lambda: default_spec(command.command, min_bytes="64KiB", max_bytes="16MiB"),
                      order=100, min_gpus=0, each_rank=True)]


def fleet_checks(result) -> list[dict]:
    """The median rate at the largest size, in GB/s."""
    from gpubench.validation.checks import largest, median_rate_gbps, row, size_text

    best = largest(result.records, lambda r: "all")
    return [row(f"hostcopy {size_text(r.nbytes)}", result.command, r, median_rate_gbps(r)) for r in best.values()]
