"""What ``gpubench suite`` and the fleet ask of merge: its step (with ``--merge``) and its fleet figure."""

from __future__ import annotations

from gpubench.core.plugin import StepPlace, SuiteStep
from gpubench.validation.checks import row


def suite_steps(place: StepPlace) -> list[SuiteStep]:
    """With GPUs the Dask-CUDA merge over UCX on every visible GPU; on a fleet node without GPUs
    the pandas merge on a CPU cluster (2 runs after 1 warm-up). Both only with --merge."""
    from gpubench.kit import default_spec
    from gpubench.plugins.merge import command

    if place.devices:
        devices = ",".join(map(str, place.devices))
        return [SuiteStep("merge ucx", lambda: default_spec(command.command, devices=devices, protocol="ucx"),
                          order=50, min_gpus=1, opt_in="--merge")]
    if place.fleet:
        return [SuiteStep("merge cpu", lambda: default_spec(command.command, merge_type="cpu", runs=2, warmup_runs=1),
                          order=50, min_gpus=0, opt_in="--merge", each_rank=True)]
    return [SuiteStep("merge ucx", None, order=50, min_gpus=1, opt_in="--merge")]


def fleet_checks(result) -> list[dict]:
    """The merge's harmonic-mean throughput (dask-cuda's), in GB/s."""
    out = []
    for r in result.records[:1]:
        v = r.extra.get("throughput_hmean_Bps")
        out.append(row(f"merge {r.params.get('type')} throughput", result.command, r,
                       v / 1e9 if isinstance(v, (int, float)) else None))
    return out
