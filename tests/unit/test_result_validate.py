"""The loader's validator (core/result.check_result) against the published JSON Schema: the same
files pass both, and every mutation the schema refuses the loader refuses too (exit 2 naming the
field). The loader refuses more (inf, nan, 400-digit integers, nesting beyond 64), which the
schema cannot say for Python's json module. jsonschema is a test dependency only; the loader
does not need it at run time."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from gpubench.core.errors import UsageError
from gpubench.core.result import MAX_DEPTH, Result, json_depth, json_schema, object_depth

DATA = Path(__file__).resolve().parents[1] / "data"
FILES = sorted(DATA.glob("*.json"))
jsonschema = pytest.importorskip("jsonschema")


def _validator():
    schema = json_schema()
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema)


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_fixture_results_pass_both(path):
    d = json.loads(path.read_text())
    assert not list(_validator().iter_errors(d))
    Result.from_dict(d, source=path.name)


MUTATIONS = [
    ("command", "Suite!"), ("command", 3), ("schema_version", 2), ("partial", 1), ("interrupted_by", "SIGKILL"),
    ("failed_by", 3), ("failed_by", ""), ("argv", "x"), ("argv", [1]), ("spec", []), ("env", []),
    ("records", {}), ("env.host", "x"), ("env.host.cpu_count", "2"), ("env.gpus", {}), ("env.gpus", [{"name": "x"}]),
    ("env.topology", {"0,1": 1}), ("env.versions", {"x": 1}), ("env.cuda.device_count", "1"),
    ("env.cuda.nvrtc_version", 13),
    ("records.0", []), ("records.0.params", []), ("records.0.params.x", [1]), ("records.0.metric", "speed"),
    ("records.0.nbytes", 1.5), ("records.0.nbytes", -1), ("records.0.nbytes", "1"), ("records.0.nbytes", 0), ("records.0.samples_s", [-1.0]),
    ("records.0.samples_s", ["1"]), ("records.0.samples_s", 1.0), ("records.0.samples_s", [1e-13, 1e-6]),
    ("records.0.reps", 0),
    ("records.0.error", 1), ("records.0.extra", []),
    ("records.0.extra.peak_bytes_per_s", -1.0), ("records.0.extra.peak_bytes_per_s", "1"),
    ("records.0.extra.busbw_factor", -0.5), ("records.0.extra.interval_bytes", [1, -2]),
    ("records.0.extra.interval_start_s", 1.0), ("records.0.extra.interval_end_s", ["1"]),
    ("records.0.extra.pairs", [{"n": -1}]), ("records.0.extra.pairs", [{"hmean": "1"}]),
]


def _set(d: dict, dotted: str, value):
    keys = dotted.split(".")
    for k in keys[:-1]:
        d = d[int(k)] if isinstance(d, list) else d.setdefault(k, {})
    last = keys[-1]
    if isinstance(d, list):
        d[int(last)] = value
    else:
        d[last] = value


@pytest.mark.parametrize("field,value", MUTATIONS, ids=[f"{f}={v!r}" for f, v in MUTATIONS])
def test_what_the_schema_refuses_the_loader_refuses(field, value):
    d = json.loads((DATA / "copy-pinned-h200.json").read_text())
    bad = copy.deepcopy(d)
    _set(bad, field, value)
    assert list(_validator().iter_errors(bad)), "the schema accepts this mutation: not a useful case"
    with pytest.raises(UsageError) as e:
        Result.from_dict(bad, source="m.json")
    line = e.value.one_line()
    assert line.startswith("m.json"), line
    assert "/" + field.split(".")[0] in line or "schema version" in line, line


_REQ = json_schema()
REQUIRED = [f for f in _REQ["required"] if f not in ("schema", "schema_version")]
RECORD_REQUIRED = _REQ["$defs"]["record"]["required"]


@pytest.mark.parametrize("field", REQUIRED + [f"records.0.{f}" for f in RECORD_REQUIRED])
def test_a_required_field_that_is_missing_is_refused_by_both(field):
    """A result without ``records`` (or any other field the schema requires) was read as a run
    that measured nothing; now both refuse it, and the loader names the field."""
    d = json.loads((DATA / "copy-pinned-h200.json").read_text())
    keys = field.split(".")
    target = d
    for k in keys[:-1]:
        target = target[int(k)] if isinstance(target, list) else target[k]
    del target[keys[-1]]
    assert list(_validator().iter_errors(d))
    with pytest.raises(UsageError) as e:
        Result.from_dict(d, source="m.json")
    pointer = "/" + "/".join(keys)
    assert e.value.one_line().startswith(f"m.json: {pointer} is missing") or (
        field == "command" and "names no command" in e.value.one_line()), e.value.one_line()


@pytest.mark.parametrize("field", ["env", "spec", "timing", "records.0.extra", "argv", "partial", "records",
                                   "gpubench_version", "created", "records.0.params", "records.0.samples_s"])
def test_null_where_the_schema_wants_a_value_is_refused_by_both(field):
    d = json.loads((DATA / "copy-pinned-h200.json").read_text())
    _set(d, field, None)
    assert list(_validator().iter_errors(d))
    with pytest.raises(UsageError, match=r"^m\.json: /" + field.replace(".", "/") + " is null"):
        Result.from_dict(d, source="m.json")


@pytest.mark.parametrize("mutation", [{"failed_by": "boom"}, {"interrupted_by": "SIGINT"}, {"created": "yesterday"},
                                      {"extra_top_level": 1}])
def test_what_else_the_schema_refuses_the_loader_refuses(mutation):
    d = json.loads((DATA / "copy-pinned-h200.json").read_text())
    d.update(mutation)
    assert list(_validator().iter_errors(d))
    with pytest.raises(UsageError, match=r"^m\.json: /(partial|created|extra_top_level) is"):
        Result.from_dict(d, source="m.json")


PARAM_MUTATIONS = [
    ("copy-pinned-h200.json", "device", True), ("copy-pinned-h200.json", "device", None),
    ("copy-pinned-h200.json", "nbytes", -1), ("copy-pinned-h200.json", "nbytes", "4096"),
    ("copy-pinned-h200.json", "not_a_param", 1), ("net-local.json", "stream", True),
    ("net-local.json", "stream", None), ("net-local.json", "zzz", "x"), ("net-local.json", "streams", 0),
    ("p2p-h200x2.json", "src", False), ("merge-cpu.json", "broadcast", 1),
]


@pytest.mark.parametrize("name,param,value", PARAM_MUTATIONS, ids=[f"{n}:{p}={v!r}" for n, p, v in PARAM_MUTATIONS])
def test_params_the_commands_schema_refuses_the_loader_refuses(name, param, value):
    """Each command's records have the params its plug-in declares (the schema's allOf entry per
    command): a param of another type, out of its range or not the command's pairs as another
    point in compare (``stream: true`` beside ``stream: 1``), so the loader refuses it as the
    schema does, naming it."""
    d = json.loads((DATA / name).read_text())
    d["records"][0]["params"][param] = value
    assert list(_validator().iter_errors(d)), "the schema accepts this mutation: not a useful case"
    with pytest.raises(UsageError) as e:
        Result.from_dict(d, source="m.json")
    assert e.value.one_line().startswith(f"m.json: /records/0/params/{param} is"), e.value.one_line()


@pytest.mark.parametrize("name", ["copy-pinned-h200.json", "net-local.json"])
def test_a_param_the_commands_records_all_have_is_required(name):
    d = json.loads((DATA / name).read_text())
    required = "device" if name.startswith("copy") else "stream"
    del d["records"][0]["params"][required]
    assert list(_validator().iter_errors(d))
    with pytest.raises(UsageError, match=rf"^m\.json: /records/0/params/{required} is missing"):
        Result.from_dict(d, source="m.json")


@pytest.mark.parametrize("value", [float("inf"), float("nan"), 10**400, True])
def test_what_the_schema_cannot_say_the_loader_still_refuses(value):
    d = json.loads((DATA / "copy-pinned-h200.json").read_text())
    d["records"][0]["samples_s"][0] = value
    with pytest.raises(UsageError, match=r"/records/0/samples_s/0 is"):
        Result.from_dict(d, source="m.json")


def test_depth_of_raw_text_and_of_objects_agree():
    for depth in (0, 1, 5, MAX_DEPTH, 1000):
        text = "[" * depth + "1" + "]" * depth if depth else "1"
        assert json_depth(text.encode()) == depth
        if depth < 500:
            assert object_depth(json.loads(text)) == depth
    assert json_depth(b'{"a": "[[[[[[", "b": "\\"[[[", "c": [1, {"d": []}]}') == 4


def test_the_check_builds_each_fixture_record_as_it_was_saved():
    """check_record checks a well-formed record in one walk and builds the Record it was saved from,
    its samples copied rather than shared with the parsed file."""
    from gpubench.core import result as R

    for path in FILES:
        recs = json.loads(path.read_text())["records"]
        for i, r in enumerate(recs):
            rec = R.check_record(r, "f", f"/records/{i}")
            assert rec.to_dict() == {"telemetry": None, **r}, path.name
            assert rec.samples_s is not r["samples_s"]


@pytest.mark.parametrize("value", [float("inf"), float("nan"), -1.0, 0.0, True, 1])
def test_every_doubtful_sample_is_named_or_taken_as_seconds(value):
    """A sample that is no finite float >= 1e-12 s is named by its JSON Pointer, or (an integer) taken as a float."""
    from gpubench.core import result as R

    d = json.loads((DATA / "copy-pinned-h200.json").read_text())["records"][0]
    d["samples_s"][3] = value
    if value == 1 and type(value) is int:
        assert type(R.check_record(d, "f", "/records/0").samples_s[3]) is float
        return
    with pytest.raises(UsageError, match=r"^f: /records/0/samples_s/3 is"):
        R.check_record(d, "f", "/records/0")


def _driver_check(status="ok"):
    return {"status": status, "warning": None, "driver_cuda": "13.0", "runtime_cuda": "13.0",
            "nvidia_driver": "580.1", "min_driver": None}


@pytest.mark.parametrize("path, value, pointer", [
    (("records", 0, "extra", "noise_pct"), -5, "/records/0/extra/noise_pct"),
    (("records", 0, "extra", "noise_pct"), "x", "/records/0/extra/noise_pct"),
    (("records", 1, "extra", "stopped_by"), "bogus", "/records/1/extra/stopped_by"),
    (("records", 1, "extra", "stopped_by"), None, "/records/1/extra/stopped_by"),
    (("env", "cuda", "driver_check"), _driver_check("bogus"), "/env/cuda/driver_check/status"),
    (("env", "cuda", "driver_check"), {"status": "ok"}, "/env/cuda/driver_check"),
    (("env", "cuda", "driver_check"), dict(_driver_check(), driver_cuda=None), "/env/cuda/driver_check/driver_cuda"),
    (("env", "cuda", "driver_check"), "ok", "/env/cuda/driver_check"),
    (("argv",), ["gpubench", 5], "/argv/1"),
])
def test_the_schemas_declared_extra_and_driver_check_fields_are_refused_as_the_schema_refuses(path, value, pointer):
    d = json.loads((DATA / "copy-pinned-h200.json").read_text())
    node = d
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    with pytest.raises(jsonschema.ValidationError):
        _validator().validate(d)
    with pytest.raises(UsageError) as e:
        Result.from_dict(copy.deepcopy(d), source="r.json")
    assert pointer in e.value.one_line(), e.value.one_line()


@pytest.mark.parametrize("path, value", [
    (("records", 0, "extra", "noise_pct"), None), (("records", 0, "extra", "noise_pct"), 0),
    (("records", 1, "extra", "stopped_by"), "max_time"),
    (("env", "cuda", "driver_check"), None), (("env", "cuda", "driver_check"), _driver_check("driver-too-old")),
])
def test_the_schemas_declared_extra_and_driver_check_fields_load_where_the_schema_takes_them(path, value):
    d = json.loads((DATA / "copy-pinned-h200.json").read_text())
    node = d
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    _validator().validate(d)
    Result.from_dict(d, source="r.json")


def test_a_time_record_takes_samples_under_the_byte_moving_floor_in_both():
    """The 1e-12 s floor keeps rates finite, so it is for records that move bytes: a time (nbytes 0)
    of 1e-13 s is taken by the schema and the loader alike."""
    d = json.loads((DATA / "copy-pinned-h200.json").read_text())
    d["records"][0].update(metric="time", nbytes=0, samples_s=[1e-13, 5e-324])
    _validator().validate(d)
    assert Result.from_dict(d, source="r.json").records[0].samples_s == [1e-13, 5e-324]
