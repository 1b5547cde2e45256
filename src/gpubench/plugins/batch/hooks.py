"""What ``gpubench suite`` asks of batch: its step (a node figure, not a fleet one)."""

from __future__ import annotations

from gpubench.core.plugin import StepPlace, SuiteStep


def suite_steps(place: StepPlace) -> list[SuiteStep]:
    """batch with its defaults on a node suite; none on a fleet."""
    from gpubench.kit import default_spec
    from gpubench.plugins.batch import command

    if place.fleet:
        return []
    return [SuiteStep("batch", lambda: default_spec(command.command), order=20, min_gpus=1)]
