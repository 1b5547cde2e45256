"""examples/plugin, a distribution of its own, installed as a user would: `gpubench hostcopy` runs,
saves, and goes through compare, plot, report and suite --check like a built-in command, with
nothing in src/ naming it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "examples" / "plugin"


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The example plug-in installed by pip into a folder of its own (its dist-info carries the entry
    point), built with this environment's setuptools: no network."""
    target = tmp_path_factory.mktemp("site")
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                        "--target", str(target), str(PLUGIN)], capture_output=True, text=True, timeout=300)
    if r.returncode != 0 and "setuptools" in r.stderr:
        pytest.skip("building the example plug-in needs setuptools >= 77 (the test extra)")
    assert r.returncode == 0, r.stderr
    return target


def gb(site: Path, *args, cwd=None):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "gpubench", *args], capture_output=True, text=True, timeout=180,
                          env=env, cwd=cwd)


def test_src_never_names_the_example_plugin():
    named = [p for p in (ROOT / "src").rglob("*.py") if "hostcopy" in p.read_text()]
    assert named == []


def test_the_installed_plugin_is_a_command_that_measures_saves_and_is_listed(site, tmp_path):
    help_ = gb(site, "--help")
    assert help_.returncode == 0 and "hostcopy" in help_.stdout
    out = tmp_path / "a.json"
    r = gb(site, "hostcopy", "-b", "4KiB", "-e", "64KiB", "--min-time", "0.01", "--json", str(out))
    assert r.returncode == 0, r.stderr
    assert "hostcopy: host-to-host copy" in r.stdout
    d = json.loads(out.read_text())
    assert d["command"] == "hostcopy" and [x["nbytes"] for x in d["records"]] == [4096, 16384, 65536]
    assert all(x["samples_s"] and all(t > 0 for t in x["samples_s"]) for x in d["records"])
    # the schema published where the plug-in is installed holds its results to its declared params
    check = ("import json, sys, jsonschema; from gpubench.core.result import json_schema; s = json_schema(); "
             "assert any(e.get('$comment', '').endswith(' hostcopy') for e in s['allOf']); "
             "jsonschema.validate(json.load(open(sys.argv[1])), s); print('valid')")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    v = subprocess.run([sys.executable, "-c", check, str(out)], capture_output=True, text=True, timeout=60, env=env)
    assert v.returncode == 0 and v.stdout.strip() == "valid", v.stderr


def test_bad_input_to_the_plugin_is_one_line_and_exit_2(site):
    r = gb(site, "hostcopy", "-b", "lots")
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = gb(site, "hostcopy", "-n", "१२")  # Unicode digits: the shared strict numbers apply to a plug-in too
    assert r.returncode == 2 and "-n/--iters" in r.stderr


def test_the_plugin_goes_through_compare_plot_report_and_suite_check(site, tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    for path in (a, b):
        r = gb(site, "hostcopy", "-b", "64KiB", "-e", "256KiB", "--min-time", "0.01", "-q", "--json", str(path))
        assert r.returncode == 0, r.stderr
    r = gb(site, "compare", str(a), str(b))
    assert r.returncode == 0, r.stderr
    assert "2 figure(s) paired" in r.stdout
    r = gb(site, "compare", str(a), str(b), "--format", "markdown")
    assert r.returncode == 0 and "hostcopy" in r.stdout
    r = gb(site, "plot", str(a), str(b), "-o", str(tmp_path / "p.png"))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    r = gb(site, "report", str(a), str(b), "-o", str(tmp_path / "r.html"))
    assert r.returncode == 0, r.stderr
    assert "hostcopy" in (tmp_path / "r.html").read_text()
    expect = tmp_path / "e.toml"
    expect.write_text('[[expect]]\nname = "hostcopy 256 KiB"\ncommand = "hostcopy"\nwhere = { nbytes = 262144 }\n'
                      'min_gbps = 0.001\n\n[[expect]]\nname = "impossible"\ncommand = "hostcopy"\n'
                      'where = { nbytes = 262144 }\nmin_gbps = 1e9\n')
    r = gb(site, "suite", "--check", str(a), "--expect", str(expect))
    assert r.returncode == 1, r.stdout + r.stderr  # one expectation passes, the impossible one fails
    assert "1 pass, 1 fail" in r.stdout


def _fake(tmp_path: Path, name: str, entries: dict[str, str], modules: dict[str, str]) -> Path:
    """A distribution written by hand into a folder of its own: its entry points and modules."""
    site = tmp_path / name
    info = site / f"{name}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[gpubench.plugins]\n" + "".join(f"{k} = {v}\n" for k, v in entries.items()))
    for mod, text in modules.items():
        (site / f"{mod}.py").write_text(text)
    return site


def _gb_with(site: Path, *args):
    env = dict(os.environ, PYTHONPATH=str(site))
    return subprocess.run([sys.executable, "-m", "gpubench", *args], capture_output=True, text=True, env=env, timeout=120)


def test_a_third_party_cannot_take_a_builtin_command(tmp_path):
    site = _fake(tmp_path, "aaa_evil", {"copy": "aaa_evil:PLUGIN"}, {"aaa_evil": (
        "from gpubench.core.plugin import Plugin\n"
        "PLUGIN = Plugin(name='copy', help='HIJACKED copy', command='aaa_evil', gpu='no')\n")})
    r = _gb_with(site, "--help")
    assert r.returncode == 0 and "HIJACKED" not in r.stdout
    assert "aaa_evil:PLUGIN left out: the command 'copy' is taken by gpubench.plugins.copy.command" in r.stderr


def test_a_plugin_that_exits_or_has_a_bad_field_is_left_out_and_the_others_work(tmp_path):
    site = _fake(tmp_path, "gpubench_bad", {"byebye": "bad_exit:PLUGIN", "badhelp": "bad_help:PLUGIN",
                                            "badgpu": "bad_gpu:PLUGIN"}, {
        "bad_exit": "raise SystemExit('bye from plugin')\n",
        "bad_help": "from gpubench.core.plugin import Plugin\nPLUGIN = Plugin(name='badhelp', help=12345, command='x')\n",
        "bad_gpu": "from gpubench.core.plugin import Plugin\nPLUGIN = Plugin(name='badgpu', help='h', command='x', gpu=None)\n",
    })
    r = _gb_with(site, "--help")
    assert r.returncode == 0 and "copy" in r.stdout and "bye from plugin" not in r.stdout
    warned = [x for x in r.stderr.splitlines() if x.startswith("gpubench: warning: plug-in ")]
    assert len(warned) == 3, r.stderr
    assert any("SystemExit: bye from plugin" in x for x in warned)
    assert any("help 12345 is not a string" in x for x in warned) and any("gpu None is not a string" in x for x in warned)
    r = _gb_with(site, "env", "-q")  # a built-in runs, its no-GPU list intact
    assert r.returncode == 0, r.stderr


def test_plugin_help_reaches_the_terminal_inert(tmp_path):
    site = _fake(tmp_path, "gpubench_ansi", {"ansi": "ansi_mod:PLUGIN"}, {"ansi_mod": (
        "from gpubench.core.plugin import Plugin\n"
        "PLUGIN = Plugin(name='ansi', help='x\\x1b[2J\\x1b]8;;http://e\\x07link\\u202eevil\\r', command='ansi_mod')\n")})
    r = _gb_with(site, "--help")
    assert r.returncode == 0
    assert "\x1b" not in r.stdout and "\u202e" not in r.stdout and "\r" not in r.stdout
    assert "ansi" in r.stdout


def test_broken_hooks_are_said_once_and_left_out_where_saved_results_are_read(site, tmp_path):
    hooks = _fake(tmp_path, "gpubench_hooks", {"hooky": "hooky:PLUGIN"}, {"hooky": (
        "from gpubench.core.plugin import Plugin\n"
        "PLUGIN = Plugin(name='hooky', help='h', command='hooky', gpu='no', compare_notes='hooky:notes',\n"
        "                fleet_checks='hooky:checks', suite_steps='hooky:steps')\n"
        "def notes(base, new):\n    raise RuntimeError('notes boom')\n"
        "def checks(result):\n    return 'junk'\n"
        "def steps(place):\n    return ['not a step']\n")})
    a = tmp_path / "a.json"
    r = gb(site, "hostcopy", "-b", "64KiB", "-e", "64KiB", "--min-time", "0.01", "-q", "--json", str(a))
    assert r.returncode == 0, r.stderr
    d = json.loads(a.read_text())
    d["command"] = "hooky"
    a.write_text(json.dumps(d))
    env = dict(os.environ, PYTHONPATH=str(hooks))
    code = ("import sys\nfrom gpubench.core.result import load\nfrom gpubench.analysis import compare\n"
            "from gpubench.core.plugin import StepPlace\nfrom gpubench.validation import fleet, steps\n"
            "r = load(sys.argv[1])\nprint('NOTES', compare.compare(r, r).notes)\nprint('CHECKS', fleet.checks_of(r))\n"
            "print('STEPS', [s.name for p, s in steps.planned(StepPlace(devices=(0,)))])\n")
    p = subprocess.run([sys.executable, "-c", code, str(a)], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "NOTES []" in p.stdout and "CHECKS []" in p.stdout and "'copy pinned'" in p.stdout
    assert "its compare_notes hook failed (RuntimeError: notes boom); left out" in p.stderr
    assert "its fleet_checks hook failed" in p.stderr and "its suite_steps hook failed" in p.stderr


def test_a_broken_plugin_is_left_out_with_one_warning_and_the_rest_works(site, tmp_path):
    broken = tmp_path / "broken"
    (broken / "gpubench_broken-0.1.dist-info").mkdir(parents=True)
    (broken / "gpubench_broken-0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: gpubench-broken\n"
                                                                       "Version: 0.1\n")
    (broken / "gpubench_broken-0.1.dist-info" / "entry_points.txt").write_text(
        "[gpubench.plugins]\nbroken = gpubench_broken_missing:PLUGIN\ncopy = gpubench_broken_missing:PLUGIN\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(broken), str(site)]))
    r = subprocess.run([sys.executable, "-m", "gpubench", "--help"], capture_output=True, text=True, env=env,
                       timeout=60)
    assert r.returncode == 0 and "hostcopy" in r.stdout and "copy" in r.stdout
    lines = [x for x in r.stderr.splitlines() if x]
    assert len(lines) == 2 and all(x.startswith("gpubench: warning: plug-in ") for x in lines), r.stderr
    assert any("broken = gpubench_broken_missing:PLUGIN" in x and "ModuleNotFoundError" in x for x in lines)
    assert any("'copy' is taken" in x for x in lines)
