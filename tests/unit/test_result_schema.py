"""The published JSON Schema of results (src/gpubench/schemas/result-v1.schema.json) against the
files gpubench wrote on real machines and against results that break it on purpose. (Every result
the rest of the suite writes is validated by tests/conftest.py.)"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

jsonschema = pytest.importorskip("jsonschema")

from gpubench.core.result import SCHEMA_VERSION, Record, Result, json_schema  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "data"
FILES = sorted(DATA.glob("*.json"))


@pytest.fixture(scope="module")
def validator():
    schema = json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)


def test_the_schema_is_draft_2020_12_for_this_schema_version():
    schema = json_schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["properties"]["schema_version"] == {"const": SCHEMA_VERSION}


def test_the_schema_accepts_every_plugin_name_and_lists_gpubenchs_own():
    import re

    from gpubench.core import registry

    schema = json_schema()["properties"]["command"]
    saving = {p.name for p in registry.measuring() if p.command.startswith("gpubench.")}
    assert all(re.fullmatch(schema["pattern"].strip("^$"), name) for name in saving)
    assert set(schema["examples"]) == saving


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_real_results_validate(validator, path):
    errors = [e.message for e in validator.iter_errors(json.loads(path.read_text()))]
    assert errors == []


def test_there_are_real_results_to_validate():
    assert len(FILES) >= 7


def _good() -> dict:
    return Result(command="copy", spec={"sizes": [4096]}, records=[
        Record(params={"device": 0, "direction": "h2d", "memory": "pinned", "nbytes": 4096}, nbytes=4096,
               samples_s=[1e-6, 2e-6], reps=4)]).to_dict()


@pytest.mark.parametrize("breaks", [
    lambda d: d.pop("records"),
    lambda d: d.update(schema="something.else"),
    lambda d: d.update(schema_version=2),
    lambda d: d.update(command="Frob nicate"),
    lambda d: d.update(surprise=1),                                   # the envelope is closed
    lambda d: d.update(partial=False, failed_by="CUDA error"),        # failed_by only when partial
    lambda d: d.update(partial=False, interrupted_by="SIGINT"),
    lambda d: d.update(interrupted_by="SIGKILL", partial=True),
    lambda d: d["records"][0].update(metric="speed"),
    lambda d: d["records"][0].update(samples_s=[-1.0]),
    lambda d: d["records"][0].update(samples_s=["1e-6"]),             # numbers, not strings
    lambda d: d["records"][0].update(reps=0),
    lambda d: d["records"][0].update(nbytes=1.5),
    lambda d: d["records"][0]["params"].update(devices=[0, 1]),       # params are scalars
    lambda d: d["records"][0]["params"].update(colour="red"),         # copy's params are copy's (its plug-in's)
    lambda d: d["records"][0]["params"].pop("memory"),
    lambda d: d["records"][0]["params"].update(nbytes="4096"),
    lambda d: d["records"][0]["params"].update(nbytes=-1),
    lambda d: d["records"][0].pop("extra"),
    lambda d: d.update(created="yesterday"),
    lambda d: d["env"].update(cuda={"driver_check": {"status": "fine"}}),
])
def test_results_that_break_the_format_are_refused(validator, breaks):
    d = _good()
    assert list(validator.iter_errors(d)) == []
    bad = copy.deepcopy(d)
    breaks(bad)
    assert list(validator.iter_errors(bad)) != []


def test_a_partial_result_with_its_fault_validates(validator):
    d = _good()
    d.update(partial=True, failed_by="worker died", interrupted_by=None)
    assert list(validator.iter_errors(d)) == []


def test_the_shipped_schema_holds_the_params_gpubenchs_own_plugins_declare():
    # the published file is what schema_with() makes of the built-in descriptors: declaring a
    # param in a plug-in's package and shipping the schema cannot drift apart
    from gpubench.core import registry
    from gpubench.core.result import PARAMS_COMMENT, schema_with, shipped_schema

    own = [p for p in registry.plugins().values() if p.command.startswith("gpubench.")]
    made, shipped = schema_with(own), shipped_schema()
    entries = {e["$comment"]: e for e in made["allOf"] if e.get("$comment", "").startswith(PARAMS_COMMENT)}
    assert set(entries) == {PARAMS_COMMENT + p.name for p in own if p.params_schema}
    for e in shipped["allOf"]:
        if e.get("$comment") in entries:
            assert e == entries[e["$comment"]], f"{e['$comment']}: regenerate its entry from the plug-in:\n" + \
                json.dumps(entries[e["$comment"]])
    assert made == shipped


def test_a_third_partys_params_are_held_to_its_declaration_and_others_left_open():
    from gpubench.core.plugin import Plugin, param, params_schema
    from gpubench.core.result import schema_with

    extra = Plugin(name="hostfill", help="x", command="x", params_schema=params_schema(
        {"nbytes": param("integer", "bytes", minimum=1)}, {"threads": param("integer", "threads")}))
    v = jsonschema.Draft202012Validator(schema_with([extra]))
    d = Result(command="hostfill", spec={}, records=[Record(params={"nbytes": 8}, nbytes=8, samples_s=[1e-6])]).to_dict()
    assert list(v.iter_errors(d)) == []
    d["records"][0]["params"]["threads"] = 4
    assert list(v.iter_errors(d)) == []
    d["records"][0]["params"]["nbytes"] = 0
    assert list(v.iter_errors(d)) != []
    d["records"][0]["params"] = {"threads": 4}
    assert list(v.iter_errors(d)) != []
    d["command"] = "elsewhere"  # a command with no declaration: any scalar params
    assert list(v.iter_errors(d)) == []
