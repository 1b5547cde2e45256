"""The plug-in contract, checked for every registered command: what compare, plot, report, suite and
the fleet ask of a plug-in resolves, its docs page exists, and the registry is the entry points."""

from __future__ import annotations

import importlib
import inspect
import re
import tomllib
from pathlib import Path

import pytest

from gpubench.core import registry
from gpubench.core.plugin import NAME, Plugin, StepPlace, SuiteStep

ROOT = Path(__file__).resolve().parents[2]
PLUGINS = list(registry.plugins().values())
HOOKS = ("compare_notes", "suite_steps", "fleet_checks")


def test_the_registry_is_the_entry_points_pyproject_declares():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["gpubench.plugins"]
    assert {p.name for p in PLUGINS} >= set(declared)
    for name, value in declared.items():
        module, _, attr = value.partition(":")
        assert getattr(importlib.import_module(module), attr) is registry.get(name)


@pytest.mark.parametrize("p", PLUGINS, ids=lambda p: p.name)
def test_every_plugin_answers_the_contract(p: Plugin):
    assert NAME.match(p.name) and p.help and len(p.help) <= 100
    cmd = importlib.import_module(p.command).command
    assert cmd.name == p.name
    assert p.gpu in ("yes", "no") or p.gpu.startswith(p.name + " ")
    assert (ROOT / p.docs).is_file(), f"{p.name}: docs page {p.docs} is missing"
    for attr in HOOKS:
        hook = p.hook(attr)
        assert hook is None or callable(hook), attr
    if p.writes_results:
        assert p.more_samples
        assert p.params_schema, f"{p.name}: declare its records' params (none: params_schema({{}}))"
    if p.bench is not None:
        bench = importlib.import_module(p.bench)
        assert callable(bench.run) and list(inspect.signature(bench.run).parameters)[:2] == ["spec", "progress"]
        for obj in vars(bench).values():  # the descriptor and the benchmark agree on host buffers
            if inspect.isclass(obj) and getattr(obj, "name", None) == p.name and hasattr(obj, "host_memory"):
                assert obj.host_memory == p.host_memory, f"{p.name}: host_memory differs from {obj.__name__}'s"


@pytest.mark.parametrize("p", [p for p in PLUGINS if p.suite_steps], ids=lambda p: p.name)
@pytest.mark.parametrize("place", [StepPlace(devices=(0, 1)), StepPlace(devices=(0, 1), fleet=True, gpu=1),
                                   StepPlace(devices=(), fleet=True)], ids=["node", "fleet", "fleet-cpu"])
def test_suite_steps_are_specs_of_the_plugin_built_without_a_gpu(p: Plugin, place: StepPlace):
    for step in p.hook("suite_steps")(place):
        assert isinstance(step, SuiteStep) and step.name
        spec = step.spec() if callable(step.spec) else step.spec
        assert spec is not None and not isinstance(spec, (list, tuple, str)), "a Spec, never an argv"
        if place.fleet and place.gpu is not None and hasattr(spec, "devices") and step.each_rank:
            assert tuple(spec.devices or ()) == (place.gpu,)


def test_a_plugin_name_is_a_command_word():
    with pytest.raises(ValueError, match="lower case"):
        Plugin(name="Copy Fast", help="x", command="x")
    with pytest.raises(ValueError, match="plot_kind"):
        Plugin(name="x", help="x", command="x", plot_kind="pie")


@pytest.mark.parametrize("field,value,says", [
    ("help", 12345, "help 12345 is not a string"), ("help", "", "help '' is not a string"),
    ("help", "h" * 201, "at most 200"), ("gpu", None, "gpu None is not a string"),
    ("suite_steps", "no colon", "'module:function' reference"), ("fleet_checks", 3, "'module:function'"),
    ("added_params", None, "a mapping"), ("added_options", {3: 1}, "a mapping"),
    ("host_memory", "yes", "true or false"), ("x_name", 5, "or None"),
    ("params_schema", {"nbytes": {"type": "integer"}}, "{'properties'"),
    ("params_schema", {"properties": {"n": {}}, "required": ["m"]}, "params among them"),
])
def test_a_descriptor_with_a_bad_field_is_refused_naming_it(field, value, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        Plugin(**{"name": "x", "help": "x", "command": "x", field: value})
