"""What ``gpubench suite`` and the fleet ask of p2p: its step and its fleet figures."""

from __future__ import annotations

from gpubench.core.plugin import StepPlace, SuiteStep
from gpubench.validation.checks import largest, median_rate_gbps, row


def suite_steps(place: StepPlace) -> list[SuiteStep]:
    """The p2p matrix over every visible GPU (two at least); none on a fleet node without GPUs."""
    from gpubench.kit import default_spec
    from gpubench.plugins.p2p import command

    if place.fleet and not place.devices:
        return []
    return [SuiteStep("p2p", lambda: default_spec(command.command, devices=",".join(map(str, place.devices))),
                      order=30, min_gpus=2)]


def fleet_checks(result) -> list[dict]:
    """Per GPU pair the p2p write and read at the largest size."""
    best = largest(result.records, lambda r: (r.params.get("test"), r.params.get("src"), r.params.get("dst"))
                   if r.params.get("test") in ("write", "read") and "part" not in r.params else None)
    return [row(f"p2p {test} GPU{s}->GPU{d}", result.command, r, median_rate_gbps(r), gpu=s)
            for (test, s, d), r in sorted(best.items(), key=lambda kv: str(kv[0]))]
