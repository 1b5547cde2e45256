"""suite: expectations parsed from TOML, checked against records; the bundle round-trips."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data"))
import synth  # noqa: E402

from gpubench.validation import suite  # noqa: E402
from gpubench.core.errors import UsageError  # noqa: E402
from gpubench.core.result import Record, load  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[2] / "src" / "gpubench" / "profiles" / "h200x2.toml"
KNOWN = ["batch", "copy", "env", "merge", "nccl", "p2p"]


def parse(text: str):
    return suite.parse_expectations(suite._toml_loads(text, "t.toml"), "t.toml", KNOWN)


def test_example_file_parses():
    es = suite.load_expectations(EXAMPLE, KNOWN)
    assert len(es) >= 8
    assert {e.command for e in es} >= {"copy"}
    one = es[0]
    assert one.where == {"device": 0, "direction": "h2d", "memory": "pinned", "nbytes": 2**30}
    assert one.kind == "bandwidth" and one.min_gbps == 52.5 and one.bound_text() == ">= 52.5 GB/s"


@pytest.mark.parametrize("text,needle", [
    ("", "no [[expect]] tables"),
    ("[[expect]]\ncommand='copy'\n", "has no bound"),
    ("[[expect]]\ncommand='copy'\nmin_gbps=-1\n", "min_gbps = -1 must be a number > 0"),
    ("[[expect]]\ncommand='copy'\nmin_gbps='fast'\n", "must be a number > 0"),
    ("[[expect]]\ncommand='cpoy'\nmin_gbps=1\n", "command 'cpoy' not known"),
    ("[[expect]]\nmin_gbps=1\n", "needs command"),
    ("[[expect]]\ncommand='copy'\nmin_gbps=1\nmax_us=3\n", "mixes GB/s and us"),
    ("[[expect]]\ncommand='copy'\nmin_gbps=5\nmax_gbps=3\n", "min_gbps 5 is above max_gbps 3"),
    ("[[expect]]\ncommand='copy'\nmin_gbps=1\nwhere={nbytes=[1,2]}\n", "where must be a table"),
    ("[[expect]]\ncommand='copy'\nmin_gbps=1\nfigure='mean'\n", "figure 'mean' not known"),
    ("[[expect]]\ncommand='copy'\nmin_gbps=1\nmin_gpbs=2\n", "unknown key(s) min_gpbs"),
    ("[expect]\ncommand='copy'\n", "no [[expect]] tables"),
    ("threshold = 3\n", "unknown top-level key(s) threshold"),
    ("[[expect]\n", "not valid TOML"),
    # past Python's int conversion limit tomllib raises ValueError, not its own error
    ("[[expect]]\ncommand='net'\nmin_gbps=1" + "0" * 5000 + "\n", "holds a number too long to read"),
    ("[[expect]]\ncommand='net'\nwhere={nbytes=1" + "0" * 5000 + "}\nmin_gbps=1\n", "holds a number too long to read"),
])
def test_bad_expectations_named(text, needle):
    with pytest.raises(UsageError) as e:
        parse(text)
    assert needle in e.value.one_line()


def test_evaluate_pass_fail_missing_skipped_on_real_results():
    res = load(synth.REAL_PINNED)  # h2d 1 GiB median 54.35 GB/s, d2h 54.41
    es = parse("""
[[expect]]
command = "copy"
where = { direction = "h2d", nbytes = 1073741824 }
min_gbps = 50
[[expect]]
command = "copy"
where = { direction = "d2h", nbytes = 1073741824 }
min_gbps = 60
[[expect]]
command = "copy"
where = { direction = "h2d", nbytes = 1000 }
min_gbps = 1
[[expect]]
command = "copy"
where = { collective = "all-reduce" }
min_gbps = 1
[[expect]]
command = "nccl"
where = { nbytes = 1073741824 }
min_gbps = 300
[[expect]]
command = "copy"
where = { direction = "h2d", nbytes = 4096 }
max_us = 10
figure = "extra.latency_s"
""")
    out = suite.evaluate(es, [res], skipped={"nccl": "needs 2 GPUs, 1 visible"})
    assert [o.status for o in out] == ["pass", "fail", "missing", "missing", "skipped", "fail"]
    assert out[0].value == pytest.approx(load(synth.REAL_PINNED).records[-2].rate_summary().median / 1e9)
    assert 54 < out[1].value < 55
    assert "no copy record has direction=h2d nbytes=1000" in out[2].note
    assert "param(s) collective" in out[3].note and "direction, memory, nbytes" in out[3].note
    assert out[4].note == "needs 2 GPUs, 1 visible"
    assert "extra['latency_s']" in out[5].note
    assert len(suite.failures(out)) == 4 and len(suite.failures(out, strict=True)) == 5


def test_where_without_device_checks_every_matching_record():
    res = synth.copy_like(1)
    (e,) = parse("[[expect]]\ncommand='copy'\nwhere={nbytes=1073741824}\nmin_gbps=54\nmax_gbps=56\n")
    out = suite.evaluate([e], [res])
    assert [o.params["direction"] for o in out] == ["h2d", "d2h"]
    assert all(o.status == "pass" for o in out)


def test_time_bounds_and_percentile_figure():
    res = synth.p2p_like(3)
    es = parse("""
[[expect]]
command = "p2p"
where = { src = 0, dst = 1, test = "latency" }
max_us = 2.5
[[expect]]
command = "p2p"
where = { src = 0, dst = 1, test = "latency" }
max_us = 2.0
figure = "p25"
[[expect]]
command = "p2p"
where = { src = 0, dst = 1, peer = "on", nbytes = 1073741824 }
max_us = 2.0
""")
    out = suite.evaluate(es, [res])
    assert [o.status for o in out] == ["pass", "fail", "fail"]
    assert 2.1 < out[0].value < 2.3
    assert "metric is 'bandwidth'" in out[2].note


def test_failed_point_and_failed_step_fail():
    res = synth.copy_like(1)
    res.records[0] = Record(dict(res.records[0].params), nbytes=2**20, error="allocation of 1 MiB failed")
    es = parse("[[expect]]\ncommand='copy'\nwhere={direction='h2d', nbytes=1048576}\nmin_gbps=1\n"
               "[[expect]]\ncommand='p2p'\nmin_gbps=1\n")
    out = suite.evaluate(es, [res], failed={"p2p": "cudaErrorPeerAccessUnsupported"})
    assert [o.status for o in out] == ["fail", "fail"]
    assert "allocation" in out[0].note and "p2p failed: cudaErrorPeerAccessUnsupported" in out[1].note


def test_bool_params_match_only_bools():
    res = synth.copy_like(1)
    res.records[0].params["verified"] = True
    (e,) = parse("[[expect]]\ncommand='copy'\nwhere={verified=1}\nmin_gbps=1\n")
    assert suite.evaluate([e], [res])[0].status == "missing"


def test_bundle_round_trip(tmp_path):
    b = suite.Bundle(env=synth.real_env(), argv=["suite"])
    b.steps = [suite.Step("env", "env", "ok", seconds=0.1),
               suite.Step("copy pinned", "copy", "ok", seconds=3.0, result=load(synth.REAL_PINNED)),
               suite.Step("p2p", "p2p", "skipped", "needs 2 GPUs, 1 visible")]
    b.outcomes = suite.evaluate(suite.load_expectations(EXAMPLE, KNOWN), b.results(), b.skipped())
    p = suite.save_bundle(b, tmp_path / "b.json")
    back = suite.load_checkable(p)
    assert [s.status for s in back.steps] == ["ok", "ok", "skipped"]
    assert back.steps[1].result.records[0].samples_s == b.steps[1].result.records[0].samples_s
    assert back.skipped() == {"p2p": "needs 2 GPUs, 1 visible"}
    d = json.loads(p.read_text())
    assert d["schema"] == "gpubench.bundle" and d["expectations"]["outcomes"][0]["status"] == "pass"


def test_newer_bundle_refused(tmp_path):
    p = tmp_path / "b.json"
    p.write_text(json.dumps({"schema": "gpubench.bundle", "schema_version": 99, "steps": []}))
    with pytest.raises(UsageError, match="newer than this gpubench reads"):
        suite.load_checkable(p)


# ---- the verdict line says what was checked; a bundle keeps its run's --strict ----

def _outcomes(*statuses):
    e = suite.check_expectation({"command": "copy", "min_gbps": 1.0}, 1, "t")
    return [suite.Outcome(e, status=s) for s in statuses]


@pytest.mark.parametrize("statuses,strict,head", [
    (("skipped", "skipped"), False, "NOTHING CHECKED: 0 pass, 0 fail, 0 missing, 2 skipped."),
    ((), False, "NOTHING CHECKED: 0 pass, 0 fail, 0 missing, 0 skipped."),
    (("pass", "skipped"), False, "PASSED: 1 pass, 0 fail, 0 missing, 1 skipped."),
    (("skipped",), True, "FAILED: 0 pass, 0 fail, 0 missing, 1 skipped (skipped counts as failed: --strict)."),
    (("pass", "missing"), False, "FAILED: 1 pass, 0 fail, 1 missing, 0 skipped."),
])
def test_passed_only_when_something_was_checked_and_nothing_failed(statuses, strict, head):
    assert suite.verdict_line(suite.Bundle(outcomes=_outcomes(*statuses)), strict) == head


def test_a_bundle_keeps_its_runs_strict_and_its_verdict_honours_it():
    b = suite.Bundle(outcomes=_outcomes("pass", "skipped"), strict=True, expect_file="e.toml")
    d = json.loads(json.dumps(b.to_dict()))
    assert d["expectations"]["strict"] is True
    back = suite.Bundle.from_dict(d)
    assert back.strict is True and suite.verdict_line(back).startswith("FAILED:")
    del d["expectations"]["strict"]  # a bundle written before the field: as without --strict
    assert suite.Bundle.from_dict(d).strict is False
    d["expectations"]["strict"] = "yes"
    with pytest.raises(UsageError, match="/expectations/strict"):
        suite.Bundle.from_dict(d)


# ---- profiles and the nodes a figure needs ----

def test_every_shipped_profile_parses_and_names_a_source_for_each_bound():
    from gpubench.validation import profiles

    described = profiles.describe()
    assert [n for n, _, _ in described] == ["gcp-a2", "gcp-a3-high", "gcp-a3-mega", "gcp-g2", "gcp-n1", "h200x2"]
    for name, head, expectations in described:
        assert head["description"] and head["source"], name
        assert expectations, name
        if name.startswith("gcp-"):
            assert all(e.source.startswith("the guide: ") and e.nodes == 2 for e in expectations), name


def test_a_figure_that_needs_more_nodes_than_its_results_span_is_skipped_not_judged():
    net = json.loads((Path(__file__).resolve().parents[1] / "data" / "net-local.json").read_text())
    from gpubench.core.result import Result

    (e,) = suite.parse_expectations(suite._toml_loads(
        "[[expect]]\ncommand = 'net'\nwhere = { stream = 'total' }\nmin_gbps = 1000\nnodes = 2\nsource = 'a guide'\n",
        "t.toml"), "t.toml", [*KNOWN, "net"])
    one_host = Result.from_dict(net)
    (o,) = suite.evaluate([e], [one_host])
    assert (o.status, o.note) == ("skipped", "needs 2 nodes; the net results span 1")
    net["env"]["nodes"] = 2
    (o,) = suite.evaluate([e], [Result.from_dict(net)])
    assert o.status == "fail" and o.value is not None  # judged: 5.7 GB/s against >= 1000
    assert e.to_dict()["source"] == "a guide" and e.to_dict()["nodes"] == 2


def test_an_expectation_on_a_param_added_later_matches_older_records_at_the_value_they_measured():
    """A TCP profile's `protocol = "tcp"` matches a net result written before net had --protocol
    (net's added_params, as compare pairs it), never a UCX one."""
    from gpubench.core.result import Result

    net = json.loads((Path(__file__).resolve().parents[1] / "data" / "net-local.json").read_text())
    (e,) = suite.parse_expectations(suite._toml_loads(
        "[[expect]]\ncommand = 'net'\nwhere = { stream = 'total', protocol = 'tcp' }\nmin_gbps = 0.001\n",
        "t.toml"), "t.toml", [*KNOWN, "net"])
    for r in net["records"]:
        r["params"].pop("protocol", None)
    assert [o.status for o in suite.evaluate([e], [Result.from_dict(net)])] == ["pass"]
    for r in net["records"]:
        r["params"]["protocol"] = "ucx"
    assert [o.status for o in suite.evaluate([e], [Result.from_dict(net)])] == ["missing"]


@pytest.mark.parametrize("text,needle", [
    ("[[expect]]\ncommand='copy'\nmin_gbps=1\nnodes=0\n", "nodes = 0 must be an integer 1..1,048,576"),
    ("[[expect]]\ncommand='copy'\nmin_gbps=1\nnodes=true\n", "nodes = True must be an integer"),
    ("[[expect]]\ncommand='copy'\nmin_gbps=1\nsource=5\n", "source must be a string"),
    ("[profile]\nname='x'\n[[expect]]\ncommand='copy'\nmin_gbps=1\n", "[profile] holds description and source"),
])
def test_bad_profile_keys_are_refused(text, needle):
    with pytest.raises(UsageError, match=re.escape(needle)):
        parse(text)


def test_expect_takes_a_profile_name_and_lists_the_profiles_for_an_unknown_one(run_cli):
    code, out, err = run_cli("suite", "--check", DATA_NCCL, "--expect", "gcp-a3-high")
    assert code == 0 and "skipped: needs 2 nodes; the nccl results span 1" in out, (out, err)
    code, out, err = run_cli("suite", "--check", DATA_NCCL, "--expect", "gcp-a9")
    assert code == 2 and err == ("gpubench: error: --expect 'gcp-a9' is no file and no profile (profiles: gcp-a2, "
                                 "gcp-a3-high, gcp-a3-mega, gcp-g2, gcp-n1, h200x2; or give a TOML file)\n")
    code, out, err = run_cli("suite", "--profiles")
    assert code == 0 and err == ""
    assert "gcp-a3-mega" in out and "cloud.google.com/compute/docs/gpus/gpu-network-bandwidth" in out


DATA_NCCL = Path(__file__).resolve().parents[1] / "data" / "nccl-h200x2.json"
