"""How suite runs a step, without a GPU: every plug-in declares its steps as Specs built with its
command line's defaults, the spec goes to the command's run function (the driver), the result is
saved; a machine fault keeps its finished points in the bundle; an interrupt stops the suite.
The plug-ins' run functions are replaced by fakes, so only the suite's own path runs."""

from __future__ import annotations

import json

import click
import pytest
from click.testing import CliRunner

from gpubench.validation import suite
from gpubench.plugins.batch import bench as batch_bench
from gpubench.plugins.copy import bench as copy_bench
from gpubench.cli.app import main
from gpubench.core import registry
from gpubench.core.plugin import Plugin, StepPlace, SuiteStep
from gpubench.plugins.batch.command import build_spec as batch_build_spec
from gpubench.kit import benchmark_command, default_spec
from gpubench.validation import steps
from gpubench.core.errors import MachineError, UsageError
from gpubench.core.result import Record, Result, load
from gpubench.core.timing import TimingPlan
from gpubench.core.units import parse_size, size_sweep

BATCH_ARGV = ["--count", "64", "--piece", "1KiB,4KiB", "-s", "separate,contiguous", "--direction", "h2d",
              "-m", "pinned", "-n", "3", "-w", "0", "--no-gate", "--spread", "range", "--units", "GiB"]


def _capture_cli_spec(monkeypatch, module, cmd, argv):
    """The spec the click command builds for ``argv`` (its run function replaced by a recorder)."""
    seen = []

    def fake_run(spec, progress=None):
        seen.append(spec)
        return Result(command=cmd.name, spec=spec.to_dict())

    monkeypatch.setattr(module, "run", fake_run)
    out = CliRunner().invoke(cmd, argv)
    assert out.exception is None, out.output
    (spec,) = seen
    return spec


def test_the_batch_step_is_the_spec_the_cli_builds_from_its_defaults(monkeypatch):
    from gpubench.plugins.batch import command

    (step,) = [s for p, s in steps.planned(StepPlace(devices=(0,))) if p.name == "batch"]
    assert step.spec() == _capture_cli_spec(monkeypatch, batch_bench, command.command, [])


def test_default_spec_changes_options_by_name_with_the_commands_own_checks():
    from gpubench.plugins.batch import command

    spec = default_spec(command.command, count=64, piece="1KiB,4KiB", strategies="separate,contiguous",
                        directions="h2d", memory="pinned", iters=3, warmup=0, no_gate=True)
    assert spec == batch_build_spec(count=64, piece="1KiB,4KiB", total=None, sweep=False,
                                    strategies="separate,contiguous", directions="h2d", memory="pinned", device=0,
                                    warmup=0, iters=3, min_time=0.1, no_gate=True)
    with pytest.raises(TypeError, match="no option"):
        default_spec(command.command, nosuch=1)
    with pytest.raises(UsageError) as e:  # a value the Spec refuses: its own line
        default_spec(command.command, strategies="separate,magic")
    assert "strategy 'magic' not known" in e.value.one_line()


def test_the_copy_step_is_the_spec_suite_built_by_hand():
    from gpubench.plugins.copy import hooks as copy_hooks

    (step,) = [s for p, s in steps.planned(StepPlace(devices=(0, 1))) if p.name == "copy"]
    lo, hi, f = copy_hooks.SIZES
    assert step.spec() == copy_bench.CopySpec(sizes=tuple(size_sweep(parse_size(lo), parse_size(hi), f)),
                                              directions=("h2d", "d2h"), memory=("pinned",), devices=(0, 1),
                                              plan=TimingPlan(min_time=0.01, max_noise=0.5, max_time=0.1))


def test_the_node_suite_plans_every_plugins_steps_in_order_and_skips_with_the_reason():
    planned = steps.planned(StepPlace(devices=(0,)))
    names = [s.name for p, s in planned if p.command.startswith("gpubench.")]
    assert names == ["copy pinned", "batch", "p2p", "nccl all-reduce", "merge ucx"]
    why = {s.name: steps.skip_reason(s, 1, set()) for p, s in planned}
    assert why["p2p"] == why["nccl all-reduce"] == "needs 2 GPUs, 1 visible"
    assert why["merge ucx"] == "not asked (--merge)" and why["copy pinned"] is None and why["batch"] is None


def test_a_fleet_node_runs_its_own_gpu_and_a_cpu_node_the_loopback_and_cpu_merge():
    gpu = [s for p, s in steps.planned(StepPlace(devices=(0, 1), fleet=True, gpu=1)) if p.command.startswith("gpubench.")]
    assert [s.name for s in gpu] == ["copy pinned", "p2p", "nccl all-reduce", "merge ucx"]
    assert gpu[0].each_rank and gpu[0].spec().devices == (1,) and not any(s.each_rank for s in gpu[1:])
    assert gpu[2].own_process  # under the launcher `gpubench nccl` would join every rank
    cpu = [s for p, s in steps.planned(StepPlace(devices=(), fleet=True)) if p.command.startswith("gpubench.")]
    assert [s.name for s in cpu] == ["net loopback", "merge cpu"]
    assert cpu[1].spec().merge_type == "cpu" and cpu[1].opt_in == "--merge"


def test_a_step_runs_its_spec_through_the_commands_run_with_progress(monkeypatch):
    calls = []
    fake = benchmark_command("fake", [click.option("--x", default="1")], lambda x: ("spec", x),
                             lambda r, units="GB": [], help="A fake.",
                             run=lambda spec: lambda s, progress: calls.append((s, progress)) or Result("fake", {}))
    monkeypatch.setattr(registry, "load_command", lambda name: fake)
    plugin = Plugin(name="fake", help="A fake.", command="fake")
    res = steps.run_step(plugin, SuiteStep("fake", ("spec", "5")))
    assert res.command == "fake" and calls[0][0] == ("spec", "5") and calls[0][1] is not None
    res = steps.run_step(plugin, SuiteStep("fake", lambda: ("spec", "6")))
    assert calls[1][0] == ("spec", "6")


def _record(n_samples=3, command="copy"):
    """One 1 MiB H2D point with the params ``command``'s records carry (copy's or batch's)."""
    params = {"device": 0, "direction": "h2d", "memory": "pinned"}
    params.update({"nbytes": 1 << 20} if command == "copy" else
                  {"strategy": "separate", "count": 1, "piece_bytes": 1 << 20})
    return Record(params=params, nbytes=1 << 20, samples_s=[1e-4] * n_samples)


def test_record_step_saves_an_ok_result(tmp_path, monkeypatch):
    monkeypatch.setattr("gpubench.core.registry.INVOCATION", ["suite", "-o", "x"])
    b = suite.Bundle()
    path = tmp_path / "s-copy.json"
    assert steps.record_step(b, "copy pinned", "copy", path, lambda p: Result("copy", {}, records=[_record()]))
    (step,) = b.steps
    assert step.status == "ok" and step.path == str(path) and load(path).records[0].samples_s == [1e-4] * 3
    assert load(path).argv == ["suite", "-o", "x"]


def test_a_machine_fault_keeps_its_finished_points_as_the_step_result(tmp_path):
    partial = Result("batch", {}, records=[_record(command="batch")], partial=True, failed_by="CUDA error: an illegal address")

    def faulty(path):
        e = MachineError("CUDA error: an illegal address")
        e.partial_result = partial
        raise e

    b = suite.Bundle()
    path = tmp_path / "s-batch.json"
    assert steps.record_step(b, "batch", "batch", path, faulty) is True  # the next step runs
    (step,) = b.steps
    assert step.status == "error" and "illegal address" in step.reason
    assert step.result is partial and step.path == str(path)
    saved = json.loads(path.read_text())
    assert saved["partial"] is True and saved["failed_by"] and len(saved["records"]) == 1
    back = suite.load_checkable(suite.save_bundle(b, tmp_path / "bundle.json"))
    assert back.steps[0].status == "error" and len(back.steps[0].result.records) == 1


def test_a_fault_without_points_and_a_usage_error_are_errors_without_result(tmp_path):
    b = suite.Bundle()

    def bad(path):
        raise UsageError("strategy 'x' not known")

    assert steps.record_step(b, "batch", "batch", tmp_path / "b.json", bad)
    assert b.steps[0].status == "error" and b.steps[0].result is None and not (tmp_path / "b.json").exists()


def test_a_step_that_raises_a_bug_is_an_error_row_and_the_next_step_runs(tmp_path):
    b = suite.Bundle()

    def bug(path):
        raise AttributeError("'str' object has no attribute 'sizes'")

    assert steps.record_step(b, "hostcopy", "hostcopy", tmp_path / "h.json", bug) is True
    assert steps.record_step(b, "junk", "junk", tmp_path / "j.json", lambda p: "not a result") is True
    assert [s.status for s in b.steps] == ["error", "error"]
    assert b.steps[0].reason == "AttributeError: 'str' object has no attribute 'sizes'"
    assert "not a Result" in b.steps[1].reason


def test_an_interrupted_step_stops_the_suite(tmp_path):
    b = suite.Bundle()
    res = Result("copy", {}, records=[_record()], partial=True, interrupted_by="SIGINT")
    assert steps.record_step(b, "copy pinned", "copy", tmp_path / "c.json", lambda p: res) is False
    assert b.steps[0].status == "ok" and load(tmp_path / "c.json").partial


# -- the whole suite command on fakes: one GPU, copy and batch through the driver path -----------


@pytest.fixture
def fake_machine(monkeypatch):
    """No GPU needed: one visible device, an empty environment, and recorders as copy's and batch's
    run functions (behaviour per command set through the returned dict)."""
    from gpubench.core import env as envmod
    from gpubench.core import gpu

    monkeypatch.setattr(gpu, "require_gpu", lambda: None)
    monkeypatch.setattr(gpu, "device_count", lambda: 1)
    monkeypatch.setattr(envmod, "capture", lambda: {"host": {"hostname": "fake"}})
    seen: dict = {}
    behaviour: dict = {}

    def runner(name):
        def run(spec, progress=None):
            seen[name] = spec
            action = behaviour.get(name)
            if isinstance(action, BaseException):
                raise action
            return action or Result(name, spec.to_dict(), records=[_record(command=name)])
        return run

    monkeypatch.setattr(copy_bench, "run", runner("copy"))
    monkeypatch.setattr(batch_bench, "run", runner("batch"))
    return seen, behaviour


def _suite(capsys, *args):
    with pytest.raises(SystemExit) as e:
        main(["suite", *args])
    out, err = capsys.readouterr()
    return e.value.code, out, err


EXPECT_COPY = '[[expect]]\ncommand = "copy"\nwhere = { direction = "h2d" }\nmin_gbps = 1\n'


def test_suite_runs_copy_and_batch_through_the_driver(capsys, tmp_path, fake_machine):
    seen, _ = fake_machine
    exp = tmp_path / "e.toml"
    exp.write_text(EXPECT_COPY)
    rc, out, err = _suite(capsys, "--expect", str(exp), "-o", str(tmp_path / "o"), "-q")
    assert rc == 0, err
    assert seen["copy"].memory == ("pinned",) and seen["copy"].devices == (0,)
    assert seen["batch"] == batch_build_spec(None, None, None, False, "separate,packed,batched-api,contiguous",
                                             "h2d,d2h", "pinned,pageable", 0, 2, None, 0.1)
    (bundle_path,) = [p for p in (tmp_path / "o").glob("suite-*.json") if p.name.count("-") == 3]
    b = suite.load_checkable(bundle_path)
    assert [(s.name, s.status) for s in b.steps] == [
        ("env", "ok"), ("copy pinned", "ok"), ("batch", "ok"), ("p2p", "skipped"), ("nccl all-reduce", "skipped"),
        ("merge ucx", "skipped")]
    assert load(b.steps[2].path).command == "batch" and [o.status for o in b.outcomes] == ["pass"]


def test_a_faulting_step_is_an_error_with_its_points_and_the_suite_goes_on(capsys, tmp_path, fake_machine):
    seen, behaviour = fake_machine
    fault = MachineError("CUDA error: an illegal memory access")
    fault.partial_result = Result("copy", {}, records=[_record()], partial=True, failed_by=fault.one_line())
    behaviour["copy"] = fault
    exp = tmp_path / "e.toml"
    exp.write_text(EXPECT_COPY)
    rc, out, err = _suite(capsys, "--expect", str(exp), "-o", str(tmp_path), "-q")
    assert rc == 1 and "step(s) failed: copy pinned" in err and "interrupted" not in err
    assert "batch" in seen  # the next step ran
    (bundle_path,) = [p for p in tmp_path.glob("suite-*.json") if p.name.count("-") == 3]
    b = suite.load_checkable(bundle_path)
    copy = b.steps[1]
    assert copy.status == "error" and len(copy.result.records) == 1 and copy.result.failed_by
    assert [o.status for o in b.outcomes] == ["fail"]  # checked as failed, not on the partial points
    # --check of that bundle: the error step still fails its expectation
    rc, out, _ = _suite(capsys, "--check", str(bundle_path), "--expect", str(exp))
    assert rc == 1 and "copy failed" in out


def test_an_interrupt_stops_the_suite_and_keeps_the_bundle(capsys, tmp_path, fake_machine):
    seen, behaviour = fake_machine
    behaviour["copy"] = Result("copy", {}, records=[_record()], partial=True, interrupted_by="SIGTERM")
    rc, out, err = _suite(capsys, "-o", str(tmp_path), "-q")
    assert rc == 143 and "interrupted by SIGTERM during copy pinned" in err
    assert "batch" not in seen
    (bundle_path,) = [p for p in tmp_path.glob("suite-*.json") if p.name.count("-") == 3]
    assert [s.name for s in suite.load_checkable(bundle_path).steps] == ["env", "copy pinned"]
