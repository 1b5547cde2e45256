"""What compare, ``gpubench suite`` and the fleet ask of nccl: a note on its rates, its step and
its fleet figures."""

from __future__ import annotations

from gpubench.core.plugin import FleetStage, StageContext, StageOutcome, StepPlace, SuiteStep
from gpubench.validation.checks import largest, row, size_text

SUITE_SIZES = ("1M", "1G", 4.0)  # the in-node all-reduce: -b 1M -e 1G -f 4
ALL_NODES_SIZES = ("1G", "1G", 2.0)  # the fleet's all-node all-reduce: -b 1G -e 1G


def compare_notes(base, new) -> list[str]:
    """busbw is algbw scaled by a constant, so its change and verdict are algbw's."""
    formula = next((r.extra.get("busbw_formula") for r in new.records if r.extra.get("busbw_formula")),
                   "algbw * factor")
    return [f"nccl rates are algbw = S/t; busbw = {formula} is the same figure scaled, so its change and verdict "
            "are the same"]


def spec(sizes: tuple[str, str, float]):
    """An all-reduce Spec with the command line's defaults over ``sizes`` (min, max, factor)."""
    from gpubench.kit import default_spec
    from gpubench.plugins.nccl import command

    lo, hi, f = sizes
    return default_spec(command.command, min_bytes=lo, max_bytes=hi, step_factor=f)


def suite_steps(place: StepPlace) -> list[SuiteStep]:
    """The in-node all-reduce over every visible GPU (two at least); on a fleet node in its own process."""
    if place.fleet and not place.devices:
        return []
    return [SuiteStep("nccl all-reduce", lambda: spec(SUITE_SIZES), order=40, min_gpus=2, own_process=place.fleet)]


def fleet_checks(result) -> list[dict]:
    """The busbw at the largest size of each collective, out of place."""
    best = largest(result.records, lambda r: r.params.get("collective") if r.params.get("placement") == "out-of-place"
                   else None)
    out = []
    for coll, r in sorted(best.items()):
        bus = r.extra.get("busbw_bytes_per_s")
        out.append(row(f"nccl {coll} busbw {size_text(r.params['nbytes'])} {r.params.get('nranks')} GPUs",
                       result.command, r, bus / 1e9 if isinstance(bus, (int, float)) else None))
    return out


class AllNodes(FleetStage):
    """The fleet's all-node NCCL all-reduce at 1 GiB over every rank, through nccl's launcher plug-in
    on the fleet's own group."""

    name = "nccl all nodes"
    order = 10

    def run(self, ctx: StageContext) -> StageOutcome | None:
        import time

        from gpubench.core import benchmark as driver
        from gpubench.core.errors import GpubenchError, MachineError
        from gpubench.plugins.nccl import log as nccl_log
        from gpubench.plugins.nccl import ranks as nccl_ranks

        if not ctx.n_gpus or ctx.group.size < 2 or ctx.stopped is not None:
            return None
        ctx.say(f"fleet: NCCL all-reduce over every rank ({ctx.group.size} processes)")
        t = time.perf_counter()
        log = nccl_log.capture()  # NCCL may be initialised already here (the in-node step): then no log
        try:
            res = driver.run(nccl_ranks.NcclRanks(ctx.group, log), spec(ALL_NODES_SIZES), None)
        except GpubenchError as e:
            return StageOutcome("error", e.one_line(), seconds=time.perf_counter() - t,
                                fault=MachineError(e.one_line()))
        finally:
            log.remove()
        checks = [{**c, "check": c["check"].replace("nccl ", "nccl all nodes ", 1), "expect": None,
                   "expect_op": None, "expect_status": None} for c in fleet_checks(res)]
        return StageOutcome("ok", result=res, seconds=time.perf_counter() - t, checks=checks)


def fleet_stage() -> FleetStage:
    return AllNodes()
