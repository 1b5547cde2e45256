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
        Record(params={"direction": "h2d", "nbytes": 4096}, nbytes=4096, samples_s=[1e-6, 2e-6], reps=4)]).to_dict()


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
