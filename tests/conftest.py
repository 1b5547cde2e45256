"""Shared fixtures. Tests marked ``gpu`` skip cleanly where no CUDA device is visible.

Every result the suite writes is validated against the published JSON Schema
(src/gpubench/schemas/result-v1.schema.json): in-process writes through
``gpubench.core.result`` (files and ``--json -``) fail the test that made them, and every result
file left under pytest's temporary folders (subprocess runs too) is checked when the session ends.
"""

from __future__ import annotations

import json
import os
import random
import signal
import stat
from pathlib import Path

import pytest

# The seed of the tests that sample instants or cases at random (``sampled`` below): a new one each
# run, so the runs together cover the whole range; GPUBENCH_TEST_SEED=N replays a run. Set in the
# environment here, before pytest-xdist starts its workers, so every worker draws from the same seed.
SEED_VAR = "GPUBENCH_TEST_SEED"
if not os.environ.get(SEED_VAR, "").isdigit():
    os.environ[SEED_VAR] = str(random.SystemRandom().randrange(2**32))
SEED = int(os.environ[SEED_VAR])

# The signal tests send SIGINT to the processes they start, which must not inherit it ignored: a
# suite started as a background job of a shell without job control, or under nohup, has SIGINT
# ignored, and gpubench rightly leaves an ignored SIGINT ignored (as iperf3 and any well-behaved
# program do), so those tests would see it run on. Python's own handler is put back here, in the
# controller and in every pytest-xdist worker (each imports this file).
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_report_header(config):
    return f"gpubench: sampled instants and cases from seed {SEED} (replay with {SEED_VAR}={SEED})"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test that drew at random says how to replay its draw."""
    outcome = yield
    report = outcome.get_result()
    if report.failed and "sampled" in getattr(item, "fixturenames", ()):
        report.sections.append(("gpubench seed", f"replay this draw with {SEED_VAR}={SEED}"))


@pytest.fixture
def sampled(request) -> random.Random:
    """A random generator for this test, seeded from the run's seed and the test's id: the same test
    draws the same values on a replay, whatever else ran (or on which pytest-xdist worker)."""
    rng = random.Random(f"{SEED}:{request.node.nodeid}")
    request.node.user_properties.append(("seed", SEED))
    return rng

_SCHEMA_SEEN = {"in_process": 0, "files": 0}
_SCHEMA_ERRORS: list[str] = []


def _schema_validator():
    import jsonschema

    from gpubench.core.result import json_schema

    schema = json_schema()
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def _violations(validator, data) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message[:200]}"
            for e in sorted(validator.iter_errors(data), key=lambda e: list(map(str, e.absolute_path)))]


@pytest.fixture(scope="session", autouse=True)
def _results_match_the_schema(tmp_path_factory):
    """Validate every result written in this process; at the end, every result file under the
    session's temporary folder."""
    import os

    from gpubench.core import result as resmod

    try:
        validator = _schema_validator()
    except ImportError:
        # the test extra brings jsonschema; a machine without it (the lent GPU machine) runs the
        # tests unvalidated and says so; CI (CI=true) must validate
        if os.environ.get("CI"):
            raise
        _SCHEMA_SEEN["skipped"] = 1
        yield
        return
    atomic, stdout = resmod.write_json_atomic, resmod.write_json_stdout

    def check(data, where):
        _SCHEMA_SEEN["in_process"] += 1
        _SCHEMA_ERRORS.extend(f"{where}: {v}" for v in _violations(validator, data))

    def write_json_atomic(data, path, what="result"):
        if what == "result":
            check(data, str(path))
        return atomic(data, path, what)

    def write_json_stdout(data):
        check(data, "--json -")
        return stdout(data)

    resmod.write_json_atomic, resmod.write_json_stdout = write_json_atomic, write_json_stdout
    try:
        yield
    finally:
        resmod.write_json_atomic, resmod.write_json_stdout = atomic, stdout
    bad = []
    for path in sorted(Path(tmp_path_factory.getbasetemp()).rglob("*.json")):
        try:
            if not stat.S_ISREG(path.stat().st_mode):
                continue  # the loader's tests make named pipes and devices named *.json
            text = path.read_text()
            data = json.loads(text)
        except (OSError, ValueError, UnicodeDecodeError):
            continue  # the tests write broken files on purpose
        if not isinstance(data, dict) or data.get("schema") != "gpubench.result":
            continue
        if text != json.dumps(data, indent=1, allow_nan=False) + "\n":
            continue  # not the bytes gpubench's writer makes: a test's hand-made input (often bad on purpose)
        _SCHEMA_SEEN["files"] += 1
        bad += [f"{path}: {v}" for v in _violations(validator, data)]
    if bad:
        pytest.fail("results that do not match the JSON schema:\n" + "\n".join(bad[:20]), pytrace=False)


@pytest.fixture(autouse=True)
def _no_result_broke_the_schema():
    """A test whose run wrote a result that does not match the schema fails."""
    _SCHEMA_ERRORS.clear()
    yield
    if _SCHEMA_ERRORS:
        errors = list(_SCHEMA_ERRORS)
        _SCHEMA_ERRORS.clear()
        pytest.fail("a result written by this test does not match the JSON schema:\n" + "\n".join(errors[:20]),
                    pytrace=False)


def pytest_sessionfinish(session):
    """On a pytest-xdist worker: hand this worker's counts to the controller, which prints the sum."""
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["gpubench_schema_seen"] = dict(_SCHEMA_SEEN)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    for k, v in getattr(node, "workeroutput", {}).get("gpubench_schema_seen", {}).items():
        _SCHEMA_SEEN[k] = _SCHEMA_SEEN.get(k, 0) + v


def pytest_terminal_summary(terminalreporter):
    # the header line is not shown under -q: the seed is said here too
    terminalreporter.write_line(f"gpubench: sampled instants and cases from seed {SEED} "
                                f"(replay with {SEED_VAR}={SEED})")
    if _SCHEMA_SEEN.get("skipped"):
        terminalreporter.write_line("gpubench: results NOT validated against the JSON schema: jsonschema is not "
                                    "installed (the test extra brings it)")
    elif _SCHEMA_SEEN["in_process"] or _SCHEMA_SEEN["files"]:
        terminalreporter.write_line(
            f"gpubench: results validated against the JSON schema: {_SCHEMA_SEEN['in_process']} written in "
            f"process, {_SCHEMA_SEEN['files']} result files under the session's temporary folder")


@pytest.fixture
def run_cli(capsys):
    """Run ``gpubench ARGS`` in-process through cli.main; returns (exit code, stdout, stderr)."""
    from gpubench.cli.app import main

    def run(*args):
        with pytest.raises(SystemExit) as e:
            main([str(a) for a in args])
        out = capsys.readouterr()
        return e.value.code, out.out, out.err

    return run


def _gpu_reason() -> str | None:
    from gpubench.core.errors import NoGPUError
    from gpubench.core.gpu import require_gpu

    try:
        require_gpu()
    except NoGPUError as e:
        return e.message
    return None


def pytest_collection_modifyitems(config, items):
    if not any(item.get_closest_marker("gpu") for item in items):
        return
    reason = _gpu_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


@pytest.fixture
def gpu_count() -> int:
    """Number of visible CUDA devices (the test is marked gpu, so at least 1)."""
    from gpubench.core.gpu import device_count

    return device_count()
